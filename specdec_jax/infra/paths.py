"""Every file the project reads or writes, local or gs://, through one layer.

A path is a local path or `gs://bucket/key`. Workdirs (results, tables,
plots, `config.gin`, TensorBoard events), checkpoints and data files all go
through the functions here, so a test against a Cloud Storage emulator
covers the same code a run on a TPU slice uses.

Why tensorstore's kvstore: it is already how our checkpoints (orbax, T5X
arrays) reach gs://, so one client, one credential path and one retry policy
serve everything; it is maintained by Google for exactly this (T5X and orbax
read buckets through it); it has conditional writes (`if_equal`, GCS's
`ifGenerationMatch`), which the workdir lock needs; and it honours
`TENSORSTORE_GCS_HTTP_URL` + `GOOGLE_AUTH_TOKEN_FOR_TESTING`, so tests run it
against a local emulator. fsspec/gcsfs would add a second client beside it.

Cloud Storage has no append and no rename: `write_bytes` replaces an object
whole (atomic on GCS; locally a temporary file renamed over the target), so
a reader sees the old or the new contents, never half of one.

Bounded waits: every remote call gives up after `timeout_s()` seconds
(`SPECDEC_IO_TIMEOUT_S`, default 120) with a `RemoteStorageError` naming the
bucket and the likely causes, instead of tensorstore's default retries
(minutes of silence with no network). A server that refuses the connection
(nothing listens at the endpoint) fails at once instead, saying so. Long
transfers (`copy_tree`) log their progress.

tensorstore is imported inside the functions that touch storage, so
importing this module needs only the standard library.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import posixpath
import socket
import tempfile
import time
import urllib.parse
from typing import Any

from specdec_jax import errors

GCS = "gs://"
TIMEOUT_ENV = "SPECDEC_IO_TIMEOUT_S"
_DEFAULT_TIMEOUT_S = 120.0
# tensorstore's generation of a missing object: a write with
# `if_equal=_MISSING` succeeds only if the object does not exist yet.
_MISSING = b"\x02"
# Bytes per second below which a transfer counts as stalled: a write of n
# bytes may take timeout_s() + n / _MIN_RATE seconds.
_MIN_RATE = 1 << 20


class RemoteStorageError(OSError, errors.UsageError):
  """A gs:// call failed or did not answer in time."""


def is_remote(path: Any) -> bool:
  return isinstance(path, str) and path.startswith(GCS)


is_gcs = is_remote


def join(path: str, *names: str) -> str:
  return (posixpath if is_remote(path) else os.path).join(path, *names)


join_path = join


def split(path: str) -> tuple[str, str]:
  path = path.rstrip("/") if is_remote(path) else path.rstrip(os.sep)
  return (posixpath if is_remote(path) else os.path).split(path)


split_path = split


def absolute(path: str) -> str:
  """A local path made absolute (and ~ expanded); a gs:// path unchanged."""
  return path if is_remote(path) else os.path.abspath(os.path.expanduser(path))


def bucket(path: str) -> str:
  return path[len(GCS):].split("/", 1)[0]


def timeout_s() -> float:
  return float(os.environ.get(TIMEOUT_ENV, _DEFAULT_TIMEOUT_S))


@functools.lru_cache(maxsize=None)
def _context(timeout: float) -> Any:
  # tensorstore only when files are read or written.
  import tensorstore as ts  # pylint: disable=g-import-not-at-top
  # Retries back off up to a quarter of the budget, so several fit in it and
  # the last one ends before `timeout`; the result timeout is the hard cap.
  return ts.Context({"gcs_request_retries": {
      "max_retries": 8, "initial_delay": f"{min(1.0, timeout / 16)}s",
      "max_delay": f"{max(0.1, timeout / 4)}s"}})


def kvstore_spec(directory: str) -> dict[str, Any]:
  """The tensorstore kvstore spec of a directory."""
  if is_remote(directory):
    name, _, prefix = directory[len(GCS):].partition("/")
    prefix = prefix.strip("/")
    return {"driver": "gcs", "bucket": name,
            "path": prefix + "/" if prefix else ""}
  return {"driver": "file", "path": os.path.abspath(directory) + "/"}


