"""Hugging Face Llama-layout checkpoints (Llama 3, Qwen 3, Qwen 2.5): load,
export.

`load_llama` reads an HF directory of model_type `llama`
(`LlamaForCausalLM`: Llama 3.1, 3.2), `qwen3` (`Qwen3ForCausalLM`) or
`qwen2` (`Qwen2ForCausalLM`: Qwen 2 and 2.5, biases on the query, key and
value projections) into our `models.llama`. Weights are model.safetensors or shards with
model.safetensors.index.json, float32 or bfloat16, read one tensor at a
time (`hf.Tensors`), local or gs:// (`hf.local_directory`).
`load_model("hf:DIR")` also reads the tokenizer next to the weights
(`read_vocabulary`: tokenizer.json through the `tokenizers` library, with
tokenizer_config.json and generation_config.json) as the Model's
vocabulary. `save_llama` writes one of our Llama-layout `Model`s back as
a directory of the same model_type (its exact inverse), with the
tokenizer files when the Model carries them.

config.json. The Hub's configs, written by transformers 4, give the
rotary settings as `rope_theta` and `rope_scaling` (Llama 3's
`rope_type: llama3` with its factor, frequency factors and original
length); transformers 5 writes them as one `rope_parameters`. Both are
read. Fields a config leaves out take transformers' defaults for its
model_type. Variants the layout does not run are refused naming the field:
biases (`attention_bias`, `mlp_bias`), another activation, another rotary
scheme, Qwen 3's sliding windows.

The output layer follows `tie_word_embeddings`, as transformers does: tied
means the embedding is the output layer (an `lm_head.weight` beside it is
not read); untied means `lm_head.weight` is.

Name mapping (HF Linear weights [out, in] are transposed to [in, out]):
  model.embed_tokens.weight [V, D]     -> decoder/token_embedder/embedding
  model.norm.weight                    -> decoder/decoder_norm/scale
  model.layers.i.input_layernorm       -> decoder/layers_i/
                                          pre_self_attention_norm/scale
  model.layers.i.post_attention_layernorm -> .../pre_mlp_norm/scale
  model.layers.i.self_attn.{q,k,v,o}_proj -> .../self_attention/
                                          {query,key,value,out}/kernel
  model.layers.i.self_attn.{q,k}_norm  -> .../self_attention/
                                          {query,key}_norm/scale (Qwen 3)
  model.layers.i.self_attn.{q,k,v}_proj.bias -> .../self_attention/
                                          {query,key,value}/bias (Qwen 2)
  model.layers.i.mlp.{gate,up,down}_proj -> .../mlp/{wi_0,wi_1,wo}/kernel
  lm_head.weight [V, D]                -> decoder/logits_dense/kernel [D, V]
"""

from __future__ import annotations

import os
from typing import Any

import jax.numpy as jnp

from specdec_jax import tokens
from specdec_jax.checkpoints import hf
from specdec_jax.checkpoints import hf_files
from specdec_jax.checkpoints.errors import UnsupportedCheckpointError
from specdec_jax.infra import paths
from specdec_jax.models.gemma_layers import GLOBAL
from specdec_jax.models.llama import LlamaConfig, LlamaDef

LLAMA, QWEN3, QWEN2 = "llama", "qwen3", "qwen2"
MODEL_TYPES = (LLAMA, QWEN3, QWEN2)
ARCHITECTURES = {LLAMA: "LlamaForCausalLM", QWEN3: "Qwen3ForCausalLM",
                 QWEN2: "Qwen2ForCausalLM"}
# transformers' defaults of each model_type for the fields a config.json
# may leave out (LlamaConfig, Qwen3Config, Qwen2Config).
_DEFAULTS = {
    LLAMA: dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008,
                num_hidden_layers=32, num_attention_heads=32,
                max_position_embeddings=2048, rms_norm_eps=1e-6,
                tie_word_embeddings=False),
    QWEN3: dict(vocab_size=151936, hidden_size=4096, intermediate_size=22016,
                num_hidden_layers=32, num_attention_heads=32,
                num_key_value_heads=32, head_dim=128,
                max_position_embeddings=32768, rms_norm_eps=1e-6,
                tie_word_embeddings=False),
    QWEN2: dict(vocab_size=151936, hidden_size=4096, intermediate_size=22016,
                num_hidden_layers=32, num_attention_heads=32,
                num_key_value_heads=32, max_position_embeddings=32768,
                rms_norm_eps=1e-6, tie_word_embeddings=False),
}
_DEFAULT_THETA = 10_000.0
_SUBLAYERS = {"pre_self_attention_norm": "input_layernorm",
              "pre_mlp_norm": "post_attention_layernorm",
              "self_attention": "self_attn", "mlp": "mlp"}
_LEAVES = {"query": "q_proj", "key": "k_proj", "value": "v_proj",
           "out": "o_proj", "query_norm": "q_norm", "key_norm": "k_norm",
           "wi_0": "gate_proj", "wi_1": "up_proj", "wo": "down_proj"}
