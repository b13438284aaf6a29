"""T5X checkpoints: reading and writing T5X's on-disk format.

T5X layout (checked against google-research/t5x t5x/checkpoints.py,
checkpoints_utils.py, checkpoint_utils.py and train_state.py):

  checkpoint_<step>/checkpoint   msgpack (flax.serialization) of
      {'version': 3, 'optimizer': {'target': params,
                                   'state': {'step': int32, 'param_states'}}}
      (version 0 files hold the state dict itself, without 'optimizer').
      A leaf is either the array itself (flax's ndarray extension: what T5X
      writes for unpartitioned leaves) or the JSON of a tensorstore spec
      {'driver': 'zarr', 'dtype', 'kvstore': {'driver': 'file'|'gcs',
      'path': 'target.encoder.layers_0.attention.query.kernel'},
      'metadata': {'chunks', 'compressor': {'id': 'gzip'}, 'shape'}}
      whose path is relative to the checkpoint directory (older tensorstore
      put it in a top-level 'path'; the gcs bucket is a dummy).
  checkpoint_<step>/target.<name with / as .>/   one zarr v2 array.
  checkpoint_<step>/state/   newer T5X: an orbax PyTree checkpoint of
      {'target': params, 'state': {...}} (no 'optimizer', no 'version').
Version 3 stores bfloat16 natively; version 2 stored it as uint16, which
T5X itself refuses to read, and so do we.

Files are read and written through tensorstore (local paths and gs://), and
the orbax layouts through orbax; both are imported inside the functions that
need them, so importing this module needs only jax, flax and numpy. The
storage helpers it reads with (paths, flat parameter trees, orbax) live in
`storage`, which our own format shares.
"""

from __future__ import annotations

import os
import re
import tempfile
from typing import Any, Mapping

import flax.serialization
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.infra import paths
from specdec_jax.checkpoints.errors import CheckpointError
from specdec_jax.checkpoints.errors import CheckpointNotFoundError
from specdec_jax.checkpoints.storage import StoredParams
from specdec_jax.checkpoints.storage import flatten_tree
from specdec_jax.checkpoints.storage import is_tensorstore_spec
from specdec_jax.checkpoints.storage import is_gcs
from specdec_jax.checkpoints.storage import isdir
from specdec_jax.checkpoints.storage import join_path
from specdec_jax.checkpoints.storage import kvstore_spec
from specdec_jax.checkpoints.storage import list_dir
from specdec_jax.checkpoints.storage import open_orbax
from specdec_jax.checkpoints.storage import place_read
from specdec_jax.checkpoints.storage import progress
from specdec_jax.checkpoints.storage import read_bytes
from specdec_jax.checkpoints.storage import split_path
from specdec_jax.checkpoints.storage import unflatten_tree
from specdec_jax.checkpoints.storage import write_bytes

T5X_VERSION = 3
T5X_MSGPACK = "checkpoint"
T5X_ORBAX_DIR = "state"
# T5X's chunk target; any chunking reads back the same.
_CHUNK_BYTES = 64 * 2**20
_GCS_DUMMY_BUCKET = "t5x-dummy-bucket"


# --- T5X ---


def _t5x_ts_leaf(ckpt_dir: str, name: str, spec: Mapping[str, Any]):
  """(shape, reader) of a tensorstore-written T5X leaf."""
  # tensorstore only when files are read or written.
  import tensorstore as ts  # pylint: disable=g-import-not-at-top
  relative = spec.get("kvstore", {}).get("path") or spec.get("path")
  if not relative:
    raise CheckpointError(f"{name}: tensorstore spec without a path: {spec}")
  dtype = spec.get("dtype") or spec.get("metadata", {}).get("dtype")
  if dtype in ("uint16", "<u2"):
    raise CheckpointError(
        f"{name} in {ckpt_dir} is stored as uint16 (a T5X version-2 "
        "bfloat16); re-save it with a current T5X, which stores bfloat16")
  # Wherever it was written (file, gfile, gcs with a dummy bucket), the
  # array now lives next to the msgpack file.
  array_dir = join_path(ckpt_dir, relative.rstrip("/"))
  open_spec = {"driver": spec["driver"], "kvstore": kvstore_spec(array_dir)}
  shape = spec.get("metadata", {}).get("shape")
  if shape is None:
    shape = ts.open(open_spec, open=True).result().shape
  # Read by index domain: a host reads only the slices its devices hold.
  return tuple(shape), lambda index: ts.open(open_spec, open=True).result()[
      index].read().result()


