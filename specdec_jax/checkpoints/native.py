"""Checkpoints: T5X's on-disk format, our own format, and `load_model`.

`load_model(spec)` understands these specs:

  hf:DIR       Hugging Face T5ForConditionalGeneration (`checkpoints.hf`),
               T5GemmaForConditionalGeneration (`checkpoints.hf_t5gemma`),
               Gemma 3 (`checkpoints.hf_gemma3`: gemma3_text, and the text
               model of gemma3) or the text model of T5Gemma 2
               (`checkpoints.hf_t5gemma2`), or the Llama layout (Llama 3,
               Qwen 3: `checkpoints.hf_llama`), told apart by
               config.json's model_type.
  t5x:PATH     a T5X `checkpoint_<step>` directory (local or gs://). T5X does
               not record the architecture, so `config=` must say it: one of
               our config names, a gin file such as configs/models/x.gin, a
               dict of T5X `T5Config` fields, or a config object.
  DIR          a directory written by `save` (config.json + orbax params).
  demo:NAME    a shipped demo model, `specdec_jax/demo_models/NAME/` (ours).
  NAME         a config name (`registry.NAMES`, e.g. "t5_tiny"): random,
               seeded parameters for tests and benchmarks.

The T5X format (layout, reader, writer) lives in `t5x`, the Hugging Face
one in `hf`, config resolution (`resolve_config`) in `configs`, the shared
storage helpers in `storage`. orbax, tensorstore and gin are imported
inside the functions that use them, so `import specdec_jax.checkpoints`
needs only jax, flax and numpy.

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
copy by `checkpoints.hf` and then placed leaf by leaf, dropping each host
array as it goes. `read_t5x` returns host numpy arrays, i.e. the full model
in host memory.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import posixpath
import re
import tempfile
from typing import Any, Mapping

import jax
import numpy as np

from specdec_jax.infra import multihost
from specdec_jax.infra import paths
from specdec_jax import sharding as sharding_lib
from specdec_jax import tokens
from specdec_jax.checkpoints import hf
from specdec_jax.checkpoints import hf_files
from specdec_jax.checkpoints import hf_gemma3
from specdec_jax.checkpoints import hf_llama
from specdec_jax.checkpoints import hf_t5gemma
from specdec_jax.checkpoints import hf_t5gemma2
from specdec_jax.checkpoints.configs import FAMILIES
from specdec_jax.checkpoints.configs import config_from_fields
from specdec_jax.checkpoints.configs import resolve_config
from specdec_jax.checkpoints.errors import CheckpointError
from specdec_jax.checkpoints.errors import CheckpointNotFoundError
from specdec_jax.checkpoints.errors import MissingParameterError
from specdec_jax.checkpoints.errors import NonFiniteParameterError
from specdec_jax.checkpoints.errors import ParameterShapeError
from specdec_jax.checkpoints.errors import SpecError
from specdec_jax.checkpoints.errors import UnexpectedParameterError
from specdec_jax.checkpoints.storage import StoredParams
from specdec_jax.checkpoints.storage import flatten_tree
from specdec_jax.checkpoints.storage import is_gcs
from specdec_jax.checkpoints.storage import isdir
from specdec_jax.checkpoints.storage import join_path
from specdec_jax.checkpoints.storage import list_dir
from specdec_jax.checkpoints.storage import open_orbax
from specdec_jax.checkpoints.storage import place_leaf
from specdec_jax.checkpoints.storage import read_bytes
from specdec_jax.checkpoints.storage import unflatten_tree
from specdec_jax.checkpoints.storage import write_bytes
from specdec_jax.checkpoints.t5x import open_t5x
from specdec_jax.decoding.protocol import Model
from specdec_jax.models import registry
from specdec_jax.tokens import SentencePieceVocabulary

FORMAT = "specdec_jax"
FORMAT_VERSION = 1
CONFIG_FILE = "config.json"
PARAMS_DIR = "params"
VOCAB_FILE = "vocab.model"
DEMO_DIR = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "demo_models")
SPEC_PREFIXES = ("hf", "t5x", "demo")
# config.json's model_type -> the loader of a Hugging Face directory
# (anything else: T5, whose loader names what it cannot read). Gemma's
# tokenizer.model sits next to the weights, the Llama layout's tokenizer.json
# (`hf_llama.read_vocabulary`); T5's is left to the task.
_HF_LOADERS = {hf_t5gemma.MODEL_TYPE: hf_t5gemma.load_t5gemma,
               hf_t5gemma2.MODEL_TYPE: hf_t5gemma2.load_t5gemma2,
               **{t: hf_gemma3.load_gemma3 for t in hf_gemma3.MODEL_TYPES},
               **{t: hf_llama.load_llama for t in hf_llama.MODEL_TYPES}}
# A config's family -> the writer of its Hugging Face directory.
_HF_SAVERS = {"t5": hf.save_t5, "t5gemma": hf_t5gemma.save_t5gemma,
              "gemma3": hf_gemma3.save_gemma3, "llama": hf_llama.save_llama}


# --- Checking parameters against a model definition. ---


@functools.lru_cache(maxsize=32)
def _expected(definition: Any) -> dict[str, jax.ShapeDtypeStruct]:
  """Name -> shape and dtype of every parameter `definition` needs."""
  return flatten_tree(jax.eval_shape(definition.init_params,
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


# --- Our format: config.json + an orbax PyTree checkpoint of the params. ---


def _family(config: Any) -> str:
  for family, cls in FAMILIES:
    if isinstance(config, cls):
      return family
  raise TypeError(f"not a model config (T5Config, GPTConfig or "
                  f"T5GemmaConfig): {config!r}")


def save(model_or_params: Model | Any, directory: str, *, config: Any = None,
         vocab: str | None = None, copy_vocab: bool = True,
         vocab_extra_ids: int | None = None, overwrite: bool = False) -> str:
  """Saves parameters in our format.

  The directory holds `config.json` ({"format", "format_version", "family":
  "t5"|"gpt"|..., "config": fields, "vocab": file or null}), the parameters
  as an orbax PyTree checkpoint in `params/`, and optionally the
  vocabulary: `vocab.model` (SentencePiece), or a BPE tokenizer's
  `tokenizer.json` with those of its companions it has
  (`tokens.BPE_FILES`: tokenizer_config.json, chat_template.jinja,
  generation_config.json), as a Hugging Face directory holds them.

  Args:
    model_or_params: a `Model`, or a parameter tree.
    directory: where to write (local or gs://).
    config: the architecture (T5Config/GPTConfig); defaults to the Model's.
    vocab: a SentencePiece model file, or a tokenizer.json (its companions
      beside it are copied with it), to record (default: the Model's
      vocabulary, if it has one).
    copy_vocab: copy `vocab` into the directory (else record its path).
    vocab_extra_ids: sentinel ids appended to the vocabulary (T5's 100
      `<extra_id_*>`); default: the Model vocabulary's, else 0.
    overwrite: replace an existing checkpoint.

  Returns:
    `directory`.
  """
  params = model_or_params
  bpe_files = None  # a tokenizer.json and its companions: {name: bytes}
  if isinstance(model_or_params, Model):
    params = model_or_params.params
    config = config if config is not None else model_or_params.config
    if vocab is None and isinstance(model_or_params.vocab,
                                    tokens.BpeVocabulary):
      bpe_files = model_or_params.vocab.files()
    if vocab is None:
      vocab = getattr(model_or_params.vocab, "sentencepiece_model_file", None)
    if vocab_extra_ids is None:
      vocab_extra_ids = getattr(model_or_params.vocab, "extra_ids", None)
  if config is None:
    raise SpecError("save() needs config= (a T5Config or GPTConfig) when "
                    "given parameters rather than a Model")
  family = _family(config)
  definition = registry.make_def(config)
  _check({n: np.shape(v) for n, v in flatten_tree(params).items()}, definition,
         "the parameters to save")
  config_path = join_path(directory, CONFIG_FILE)
  if read_bytes(config_path) is not None and not overwrite:
    raise FileExistsError(f"{config_path} exists; pass overwrite=True")
  vocab_entry, vocab_data = vocab, None
  if vocab is not None:
    vocab_data = read_bytes(vocab)
    if vocab_data is None:
      raise CheckpointNotFoundError(f"vocabulary file not found: {vocab!r}")
    is_bpe = posixpath.basename(vocab) == tokens.TOKENIZER_FILE
    if is_bpe and copy_vocab:  # with the files beside it that exist
      bpe_files = _read_bpe_files(posixpath.dirname(vocab) or ".")
    vocab_entry = (tokens.TOKENIZER_FILE if is_bpe else VOCAB_FILE) if (
        copy_vocab) else (vocab if is_gcs(vocab) else os.path.abspath(vocab))
  elif bpe_files is not None:
    vocab_entry = tokens.TOKENIZER_FILE
  # orbax is slow to import: only when a checkpoint is read or written.
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  params_dir = join_path(directory, PARAMS_DIR)
  if not is_gcs(params_dir):
    ocp.PyTreeCheckpointer().save(os.path.abspath(params_dir), params,
                                  force=overwrite)
  elif jax.process_count() > 1:
    # Each host holds only its shards: orbax writes them together (through
    # its own gs:// client, without our bounded waits).
    ocp.PyTreeCheckpointer().save(params_dir, params, force=overwrite)
  else:
    # orbax's gs:// client is not ours (no bounded waits, not the emulator):
    # write locally, then upload through specdec_jax.infra.paths.
    _save_orbax_then_upload(ocp, params, params_dir)
  if not multihost.is_primary():
    return directory
  if bpe_files is not None:
    for name, data in bpe_files.items():
      write_bytes(join_path(directory, name), data)
  elif vocab_data is not None and copy_vocab:
    write_bytes(join_path(directory, VOCAB_FILE), vocab_data)
  manifest = {"format": FORMAT, "format_version": FORMAT_VERSION,
              "family": family, "config": dataclasses.asdict(config),
              "vocab": vocab_entry, "vocab_extra_ids": vocab_extra_ids or 0}
  # Written last: a directory with config.json is a complete checkpoint.
  write_bytes(config_path, json.dumps(manifest, indent=2).encode())
  return directory


def _save_orbax_then_upload(ocp: Any, params: Any, params_dir: str) -> None:
  """Writes `params` as orbax does into a local temporary directory and
  uploads it to the gs:// `params_dir` (replacing what was there), with
  progress logged and each call within the bounded wait."""
  for name in paths.list_files(params_dir):
    paths.remove(join_path(params_dir, name))
  with tempfile.TemporaryDirectory(prefix="specdec_jax_save.") as local:
    ocp.PyTreeCheckpointer().save(os.path.join(local, PARAMS_DIR), params)
    paths.copy_tree(os.path.join(local, PARAMS_DIR), params_dir)


def _read_bpe_files(directory: str) -> dict[str, bytes]:
  """tokenizer.json and those of `tokens.BPE_FILES` beside it that exist."""
  files = {name: read_bytes(join_path(directory, name))
           for name in tokens.BPE_FILES}
  return {name: data for name, data in files.items() if data is not None}


def _make_vocab(path: str, extra_ids: int = 0
                ) -> SentencePieceVocabulary | tokens.BpeVocabulary:
  """The checkpoint's vocabulary: a tokenizer.json (with the files beside
  it) as a `tokens.BpeVocabulary`; else SentencePiece itself, not seqio's
  class, whose TensorFlow import would cost a decoding user seconds and a
  page of log lines (the seqio tasks read the same file with seqio's
  own)."""
  if posixpath.basename(path) == tokens.TOKENIZER_FILE:
    files = _read_bpe_files(posixpath.dirname(path) or ".")
    if tokens.TOKENIZER_FILE not in files:
      raise CheckpointNotFoundError(f"vocabulary file not found: {path!r}")
    return tokens.BpeVocabulary(files, source=posixpath.dirname(path))
  # A gs:// vocabulary is fetched through the one I/O layer into a local
  # cache first.
  return SentencePieceVocabulary(paths.local_copy(path), extra_ids=extra_ids)


def _read_manifest(directory: str) -> dict[str, Any]:
  data = read_bytes(join_path(directory, CONFIG_FILE))
  if data is None:
    if not isdir(directory):
      raise CheckpointNotFoundError(f"checkpoint directory not found: "
                                    f"{directory!r}")
    raise CheckpointNotFoundError(
        f"{directory!r} is not a {FORMAT} checkpoint: it has no {CONFIG_FILE} "
        "(write one with checkpoints.save or scripts/convert_checkpoint.py)")
  manifest = json.loads(data)
  if manifest.get("format") != FORMAT:
    raise CheckpointError(f"{join_path(directory, CONFIG_FILE)} is not a "
                          f"{FORMAT} config (no \"format\": \"specdec_jax\")")
  if manifest.get("format_version", 0) > FORMAT_VERSION:
    raise CheckpointError(
        f"{directory!r} has format_version {manifest['format_version']}, "
        f"newer than this code's {FORMAT_VERSION}; upgrade specdec_jax")
  return manifest


def restore(directory: str, *, mesh: jax.sharding.Mesh | None = None,
            dtype: str | None = None, param_dtype: str | None = None,
            replicate: Any = False) -> Model:
  """Loads a directory written by `save`.

  Args:
    directory: the checkpoint directory (local or gs://).
    mesh: place the parameters sharded over this mesh; None: this
      process's first device.
    dtype: override the compute dtype of the stored config.
    param_dtype: override the parameter dtype (cast as they load).
    replicate: a whole copy on every device of `mesh` instead of shards.

  Returns:
    The `Model` (with its vocabulary when one was saved).
  """
  manifest = _read_manifest(directory)
  config = config_from_fields(manifest["config"], manifest["family"],
                              f"{join_path(directory, CONFIG_FILE)}")
  overrides = {k: v for k, v in [("dtype", dtype),
                                  ("param_dtype", param_dtype)] if v}
  config = dataclasses.replace(config, **overrides)
  definition = registry.make_def(config)
  params_dir = join_path(directory, PARAMS_DIR)
  if not is_gcs(params_dir):
    params_dir = os.path.abspath(params_dir)
  stored = open_orbax(params_dir, "", f"checkpoint {directory}")
  params = _load_checked(stored, definition, mesh, replicate)
  vocab = None
  if manifest.get("vocab"):
    vocab_path = manifest["vocab"]
    if not is_gcs(vocab_path) and not os.path.isabs(vocab_path):
      vocab_path = join_path(directory, vocab_path)
    vocab = _make_vocab(vocab_path, int(manifest.get("vocab_extra_ids", 0)))
  return Model(definition, params, vocab)


def _shardings(definition: Any, shapes: dict[str, Any],
               mesh: jax.sharding.Mesh | None,
               replicate: Any = False) -> dict[str, Any]:
  """Name -> sharding: over `mesh` by the logical axis rules (or replicated
  on it), else this process's first device (`jax.devices()[0]` is process
  0's, which other hosts cannot address)."""
  if mesh is None:
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    return {name: device for name in shapes}
  if callable(replicate):
    replicate = replicate(definition)
  return flatten_tree(sharding_lib.param_shardings(
      definition, unflatten_tree(shapes), mesh, replicate=replicate))


def _load_checked(stored: StoredParams, definition: Any,
                  mesh: jax.sharding.Mesh | None,
                  replicate: Any = False) -> dict[str, Any]:
  """Checks names and shapes, then reads every leaf in place (each host
  only the index ranges of its own devices' shards)."""
  expected = _check(stored.shapes, definition, stored.where)
  shardings = _shardings(definition, expected, mesh, replicate)
  return unflatten_tree(stored.load(
      {n: (s.dtype, shardings[n]) for n, s in expected.items()}))


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
  if isdir(spec):
    return "ours", spec
  if is_gcs(spec) or "/" in spec or os.sep in spec or spec.startswith("."):
    raise CheckpointNotFoundError(f"checkpoint directory not found: {spec!r}")
  raise SpecError(
      f"unknown config name {spec!r} (and no such directory); known config "
      f"names: {', '.join(registry.NAMES)}")


def _to_devices(params: dict[str, Any], definition: Any,
                mesh: jax.sharding.Mesh | None,
                replicate: Any = False) -> dict[str, Any]:
  """Moves host leaves to devices in place, so each host copy dies at once."""
  shardings = _shardings(definition, flatten_tree(params), mesh, replicate)
  for name, sharding in shardings.items():
    *parents, leaf = name.split("/")
    node = params
    for key in parents:
      node = node[key]
    node[leaf] = place_leaf(node[leaf], (None, sharding))
  return params


def load_model(spec: str, *, config: Any = None,
               mesh: jax.sharding.Mesh | None = None,
               dtype: str | None = None, param_dtype: str | None = None,
               seed: int = 0, check_finite: bool = True,
               replicate: Any = False) -> Model:
  """Loads (or randomly initialises) a model; see the module docstring.

  Args:
    spec: "hf:DIR", "t5x:PATH", "demo:NAME", a directory written by `save`,
      or a config name (random parameters).
    config: for "t5x:" only, and required there: the architecture, in any
      form `resolve_config` accepts.
    mesh: place the parameters sharded over this mesh (leaf by leaf; each
      host reads only its devices' shards); None: on this process's first
      device.
    dtype: compute dtype override, e.g. "bfloat16".
    param_dtype: parameter dtype override (parameters are cast to it as
      they load), e.g. "bfloat16" to hold T5 XXL in 22 GB.
    seed: PRNG seed of random initialisation.
    check_finite: check every floating-point parameter for NaN/inf after
      loading (one reduction per tensor on its device: docs/reliability.md);
      False skips it.
    replicate: with `mesh`, a whole copy on every device instead of shards
      (a small draft next to a model-parallel target); or a function of the
      model definition deciding it (from shapes, before anything is read).

  Returns:
    A `Model`.

  Raises:
    SpecError: unknown prefix or config name, config missing or misplaced.
    CheckpointNotFoundError: missing file or directory.
    MissingParameterError, UnexpectedParameterError, ParameterShapeError:
      the checkpoint does not fit the config.
    NonFiniteParameterError: a parameter holds NaN or inf.
  """
  model = _load_model(spec, config=config, mesh=mesh, dtype=dtype,
                      param_dtype=param_dtype, seed=seed, replicate=replicate)
  if check_finite:
    check_finite_params(model, spec)
  return model


@jax.jit
def _all_finite(leaves: dict[str, jax.Array]) -> dict[str, jax.Array]:
  """Whether each tensor is free of NaN and inf: one program for a whole
  model (per-tensor calls would compile one per distinct shape)."""
  return {name: jax.numpy.isfinite(leaf).all() for name, leaf in leaves.items()}


def check_finite_params(model: Model, where: str) -> None:
  """Raises NonFiniteParameterError naming the tensors holding NaN or inf."""
  inexact = {name: leaf for name, leaf in flatten_tree(model.params).items()
             if jax.numpy.issubdtype(leaf.dtype, jax.numpy.inexact)}
  finite = jax.device_get(_all_finite(inexact))
  bad = [name for name in inexact if not finite[name]]
  if bad:
    raise NonFiniteParameterError(
        f"{where}: parameters hold NaN or inf in {len(bad)} tensor(s): "
        f"{', '.join(bad[:5])}{' ...' if len(bad) > 5 else ''}. The checkpoint "
        "is damaged or its training diverged: re-export it or load an "
        "earlier checkpoint (load_model(..., check_finite=False) loads it "
        "anyway).")


def _load_model(spec: str, *, config: Any, mesh: jax.sharding.Mesh | None,
                dtype: str | None, param_dtype: str | None,
                seed: int, replicate: Any = False) -> Model:
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
      shardings = _shardings(definition, _expected(definition), mesh,
                             replicate)
      init = jax.jit(init, out_shardings=unflatten_tree(shardings))
    return Model(definition, init(jax.random.PRNGKey(seed)))
  if kind == "t5x":
    model_config = dataclasses.replace(resolve_config(config), **overrides)
    definition = registry.make_def(model_config)
    return Model(definition, _load_checked(open_t5x(rest), definition, mesh,
                                           replicate))
  if kind == "hf":
    model_type = hf_files.model_type(rest)
    load = _HF_LOADERS.get(model_type)
    gemma = load is not None
    model_config, params = (load or hf.load_t5)(rest, **overrides)
    definition = registry.make_def(model_config)
    # Gemma's SentencePiece model has no sentinel ids.
    tokenizer = join_path(rest, hf_t5gemma.TOKENIZER_FILE)
    if model_type in hf_llama.MODEL_TYPES:
      vocab = hf_llama.read_vocabulary(rest)
    else:
      vocab = (_make_vocab(tokenizer) if gemma and read_bytes(tokenizer)
               is not None else None)
    return Model(definition, _to_devices(params, definition, mesh,
                                         replicate), vocab)
  if kind == "demo":
    shipped = sorted(list_dir(DEMO_DIR)) if os.path.isdir(DEMO_DIR) else []
    if rest not in shipped:  # also keeps demo:../x inside the shipped models
      raise CheckpointNotFoundError(
          f"demo model {rest!r} is not shipped: demo:NAME takes a shipped "
          f"name (for a directory of your own, pass its path without "
          f"demo:); shipped: {', '.join(shipped) or 'none'}")
    directory = os.path.join(DEMO_DIR, rest)
    if not os.path.isfile(os.path.join(directory, CONFIG_FILE)):
      shipped = sorted(list_dir(DEMO_DIR)) if os.path.isdir(DEMO_DIR) else []
      raise CheckpointNotFoundError(
          f"demo model {rest!r} is not shipped: no {directory}/{CONFIG_FILE}; "
          f"shipped: {', '.join(shipped) or 'none'}")
    return restore(directory, mesh=mesh, replicate=replicate, **overrides)
  return restore(rest, mesh=mesh, replicate=replicate, **overrides)


def vocabulary_of(spec: str, config: Any = None
                  ) -> tuple[int, tuple[str, int] | None]:
  """(vocabulary size, fingerprint) of what `load_model(spec, config=...)`
  loads, read from its config and tokenizer files alone, no weights: a run
  compares its models before it reads any. The fingerprint is
  `protocol.vocab_fingerprint`'s (sha256 of the SentencePiece model, extra
  ids; of a tokenizer.json's pieces, 0), None without a vocabulary file."""
  kind, rest = _parse_spec(os.fspath(spec))
  vocab_file, extra_ids = None, 0
  if kind == "random":
    size = registry.get_config(rest).vocab_size
  elif kind == "t5x":
    if config is None:
      raise SpecError(f"{spec!r}: T5X checkpoints do not record their "
                      "architecture; pass config= (a config name, a gin "
                      "file under configs/models, or a dict of fields)")
    size = resolve_config(config).vocab_size
  elif kind == "hf":
    data = read_bytes(join_path(rest, hf.CONFIG_FILE))
    if data is None:
      raise CheckpointNotFoundError(
          f"missing {hf.CONFIG_FILE} in HF checkpoint directory {rest!r}")
    fields = json.loads(data)
    if fields.get("model_type") in hf_llama.MODEL_TYPES:
      data = read_bytes(join_path(rest, tokens.TOKENIZER_FILE))
      return hf_llama.llama_config_from_hf(fields).vocab_size, (
          None if data is None else (tokens.pieces_digest(data), 0))
    if fields.get("model_type") in hf_gemma3.MODEL_TYPES:
      size = hf_gemma3.gemma3_config_from_hf(fields).vocab_size
    elif fields.get("model_type") == hf_t5gemma2.MODEL_TYPE:
      size = hf_t5gemma2.t5gemma2_config_from_hf(fields).vocab_size
    else:
      size = fields.get("vocab_size", 32128)
    if fields.get("model_type") in _HF_LOADERS:
      vocab_file = join_path(rest, hf_gemma3.TOKENIZER_FILE)
  else:
    directory = join_path(DEMO_DIR, rest) if kind == "demo" else rest
    manifest = _read_manifest(directory)
    size = config_from_fields(manifest["config"], manifest["family"],
                              directory).vocab_size
    if manifest.get("vocab"):
      vocab_file = manifest["vocab"]
      if not is_gcs(vocab_file) and not os.path.isabs(vocab_file):
        vocab_file = join_path(directory, vocab_file)
      extra_ids = int(manifest.get("vocab_extra_ids", 0))
  proto = None if vocab_file is None else read_bytes(vocab_file)
  if proto is not None and posixpath.basename(
      vocab_file) == tokens.TOKENIZER_FILE:
    return int(size), (tokens.pieces_digest(proto), 0)
  return int(size), None if proto is None else (
      hashlib.sha256(proto).hexdigest()[:16], extra_ids)


def save_hf(model: Model, directory: str, *, overwrite: bool = False) -> str:
  """Writes `model` as the Hugging Face directory of its family (T5,
  T5Gemma, Gemma 3, the Llama layout: `hf.save_t5`,
  `hf_t5gemma.save_t5gemma`, `hf_gemma3.save_gemma3`,
  `hf_llama.save_llama`), local or gs://; returns `directory`."""
  family = _family(model.config)
  if family not in _HF_SAVERS:
    raise SpecError(f"a {family} model has no Hugging Face format; export "
                    f"one of: {', '.join(_HF_SAVERS)}")
  return _HF_SAVERS[family](model, directory, overwrite=overwrite)


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