_LLAMA3_KEYS = ("low_freq_factor", "high_freq_factor",
                "original_max_position_embeddings")


def _rotary(fields: dict[str, Any], where: str) -> dict[str, Any]:
  """Our rope_theta, rope_scale and rope_llama3_band from either format."""
  params = fields.get("rope_parameters")
  if not isinstance(params, dict):  # transformers 4: flat fields
    params = dict(fields.get("rope_scaling") or {})
    params.setdefault("rope_theta", fields.get("rope_theta", _DEFAULT_THETA))
  kind = params.get("rope_type", params.get("type", "default"))
  theta = float(params.get("rope_theta", _DEFAULT_THETA))
  if float(params.get("partial_rotary_factor", 1.0)) != 1.0:
    raise UnsupportedCheckpointError(
        f"{where}: partial_rotary_factor "
        f"{params['partial_rotary_factor']} is not supported; the Llama "
        "layout rotates every head dimension")
  if kind == "default":
    return dict(rope_theta=theta)
  if kind == "linear":
    return dict(rope_theta=theta, rope_scale=float(params["factor"]))
  if kind == "llama3":
    missing = [k for k in ("factor",) + _LLAMA3_KEYS if k not in params]
    if missing:
      raise UnsupportedCheckpointError(
          f"{where}: rope_type 'llama3' without {', '.join(missing)}")
    return dict(rope_theta=theta, rope_scale=float(params["factor"]),
                rope_llama3_band=tuple(params[k] for k in _LLAMA3_KEYS))
  raise UnsupportedCheckpointError(
      f"{where}: rotary embeddings of rope_type {kind!r} are not supported; "
      "the Llama layout runs 'default', 'linear' and 'llama3' (Llama 3.1, "
      "3.2)")


def llama_config_from_hf(hf_config: dict[str, Any], *,
                         dtype: str = "float32", param_dtype: str = "float32",
                         where: str = "config.json") -> LlamaConfig:
  """Our LlamaConfig for an HF config dict of model_type llama, qwen3 or
  qwen2."""
  kind = hf_config.get("model_type")
  if kind not in MODEL_TYPES:
    raise UnsupportedCheckpointError(
        f"{where}: model_type {kind!r} is not one of {MODEL_TYPES}")
  fields = dict(_DEFAULTS[kind], **{k: v for k, v in hf_config.items()
                                    if v is not None})
  activation = fields.get("hidden_act", "silu")
  if activation != "silu":
    raise UnsupportedCheckpointError(
        f"{where}: hidden_act {activation!r} is not supported; the Llama "
        "layout's MLP is SwiGLU (silu)")
  for flag in ("attention_bias", "mlp_bias", "use_sliding_window"):
    if fields.get(flag):
      raise UnsupportedCheckpointError(
          f"{where}: {flag} is set; the Llama layout here has no biases but "
          "Qwen 2's on queries, keys and values, and no sliding windows (no "
          "published Llama 3, Qwen 3 or 2.5 uses them)")
  windowed = [t for t in fields.get("layer_types") or () if t != GLOBAL]
  if windowed:
    raise UnsupportedCheckpointError(
        f"{where}: layer_types holds {windowed[0]!r}; the Llama layout here "
        f"runs {GLOBAL!r} layers only")
  heads = fields["num_attention_heads"]
  return LlamaConfig(
      vocab_size=fields["vocab_size"], emb_dim=fields["hidden_size"],
      num_layers=fields["num_hidden_layers"], num_heads=heads,
      num_kv_heads=fields.get("num_key_value_heads") or heads,
      head_dim=fields.get("head_dim") or fields["hidden_size"] // heads,
      mlp_dim=fields["intermediate_size"], qk_norm=kind == QWEN3,
      qkv_bias=kind == QWEN2,
      tie_embeddings=bool(fields["tie_word_embeddings"]),
      layer_norm_epsilon=fields["rms_norm_eps"],
      max_len=fields["max_position_embeddings"], dtype=dtype,
      param_dtype=param_dtype, **_rotary(fields, where))


def _hf_name(path: tuple[str, ...]) -> tuple[str, bool]:
  """(HF tensor name, transpose) of one of our parameter paths."""
  if path[1] == "token_embedder":
    return "model.embed_tokens.weight", False
  if path[1] == "decoder_norm":
    return "model.norm.weight", False
  if path[1] == "logits_dense":
    return "lm_head.weight", True
  layer = f"model.layers.{int(path[1].removeprefix('layers_'))}"
  module = _SUBLAYERS[path[2]]
  if module.endswith("layernorm"):
    return f"{layer}.{module}.weight", False
  leaf = _LEAVES[path[3]]
  if path[-1] == "bias":
    return f"{layer}.{module}.{leaf}.bias", False
  return f"{layer}.{module}.{leaf}.weight", not leaf.endswith("_norm")