def endpoint() -> str:
  """The Cloud Storage server gs:// paths go to (an emulator's, when
  `TENSORSTORE_GCS_HTTP_URL` names one)."""
  return os.environ.get("TENSORSTORE_GCS_HTTP_URL",
                        "https://storage.googleapis.com")


# What a storage server answered that is about the server, not the data:
# a marker of the error text -> what it means. Anything else that fails
# while reading data that arrived is the data's fault.
SERVER_ANSWERS = {
    "Malformed StorageGeneration": (
        "the server sent no usable x-goog-generation header with a "
        "download (Cloud Storage always does; the stock gcp-storage-emulator"
        " and some proxies or GCS-compatible stores do not)"),
    "PERMISSION_DENIED": "the server refused access (credentials or the "
                         "bucket's permissions)",
    "UNAUTHENTICATED": "the server wants credentials "
                       "(`gcloud auth application-default login`)",
    "UNAVAILABLE": "the server could not be reached or answered with an "
                   "error status",
    "DEADLINE_EXCEEDED": "the server did not answer in time",
}


def server_answer(error: BaseException) -> str | None:
  """What `error` says about the storage server (see SERVER_ANSWERS), or
  None when it is not about the server."""
  text = str(error)
  return next((meaning for marker, meaning in SERVER_ANSWERS.items()
               if marker in text), None)


def _explain(path: str, what: str, error: BaseException) -> RemoteStorageError:
  first = (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
  return RemoteStorageError(
      f"{what} {path} failed ({first or type(error).__name__}) talking to "
      f"bucket gs://{bucket(path)} at {endpoint()}. Likely causes: no network "
      "from this machine, no credentials (`gcloud auth application-default "
      "login`, or the VM's service account lacks access to the bucket), or "
      f"the bucket does not exist. Remote calls give up after {timeout_s():g}"
      f" s; set {TIMEOUT_ENV} to wait longer on a slow link.")


# Variables that send HTTP through a proxy: then a direct connection to the
# endpoint says nothing about tensorstore's.
_PROXY_ENV = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy",
              "ALL_PROXY", "all_proxy")
# The endpoints a connection was made to (checked once per process).
_REACHED: set[str] = set()
# The buckets whose first call was announced in the log.
_ANNOUNCED: set[tuple[str, str]] = set()
# A call still waiting after this many seconds says so, and again as often.
_PROGRESS_S = 10.0


def _refuse_refused(path: str, what: str, wait: float) -> None:
  """Raises RemoteStorageError at once when nothing listens at the
  endpoint.

  tensorstore retries a refused connection like any unavailable server,
  for the whole bounded wait (minutes), then reports it as a timeout. A
  refused TCP connection is known in milliseconds, and means a server that
  is not running or a variable pointing at the wrong port. Any other
  outcome (connected, slow, no DNS) is left to the call and its bounded
  wait.
  """
  url = endpoint()
  if url in _REACHED or any(os.environ.get(v) for v in _PROXY_ENV):
    return
  parts = urllib.parse.urlsplit(url)
  port = parts.port or (443 if parts.scheme == "https" else 80)
  try:
    socket.create_connection((parts.hostname, port),
                             timeout=min(5.0, wait)).close()
  except ConnectionRefusedError:
    named = [f"{v}={os.environ[v]}" for v in ("TENSORSTORE_GCS_HTTP_URL",
                                              "STORAGE_EMULATOR_HOST")
             if os.environ.get(v, "").rstrip("/") == url.rstrip("/")]
    where = (f" {' and '.join(named)} point{'s' if len(named) == 1 else ''}"
             " there." if named else " No variable points elsewhere: this is"
             " Cloud Storage itself, refused on the way (a firewall).")
    raise RemoteStorageError(
        f"{what} {path} failed: {url}: connection refused (is the server "
        f"running? which variable points at it?).{where}") from None
  except OSError:  # slow, no route, no DNS: the call's bounded wait tells
    return
  _REACHED.add(url)


