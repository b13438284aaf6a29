"""Checkpoints: T5X's on-disk format, our own format, and `load_model`.

`load_model(spec)` understands these specs:

  hf:DIR       Hugging Face T5ForConditionalGeneration (`checkpoints_hf`).
  t5x:PATH     a T5X `checkpoint_<step>` directory (local or gs://). T5X does
               not record the architecture, so `config=` must say it: one of
               our config names, a gin file such as configs/models/x.gin, a
               dict of T5X `T5Config` fields, or a config object.
  DIR          a directory written by `save` (config.json + orbax params).
  demo:NAME    a shipped demo model, `specdec_jax/demo_models/NAME/` (ours).
  NAME         a config name (`registry.NAMES`, e.g. "t5_tiny"): random,
               seeded parameters for tests and benchmarks.

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

Memory. Loading reads, checks, casts and places one tensor at a time: the
leaf is read from tensorstore, cast to the config's `param_dtype`, put on
its devices (sharded with `mesh`, else the default device), and its host
copy dropped before the next is read; orbax directories (ours, newer T5X)
are restored by orbax straight to their devices, a few arrays in flight at
a time. Peak host memory is therefore about the largest single tensor
(twice it while casting), not the model. T5 v1.1 XXL has ~11.1B
parameters: 22 GB as bfloat16, 45 GB as float32 (pass
`param_dtype='bfloat16'` to keep it at 22 GB on the devices); its largest
tensors are the embedding and the output layer, 32128 x 4096 = 132M values
(0.26 GB bf16, 0.53 GB f32), so loading it needs well under 2 GB of host
memory beyond the runtime. Hugging Face checkpoints are read into one host
copy by `checkpoints_hf` and then placed leaf by leaf, dropping each host
array as it goes. `read_t5x` returns host numpy arrays, i.e. the full model
in host memory.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import posixpath
import re
from typing import Any, Callable, Mapping

import flax.serialization
import jax
import jax.numpy as jnp
import numpy as np
import tensorstore as ts

from specdec_jax import checkpoints_hf
from specdec_jax import sharding as sharding_lib
from specdec_jax.checkpoints_hf import CheckpointError
from specdec_jax.checkpoints_hf import CheckpointNotFoundError
from specdec_jax.checkpoints_hf import MissingParameterError
from specdec_jax.checkpoints_hf import ParameterShapeError
from specdec_jax.model import Model
from specdec_jax.models import registry
from specdec_jax.models.gpt import GPTConfig
from specdec_jax.models.t5 import T5Config

T5X_VERSION = 3
T5X_MSGPACK = "checkpoint"
T5X_ORBAX_DIR = "state"
FORMAT = "specdec_jax"
FORMAT_VERSION = 1
CONFIG_FILE = "config.json"
PARAMS_DIR = "params"
VOCAB_FILE = "vocab.model"
DEMO_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                        "demo_models")
SPEC_PREFIXES = ("hf", "t5x", "demo")
# T5X's chunk target; any chunking reads back the same.
_CHUNK_BYTES = 64 * 2**20
_GCS_DUMMY_BUCKET = "t5x-dummy-bucket"
# T5X `T5Config` / decoder-only `TransformerConfig` fields that don't matter
# for inference.
_IGNORED_FIELDS = ("dropout_rate", "float32_attention_logits")
_FAMILIES = (("t5", T5Config), ("gpt", GPTConfig))


class UnexpectedParameterError(CheckpointError):
  """The checkpoint has parameters the config does not."""


class SpecError(ValueError):
  """A `load_model` spec or config that cannot be understood."""


# --- Locations: a local path or gs://bucket/path, read via tensorstore. ---


def _is_gcs(path: str) -> bool:
  return path.startswith("gs://")


def _join(path: str, *names: str) -> str:
  return (posixpath if _is_gcs(path) else os.path).join(path, *names)


def _kvstore(directory: str) -> dict[str, Any]:
  """The tensorstore kvstore spec of a directory."""
  if _is_gcs(directory):
    bucket, _, prefix = directory[len("gs://"):].partition("/")
    prefix = prefix.strip("/")
    return {"driver": "gcs", "bucket": bucket,
            "path": prefix + "/" if prefix else ""}
  return {"driver": "file", "path": os.path.abspath(directory) + "/"}


def _split(path: str) -> tuple[str, str]:
  path = path.rstrip("/")
  return (posixpath if _is_gcs(path) else os.path).split(path)


def _read_bytes(path: str) -> bytes | None:
  """The contents of a file, or None if it does not exist."""
  directory, name = _split(path)
  store = ts.KvStore.open(_kvstore(directory)).result()
  result = store.read(name).result()
  return bytes(result.value) if result.state == "value" else None


def _write_bytes(path: str, data: bytes) -> None:
  directory, name = _split(path)
  ts.KvStore.open(_kvstore(directory)).result().write(name, data).result()


def _isdir(path: str) -> bool:
  if not _is_gcs(path):
    return os.path.isdir(path)
  return bool(ts.KvStore.open(_kvstore(path)).result().list().result())


def _children(path: str) -> list[str]:
  """Names of the entries directly inside a directory."""
  if not _is_gcs(path):
    return sorted(os.listdir(path)) if os.path.isdir(path) else []
  keys = ts.KvStore.open(_kvstore(path)).result().list().result()
  return sorted({k.decode().split("/")[0] for k in keys})


# --- Parameter trees as flat {"a/b/c": leaf} dicts. ---


def _is_ts_spec(x: Any) -> bool:
  return isinstance(x, Mapping) and "driver" in x and (
      "kvstore" in x or "path" in x)


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
  if not isinstance(tree, Mapping) or _is_ts_spec(tree):
    return {prefix: tree}
  flat = {}
  for key, value in tree.items():
    flat.update(_flatten(value, f"{prefix}/{key}" if prefix else str(key)))
  return flat


def _unflatten(flat: Mapping[str, Any]) -> dict[str, Any]:
  tree: dict[str, Any] = {}
  for name, value in flat.items():
    *parents, leaf = name.split("/")
    node = tree
    for key in parents:
      node = node.setdefault(key, {})
    node[leaf] = value
  return tree


@functools.lru_cache(maxsize=32)
def _expected(definition: Any) -> dict[str, jax.ShapeDtypeStruct]:
  """Name -> shape and dtype of every parameter `definition` needs."""
  return _flatten(jax.eval_shape(definition.init_params,
                                 jax.random.PRNGKey(0)))


def _check(found: Mapping[str, tuple[int, ...]], definition: Any,
           where: str) -> dict[str, jax.ShapeDtypeStruct]:
  """Raises unless `found` (name -> shape) is what `definition` needs."""
  expected = _expected(definition)
  missing = sorted(set(expected) - set(found))
  extra = sorted(set(found) - set(expected))
  hint = (f"; does the config match the checkpoint? "
          f"(config: {definition.config})")
  if missing:
    raise MissingParameterError(
        f"{len(missing)} parameter(s) missing from {where}: "
        f"{', '.join(missing[:8])}{' ...' if len(missing) > 8 else ''}{hint}")
  if extra:
    raise UnexpectedParameterError(
        f"{len(extra)} unexpected parameter(s) in {where}: "
        f"{', '.join(extra[:8])}{' ...' if len(extra) > 8 else ''}{hint}")
  for name, want in expected.items():
    if tuple(found[name]) != tuple(want.shape):
      raise ParameterShapeError(
          f"parameter {name} in {where} has shape {tuple(found[name])}, but "
          f"the config expects {tuple(want.shape)}{hint}")
  return expected


# A placement: (dtype to cast to or None, sharding or None for host numpy).
_Placement = tuple[Any, Any]


def _place(value: np.ndarray, placement: _Placement) -> Any:
  dtype, sharding = placement
  if dtype is not None and value.dtype != dtype:
    value = value.astype(dtype)
  if sharding is None:
    return value
  if isinstance(sharding, jax.sharding.NamedSharding):
    return sharding_lib.put(value, sharding)
  return jax.device_put(value, sharding)


@dataclasses.dataclass
class _Stored:
  """Parameters found in a checkpoint, not read yet.

  Attributes:
    where: a description for errors.
    shapes: name -> shape of every parameter.
    load: {name: _Placement} -> {name: array}, reading as it places.
  """

  where: str
  shapes: dict[str, tuple[int, ...]]
  load: Callable[[dict[str, _Placement]], dict[str, Any]]


# --- T5X ---


def _t5x_ts_leaf(ckpt_dir: str, name: str, spec: Mapping[str, Any]):
  """(shape, reader) of a tensorstore-written T5X leaf."""
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
  open_spec = {"driver": spec["driver"],
               "kvstore": _kvstore(_join(ckpt_dir, relative.rstrip("/")))}
  shape = spec.get("metadata", {}).get("shape")
  if shape is None:
    shape = ts.open(open_spec, open=True).result().shape
  return tuple(shape), lambda: ts.open(open_spec, open=True).result().read(
  ).result()


def _open_t5x_msgpack(ckpt_dir: str, data: bytes) -> _Stored:
  where = f"T5X checkpoint {_join(ckpt_dir, T5X_MSGPACK)}"
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
  for name, leaf in _flatten(state["target"]).items():
    if _is_ts_spec(leaf):
      leaves[name] = _t5x_ts_leaf(ckpt_dir, name, leaf)
    else:
      # A copy: writable, and it frees the msgpack buffer it points into.
      value = np.array(leaf)
      leaves[name] = (value.shape, lambda value=value: value)

  def load(placements):
    out = {}
    for name, placement in placements.items():
      # Read, cast and place one leaf; its host copy dies with this frame.
      out[name] = _place(np.asarray(leaves[name][1]()), placement)
    return out

  return _Stored(where, {n: s for n, (s, _) in leaves.items()}, load)


def _orbax_restore_args(dtype, sharding):
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  if sharding is None:
    return ocp.RestoreArgs(restore_type=np.ndarray, dtype=dtype)
  return ocp.ArrayRestoreArgs(sharding=sharding, dtype=dtype)


def _open_orbax(directory: str, prefix: str, where: str) -> _Stored:
  """Parameters under `prefix` ('' for all) of an orbax PyTree checkpoint."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  checkpointer = ocp.PyTreeCheckpointer()
  metadata = checkpointer.metadata(directory)
  tree = getattr(getattr(metadata, "item_metadata", metadata), "tree",
                 metadata)
  if prefix:
    if prefix not in tree:
      raise CheckpointError(f"{where} has no '{prefix}' parameters (keys: "
                            f"{sorted(tree)}); is it a T5X checkpoint?")
    tree = tree[prefix]
  leaves = _flatten(tree)
  shapes = {n: tuple(m.shape) for n, m in leaves.items()}

  def load(placements):
    def wrap(t):
      return {prefix: t} if prefix else t
    item = wrap(_unflatten({
        n: jax.ShapeDtypeStruct(shapes[n], d or leaves[n].dtype)
        for n, (d, _) in placements.items()}))
    args = wrap(_unflatten({n: _orbax_restore_args(*p)
                            for n, p in placements.items()}))
    restored = checkpointer.restore(directory, args=ocp.args.PyTreeRestore(
        item=item, restore_args=args, partial_restore=True))
    return _flatten(restored[prefix] if prefix else restored)

  return _Stored(where, shapes, load)


