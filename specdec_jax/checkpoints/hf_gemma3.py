"""Hugging Face Gemma 3 checkpoints: load the text model, export ours.

`load_gemma3` reads an HF directory into our `models.gemma3`:
  * model_type `gemma3_text` (`Gemma3ForCausalLM`: 270M, 1B, and the text
    models written by transformers), or
  * model_type `gemma3` (`Gemma3ForConditionalGeneration`: 4B, 12B, 27B),
    whose text tower it reads; the vision tower and its projector are
    skipped, and a log line says how many tensors that leaves unread.
Weights are model.safetensors or shards with model.safetensors.index.json,
float32 or bfloat16, read one tensor at a time (`hf.Tensors`), local or
gs:// (`hf.local_directory`). `load_model("hf:DIR")` also reads the
SentencePiece tokenizer.model next to the weights as the Model's
vocabulary. `save_gemma3` writes one of our Gemma 3 `Model`s as a
`gemma3_text` directory (its exact inverse).

config.json. The Hub's configs, written by transformers 4, give the rotary
settings as `rope_theta` (global), `rope_local_base_freq` and
`rope_scaling` (the global layers' linear factor), and the 4B-27B ones
leave most text fields to Gemma3TextConfig's defaults; transformers 5
writes `rope_parameters` per layer type. Both are read, with the same
defaults.

Name mapping (HF Linear weights [out, in] are transposed to [in, out]);
P is `model.` (gemma3_text), `language_model.model.` (gemma3 as the Hub
holds it) or `model.language_model.` (gemma3 written by transformers 5):
  P embed_tokens.weight [V, D]           -> decoder/token_embedder/embedding
  P norm.weight                          -> decoder/decoder_norm/scale
  P layers.i.self_attn.{q,k,v,o}_proj    -> decoder/layers_i/self_attention/
                                            {query,key,value,out}/kernel
  P layers.i.self_attn.{q,k}_norm        -> .../self_attention/
                                            {query,key}_norm/scale
  P layers.i.input_layernorm             -> .../pre_self_attention_norm
  P layers.i.post_attention_layernorm    -> .../post_self_attention_norm
  P layers.i.{pre,post}_feedforward_layernorm -> .../{pre,post}_mlp_norm
  P layers.i.mlp.{gate,up,down}_proj     -> .../mlp/{wi_0,wi_1,wo}/kernel
  lm_head.weight: tied to the embedding; absent, or equal to it (an
      untied one is refused).
"""

from __future__ import annotations

import logging
import os
from typing import Any

import jax.numpy as jnp
import numpy as np

from specdec_jax.checkpoints import hf
from specdec_jax.checkpoints import hf_files
from specdec_jax.checkpoints.errors import MissingParameterError
from specdec_jax.checkpoints.errors import UnsupportedCheckpointError
from specdec_jax.models import gemma3
from specdec_jax.models.gemma3 import Gemma3Config, Gemma3Def
from specdec_jax.models.gemma_layers import GLOBAL, SLIDING

TEXT_TYPE, MULTIMODAL_TYPE = "gemma3_text", "gemma3"
MODEL_TYPES = (TEXT_TYPE, MULTIMODAL_TYPE)
ARCHITECTURE = "Gemma3ForCausalLM"
TOKENIZER_FILE = "tokenizer.model"
# Where each kind keeps its text model's tensors (the first that holds the
# embedding is used).
_PREFIXES = {TEXT_TYPE: ("model.",),
             MULTIMODAL_TYPE: ("language_model.model.",
                               "model.language_model.")}
_LM_HEADS = ("lm_head.weight", "language_model.lm_head.weight")
_TANH_GELU = ("gelu_pytorch_tanh", "gelu_new")
_SUBLAYERS = {
    "pre_self_attention_norm": "input_layernorm",
    "post_self_attention_norm": "post_attention_layernorm",
    "pre_mlp_norm": "pre_feedforward_layernorm",
    "post_mlp_norm": "post_feedforward_layernorm",
    "self_attention": "self_attn",
    "mlp": "mlp",
}
LEAVES = {"query": "q_proj", "key": "k_proj", "value": "v_proj",
           "out": "o_proj", "query_norm": "q_norm", "key_norm": "k_norm",
           "wi_0": "gate_proj", "wi_1": "up_proj", "wo": "down_proj"}
# transformers' Gemma3TextConfig defaults, which the Hub's 4B-27B configs
# rely on.
_DEFAULTS = dict(vocab_size=262_208, hidden_size=2304, intermediate_size=9216,
                 num_hidden_layers=26, num_attention_heads=8,
                 num_key_value_heads=4, head_dim=256,
                 query_pre_attn_scalar=256, sliding_window=4096,
                 max_position_embeddings=131_072, rms_norm_eps=1e-6)