def _remote(path: str, what: str, make_future, size: int = 0,
            timeout: float | None = None) -> Any:
  """Runs one tensorstore call on `path` within the bounded wait (or
  `timeout` seconds)."""
  wait = timeout_s() if timeout is None else timeout
  if (endpoint(), bucket(path)) not in _ANNOUNCED:
    _ANNOUNCED.add((endpoint(), bucket(path)))
    logging.info("contacting gs://%s at %s (a call gives up after %g s; %s "
                 "sets it)", bucket(path), endpoint(), wait, TIMEOUT_ENV)
  _refuse_refused(path, what, wait)
  limit = wait + size / _MIN_RATE
  started = time.monotonic()
  try:
    future = make_future(_context(wait))
    while True:
      left = limit - (time.monotonic() - started)
      try:
        return future.result(timeout=max(min(_PROGRESS_S, left), 0.0))
      except TimeoutError:
        if left <= _PROGRESS_S:
          raise
        logging.info("%s %s: no answer from %s after %.0f s, waiting up to "
                     "%g s", what, path, endpoint(),
                     time.monotonic() - started, limit)
  except TimeoutError as e:
    raise _explain(path, what, TimeoutError(
        f"no answer within {limit:g} s")) from e
  except (ValueError, RuntimeError, OSError) as e:
    if isinstance(e, RemoteStorageError):
      raise
    raise _explain(path, what, e) from e


def bounded(path: str, what: str, make_future, size: int = 0) -> Any:
  """`make_future(context)`'s result, with a tensorstore context of bounded
  retries, within the bounded wait (plus `size` bytes at 1 MB/s) when
  `path` is gs://; a failure is a RemoteStorageError naming the bucket."""
  if not is_remote(path):
    return make_future(None).result()
  return _remote(path, what, make_future, size)


def _store(directory: str, context: Any) -> Any:
  # tensorstore only when files are read or written.
  import tensorstore as ts  # pylint: disable=g-import-not-at-top
  return ts.KvStore.open(kvstore_spec(directory), context=context)


def _key_call(path: str, what: str, call, size: int = 0,
              timeout: float | None = None) -> Any:
  directory, name = split(path)
  store = _remote(path, what, lambda ctx: _store(directory, ctx),
                  timeout=timeout)
  return _remote(path, what, lambda _: call(store, name), size,
                 timeout=timeout)


# --- Reading and writing whole files. ---


def read_bytes(path: str) -> bytes | None:
  """The contents of a file, or None if it does not exist."""
  if not is_remote(path):
    try:
      with open(path, "rb") as f:
        return f.read()
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
      return None
  result = _key_call(path, "reading", lambda s, k: s.read(k))
  return bytes(result.value) if result.state == "value" else None


def read_text(path: str) -> str:
  """A UTF-8 file's text; FileNotFoundError names a missing one."""
  data = read_bytes(path)
  if data is None:
    raise FileNotFoundError(f"file not found: {path}")
  return data.decode("utf-8")


def write_bytes(path: str, data: bytes) -> None:
  """Replaces `path` whole: readers see the old or the new contents."""
  if not is_remote(path):
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp.")
    try:
      with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
      umask = os.umask(0)
      os.umask(umask)
      os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600
      os.replace(tmp, path)
    except BaseException:
      with contextlib.suppress(FileNotFoundError):
        os.remove(tmp)
      raise
    return
  _key_call(path, "writing", lambda s, k: s.write(k, data), len(data))


def write_text(path: str, text: str) -> None:
  write_bytes(path, text.encode("utf-8"))


def create_exclusive(path: str, data: bytes) -> bool:
  """Writes `path` only if it does not exist; False if it already did.

  Atomic: on GCS a write with `ifGenerationMatch=0` (tensorstore's
  `if_equal` on a missing object), locally `O_CREAT | O_EXCL`.
  """
  if not is_remote(path):
    try:
      fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
      return False
    with os.fdopen(fd, "wb") as f:
      f.write(data)
    return True
  return _create_if_missing(path, data)


def _create_if_missing(path: str, data: bytes) -> bool:
  """The conditional write behind `create_exclusive` on gs:// (through
  tensorstore, so tests can check its precondition on the file driver)."""
  stamp = _key_call(path, "creating",
                    lambda s, k: s.write(k, data, if_equal=_MISSING))
  # A failed precondition is not an error in tensorstore: the returned
  # generation is empty.
  return bool(stamp.generation)


def read_generation(path: str, timeout: float | None = None
                    ) -> tuple[bytes | None, bytes]:
  """(contents or None, storage generation) of a gs:// object: the
  generation is what `replace_if` compares (GCS's object generation).
  `timeout` bounds each call (default: the I/O layer's wait)."""
  result = _key_call(path, "reading", lambda s, k: s.read(k),
                     timeout=timeout)
  data = bytes(result.value) if result.state == "value" else None
  return data, bytes(result.stamp.generation)