def _open_t5x(path: str) -> _Stored:
  """Finds the T5X checkpoint at `path` (a checkpoint_<step> dir or file)."""
  path = path.rstrip("/")
  if _split(path)[1] == T5X_MSGPACK and not _isdir(path):
    path = _split(path)[0]
  if _isdir(_join(path, T5X_ORBAX_DIR)):
    state_dir = _join(path, T5X_ORBAX_DIR)
    return _open_orbax(state_dir, "target", f"T5X orbax checkpoint {path}")
  if _read_bytes(_join(path, "_METADATA")) is not None:  # the state dir
    return _open_orbax(path, "target", f"T5X orbax checkpoint {path}")
  data = _read_bytes(_join(path, T5X_MSGPACK))
  if data is not None:
    return _open_t5x_msgpack(path, data)
  if not _isdir(path):
    raise CheckpointNotFoundError(f"T5X checkpoint directory not found: "
                                  f"{path!r}")
  steps = [c for c in _children(path) if re.fullmatch(r"checkpoint_\d+", c)]
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
  stored = _open_t5x(path)
  return _unflatten(stored.load({n: (None, None) for n in stored.shapes}))


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
  relative = name.replace("/", ".")
  kvstore = ({"driver": "gcs", "bucket": _GCS_DUMMY_BUCKET, "path": relative}
             if _is_gcs(ckpt_dir) else {"driver": "file", "path": relative})
  spec = {"driver": "zarr", "dtype": jnp.dtype(value.dtype).name,
          "kvstore": kvstore,
          "metadata": {"compressor": {"id": "gzip"},
                       "shape": list(value.shape),
                       "chunks": _chunk_shape(value.shape,
                                              value.dtype.itemsize)}}
  recorded = ts.Spec(spec).to_json()  # normalised, as T5X records it
  spec = dict(spec, kvstore=_kvstore(_join(ckpt_dir, relative)))
  ts.open(spec, create=True, open=True).result().write(value).result()
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
  ckpt_dir = _join(path, f"checkpoint_{step}")
  if (_read_bytes(_join(ckpt_dir, T5X_MSGPACK)) is not None
      or _isdir(_join(ckpt_dir, T5X_ORBAX_DIR))):
    raise FileExistsError(f"T5X checkpoint {ckpt_dir!r} already exists")
  host = jax.tree.map(np.asarray, params)
  state = {"step": np.int32(step)}
  if param_states is not None:
    state["param_states"] = jax.tree.map(np.asarray, param_states)
  if use_orbax:
    import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
    ocp.PyTreeCheckpointer().save(_join(ckpt_dir, T5X_ORBAX_DIR),
                                  {"target": host, "state": state})
    return ckpt_dir

  def write(tree, prefix):
    return _unflatten({
        name: (value if value.nbytes < inline_below else
               _write_t5x_array(ckpt_dir, f"{prefix}/{name}", value))
        for name, value in _flatten(tree).items()})

  state_dict = {"target": write(host, "target"), "state": dict(state)}
  if param_states is not None:
    state_dict["state"]["param_states"] = write(state["param_states"],
                                                "state/param_states")
  # The msgpack file goes last: its presence marks a complete checkpoint.
  data = flax.serialization.msgpack_serialize(
      {"version": T5X_VERSION, "optimizer": state_dict})
  _write_bytes(_join(ckpt_dir, T5X_MSGPACK), data)
  return ckpt_dir


