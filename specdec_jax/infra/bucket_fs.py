"""gs:// for orbax's directory operations, through our one I/O layer.

Orbax makes, lists, opens and commits checkpoint directories through
`etils.epath`. With TensorFlow installed, epath sends gs:// to
TensorFlow's C++ GCS client, whose endpoint is fixed
(www.googleapis.com): it reaches neither the tests' emulator nor our
bounded waits. Without TensorFlow (or with `EPATH_USE_TF=false`) epath
asks fsspec for the "gcs" filesystem instead. `BucketFileSystem` is that
filesystem, on top of `specdec_jax.infra.paths` (tensorstore's kvstore, which
follows `TENSORSTORE_GCS_HTTP_URL`, with its bounded waits), so orbax's
directories go where its arrays (tensorstore too) already go. No new package:
orbax requires `etils[epath]`, which brings fsspec.

Only what epath and orbax use is here: open (whole objects: read in one
call, written in one call on close, as `paths.write_bytes` does), info /
exists / isdir, ls (and so walk, find, glob), rm, copy and move (copy then
delete: GCS has no rename). Directories are key prefixes: mkdir and
makedirs are no-ops, and a directory exists once an object is under it.

`use_for_epath()` switches a process over, for good: it sets
`EPATH_USE_TF=false` (epath reads it once per process) and registers this
class for "gs" and "gcs" with fsspec. Every gs:// path epath touches in
that process then goes through here, TFDS's included. `training.train`
calls it only for a multi-host run with a gs:// workdir (scripts/train.py).
"""

from __future__ import annotations

import io
import os
from typing import Any

import fsspec

from specdec_jax.infra import paths

PROTOCOLS = ("gs", "gcs")


def _url(path: str) -> str:
  """`gs://bucket/key` of an fsspec path (with or without its protocol)."""
  path = str(path)
  for protocol in PROTOCOLS:
    if path.startswith(protocol + "://"):
      path = path[len(protocol) + 3:]
      break
  return paths.GCS + path.strip("/")


class _Upload(io.BytesIO):
  """A file opened for writing: its bytes go to the object on close."""

  def __init__(self, url: str, initial: bytes = b""):
    super().__init__()
    self.url = url
    self.write(initial)

  def close(self) -> None:
    if not self.closed:
      data = self.getvalue()
      super().close()
      paths.write_bytes(self.url, data)