def replace_if(path: str, data: bytes | None, generation: bytes,
               timeout: float | None = None) -> bytes | None:
  """Writes `data` to a gs:// object (deletes it when None) only if it is
  still at `generation` (GCS's `ifGenerationMatch`); the new generation, or
  None when the object had changed and nothing was written. `timeout`
  bounds each call (default: the I/O layer's wait)."""
  stamp = _key_call(path, "replacing",
                    lambda s, k: s.write(k, data, if_equal=generation),
                    timeout=timeout)
  return bytes(stamp.generation) or None


def remove(path: str) -> None:
  """Deletes a file; a missing one is fine."""
  if not is_remote(path):
    with contextlib.suppress(FileNotFoundError):
      os.remove(path)
    return
  _key_call(path, "deleting", lambda s, k: s.delete_range(
      _key_range(k, exact=True)))


def _key_range(key: str, exact: bool = False) -> Any:
  # tensorstore only when files are read or written.
  import tensorstore as ts  # pylint: disable=g-import-not-at-top
  if exact:
    return ts.KvStore.KeyRange(key, key + "\x00")
  return ts.KvStore.KeyRange(key, key[:-1] + chr(ord(key[-1]) + 1)) if key \
      else ts.KvStore.KeyRange()


# --- Directories. On GCS a directory is a key prefix: it exists when some
# object is under it, and creating one is a no-op. ---


def makedirs(path: str) -> None:
  if not is_remote(path):
    os.makedirs(path, exist_ok=True)


def list_files(path: str) -> list[str]:
  """Every file under a directory, as paths relative to it, sorted."""
  if not is_remote(path):
    found = []
    for root, _, files in os.walk(path):
      for name in files:
        found.append(os.path.relpath(os.path.join(root, name), path))
    return sorted(found)
  store = _remote(path, "listing", lambda ctx: _store(path, ctx))
  keys = _remote(path, "listing", lambda _: store.list())
  return sorted(k.decode() for k in keys)


def isdir(path: str) -> bool:
  if not is_remote(path):
    return os.path.isdir(path)
  store = _remote(path, "listing", lambda ctx: _store(path, ctx))
  return bool(_remote(path, "listing", lambda _: store.list()))


def list_dir(path: str) -> list[str]:
  """Names of the entries directly inside a directory."""
  if not is_remote(path):
    return sorted(os.listdir(path)) if os.path.isdir(path) else []
  return sorted({k.split("/")[0] for k in list_files(path)})


def exists(path: str) -> bool:
  if not is_remote(path):
    return os.path.exists(path)
  return read_bytes(path) is not None or isdir(path)


def isfile(path: str) -> bool:
  return os.path.isfile(path) if not is_remote(path) else (
      read_bytes(path) is not None)


def copy_tree(source: str, destination: str) -> int:
  """Copies every file under `source` to `destination` (either may be
  gs://), logging progress; returns the number of bytes copied."""
  names = list_files(source)
  total, start, last_log = 0, time.monotonic(), time.monotonic()
  for i, name in enumerate(names, start=1):
    data = read_bytes(join(source, *name.split("/")))
    write_bytes(join(destination, *name.split("/")), data)
    total += len(data)
    if time.monotonic() - last_log > 10 or i == len(names):
      last_log = time.monotonic()
      logging.info("copied %d/%d files, %.1f MB in %.0f s: %s -> %s", i,
                   len(names), total / 1e6, last_log - start, source,
                   destination)
  return total


def local_copy(path: str) -> str:
  """A local file with the contents of `path` (itself when local).

  For libraries that only open local files (SentencePiece, safetensors):
  a gs:// file is downloaded once into a cache named by its path and
  contents, and reused while both stay the same.
  """
  if not is_remote(path):
    return path
  data = read_bytes(path)
  if data is None:
    raise FileNotFoundError(f"file not found: {path}")
  digest = hashlib.sha256(path.encode() + b"\0" + data).hexdigest()[:16]
  cache = os.path.join(tempfile.gettempdir(), "specdec_jax_remote", digest)
  local = os.path.join(cache, posixpath.basename(path.rstrip("/")))
  if read_bytes(local) != data:
    write_bytes(local, data)
  return local