# --- Our format: config.json + an orbax PyTree checkpoint of the params. ---


def _family(config: Any) -> str:
  for family, cls in _FAMILIES:
    if isinstance(config, cls):
      return family
  raise TypeError(f"not a model config (T5Config or GPTConfig): {config!r}")


def save(model_or_params: Model | Any, directory: str, *, config: Any = None,
         vocab: str | None = None, copy_vocab: bool = True,
         overwrite: bool = False) -> str:
  """Saves parameters in our format.

  The directory holds `config.json` ({"format", "format_version", "family":
  "t5"|"gpt", "config": fields, "vocab": file or null}), the parameters as
  an orbax PyTree checkpoint in `params/`, and optionally `vocab.model`.

  Args:
    model_or_params: a `Model`, or a parameter tree.
    directory: where to write (local or gs://).
    config: the architecture (T5Config/GPTConfig); defaults to the Model's.
    vocab: a SentencePiece model file to record (default: the Model's
      vocabulary file, if it has one).
    copy_vocab: copy `vocab` into the directory (else record its path).
    overwrite: replace an existing checkpoint.

  Returns:
    `directory`.
  """
  params = model_or_params
  if isinstance(model_or_params, Model):
    params = model_or_params.params
    config = config if config is not None else model_or_params.config
    if vocab is None:
      vocab = getattr(model_or_params.vocab, "sentencepiece_model_file", None)
  if config is None:
    raise SpecError("save() needs config= (a T5Config or GPTConfig) when "
                    "given parameters rather than a Model")
  family = _family(config)
  definition = registry.make_def(config)
  _check({n: np.shape(v) for n, v in _flatten(params).items()}, definition,
         "the parameters to save")
  config_path = _join(directory, CONFIG_FILE)
  if _read_bytes(config_path) is not None and not overwrite:
    raise FileExistsError(f"{config_path} exists; pass overwrite=True")
  vocab_entry, vocab_data = vocab, None
  if vocab is not None:
    vocab_data = _read_bytes(vocab)
    if vocab_data is None:
      raise CheckpointNotFoundError(f"vocabulary file not found: {vocab!r}")
    vocab_entry = VOCAB_FILE if copy_vocab else (
        vocab if _is_gcs(vocab) else os.path.abspath(vocab))
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  params_dir = _join(directory, PARAMS_DIR)
  if not _is_gcs(params_dir):
    params_dir = os.path.abspath(params_dir)
  ocp.PyTreeCheckpointer().save(params_dir, params, force=overwrite)
  if not sharding_lib.is_primary():
    return directory
  if vocab_data is not None and copy_vocab:
    _write_bytes(_join(directory, VOCAB_FILE), vocab_data)
  manifest = {"format": FORMAT, "format_version": FORMAT_VERSION,
              "family": family, "config": dataclasses.asdict(config),
              "vocab": vocab_entry}
  # Written last: a directory with config.json is a complete checkpoint.
  _write_bytes(config_path, json.dumps(manifest, indent=2).encode())
  return directory


