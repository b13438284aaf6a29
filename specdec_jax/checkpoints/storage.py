"""Where checkpoints live and how their parameters are read, leaf by leaf.

What every checkpoint format here shares: paths that are local or gs://
(through `specdec_jax.infra.paths`, the one I/O layer), parameter trees as flat
{"a/b/c": leaf} dicts, `StoredParams` (shapes known, arrays read only when
placed) and the orbax PyTree reader that our format and newer T5X
checkpoints both use. tensorstore and orbax are imported inside the
functions that need them, so importing this module needs only jax, flax and
numpy.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import time
from typing import Any, Callable, Mapping

import jax
import numpy as np

from specdec_jax.infra import multihost
from specdec_jax.infra import paths
from specdec_jax import sharding as sharding_lib
# Paths (local or gs://) live in the one I/O layer, `specdec_jax.infra.paths`;
# re-exported here for the checkpoint formats.
from specdec_jax.infra.paths import is_gcs  # pylint: disable=unused-import
from specdec_jax.infra.paths import isdir  # pylint: disable=unused-import
from specdec_jax.infra.paths import join_path  # pylint: disable=unused-import
from specdec_jax.infra.paths import kvstore_spec  # pylint: disable=unused-import
from specdec_jax.infra.paths import list_dir  # pylint: disable=unused-import
from specdec_jax.infra.paths import read_bytes  # pylint: disable=unused-import
from specdec_jax.infra.paths import split_path  # pylint: disable=unused-import
from specdec_jax.infra.paths import write_bytes  # pylint: disable=unused-import
from specdec_jax.checkpoints.errors import CheckpointError
from specdec_jax.checkpoints.errors import CheckpointNotFoundError


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
    answer = paths.server_answer(e) if paths.is_remote(directory) else None
    if answer:
      # The server's answer, not the files: nothing here says they are bad.
      raise paths.RemoteStorageError(
          f"{where}: reading {directory} from the storage server at "
          f"{paths.endpoint()} failed: {answer} ({type(e).__name__}: "
          f"{first}). The files were not found damaged. Fix: read from "
          "Cloud Storage itself; for a local dry run use the project's "
          "emulator, which answers as Cloud Storage does (`python "
          "scripts/gcs_emulator.py start --port 9023 --in-memory`, "
          "docs/storage.md).") from None
    raise CheckpointError(
        f"{where}: the parameter files under {directory} are damaged or "
        f"incomplete ({type(e).__name__}: {first}): copy the checkpoint "
        "again, or re-save / re-convert it.") from None


def _orbax_leaves_remote(directory: str, prefix: str,
                         where: str) -> dict[str, dict[str, Any]]:
  """name -> tensorstore spec of each leaf of an orbax checkpoint on gs://.

  orbax finds files through etils.epath, whose gs:// backend (tf.io.gfile)
  has its own client that ignores our endpoint, retries and timeouts; the
  arrays themselves are zarr arrays under a kvstore (OCDBT, orbax's default,
  or one directory per leaf in older checkpoints), which tensorstore opens
  through the same gs:// client as every other path.
  """
  metadata = read_bytes(join_path(directory, "_METADATA"))
  if metadata is None:
    raise CheckpointNotFoundError(
        f"{where}: no orbax checkpoint under {directory} (no _METADATA): "
        "copy the whole checkpoint directory, or re-save it.")
  base = kvstore_spec(directory)
  if read_bytes(join_path(directory, "manifest.ocdbt")) is not None:
    def kvstore(name):
      return {"driver": "ocdbt", "base": base, "path": name + "/"}
  else:
    def kvstore(name):
      return dict(base, path=base["path"] + name + "/")
  leaves = {}
  for entry in json.loads(metadata)["tree_metadata"].values():
    keys = [str(k["key"]) for k in entry["key_metadata"]]
    if prefix and keys[0] != prefix:
      continue
    name = "/".join(keys[1:] if prefix else keys)
    leaves[name] = {"driver": "zarr", "kvstore": kvstore(".".join(keys))}
  if prefix and not leaves:
    raise CheckpointError(f"{where} has no '{prefix}' parameters; is it a "
                          "T5X checkpoint?")
  return leaves


def _open_orbax_remote(directory: str, prefix: str,
                       where: str) -> StoredParams:
  # tensorstore only when files are read or written.
  import tensorstore as ts  # pylint: disable=g-import-not-at-top
  specs = _orbax_leaves_remote(directory, prefix, where)
  with _damaged_orbax_named(directory, where):
    arrays = {n: ts.open(s, open=True).result() for n, s in specs.items()}
  shapes = {n: tuple(a.shape) for n, a in arrays.items()}

  def load(placements):
    out = {}
    with _damaged_orbax_named(directory, where):
      for name, (dtype, sharding) in placements.items():
        array = arrays[name]
        if isinstance(sharding, jax.sharding.NamedSharding):
          # Each process reads only the blocks its own devices hold.
          def block(index, array=array, dtype=dtype):
            value = array[index].read().result()
            return value.astype(dtype) if dtype is not None else value
          out[name] = jax.make_array_from_callback(
              shapes[name], sharding, block)
        else:
          out[name] = place_leaf(array.read().result(), (dtype, sharding))
    return out

  return StoredParams(where, shapes, load)


def open_orbax(directory: str, prefix: str, where: str) -> StoredParams:
  """Parameters under `prefix` ('' for all) of an orbax PyTree checkpoint."""
  if is_gcs(directory):
    return _open_orbax_remote(directory, prefix, where)
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