def _open_t5x_msgpack(ckpt_dir: str, data: bytes) -> StoredParams:
  where = f"T5X checkpoint {join_path(ckpt_dir, T5X_MSGPACK)}"
  try:
    contents = flax.serialization.msgpack_restore(data)
  except Exception as e:  # msgpack raises several unrelated types
    raise CheckpointError(f"{where} is not a T5X msgpack file: {e}") from None
  state = contents.get("optimizer", contents)
  if not isinstance(state, Mapping) or "target" not in state:
    raise CheckpointError(
        f"{where} has no 'target' parameters (top-level keys: "
        f"{sorted(contents)}); is it a T5X checkpoint?")
  leaves = {}
  for name, leaf in flatten_tree(state["target"]).items():
    if is_tensorstore_spec(leaf):
      leaves[name] = _t5x_ts_leaf(ckpt_dir, name, leaf)
    else:
      # A copy: writable, and it frees the msgpack buffer it points into.
      value = np.array(leaf)
      leaves[name] = (value.shape, lambda index, value=value: value[index])

  def load(placements):
    out = {}
    tick = progress(where, len(placements))
    for name, placement in placements.items():
      # Read, cast and place one leaf; its host copy dies with this frame.
      out[name] = place_read(*leaves[name], placement)
      tick()
    return out

  return StoredParams(where, {n: s for n, (s, _) in leaves.items()}, load)


def open_t5x(path: str) -> StoredParams:
  """Finds the T5X checkpoint at `path` (a checkpoint_<step> dir or file)."""
  path = path.rstrip("/")
  if split_path(path)[1] == T5X_MSGPACK and not isdir(path):
    path = split_path(path)[0]
  if isdir(join_path(path, T5X_ORBAX_DIR)):
    state_dir = join_path(path, T5X_ORBAX_DIR)
    return open_orbax(state_dir, "target", f"T5X orbax checkpoint {path}")
  if read_bytes(join_path(path, "_METADATA")) is not None:  # the state dir
    return open_orbax(path, "target", f"T5X orbax checkpoint {path}")
  data = read_bytes(join_path(path, T5X_MSGPACK))
  if data is not None:
    return _open_t5x_msgpack(path, data)
  if not isdir(path):
    raise CheckpointNotFoundError(f"T5X checkpoint directory not found: "
                                  f"{path!r}")
  steps = [c for c in list_dir(path) if re.fullmatch(r"checkpoint_\d+", c)]
  hint = (f"; it holds {', '.join(steps)}: pass one of those directories"
          if steps else "")
  raise CheckpointNotFoundError(
      f"no T5X checkpoint in {path!r}: expected a msgpack file "
      f"'{T5X_MSGPACK}' or an orbax '{T5X_ORBAX_DIR}/' directory{hint}")


def read_t5x(path: str) -> dict[str, Any]:
  """Reads the parameters (`target`) of a T5X checkpoint.

  Args:
    path: a `checkpoint_<step>` directory (local or gs://), or its msgpack
      `checkpoint` file. Optimizer states are not read.

  Returns:
    The parameter tree (nested dicts of numpy arrays, stored dtypes), with
    T5X's names, e.g. params['encoder']['layers_0']['attention']['query'].

  Raises:
    CheckpointNotFoundError: no checkpoint at `path`.
    CheckpointError: a file that is not a T5X checkpoint.
  """
  stored = open_t5x(path)
  return unflatten_tree(stored.load({n: (None, None) for n in stored.shapes}))


def _chunk_shape(shape: tuple[int, ...], itemsize: int) -> list[int]:
  """Chunks dividing `shape`, at most _CHUNK_BYTES, largest dims split first."""
  chunks = [max(int(d), 1) for d in shape]
  while chunks and int(np.prod(chunks)) * itemsize > _CHUNK_BYTES:
    i = int(np.argmax(chunks))
    size = chunks[i]
    smallest_factor = next(f for f in range(2, size + 1) if size % f == 0)
    chunks[i] = size // smallest_factor
  return chunks