class BucketFileSystem(fsspec.AbstractFileSystem):
  """fsspec's view of gs:// through `specdec_jax.infra.paths` (see the
  module docstring)."""

  protocol = PROTOCOLS
  root_marker = ""

  def __init__(self, *args: Any, **storage_options: Any):
    # epath passes finalize_on_close=True (gcsfs's option): every write
    # here is final when its file closes.
    storage_options.pop("finalize_on_close", None)
    super().__init__(*args, **storage_options)

  @classmethod
  def _strip_protocol(cls, path: Any) -> str:
    return _url(path)[len(paths.GCS):]

  # --- Reading the tree. ---

  def _entry(self, name: str, kind: str, size: int = 0) -> dict[str, Any]:
    return {"name": name, "type": kind, "size": size}

  def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
    del kwargs
    name = self._strip_protocol(path)
    url = paths.GCS + name
    if "/" not in name:  # a bucket: list its objects
      below = paths.list_files(url + "/")
    else:
      below = paths.list_files(url)
    if not below:
      data = paths.read_bytes(url) if "/" in name else None
      if data is None:
        raise FileNotFoundError(f"no such gs:// file or directory: {url}")
      entries = [self._entry(name, "file", len(data))]
    else:
      children: dict[str, str] = {}
      for key in below:
        first, _, rest = key.partition("/")
        children[first] = "directory" if rest else children.get(first, "file")
      entries = [self._entry(f"{name}/{child}", kind)
                 for child, kind in sorted(children.items())]
    return entries if detail else [e["name"] for e in entries]

  def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
    del kwargs
    name = self._strip_protocol(path)
    url = paths.GCS + name
    if "/" in name:
      data = paths.read_bytes(url)
      if data is not None:
        return self._entry(name, "file", len(data))
    if paths.list_files(url if "/" in name else url + "/"):
      return self._entry(name, "directory")
    raise FileNotFoundError(f"no such gs:// file or directory: {url}")

  # --- Directories: key prefixes. ---

  def mkdir(self, path: str, create_parents: bool = True,
            **kwargs: Any) -> None:
    del path, create_parents, kwargs

  def makedirs(self, path: str, exist_ok: bool = False) -> None:
    del path, exist_ok

  def rmdir(self, path: str) -> None:
    del path

  # --- Files. ---

  def _open(self, path: str, mode: str = "rb", block_size: Any = None,
            autocommit: bool = True, cache_options: Any = None,
            **kwargs: Any) -> Any:
    del block_size, autocommit, cache_options, kwargs
    url = _url(path)
    if "r" in mode:
      data = paths.read_bytes(url)
      if data is None:
        raise FileNotFoundError(f"no such gs:// file: {url}")
      return io.BytesIO(data)
    if "a" in mode:
      return _Upload(url, paths.read_bytes(url) or b"")
    if "w" in mode or "x" in mode:
      if "x" in mode and paths.read_bytes(url) is not None:
        raise FileExistsError(f"gs:// file exists: {url}")
      return _Upload(url)
    raise ValueError(f"mode {mode!r} is not supported for gs:// files "
                     "(read, write or append, whole objects)")

  def _rm(self, path: str) -> None:
    paths.remove(_url(path))

  def rm(self, path: Any, recursive: bool = False,
         maxdepth: int | None = None) -> None:
    del maxdepth
    for one in ([path] if isinstance(path, str) else path):
      url = _url(one)
      below = paths.list_files(url)
      if below and not recursive:
        raise IsADirectoryError(f"{url} is a directory: pass recursive=True")
      for key in below:
        paths.remove(paths.join(url, key))
      if "/" in url[len(paths.GCS):]:
        paths.remove(url)

  def cp_file(self, path1: str, path2: str, **kwargs: Any) -> None:
    del kwargs
    data = paths.read_bytes(_url(path1))
    if data is None:
      raise FileNotFoundError(f"no such gs:// file: {_url(path1)}")
    paths.write_bytes(_url(path2), data)

  def mv(self, path1: str, path2: str, recursive: bool = False,
         maxdepth: int | None = None, **kwargs: Any) -> None:
    """Copies, then deletes the source: GCS has no rename."""
    del recursive, maxdepth, kwargs
    source, target = _url(path1), _url(path2)
    below = paths.list_files(source)
    pairs = ([(paths.join(source, k), paths.join(target, k)) for k in below]
             if below else [(source, target)])
    for one, other in pairs:
      self.cp_file(one, other)
    for one, _ in pairs:
      paths.remove(one)

  rename = mv


def use_for_epath() -> None:
  """Sends this process's epath gs:// calls (orbax's directories) through
  `BucketFileSystem`, for the rest of the process (see the module
  docstring)."""
  os.environ["EPATH_USE_TF"] = "false"
  # epath decides TF-or-fsspec once per process (a cached function): a
  # decision taken before the variable was set is forgotten.
  from etils.epath import gpath  # pylint: disable=g-import-not-at-top
  cached = getattr(gpath, "_is_tf_installed", None)
  if cached is not None and hasattr(cached, "cache_clear"):
    cached.cache_clear()
  for protocol in PROTOCOLS:
    fsspec.register_implementation(protocol, BucketFileSystem, clobber=True)
  fsspec.AbstractFileSystem.clear_instance_cache()
  # epath caches the filesystem it got; drop one made before the switch.
  from etils.epath import backend  # pylint: disable=g-import-not-at-top
  getter = getattr(backend.fsspec_backend, "_get_filesystem", None)
  if getter is not None and hasattr(getter, "cache_clear"):
    getter.cache_clear()
  # Orbax asks google-cloud-storage (not a dependency of ours) whether a
  # bucket has a hierarchical namespace before it lists or deletes step
  # directories. Through this filesystem every bucket is a flat key space:
  # listing and deleting go object by object, which an HNS bucket serves
  # too (its emptied folders stay behind).
  from orbax.checkpoint._src.path import gcs_utils  # pylint: disable=g-import-not-at-top
  if hasattr(gcs_utils, "is_hierarchical_namespace_enabled"):
    gcs_utils.is_hierarchical_namespace_enabled = _flat_namespace


def _flat_namespace(path: Any) -> bool:
  """Orbax's HNS question, answered for `BucketFileSystem`: flat."""
  del path
  return False