def _make_vocab(path: str) -> Any:
  """A seqio SentencePiece vocabulary (seqio is imported only here)."""
  import seqio  # pylint: disable=g-import-not-at-top
  return seqio.SentencePieceVocabulary(path)


def _read_manifest(directory: str) -> dict[str, Any]:
  data = _read_bytes(_join(directory, CONFIG_FILE))
  if data is None:
    if not _isdir(directory):
      raise CheckpointNotFoundError(f"checkpoint directory not found: "
                                    f"{directory!r}")
    raise CheckpointNotFoundError(
        f"{directory!r} is not a {FORMAT} checkpoint: it has no {CONFIG_FILE} "
        "(write one with checkpoints.save or scripts/convert_checkpoint.py)")
  manifest = json.loads(data)
  if manifest.get("format") != FORMAT:
    raise CheckpointError(f"{_join(directory, CONFIG_FILE)} is not a {FORMAT} "
                          "config (no \"format\": \"specdec_jax\")")
  if manifest.get("format_version", 0) > FORMAT_VERSION:
    raise CheckpointError(
        f"{directory!r} has format_version {manifest['format_version']}, "
        f"newer than this code's {FORMAT_VERSION}; upgrade specdec_jax")
  return manifest


def restore(directory: str, *, mesh: jax.sharding.Mesh | None = None,
            dtype: str | None = None,
            param_dtype: str | None = None) -> Model:
  """Loads a directory written by `save`.

  Args:
    directory: the checkpoint directory (local or gs://).
    mesh: place the parameters sharded over this mesh; None: default device.
    dtype: override the compute dtype of the stored config.
    param_dtype: override the parameter dtype (cast as they load).

  Returns:
    The `Model` (with its vocabulary when one was saved).
  """
  manifest = _read_manifest(directory)
  config = _config_from_fields(manifest["config"], manifest["family"],
                               f"{_join(directory, CONFIG_FILE)}")
  overrides = {k: v for k, v in [("dtype", dtype),
                                  ("param_dtype", param_dtype)] if v}
  config = dataclasses.replace(config, **overrides)
  definition = registry.make_def(config)
  params_dir = _join(directory, PARAMS_DIR)
  if not _is_gcs(params_dir):
    params_dir = os.path.abspath(params_dir)
  stored = _open_orbax(params_dir, "", f"checkpoint {directory}")
  params = _load_checked(stored, definition, mesh)
  vocab = None
  if manifest.get("vocab"):
    vocab_path = manifest["vocab"]
    if not _is_gcs(vocab_path) and not os.path.isabs(vocab_path):
      vocab_path = _join(directory, vocab_path)
    vocab = _make_vocab(vocab_path)
  return Model(definition, params, vocab)