def load_llama(path: str, *, dtype: str = "float32",
               param_dtype: str = "float32") -> tuple[LlamaConfig, Any]:
  """Loads an HF Llama, Qwen 3 or Qwen 2 directory.

  Args:
    path: directory with config.json and the weights, local or gs:// (then
      fetched into a temporary directory first, as `hf.load_t5` does).
    dtype: compute dtype of the returned config.
    param_dtype: dtype of the returned parameters.

  Returns:
    (LlamaConfig, parameter tree of numpy arrays).

  Raises:
    CheckpointNotFoundError: missing directory, config or weights.
    UnsupportedCheckpointError: another model_type, or a variant the
      layout does not run (biases, another activation or rotary scheme).
    MissingParameterError, ParameterShapeError: the weights do not fit.
  """
  with hf.local_directory(path) as local:
    hf_config, _ = hf_files.read_config(local, MODEL_TYPES, "load_llama")
    config = llama_config_from_hf(
        hf_config, dtype=dtype, param_dtype=param_dtype,
        where=os.path.join(path, hf.CONFIG_FILE))
    return config, hf_files.read_params(hf.Tensors(local), LlamaDef(config),
                                        _hf_name, param_dtype)


def read_vocabulary(path: str) -> tokens.BpeVocabulary | None:
  """The tokenizer of the HF directory `path` (local or gs://):
  tokenizer.json with those of `tokens.BPE_FILES` beside it that exist;
  None without a tokenizer.json."""
  files = {name: paths.read_bytes(paths.join(path, name))
           for name in tokens.BPE_FILES}
  if files[tokens.TOKENIZER_FILE] is None:
    return None
  return tokens.BpeVocabulary(
      {k: v for k, v in files.items() if v is not None}, source=path)


# --- Export: our Llama layout -> a Hugging Face directory. ---


def hf_config_from_llama(config: LlamaConfig) -> dict[str, Any]:
  """The HF config.json dict (transformers 5's format) of one of our
  LlamaConfigs, model_type qwen3 with QK-norm, qwen2 with biases, else
  llama: the inverse of `llama_config_from_hf` up to dtype/param_dtype.

  Raises:
    UnsupportedCheckpointError: QK-norm and biases both (no such type).
  """
  if config.qk_norm and config.qkv_bias:
    raise UnsupportedCheckpointError(
        "no Hugging Face model_type has both QK-norm and query/key/value "
        "biases; export a config with one of them")
  kind = QWEN3 if config.qk_norm else QWEN2 if config.qkv_bias else LLAMA
  rope: dict[str, Any] = {"rope_type": "default",
                          "rope_theta": config.rope_theta}
  if config.rope_llama3_band is not None:
    rope.update(rope_type="llama3", factor=config.rope_scale,
                **dict(zip(_LLAMA3_KEYS, config.rope_llama3_band)))
  elif config.rope_scale != 1.0:
    rope.update(rope_type="linear", factor=config.rope_scale)
  return {
      "architectures": [ARCHITECTURES[kind]], "model_type": kind,
      "vocab_size": config.vocab_size, "hidden_size": config.emb_dim,
      "intermediate_size": config.mlp_dim,
      "num_hidden_layers": config.num_layers,
      "num_attention_heads": config.num_heads,
      "num_key_value_heads": config.num_kv_heads,
      "head_dim": config.head_dim, "hidden_act": "silu",
      "rope_parameters": rope, "rms_norm_eps": config.layer_norm_epsilon,
      "max_position_embeddings": config.max_len,
      "tie_word_embeddings": config.tie_embeddings,
      **({"attention_bias": False} if kind != QWEN2 else {}),
      **({"mlp_bias": False} if kind == LLAMA else
         {"use_sliding_window": False}),
      "dtype": str(jnp.dtype(config.param_dtype)),
  }


def save_llama(model: Any, directory: str, *,
               overwrite: bool = False) -> str:
  """Writes a Llama-layout `Model` as an HF `LlamaForCausalLM`,
  `Qwen3ForCausalLM` or `Qwen2ForCausalLM` directory (config.json + model.safetensors, and the
  tokenizer files its `tokens.BpeVocabulary` was read from), which
  transformers' `from_pretrained` and `load_llama` both read (the latter
  giving back the same config and bit-identical parameters).

  Raises:
    TypeError: not a Llama-layout model.
    MissingParameterError, ParameterShapeError: the parameters do not fit
      the config.
    FileExistsError: `directory` holds a checkpoint and not overwrite.
  """
  config = getattr(getattr(model, "definition", None), "config", None)
  if not isinstance(config, LlamaConfig):
    raise TypeError(f"save_llama exports Llama-layout models only; got "
                    f"config {type(config).__name__}")
  tensors = hf_files.export_tensors(LlamaDef(config), model.params, _hf_name)
  vocab = model.vocab
  files = vocab.files() if isinstance(vocab, tokens.BpeVocabulary) else None
  return hf_files.write_directory(directory, tensors,
                                  hf_config_from_llama(config), overwrite,
                                  files)
