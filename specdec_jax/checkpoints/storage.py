"""Where checkpoints live and how their parameters are read, leaf by leaf.

The storage layer every checkpoint format here shares: paths that are local
or gs:// (read and written through tensorstore), parameter trees as flat
{"a/b/c": leaf} dicts, `StoredParams` (shapes known, arrays read only when
placed) and the orbax PyTree reader that our format and newer T5X
checkpoints both use. tensorstore and orbax are imported inside the
functions that need them, so importing this module needs only jax, flax and
numpy.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import posixpath
import time
from typing import Any, Callable, Mapping

import jax
import numpy as np

from specdec_jax import multihost
from specdec_jax import sharding as sharding_lib
from specdec_jax.checkpoints.errors import CheckpointError
from specdec_jax.checkpoints.errors import CheckpointNotFoundError


# --- Locations: a local path or gs://bucket/path, read via tensorstore. ---


def is_gcs(path: str) -> bool:
  return path.startswith("gs://")


def join_path(path: str, *names: str) -> str:
  return (posixpath if is_gcs(path) else os.path).join(path, *names)


def kvstore_spec(directory: str) -> dict[str, Any]:
  """The tensorstore kvstore spec of a directory."""
  if is_gcs(directory):
    bucket, _, prefix = directory[len("gs://"):].partition("/")
    prefix = prefix.strip("/")
    return {"driver": "gcs", "bucket": bucket,
            "path": prefix + "/" if prefix else ""}
  return {"driver": "file", "path": os.path.abspath(directory) + "/"}


def split_path(path: str) -> tuple[str, str]:
  path = path.rstrip("/")
  return (posixpath if is_gcs(path) else os.path).split(path)


def read_bytes(path: str) -> bytes | None:
  """The contents of a file, or None if it does not exist."""
  directory, name = split_path(path)
  # tensorstore only when files are read or written.
  import tensorstore as ts  # pylint: disable=g-import-not-at-top
  store = ts.KvStore.open(kvstore_spec(directory)).result()
  result = store.read(name).result()
  return bytes(result.value) if result.state == "value" else None


def write_bytes(path: str, data: bytes) -> None:
  directory, name = split_path(path)
  # tensorstore only when files are read or written.
  import tensorstore as ts  # pylint: disable=g-import-not-at-top
  ts.KvStore.open(kvstore_spec(directory)).result().write(name, data).result()


def isdir(path: str) -> bool:
  if not is_gcs(path):
    return os.path.isdir(path)
  # tensorstore only when files are read or written.
  import tensorstore as ts  # pylint: disable=g-import-not-at-top
  return bool(ts.KvStore.open(kvstore_spec(path)).result().list().result())


def list_dir(path: str) -> list[str]:
  """Names of the entries directly inside a directory."""
  if not is_gcs(path):
    return sorted(os.listdir(path)) if os.path.isdir(path) else []
  # tensorstore only when files are read or written.
  import tensorstore as ts  # pylint: disable=g-import-not-at-top
  keys = ts.KvStore.open(kvstore_spec(path)).result().list().result()
  return sorted({k.decode().split("/")[0] for k in keys})


# --- Parameter trees as flat {"a/b/c": leaf} dicts. ---


def is_tensorstore_spec(x: Any) -> bool:
  return isinstance(x, Mapping) and "driver" in x and (
      "kvstore" in x or "path" in x)


def flatten_tree(tree: Any, prefix: str = "") -> dict[str, Any]:
  if not isinstance(tree, Mapping) or is_tensorstore_spec(tree):
    return {prefix: tree}
  flat = {}
  for key, value in tree.items():
    flat.update(flatten_tree(value, f"{prefix}/{key}" if prefix else str(key)))
  return flat


def unflatten_tree(flat: Mapping[str, Any]) -> dict[str, Any]:
  tree: dict[str, Any] = {}
  for name, value in flat.items():
    *parents, leaf = name.split("/")
    node = tree
    for key in parents:
      node = node.setdefault(key, {})
    node[leaf] = value
  return tree


# --- Stored parameters, read and placed one leaf at a time. ---


# A placement: (dtype to cast to or None, sharding or None for host numpy).
_Placement = tuple[Any, Any]


def place_leaf(value: np.ndarray, placement: _Placement) -> Any:
  dtype, sharding = placement
  if dtype is not None and value.dtype != dtype:
    value = value.astype(dtype)
  if sharding is None:
    return value
  if isinstance(sharding, jax.sharding.NamedSharding):
    return sharding_lib.put(value, sharding)
  return jax.device_put(value, sharding)


def place_read(shape: tuple[int, ...], read: Callable[[tuple], Any],
               placement: _Placement) -> Any:
  """Reads and places one leaf; `read(index)` reads the slices `index`.

  With a NamedSharding only the index ranges of this process's own devices
  are read, each distinct range once: on a slice of several hosts every
  byte of a sharded checkpoint leaves the bucket about once, not once per
  host. Without one the whole leaf is read.
  """
  dtype, sharding = placement
  if not isinstance(sharding, jax.sharding.NamedSharding):
    return place_leaf(np.asarray(read(())), placement)
  shards = {}

  def shard(index):
    key = tuple((s.start, s.stop, s.step) for s in index)
    if key not in shards:
      value = np.asarray(read(tuple(index)))
      if dtype is not None and value.dtype != dtype:
        value = value.astype(dtype)
      shards[key] = value
    return shards[key]

  return jax.make_array_from_callback(tuple(shape), sharding, shard)


def progress(where: str, total: int,
             every_s: float = 30.0) -> Callable[[], None]:
  """A counter to call once per leaf read: process 0 logs how far it got
  every `every_s` seconds and at the end (XXL takes minutes to read)."""
  start = last = time.perf_counter()
  done = 0

  def tick():
    nonlocal done, last
    done += 1
    now = time.perf_counter()
    if multihost.is_primary() and (now - last >= every_s or done == total):
      logging.getLogger(__name__).info(
          "%s: %d of %d tensors read (%.0f s)", where, done, total,
          now - start)
      last = now

  return tick


@dataclasses.dataclass
class StoredParams:
  """Parameters found in a checkpoint, not read yet.

  Attributes:
    where: a description for errors.
    shapes: name -> shape of every parameter.
    load: {name: _Placement} -> {name: array}, reading as it places.
  """

  where: str
  shapes: dict[str, tuple[int, ...]]
  load: Callable[[dict[str, _Placement]], dict[str, Any]]


def _orbax_restore_args(dtype, sharding):
  # orbax is slow to import: only when a checkpoint is read or written.
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  if sharding is None:
    return ocp.RestoreArgs(restore_type=np.ndarray, dtype=dtype)
  return ocp.ArrayRestoreArgs(sharding=sharding, dtype=dtype)


@contextlib.contextmanager
def _damaged_orbax_named(directory: str, where: str):
  """orbax/tensorstore errors (bare `Exception`s, deep tracebacks) as one
  CheckpointError naming the directory and the fix."""
  try:
    yield
  except CheckpointError:
    raise
  except FileNotFoundError as e:
    raise CheckpointNotFoundError(
        f"{where}: parameter files missing under {directory} ({e}): copy "
        "the whole checkpoint directory again, or re-save it.") from None
  except Exception as e:  # pylint: disable=broad-except  (orbax, tensorstore)
    first = (str(e).strip().splitlines() or [""])[0].split(" See full")[0][:300]
    raise CheckpointError(
        f"{where}: the parameter files under {directory} are damaged or "
        f"incomplete ({type(e).__name__}: {first}): copy the checkpoint "
        "again, or re-save / re-convert it.") from None


def open_orbax(directory: str, prefix: str, where: str) -> StoredParams:
  """Parameters under `prefix` ('' for all) of an orbax PyTree checkpoint."""
  # orbax is slow to import: only when a checkpoint is read or written.
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  checkpointer = ocp.PyTreeCheckpointer()
  with _damaged_orbax_named(directory, where):
    metadata = checkpointer.metadata(directory)
  tree = getattr(getattr(metadata, "item_metadata", metadata), "tree",
                 metadata)
  if prefix:
    if prefix not in tree:
      raise CheckpointError(f"{where} has no '{prefix}' parameters (keys: "
                            f"{sorted(tree)}); is it a T5X checkpoint?")
    tree = tree[prefix]
  leaves = flatten_tree(tree)
  shapes = {n: tuple(m.shape) for n, m in leaves.items()}

  def load(placements):
    def wrap(t):
      return {prefix: t} if prefix else t
    item = wrap(unflatten_tree({
        n: jax.ShapeDtypeStruct(shapes[n], d or leaves[n].dtype)
        for n, (d, _) in placements.items()}))
    args = wrap(unflatten_tree({n: _orbax_restore_args(*p)
                                for n, p in placements.items()}))
    if multihost.is_primary():
      logging.getLogger(__name__).info("%s: reading %d tensors", where,
                                       len(placements))
    with _damaged_orbax_named(directory, where):
      restored = checkpointer.restore(directory, args=ocp.args.PyTreeRestore(
          item=item, restore_args=args, partial_restore=True))
    return flatten_tree(restored[prefix] if prefix else restored)

  return StoredParams(where, shapes, load)