def _shardings(definition: Any, shapes: dict[str, Any],
               mesh: jax.sharding.Mesh | None) -> dict[str, Any]:
  """Name -> sharding: over `mesh` by the logical axis rules, else the
  default device."""
  if mesh is None:
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    return {name: device for name in shapes}
  return _flatten(sharding_lib.param_shardings(definition, _unflatten(shapes),
                                               mesh))


def _load_checked(stored: _Stored, definition: Any,
                  mesh: jax.sharding.Mesh | None) -> dict[str, Any]:
  """Checks names and shapes, then reads every leaf in place."""
  expected = _check(stored.shapes, definition, stored.where)
  shardings = _shardings(definition, expected, mesh)
  return _unflatten(stored.load(
      {n: (s.dtype, shardings[n]) for n, s in expected.items()}))


# --- Configs for T5X checkpoints. ---


def _config_from_fields(fields: Mapping[str, Any], family: str | None,
                        where: str) -> T5Config | GPTConfig:
  """Our config from T5X-named fields (unknown ones are an error)."""
  fields = {k: v for k, v in fields.items() if k not in _IGNORED_FIELDS}
  if family is None:
    family = ("gpt" if "num_layers" in fields
              and "num_encoder_layers" not in fields else "t5")
  cls = dict(_FAMILIES).get(family)
  if cls is None:
    raise SpecError(f"{where}: unknown model family {family!r}; "
                    f"known: {', '.join(f for f, _ in _FAMILIES)}")
  known = [f.name for f in dataclasses.fields(cls)]
  unknown = sorted(set(fields) - set(known))
  if unknown:
    raise SpecError(f"{where}: unknown {cls.__name__} field(s) {unknown}; "
                    f"known: {', '.join(known + list(_IGNORED_FIELDS))}")
  for key in ("dtype", "param_dtype"):
    if key in fields:  # T5X binds jnp.bfloat16 objects; we keep names
      fields[key] = jnp.dtype(fields[key]).name
  try:
    return cls(**fields)
  except TypeError as e:
    raise SpecError(f"{where}: incomplete {cls.__name__}: {e}") from None


