"""Hugging Face `T5ForConditionalGeneration` checkpoints: load and export.

`load_t5` reads an HF directory into our T5; `save_t5` writes one of our T5
`Model`s as an HF directory (its exact inverse, see "Export" below).

A checkpoint directory holds `config.json` and the weights as
`model.safetensors`, sharded safetensors with `model.safetensors.index.json`,
or `pytorch_model.bin` (which needs torch: `pip install -e '.[hf]'`). A
gs:// directory is first downloaded into a temporary local one.
Safetensors are read with `safetensors` in numpy, one tensor at a time, and
each is transposed into T5X's layout and cast before the next is read, so
the parameters are never held twice.

Output layer conventions (checked against transformers 5.24's T5 code):
  * Hub T5 v1.1 configs say `tie_word_embeddings: false` and ship
    `lm_head.weight`: separate output layer, no scaling of the decoder output.
  * Original T5 configs leave `tie_word_embeddings` unset (true) and ship no
    `lm_head.weight`: the output layer is the embedding and the decoder
    output is scaled by d_model**-0.5 first.
  * Configs written by transformers 5 always say `tie_word_embeddings: true`
    and carry `scale_decoder_outputs`, which then decides the scaling; the
    weights are tied only if `lm_head.weight` is absent or equal to
    `shared.weight` (transformers 5 unties two different weights).
A combination that T5X cannot express (tied but unscaled, or untied but
scaled) becomes an untied `logits_dense` kernel with the scale folded in.

Name mapping (HF [out, in] Linear weights are transposed to T5X [in, out]):
  shared.weight -> token_embedder/embedding
  X.block.0.layer.0.SelfAttention.relative_attention_bias.weight [R, N]
      -> X/relpos_bias/rel_embedding [N, R]   (X = encoder or decoder)
  encoder.block.i.layer.0.SelfAttention.{q,k,v,o}
      -> encoder/layers_i/attention/{query,key,value,out}/kernel
  encoder.block.i.layer.0.layer_norm -> .../pre_attention_layer_norm/scale
  encoder.block.i.layer.1.DenseReluDense.{wi,wi_0,wi_1,wo} -> .../mlp/...
  encoder.block.i.layer.1.layer_norm -> .../pre_mlp_layer_norm/scale
  decoder.block.i.layer.{0,1,2}: SelfAttention, EncDecAttention and
      DenseReluDense with their layer_norms -> self_attention,
      encoder_decoder_attention, mlp and pre_*_layer_norm
  X.final_layer_norm.weight -> X/{encoder,decoder}_norm/scale
  lm_head.weight [V, D] -> decoder/logits_dense/kernel [D, V]
Our attention kernels already hold T5X's joined heads: [D, N*H] with the
head index outer, the layout of HF's q/k/v [N*H, D] transposed (and of o
[D, N*H] for our out [N*H, D]), so no reshaping is needed either way. T5
does not scale attention logits by 1/sqrt(H); T5X and HF both keep that
factor folded into the trained query weights, so they carry the same numbers.

Export (`save_t5`). The same mapping run backwards: every parameter is
transposed back where the loader transposes it and written under its HF
name, with its dtype unchanged (float32 or bfloat16), into a single
`model.safetensors` (metadata format "pt", as `save_pretrained` writes);
`encoder/decoder.embed_tokens` are left out, as `save_pretrained` does,
since HF ties them to `shared`. The output layer:
  * logits_via_embedding (v1.0): no `lm_head.weight`, and config.json says
    `tie_word_embeddings: true`, `scale_decoder_outputs: true`.
  * otherwise (v1.1): `lm_head.weight` = logits_dense/kernel transposed,
    `tie_word_embeddings: false`, `scale_decoder_outputs: false`.
Both keys are written so that transformers 4 (which reads the first) and 5
(which reads the second) agree. `max_input_len` goes to `n_positions`,
which HF's T5 ignores but `load_t5` reads back. The whole model is held in
host memory once while the file is written.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
from typing import Any, Iterator

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.infra import paths
from specdec_jax.checkpoints.errors import CheckpointError
from specdec_jax.checkpoints.errors import CheckpointNotFoundError
from specdec_jax.checkpoints.errors import MissingParameterError
from specdec_jax.checkpoints.errors import ParameterShapeError
from specdec_jax.checkpoints.errors import UnsupportedCheckpointError
from specdec_jax.models.t5 import T5Config, T5Def

CONFIG_FILE = "config.json"
SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
TORCH_FILE = "pytorch_model.bin"
TORCH_INDEX = "pytorch_model.bin.index.json"
ARCHITECTURE = "T5ForConditionalGeneration"


# HF `feed_forward_proj` -> our MLP activations. HF maps "gated-gelu" to the
# tanh approximation ("gelu_new") but a plain "gelu" to the exact erf form.
_FEED_FORWARD = (
    ("relu", ("relu",)),
    ("gated-relu", ("relu", "linear")),
    ("gelu", ("gelu_exact",)),
    ("gated-gelu", ("gelu", "linear")),
    ("gelu_new", ("gelu",)),
    ("gated-gelu_new", ("gelu", "linear")),
    ("silu", ("silu",)),
    ("gated-silu", ("silu", "linear")),
)


def read_hf_config(path: str) -> dict[str, Any]:
  """Reads `config.json` of a checkpoint directory and checks it is a T5."""
  if not os.path.isdir(path):
    raise CheckpointNotFoundError(
        f"HF checkpoint directory not found: {path!r}")
  config_file = os.path.join(path, CONFIG_FILE)
  if not os.path.isfile(config_file):
    raise CheckpointNotFoundError(
        f"missing {CONFIG_FILE} in HF checkpoint directory {path!r}")
  with open(config_file) as f:
    hf = json.load(f)
  model_type = hf.get("model_type")
  architectures = hf.get("architectures") or [ARCHITECTURE]
  if model_type != "t5" or ARCHITECTURE not in architectures:
    raise UnsupportedCheckpointError(
        f"{config_file}: unsupported model_type={model_type!r}, "
        f"architectures={architectures}; only model_type 't5' with "
        f"{ARCHITECTURE} (and 't5gemma' with "
        "T5GemmaForConditionalGeneration: checkpoints.hf_t5gemma; "
        "'gemma3_text' and 'gemma3': checkpoints.hf_gemma3) can be loaded")
  return hf


def t5_config_from_hf(hf: dict[str, Any], *, logits_via_embedding: bool,
                      dtype: str = "float32",
                      param_dtype: str = "float32") -> T5Config:
  """Our T5Config for an HF T5 config dict.

  Args:
    hf: the parsed config.json.
    logits_via_embedding: whether the output layer is the scaled tied
      embedding (decided by `load_t5` from the config and the weights).
    dtype: compute dtype.
    param_dtype: parameter dtype.

  Returns:
    The T5Config.
  """
  proj = hf.get("feed_forward_proj", "relu")
  activations = next((a for name, a in _FEED_FORWARD if name == proj), None)
  if activations is None:
    known = ", ".join(name for name, _ in _FEED_FORWARD)
    raise UnsupportedCheckpointError(
        f"unsupported feed_forward_proj {proj!r}; known: {known}")
  num_layers = hf.get("num_layers", 6)
  return T5Config(
      vocab_size=hf.get("vocab_size", 32128),
      emb_dim=hf.get("d_model", 512),
      num_heads=hf.get("num_heads", 8),
      num_encoder_layers=num_layers,
      num_decoder_layers=hf.get("num_decoder_layers") or num_layers,
      head_dim=hf.get("d_kv", 64),
      mlp_dim=hf.get("d_ff", 2048),
      mlp_activations=activations,
      logits_via_embedding=logits_via_embedding,
      relative_attention_num_buckets=hf.get(
          "relative_attention_num_buckets", 32),
      relative_attention_max_distance=hf.get(
          "relative_attention_max_distance", 128),
      dtype=dtype, param_dtype=param_dtype,
      max_input_len=hf.get("n_positions") or 512,
      layer_norm_epsilon=hf.get("layer_norm_epsilon", 1e-6))


class Tensors:
  """Reads named tensors of a checkpoint one at a time, as numpy arrays."""

  def __init__(self, path: str):
    self._files: dict[str, str] = {}  # tensor name -> file
    self._torch_state = None
    single = os.path.join(path, SAFETENSORS_FILE)
    index = os.path.join(path, SAFETENSORS_INDEX)
    torch_file = os.path.join(path, TORCH_FILE)
    if os.path.isfile(single):
      with _damaged_file_named(single):
        # safetensors only when Hugging Face files are read.
        import safetensors  # pylint: disable=g-import-not-at-top
        with safetensors.safe_open(single, framework="np") as f:
          self._files = {name: single for name in f.keys()}
    elif os.path.isfile(index):
      with open(index) as f:
        weight_map = json.load(f)["weight_map"]
      for name, shard in weight_map.items():
        shard_path = os.path.join(path, shard)
        if not os.path.isfile(shard_path):
          raise CheckpointNotFoundError(
              f"missing safetensors shard {shard!r} listed in {index}")
        self._files[name] = shard_path
    elif os.path.isfile(torch_file):
      self._torch_state = _torch_load(torch_file)
    elif os.path.isfile(os.path.join(path, TORCH_INDEX)):
      raise UnsupportedCheckpointError(
          f"sharded {TORCH_INDEX} in {path!r} is not supported; load it "
          "with transformers and save_pretrained() it as safetensors")
    else:
      raise CheckpointNotFoundError(
          f"no weights in HF checkpoint directory {path!r}: expected "
          f"{SAFETENSORS_FILE}, {SAFETENSORS_INDEX} or {TORCH_FILE}")
    self._handles: dict[str, Any] = {}
    # Some checkpoints (older .bin files) carry the embedding only under the
    # names of its tied copies.
    self._aliases: dict[str, str] = {}
    if not self._has("shared.weight"):
      for copy in ("encoder.embed_tokens.weight",
                   "decoder.embed_tokens.weight"):
        if self._has(copy):
          self._aliases["shared.weight"] = copy
          break

  def _has(self, name: str) -> bool:
    if self._torch_state is not None:
      return name in self._torch_state
    return name in self._files

  def __contains__(self, name: str) -> bool:
    return self._has(self._aliases.get(name, name))

  def get(self, name: str) -> np.ndarray:
    name = self._aliases.get(name, name)
    if self._torch_state is not None:
      return _torch_to_numpy(self._torch_state[name])
    file = self._files[name]
    with _damaged_file_named(file):
      if file not in self._handles:
        # safetensors only when Hugging Face files are read.
        import safetensors  # pylint: disable=g-import-not-at-top
        # Opened once per shard and kept: safe_open memory-maps the file, so
        # a handle costs no memory for the tensors not read yet.
        self._handles[file] = safetensors.safe_open(file, framework="np")
      return self._handles[file].get_tensor(name)


@contextlib.contextmanager
def _damaged_file_named(file: str):
  """Turns safetensors' errors (no path in them) into a CheckpointError
  naming the file and the fix."""
  try:
    yield
  except (OSError, CheckpointError):
    raise
  except Exception as e:  # pylint: disable=broad-except  (SafetensorError)
    raise CheckpointError(
        f"{file} is damaged or truncated ({type(e).__name__}: {e}): "
        "re-download it, or re-export it (hf.save_t5 / save_pretrained)."
    ) from None


def _torch_load(file: str):
  try:
    # torch is optional (the hf extra).
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise ImportError(
        f"reading {file} needs torch, which is not installed; install it "
        "with `pip install -e '.[hf]'` or convert the checkpoint to "
        "safetensors") from None
  try:
    # Memory-mapped, so tensors are paged in one at a time as converted.
    return torch.load(file, map_location="cpu", weights_only=True, mmap=True)
  except RuntimeError:  # legacy (pre-zip) format cannot be memory-mapped
    return torch.load(file, map_location="cpu", weights_only=True)


def _torch_to_numpy(tensor) -> np.ndarray:
  # torch is optional (the hf extra).
  import torch  # pylint: disable=g-import-not-at-top
  if tensor.dtype == torch.bfloat16:
    # only for bfloat16 torch tensors.
    import ml_dtypes  # pylint: disable=g-import-not-at-top
    return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
  return tensor.numpy()


def _hf_name(path: tuple[str, ...]) -> tuple[str, bool]:
  """HF tensor name for one of our parameter paths, and whether to transpose.

  Args:
    path: e.g. ('decoder', 'layers_3', 'self_attention', 'query', 'kernel').

  Returns:
    (name, transpose).
  """
  stack = path[0]  # encoder / decoder / token_embedder
  if path == ("token_embedder", "embedding"):
    return "shared.weight", False
  if path[1] == "relpos_bias":
    return (f"{stack}.block.0.layer.0.SelfAttention."
            "relative_attention_bias.weight", True)
  if path[1] in ("encoder_norm", "decoder_norm"):
    return f"{stack}.final_layer_norm.weight", False
  if path[1] == "logits_dense":
    return "lm_head.weight", True
  block = f"{stack}.block.{int(path[1].removeprefix('layers_'))}"
  sublayer = path[2]
  # Sub-layer index inside an HF block, and the HF module name.
  where = {
      "attention": ("0", "SelfAttention"),
      "pre_attention_layer_norm": ("0", None),
      "self_attention": ("0", "SelfAttention"),
      "pre_self_attention_layer_norm": ("0", None),
      "encoder_decoder_attention": ("1", "EncDecAttention"),
      "pre_cross_attention_layer_norm": ("1", None),
      "mlp": ("1" if stack == "encoder" else "2", "DenseReluDense"),
      "pre_mlp_layer_norm": ("1" if stack == "encoder" else "2", None),
  }
  index, module = where[sublayer]
  if module is None:
    return f"{block}.layer.{index}.layer_norm.weight", False
  leaf = {"query": "q", "key": "k", "value": "v", "out": "o"}.get(
      path[3], path[3])
  return f"{block}.layer.{index}.{module}.{leaf}.weight", True


def tree_paths(tree: Any) -> Iterator[tuple[tuple[str, ...], Any]]:
  """(key path, leaf) of every leaf of a nested dict of parameters."""
  for keypath, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    yield tuple(k.key for k in keypath), leaf


def set_path(tree: dict, path: tuple[str, ...], value: Any) -> None:
  """`tree[path[0]][path[1]]... = value`, making the dicts on the way."""
  for key in path[:-1]:
    tree = tree.setdefault(key, {})
  tree[path[-1]] = value


@contextlib.contextmanager
def local_directory(path: str) -> Iterator[str]:
  """`path` itself, or for gs:// a temporary local copy of the files
  `load_t5` reads (config.json and the weights its directory has); safetensors
  and torch open local files only. Errors raised inside name `path`."""
  if not paths.is_remote(path):
    yield path
    return
  present = set(paths.list_dir(path))
  if CONFIG_FILE not in present:
    raise CheckpointNotFoundError(
        f"HF checkpoint directory not found: {path!r}" if not present else
        f"missing {CONFIG_FILE} in HF checkpoint directory {path!r}")
  names = [CONFIG_FILE]
  for weights in (SAFETENSORS_FILE, SAFETENSORS_INDEX, TORCH_FILE):
    if weights in present:
      names.append(weights)
      break
  if names[-1] == SAFETENSORS_INDEX:
    index = json.loads(paths.read_text(paths.join(path, SAFETENSORS_INDEX)))
    # A shard the index lists but the bucket lacks stays missing, for
    # `Tensors` to name.
    names += sorted(set(index["weight_map"].values()) & present)
  with tempfile.TemporaryDirectory(prefix="specdec_jax_hf.") as local:
    for i, name in enumerate(names, start=1):
      data = paths.read_bytes(paths.join(path, name))
      if data is None:
        raise CheckpointNotFoundError(
            f"{paths.join(path, name)} disappeared while being downloaded")
      logging.info("downloaded %s (%d/%d, %.1f MB) from %s", name, i,
                   len(names), len(data) / 1e6, path)
      with open(os.path.join(local, name), "wb") as f:
        f.write(data)
      del data
    try:
      yield local
    except (CheckpointError, CheckpointNotFoundError) as e:
      raise type(e)(str(e).replace(local, path)) from e


def load_t5(path: str, *, dtype: str = "float32",
            param_dtype: str = "float32") -> tuple[T5Config, Any]:
  """Loads an HF T5ForConditionalGeneration directory.

  Args:
    path: directory with config.json and the weights, local or gs:// (then
      its files are downloaded into a temporary directory first, one at a
      time within the bounded waits of `specdec_jax.infra.paths`; it needs local
      disk for the weights).
    dtype: compute dtype of the returned config.
    param_dtype: dtype of the returned parameters.

  Returns:
    (T5Config, parameter tree of numpy arrays in T5X's layout).

  Raises:
    CheckpointNotFoundError: missing directory, config or weights.
    UnsupportedCheckpointError: not a T5ForConditionalGeneration.
    MissingParameterError: a tensor the config needs is missing.
    ParameterShapeError: a tensor has the wrong shape for the config.
    ImportError: a pytorch_model.bin without torch installed.
  """
  with local_directory(path) as local:
    return _load_local(local, dtype, param_dtype)


def _load_local(path: str, dtype: str,
                param_dtype: str) -> tuple[T5Config, Any]:
  hf = read_hf_config(path)
  tensors = Tensors(path)
  if "shared.weight" not in tensors:
    raise MissingParameterError(
        f"missing parameter 'shared.weight' (token_embedder/embedding) in "
        f"{path!r}")
  if "scale_decoder_outputs" in hf:  # written by transformers >= 5
    scale = bool(hf["scale_decoder_outputs"])
  else:
    scale = hf.get("tie_word_embeddings", True) is not False
  tied = "lm_head.weight" not in tensors or np.array_equal(
      tensors.get("lm_head.weight"), tensors.get("shared.weight"))
  config = t5_config_from_hf(hf, logits_via_embedding=tied and scale,
                             dtype=dtype, param_dtype=param_dtype)
  # How to fill logits_dense when T5X's two conventions don't fit.
  logits_source = "shared.weight" if tied else "lm_head.weight"
  logits_scale = config.emb_dim**-0.5 if scale and not tied else None

  shapes = T5Def(config).param_shapes()
  params: dict[str, Any] = {}
  for ours, shape_dtype in tree_paths(shapes):
    name, transpose = _hf_name(ours)
    if ours[-2:] == ("logits_dense", "kernel"):
      name = logits_source
      value = convert_tensor(tensors, name, ours, shape_dtype.shape, transpose,
                       param_dtype, logits_scale)
    else:
      value = convert_tensor(tensors, name, ours, shape_dtype.shape, transpose,
                       param_dtype, None)
    set_path(params, ours, value)
  return config, params


def convert_tensor(tensors: Tensors, name: str, ours: tuple[str, ...],
             shape: tuple[int, ...], transpose: bool, param_dtype: str,
             scale: float | None) -> np.ndarray:
  """Reads one HF tensor and returns it in our layout and dtype."""
  ours_name = "/".join(ours)
  if name not in tensors:
    raise MissingParameterError(
        f"missing parameter {name!r} ({ours_name}) in the checkpoint")
  value = tensors.get(name)
  hf_shape = tuple(reversed(shape)) if transpose else tuple(shape)
  if value.shape != hf_shape:
    raise ParameterShapeError(
        f"parameter {name!r} ({ours_name}) has shape {value.shape}, "
        f"expected {hf_shape} from config.json")
  if transpose:
    value = value.T
  if scale is not None:
    value = value.astype(np.float32) * np.float32(scale)
  # jnp.dtype also knows bfloat16, which plain numpy does not.
  return np.ascontiguousarray(value.astype(jnp.dtype(param_dtype)))


# --- Export: our T5 -> a Hugging Face directory. ---


def hf_config_from_t5(config: T5Config) -> dict[str, Any]:
  """The HF `config.json` dict for one of our T5Configs.

  The inverse of `t5_config_from_hf` (plus `load_t5`'s output layer rule):
  `t5_config_from_hf(hf_config_from_t5(c), logits_via_embedding=...)`
  gives back `c` up to `dtype`/`param_dtype`, which the caller passes.

  Raises:
    TypeError: `config` is not a T5Config.
    UnsupportedCheckpointError: MLP activations HF's T5 cannot express.
  """
  if not isinstance(config, T5Config):
    raise TypeError(f"not a T5Config: {type(config).__name__}; only T5 "
                    "models can be exported to the Hugging Face format")
  proj = next((name for name, activations in _FEED_FORWARD
               if activations == config.mlp_activations), None)
  if proj is None:
    known = ", ".join(f"{a} ({name})" for name, a in _FEED_FORWARD)
    raise UnsupportedCheckpointError(
        f"MLP activations {config.mlp_activations} have no HF "
        f"feed_forward_proj; exportable: {known}")
  tied = bool(config.logits_via_embedding)
  return {
      "architectures": [ARCHITECTURE],
      "model_type": "t5",
      "vocab_size": config.vocab_size,
      "d_model": config.emb_dim,
      "d_kv": config.head_dim,
      "d_ff": config.mlp_dim,
      "num_layers": config.num_encoder_layers,
      "num_decoder_layers": config.num_decoder_layers,
      "num_heads": config.num_heads,
      "relative_attention_num_buckets": config.relative_attention_num_buckets,
      "relative_attention_max_distance":
          config.relative_attention_max_distance,
      "feed_forward_proj": proj,
      "layer_norm_epsilon": config.layer_norm_epsilon,
      "dropout_rate": 0.1,
      "initializer_factor": 1.0,
      "is_encoder_decoder": True,
      "use_cache": True,
      "pad_token_id": 0,
      "eos_token_id": 1,
      "decoder_start_token_id": 0,
      "tie_word_embeddings": tied,
      "scale_decoder_outputs": tied,
      "n_positions": config.max_input_len,
      "dtype": str(jnp.dtype(config.param_dtype)),
  }


def save_t5(model: Any, directory: str, *, overwrite: bool = False) -> str:
  """Writes a T5 `Model` as a Hugging Face T5ForConditionalGeneration dir.

  The result loads with `transformers.T5ForConditionalGeneration
  .from_pretrained(directory)` and with `load_t5(directory)` (giving back
  the same config and bit-identical parameters). The vocabulary is not
  written.

  Args:
    model: a `specdec_jax.Model` whose definition is a T5 (its
      `definition.config` a T5Config), parameters in T5X's layout.
    directory: local directory to write (created if missing).
    overwrite: replace an existing config.json / model.safetensors.

  Returns:
    `directory`.

  Raises:
    TypeError: not a T5 model.
    UnsupportedCheckpointError: MLP activations HF's T5 cannot express.
    MissingParameterError, ParameterShapeError: the parameters do not fit
      the config; CheckpointError for parameters the config does not have.
    FileExistsError: `directory` holds a checkpoint and not overwrite.
  """
  definition = getattr(model, "definition", None)
  config = getattr(definition, "config", None)
  if not isinstance(config, T5Config):
    raise TypeError(
        f"save_t5 exports T5 models only; got a {type(model).__name__} "
        f"whose definition is {type(definition).__name__} with config "
        f"{type(config).__name__}")
  hf_config = hf_config_from_t5(config)
  tensors = _hf_tensors(config, model.params)
  dtypes = {str(t.dtype) for t in tensors.values()}
  if len(dtypes) == 1:  # what the parameters are, whatever param_dtype says
    hf_config["dtype"] = dtypes.pop()
  for name in (CONFIG_FILE, SAFETENSORS_FILE):
    if paths.exists(paths.join(directory, name)) and not overwrite:
      raise FileExistsError(f"{paths.join(directory, name)} exists; pass "
                            "overwrite=True")
  if paths.is_remote(directory):
    # safetensors writes local files only: write here, then upload through
    # specdec_jax.infra.paths (bounded waits, progress), config.json last.
    with tempfile.TemporaryDirectory(prefix="specdec_jax_hf.") as local:
      save_t5(model, local)
      for name in (SAFETENSORS_FILE, CONFIG_FILE):
        data = paths.read_bytes(os.path.join(local, name))
        logging.info("uploading %s (%.1f MB) to %s", name, len(data) / 1e6,
                     directory)
        paths.write_bytes(paths.join(directory, name), data)
    return directory
  os.makedirs(directory, exist_ok=True)
  # safetensors only when Hugging Face files are written.
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  weights = os.path.join(directory, SAFETENSORS_FILE)
  save_file(tensors, weights, metadata={"format": "pt"})
  # safetensors creates the file 0600; give it the mode of every other file
  # we write (0666 less the umask), so a shared checkpoint is readable.
  umask = os.umask(0)
  os.umask(umask)
  os.chmod(weights, 0o666 & ~umask)
  # Written last: a directory with config.json is a complete checkpoint.
  with open(os.path.join(directory, CONFIG_FILE), "w") as f:
    json.dump(hf_config, f, indent=2, sort_keys=True)
    f.write("\n")
  return directory


def _hf_tensors(config: T5Config, params: Any) -> dict[str, np.ndarray]:
  """HF name -> tensor in HF's layout, for every parameter of `config`."""
  shapes = T5Def(config).param_shapes()
  expected = dict(tree_paths(shapes))
  found = dict(tree_paths(params))
  extra = sorted("/".join(p) for p in set(found) - set(expected))
  if extra:
    raise CheckpointError(
        f"{len(extra)} parameter(s) not in the config {config}: "
        f"{', '.join(extra[:8])}{' ...' if len(extra) > 8 else ''}")
  tensors: dict[str, np.ndarray] = {}
  for ours, shape_dtype in expected.items():
    ours_name = "/".join(ours)
    if ours not in found:
      raise MissingParameterError(
          f"missing parameter {ours_name} that the config needs")
    value = np.asarray(found[ours])
    if value.shape != tuple(shape_dtype.shape):
      raise ParameterShapeError(
          f"parameter {ours_name} has shape {value.shape}, expected "
          f"{tuple(shape_dtype.shape)} from the config")
    name, transpose = _hf_name(ours)
    tensors[name] = np.ascontiguousarray(value.T if transpose else value)
  return tensors