def _write_t5x_array(ckpt_dir: str, name: str, value: np.ndarray) -> dict:
  """Writes one zarr array as T5X does; returns the spec for the msgpack."""
  # tensorstore only when files are read or written.
  import tensorstore as ts  # pylint: disable=g-import-not-at-top
  relative = name.replace("/", ".")
  kvstore = ({"driver": "gcs", "bucket": _GCS_DUMMY_BUCKET, "path": relative}
             if is_gcs(ckpt_dir) else {"driver": "file", "path": relative})
  spec = {"driver": "zarr", "dtype": jnp.dtype(value.dtype).name,
          "kvstore": kvstore,
          "metadata": {"compressor": {"id": "gzip"},
                       "shape": list(value.shape),
                       "chunks": _chunk_shape(value.shape,
                                              value.dtype.itemsize)}}
  recorded = ts.Spec(spec).to_json()  # normalised, as T5X records it
  spec = dict(spec, kvstore=kvstore_spec(join_path(ckpt_dir, relative)))
  path = join_path(ckpt_dir, relative)
  array = paths.bounded(path, "creating", lambda context: ts.open(
      spec, create=True, open=True, context=context))
  paths.bounded(path, "writing", lambda _: array.write(value), value.nbytes)
  return recorded


def write_t5x(params: Any, path: str, step: int, *, inline_below: int = 0,
              param_states: Any = None, use_orbax: bool = False) -> str:
  """Writes `params` as a T5X checkpoint, `path/checkpoint_<step>`.

  Args:
    params: parameter tree (numpy or jax arrays) with T5X's names.
    path: the model directory holding `checkpoint_<step>` (local or gs://).
    step: the training step.
    inline_below: arrays smaller than this many bytes go into the msgpack
      file itself (as T5X does for unpartitioned leaves); the others go to
      tensorstore. 0: all to tensorstore (a partitioned T5X run).
    param_states: optional optimizer state tree, stored as T5X stores it
      under state/param_states (readers must skip it).
    use_orbax: write newer T5X's orbax layout (`state/`) instead.

  Returns:
    The checkpoint directory.
  """
  ckpt_dir = join_path(path, f"checkpoint_{step}")
  if (read_bytes(join_path(ckpt_dir, T5X_MSGPACK)) is not None
      or isdir(join_path(ckpt_dir, T5X_ORBAX_DIR))):
    raise FileExistsError(f"T5X checkpoint {ckpt_dir!r} already exists")
  host = jax.tree.map(np.asarray, params)
  state = {"step": np.int32(step)}
  if param_states is not None:
    state["param_states"] = jax.tree.map(np.asarray, param_states)
  if use_orbax:
    # orbax is slow to import: only when a checkpoint is read or written.
    import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
    tree = {"target": host, "state": state}
    if not is_gcs(ckpt_dir):
      ocp.PyTreeCheckpointer().save(join_path(ckpt_dir, T5X_ORBAX_DIR), tree)
      return ckpt_dir
    # orbax's gs:// client is not ours: write locally, upload through paths.
    with tempfile.TemporaryDirectory(prefix="specdec_jax_t5x.") as local:
      ocp.PyTreeCheckpointer().save(os.path.join(local, T5X_ORBAX_DIR), tree)
      paths.copy_tree(os.path.join(local, T5X_ORBAX_DIR),
                      join_path(ckpt_dir, T5X_ORBAX_DIR))
    return ckpt_dir

  def write(tree, prefix):
    return unflatten_tree({
        name: (value if value.nbytes < inline_below else
               _write_t5x_array(ckpt_dir, f"{prefix}/{name}", value))
        for name, value in flatten_tree(tree).items()})

  state_dict = {"target": write(host, "target"), "state": dict(state)}
  if param_states is not None:
    state_dict["state"]["param_states"] = write(state["param_states"],
                                                "state/param_states")
  # The msgpack file goes last: its presence marks a complete checkpoint.
  data = flax.serialization.msgpack_serialize(
      {"version": T5X_VERSION, "optimizer": state_dict})
  write_bytes(join_path(ckpt_dir, T5X_MSGPACK), data)
  return ckpt_dir