def _rotary(text: dict[str, Any], where: str) -> dict[str, float]:
  """Our rope_theta, rope_scale, rope_local_theta from either format."""
  params = text.get("rope_parameters")
  if isinstance(params, dict) and GLOBAL in params:
    glob, local = params.get(GLOBAL) or {}, params.get(SLIDING) or {}
  else:  # transformers 4: flat fields
    glob = dict(text.get("rope_scaling") or {},
                rope_theta=text.get("rope_theta", 1_000_000.0))
    local = {"rope_theta": text.get("rope_local_base_freq", 10_000.0)}
  kinds = (glob.get("rope_type", glob.get("type", "default")),
           local.get("rope_type", "default"))
  if kinds[0] not in ("default", "linear") or kinds[1] != "default":
    raise UnsupportedCheckpointError(
        f"{where}: rotary embeddings {kinds} are not supported; Gemma 3's "
        "global layers are default or linearly scaled, its local ones "
        "default")
  return dict(rope_theta=float(glob.get("rope_theta", 1_000_000.0)),
              rope_scale=float(glob.get("factor", 1.0))
              if kinds[0] == "linear" else 1.0,
              rope_local_theta=float(local.get("rope_theta", 10_000.0)))


def gemma3_config_from_hf(hf_config: dict[str, Any], *,
                          dtype: str = "float32",
                          param_dtype: str = "float32",
                          where: str = "config.json") -> Gemma3Config:
  """Our Gemma3Config for an HF config dict (gemma3_text, or gemma3 whose
  `text_config` is read)."""
  text = hf_config
  if hf_config.get("model_type") == MULTIMODAL_TYPE:
    text = hf_config.get("text_config") or {}
  text = dict(_DEFAULTS, **text)
  activation = text.get("hidden_activation") or text.get(
      "hidden_act", "gelu_pytorch_tanh")
  if activation not in _TANH_GELU:
    raise UnsupportedCheckpointError(
        f"{where}: hidden_activation {activation!r} is not supported; "
        f"Gemma 3's MLP gate is the tanh GELU ({', '.join(_TANH_GELU)})")
  if text.get("attention_bias") or text.get("use_bidirectional_attention"):
    raise UnsupportedCheckpointError(
        f"{where}: attention_bias or use_bidirectional_attention is set; "
        "Gemma 3's causal language model has neither")
  layers = text["num_hidden_layers"]
  types = text.get("layer_types")
  if types is None:
    pattern = text.get("sliding_window_pattern", gemma3.PATTERN)
    types = [GLOBAL if (i + 1) % pattern == 0 else SLIDING
             for i in range(layers)]
  return Gemma3Config(
      vocab_size=text["vocab_size"], emb_dim=text["hidden_size"],
      num_layers=layers, num_heads=text["num_attention_heads"],
      num_kv_heads=text["num_key_value_heads"], head_dim=text["head_dim"],
      mlp_dim=text["intermediate_size"],
      query_pre_attn_scalar=float(text["query_pre_attn_scalar"]),
      sliding_window=text["sliding_window"], layer_types=tuple(types),
      attn_logit_softcapping=text.get("attn_logit_softcapping"),
      final_logit_softcapping=text.get("final_logit_softcapping"),
      layer_norm_epsilon=text["rms_norm_eps"], dtype=dtype,
      param_dtype=param_dtype, max_len=text["max_position_embeddings"],
      **_rotary(text, where))


def _hf_name(path: tuple[str, ...], prefix: str = "model."
             ) -> tuple[str, bool]:
  """(HF tensor name, transpose) of one of our parameter paths."""
  if path[1] == "token_embedder":
    return f"{prefix}embed_tokens.weight", False
  if path[1] == "decoder_norm":
    return f"{prefix}norm.weight", False
  layer = f"{prefix}layers.{int(path[1].removeprefix('layers_'))}"
  module = _SUBLAYERS[path[2]]
  if module.endswith("layernorm"):
    return f"{layer}.{module}.weight", False
  leaf = LEAVES[path[3]]
  return f"{layer}.{module}.{leaf}.weight", not leaf.endswith("_norm")


def load_gemma3(path: str, *, dtype: str = "float32",
                param_dtype: str = "float32") -> tuple[Gemma3Config, Any]:
  """Loads an HF Gemma 3 directory (its text model).

  Args:
    path: directory with config.json and the weights, local or gs:// (then
      fetched into a temporary directory first, as `hf.load_t5` does).
    dtype: compute dtype of the returned config.
    param_dtype: dtype of the returned parameters.

  Returns:
    (Gemma3Config, parameter tree of numpy arrays).

  Raises:
    CheckpointNotFoundError: missing directory, config or weights.
    UnsupportedCheckpointError: not a Gemma 3, or a variant we cannot run
      (another activation or rotary scheme, an untied output layer).
    MissingParameterError, ParameterShapeError: the weights do not fit.
  """
  with hf.local_directory(path) as local:
    return _load_local(local, path, dtype, param_dtype)