def _config_from_gin(path: str) -> T5Config | GPTConfig:
  """Reads the T5Config/GPTConfig bindings of a gin file (no global state)."""
  from gin import config_parser  # pylint: disable=g-import-not-at-top

  @dataclasses.dataclass(frozen=True)
  class Macro:
    name: str

  @dataclasses.dataclass(frozen=True)
  class Reference:
    name: str

  class Delegate(config_parser.ParserDelegate):
    def configurable_reference(self, scoped_configurable_name, evaluate):
      return Reference(scoped_configurable_name)

    def macro(self, macro_name):
      return Macro(macro_name)

  macros, bound = {}, {}
  with open(path) as f:
    for statement in config_parser.ConfigParser(f, Delegate()):
      if isinstance(statement, config_parser.IncludeStatement):
        raise SpecError(f"{path}: includes are not followed; bind every "
                        "config field in the one file")
      if not isinstance(statement, config_parser.BindingStatement):
        continue
      if not statement.arg_name:
        macros[statement.selector] = statement.value
        continue
      cls_name = statement.selector.rsplit(".", 1)[-1]
      if cls_name in ("T5Config", "GPTConfig", "TransformerConfig"):
        key = (statement.scope, statement.selector)
        bound.setdefault(key, {})[statement.arg_name] = statement.value
  if len(bound) != 1:
    found = [f"{s}/{c}" if s else c for s, c in bound] or "none"
    raise SpecError(f"{path}: expected the bindings of exactly one T5Config "
                    f"or GPTConfig, found {found}")
  (_, selector), fields = next(iter(bound.items()))

  def resolve(value):
    if isinstance(value, Macro):
      if value.name not in macros:
        raise SpecError(f"{path}: macro %{value.name} is not defined there")
      return resolve(macros[value.name])
    if isinstance(value, Reference):
      raise SpecError(f"{path}: config fields must be plain values, not "
                      f"@{value.name}")
    if isinstance(value, (tuple, list)):
      return type(value)(resolve(v) for v in value)
    return value

  family = "t5" if selector.endswith("T5Config") else "gpt"
  return _config_from_fields({k: resolve(v) for k, v in fields.items()},
                             family, path)


def resolve_config(config: Any) -> T5Config | GPTConfig:
  """A model config from a name, a gin file, a dict of fields or a config.

  Args:
    config: a `registry.NAMES` entry ("t5_1_1_xxl"), a path to a gin file
      binding one T5Config/GPTConfig (configs/models/*.gin), a dict of
      T5X `T5Config` fields (vocab_size, emb_dim, num_heads,
      num_encoder_layers, num_decoder_layers, head_dim, mlp_dim,
      mlp_activations, logits_via_embedding, dtype; dropout_rate and
      float32_attention_logits are ignored; `num_layers` instead of the two
      depths means decoder-only; fields not given take our defaults), or a
      T5Config/GPTConfig.

  Returns:
    A T5Config or GPTConfig.
  """
  if isinstance(config, (T5Config, GPTConfig)):
    return config
  if isinstance(config, Mapping):
    return _config_from_fields(dict(config), None, "config dict")
  if isinstance(config, str):
    if config.endswith(".gin") or os.path.isfile(config):
      if not os.path.isfile(config):
        raise CheckpointNotFoundError(f"gin config file not found: {config!r}")
      return _config_from_gin(config)
    return registry.get_config(config)  # raises naming the known configs
  raise SpecError(f"config must be a config name, gin file, dict or "
                  f"T5Config/GPTConfig, got {type(config).__name__}")


# --- load_model ---


def _parse_spec(spec: str) -> tuple[str, str]:
  """(kind, rest) with kind in SPEC_PREFIXES, 'ours' or 'random'."""
  match = re.fullmatch(r"([A-Za-z][\w.+-]*):(?!//)(.*)", spec, re.DOTALL)
  if match:
    prefix, rest = match.groups()
    if prefix not in SPEC_PREFIXES:
      raise SpecError(
          f"unknown spec prefix {prefix + ':'!r} in {spec!r}; use hf:DIR, "
          "t5x:PATH, demo:NAME, a directory written by checkpoints.save, or "
          f"a config name ({', '.join(registry.NAMES)})")
    if not rest:
      raise SpecError(f"empty path after {prefix + ':'!r} in spec {spec!r}")
    return prefix, rest
  if spec in registry.NAMES:
    return "random", spec
  if _isdir(spec):
    return "ours", spec
  if _is_gcs(spec) or "/" in spec or os.sep in spec or spec.startswith("."):
    raise CheckpointNotFoundError(f"checkpoint directory not found: {spec!r}")
  raise SpecError(
      f"unknown config name {spec!r} (and no such directory); known config "
      f"names: {', '.join(registry.NAMES)}")