def _load_local(path: str, shown: str, dtype: str,
                param_dtype: str) -> tuple[Gemma3Config, Any]:
  hf_config, _ = hf_files.read_config(path, MODEL_TYPES, "load_gemma3")
  config = gemma3_config_from_hf(
      hf_config, dtype=dtype, param_dtype=param_dtype,
      where=os.path.join(shown, hf.CONFIG_FILE))
  tensors = hf.Tensors(path)
  kind = hf_config["model_type"]
  prefix = next((p for p in _PREFIXES[kind]
                 if f"{p}embed_tokens.weight" in tensors), None)
  if prefix is None:
    raise MissingParameterError(
        f"missing the token embedding in {shown!r}: expected one of "
        f"{[p + 'embed_tokens.weight' for p in _PREFIXES[kind]]}")
  embedding = f"{prefix}embed_tokens.weight"
  for head in _LM_HEADS:
    if head in tensors and not np.array_equal(tensors.get(head),
                                              tensors.get(embedding)):
      raise UnsupportedCheckpointError(
          f"{shown}: {head} differs from {embedding}; Gemma 3 ties them "
          "(tie_word_embeddings) and an untied output layer is not supported")
  params: dict[str, Any] = {}
  used = set()
  for ours, shape_dtype in hf.tree_paths(Gemma3Def(config).param_shapes()):
    name, transpose = _hf_name(ours, prefix)
    used.add(name)
    hf.set_path(params, ours, hf.convert_tensor(
        tensors, name, ours, shape_dtype.shape, transpose, param_dtype, None))
  if kind == MULTIMODAL_TYPE:
    skipped = [n for n in hf_files.tensor_names(path) if n not in used
               and n not in _LM_HEADS]
    logging.info(
        "%s is a Gemma 3 with a vision tower (model_type %r): read its text "
        "model (%d tensors) and skipped the %d tensors of the vision tower "
        "and its projector", shown, kind, len(used), len(skipped))
  return config, params


# --- Export: our Gemma 3 -> a Hugging Face gemma3_text directory. ---


def hf_config_from_gemma3(config: Gemma3Config) -> dict[str, Any]:
  """The HF config.json dict (transformers 5's gemma3_text format) of one
  of our Gemma3Configs: the inverse of `gemma3_config_from_hf` up to
  dtype/param_dtype."""
  glob = {"rope_type": "default", "rope_theta": config.rope_theta}
  if config.rope_scale != 1.0:
    glob.update(rope_type="linear", factor=config.rope_scale)
  scalar = config.query_pre_attn_scalar
  return {
      "architectures": [ARCHITECTURE], "model_type": TEXT_TYPE,
      "vocab_size": config.vocab_size, "hidden_size": config.emb_dim,
      "intermediate_size": config.mlp_dim,
      "num_hidden_layers": config.num_layers,
      "num_attention_heads": config.num_heads,
      "num_key_value_heads": config.num_kv_heads,
      "head_dim": config.head_dim,
      "hidden_activation": "gelu_pytorch_tanh",
      # transformers' config declares an int (and refuses a float).
      "query_pre_attn_scalar": int(scalar) if float(scalar).is_integer()
                               else scalar,
      "sliding_window": config.sliding_window,
      "layer_types": list(config.layer_types),
      "rope_parameters": {
          GLOBAL: glob,
          SLIDING: {"rope_type": "default",
                    "rope_theta": config.rope_local_theta}},
      "attn_logit_softcapping": config.attn_logit_softcapping,
      "final_logit_softcapping": config.final_logit_softcapping,
      "rms_norm_eps": config.layer_norm_epsilon,
      "max_position_embeddings": config.max_len,
      "attention_bias": False, "tie_word_embeddings": True,
      "pad_token_id": gemma3.PAD_ID, "eos_token_id": gemma3.EOS_ID,
      "bos_token_id": gemma3.BOS_ID,
      "dtype": str(jnp.dtype(config.param_dtype)),
  }


def save_gemma3(model: Any, directory: str, *,
                overwrite: bool = False) -> str:
  """Writes a Gemma 3 `Model` as an HF `Gemma3ForCausalLM` directory
  (config.json + model.safetensors), which transformers' `from_pretrained`
  and `load_gemma3` both read (the latter giving back the same config and
  bit-identical parameters). The vocabulary is not written.

  Raises:
    TypeError: not a Gemma 3 model.
    MissingParameterError, ParameterShapeError: the parameters do not fit
      the config.
    FileExistsError: `directory` holds a checkpoint and not overwrite.
  """
  config = getattr(getattr(model, "definition", None), "config", None)
  if not isinstance(config, Gemma3Config):
    raise TypeError(f"save_gemma3 exports Gemma 3 models only; got config "
                    f"{type(config).__name__}")
  tensors = hf_files.export_tensors(Gemma3Def(config), model.params,
                                    _hf_name)
  return hf_files.write_directory(directory, tensors,
                                  hf_config_from_gemma3(config), overwrite)