def _to_devices(params: dict[str, Any], definition: Any,
                mesh: jax.sharding.Mesh | None) -> dict[str, Any]:
  """Moves host leaves to devices in place, so each host copy dies at once."""
  for name, sharding in _shardings(definition, _flatten(params), mesh).items():
    *parents, leaf = name.split("/")
    node = params
    for key in parents:
      node = node[key]
    node[leaf] = _place(node[leaf], (None, sharding))
  return params


def load_model(spec: str, *, config: Any = None,
               mesh: jax.sharding.Mesh | None = None,
               dtype: str | None = None, param_dtype: str | None = None,
               seed: int = 0) -> Model:
  """Loads (or randomly initialises) a model; see the module docstring.

  Args:
    spec: "hf:DIR", "t5x:PATH", "demo:NAME", a directory written by `save`,
      or a config name (random parameters).
    config: for "t5x:" only, and required there: the architecture, in any
      form `resolve_config` accepts.
    mesh: place the parameters sharded over this mesh (leaf by leaf);
      None: on the default device.
    dtype: compute dtype override, e.g. "bfloat16".
    param_dtype: parameter dtype override (parameters are cast to it as
      they load), e.g. "bfloat16" to hold T5 XXL in 22 GB.
    seed: PRNG seed of random initialisation.

  Returns:
    A `Model`.

  Raises:
    SpecError: unknown prefix or config name, config missing or misplaced.
    CheckpointNotFoundError: missing file or directory.
    MissingParameterError, UnexpectedParameterError, ParameterShapeError:
      the checkpoint does not fit the config.
  """
  kind, rest = _parse_spec(os.fspath(spec))
  if kind == "t5x" and config is None:
    raise SpecError(
        f"{spec!r}: T5X checkpoints do not record their architecture; pass "
        "config= (a config name such as 't5_1_1_xxl', a gin file under "
        "configs/models, or a dict of T5X T5Config fields)")
  if kind != "t5x" and config is not None:
    raise SpecError(f"config= is only used with t5x: specs; {spec!r} "
                    "determines its own architecture")
  overrides = {k: v for k, v in [("dtype", dtype),
                                  ("param_dtype", param_dtype)] if v}
  if kind == "random":
    model_config = registry.get_config(rest, **overrides)
    definition = registry.make_def(model_config)
    init = definition.init_params
    if mesh is not None:
      shardings = _shardings(definition, _expected(definition), mesh)
      init = jax.jit(init, out_shardings=_unflatten(shardings))
    return Model(definition, init(jax.random.PRNGKey(seed)))
  if kind == "t5x":
    model_config = dataclasses.replace(resolve_config(config), **overrides)
    definition = registry.make_def(model_config)
    return Model(definition, _load_checked(_open_t5x(rest), definition, mesh))
  if kind == "hf":
    model_config, params = checkpoints_hf.load_t5(rest, **overrides)
    definition = registry.make_def(model_config)
    return Model(definition, _to_devices(params, definition, mesh))
  if kind == "demo":
    directory = os.path.join(DEMO_DIR, rest)
    if not os.path.isfile(os.path.join(directory, CONFIG_FILE)):
      shipped = sorted(_children(DEMO_DIR)) if os.path.isdir(DEMO_DIR) else []
      raise CheckpointNotFoundError(
          f"demo model {rest!r} is not shipped: no {directory}/{CONFIG_FILE}; "
          f"shipped: {', '.join(shipped) or 'none'}")
    return restore(directory, mesh=mesh, **overrides)
  return restore(rest, mesh=mesh, **overrides)


def convert(spec: str, output: str, *, config: Any = None,
            param_dtype: str | None = None, vocab: str | None = None,
            overwrite: bool = False) -> str:
  """Loads `spec` (see `load_model`) and saves it in our format at `output`.

  The parameters pass through the default device (host memory on a CPU
  machine): about 22 GB for T5 XXL with param_dtype="bfloat16".

  Returns:
    `output`.
  """
  model = load_model(spec, config=config, param_dtype=param_dtype)
  return save(model, output, vocab=vocab, overwrite=overwrite)
