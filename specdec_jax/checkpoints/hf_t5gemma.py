"""Hugging Face `T5GemmaForConditionalGeneration` checkpoints: load, export.

`load_t5gemma` reads an HF T5Gemma directory (config.json with nested
`encoder` and `decoder` configs; model.safetensors or sharded safetensors
with model.safetensors.index.json; float32 or bfloat16) into our
`models.t5gemma` (`load_model("hf:DIR")` also reads Gemma's
tokenizer.model there, when there is one, as the Model's vocabulary);
`save_t5gemma` writes one of our T5Gemma `Model`s back (its exact
inverse). Files are read and gs:// directories fetched by the same
machinery as T5's (`checkpoints.hf`): one tensor at a time, each
transposed and cast before the next is read.

Name mapping (HF Linear weights [out, in] are transposed to [in, out]):
  model.X.embed_tokens.weight [V, d]       -> X/token_embedder/embedding
  model.X.norm.weight                      -> X/{X}_norm/scale
  model.X.layers.i.self_attn.{q,k,v,o}_proj
      -> X/layers_i/{attention (encoder), self_attention (decoder)}/
         {query,key,value,out}/kernel
  model.decoder.layers.i.cross_attn.{q,k,v,o}_proj
      -> decoder/layers_i/encoder_decoder_attention/...
  model.X.layers.i.{pre,post}_self_attn_layernorm
      -> X/layers_i/{pre,post}_{attention|self_attention}_norm/scale
  model.decoder.layers.i.{pre,post}_cross_attn_layernorm
      -> decoder/layers_i/{pre,post}_cross_attention_norm/scale
  model.X.layers.i.{pre,post}_feedforward_layernorm -> {pre,post}_mlp_norm
  model.X.layers.i.mlp.{gate,up,down}_proj -> X/layers_i/mlp/{wi_0,wi_1,wo}
  lm_head.out_proj.weight: tied to model.decoder.embed_tokens.weight (every
      published T5Gemma); `save_pretrained` leaves it out. A checkpoint
      whose lm_head differs from the embedding is refused.
The query/key/value kernels [d, heads*H] hold heads outer, as HF's
projections viewed as (heads, H) do, so no reshaping is needed.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

from specdec_jax.checkpoints import hf
from specdec_jax.checkpoints import hf_files
from specdec_jax.checkpoints.errors import UnsupportedCheckpointError
from specdec_jax.models import t5gemma
from specdec_jax.models.t5gemma import StackConfig, T5GemmaConfig, T5GemmaDef

MODEL_TYPE = "t5gemma"
ARCHITECTURE = "T5GemmaForConditionalGeneration"
LM_HEAD = "lm_head.out_proj.weight"
TOKENIZER_FILE = "tokenizer.model"  # Gemma's SentencePiece model
# transformers' names of the tanh-approximated GELU (the GeGLU gate).
_TANH_GELU = ("gelu_pytorch_tanh", "gelu_new")

# Our sub-module -> HF's, per stack.
_SUBLAYERS = {
    "attention": "self_attn",
    "self_attention": "self_attn",
    "encoder_decoder_attention": "cross_attn",
    "pre_attention_norm": "pre_self_attn_layernorm",
    "post_attention_norm": "post_self_attn_layernorm",
    "pre_self_attention_norm": "pre_self_attn_layernorm",
    "post_self_attention_norm": "post_self_attn_layernorm",
    "pre_cross_attention_norm": "pre_cross_attn_layernorm",
    "post_cross_attention_norm": "post_cross_attn_layernorm",
    "pre_mlp_norm": "pre_feedforward_layernorm",
    "post_mlp_norm": "post_feedforward_layernorm",
    "mlp": "mlp",
}
_LEAVES = {"query": "q_proj", "key": "k_proj", "value": "v_proj",
           "out": "o_proj", "wi_0": "gate_proj", "wi_1": "up_proj",
           "wo": "down_proj"}


def _stack_from_hf(hf_stack: dict[str, Any], where: str) -> StackConfig:
  activation = hf_stack.get("hidden_activation", "gelu_pytorch_tanh")
  rope = hf_stack.get("rope_parameters") or {}
  if activation not in _TANH_GELU:
    raise UnsupportedCheckpointError(
        f"{where}: hidden_activation {activation!r} is not supported; "
        f"T5Gemma's MLP gate is the tanh GELU ({', '.join(_TANH_GELU)})")
  if rope.get("rope_type", "default") != "default" or hf_stack.get(
      "rope_scaling"):
    raise UnsupportedCheckpointError(
        f"{where}: only default rotary embeddings are supported, not "
        f"{rope or hf_stack.get('rope_scaling')}")
  if hf_stack.get("attention_bias"):
    raise UnsupportedCheckpointError(
        f"{where}: attention_bias is true; T5Gemma's projections have none")
  return StackConfig(
      emb_dim=hf_stack.get("hidden_size", 2304),
      num_layers=hf_stack.get("num_hidden_layers", 26),
      num_heads=hf_stack.get("num_attention_heads", 8),
      num_kv_heads=hf_stack.get("num_key_value_heads", 4),
      head_dim=hf_stack.get("head_dim", 256),
      mlp_dim=hf_stack.get("intermediate_size", 9216),
      query_pre_attn_scalar=float(hf_stack.get("query_pre_attn_scalar", 256)),
      attn_logit_softcapping=hf_stack.get("attn_logit_softcapping", 50.0),
      sliding_window=hf_stack.get("sliding_window", 4096),
      layer_types=hf_stack.get("layer_types"),
      rope_theta=float(rope.get("rope_theta",
                                hf_stack.get("rope_theta", 10000.0))),
      layer_norm_epsilon=hf_stack.get("rms_norm_eps", 1e-6))


def t5gemma_config_from_hf(hf_config: dict[str, Any], *,
                           dtype: str = "float32",
                           param_dtype: str = "float32") -> T5GemmaConfig:
  """Our T5GemmaConfig for an HF T5Gemma config dict (config.json)."""
  encoder, decoder = hf_config.get("encoder"), hf_config.get("decoder")
  if not isinstance(encoder, dict) or not isinstance(decoder, dict):
    raise UnsupportedCheckpointError(
        "a T5Gemma config.json needs nested 'encoder' and 'decoder' configs")
  vocab = {hf_config.get("vocab_size"), encoder.get("vocab_size"),
           decoder.get("vocab_size")} - {None}
  if len(vocab) != 1:
    raise UnsupportedCheckpointError(
        f"encoder and decoder vocabularies differ ({sorted(vocab)}); one "
        "vocabulary is needed")
  return T5GemmaConfig(
      vocab_size=vocab.pop(),
      encoder=_stack_from_hf(encoder, "encoder"),
      decoder=_stack_from_hf(decoder, "decoder"),
      final_logit_softcapping=decoder.get("final_logit_softcapping", 30.0),
      dtype=dtype, param_dtype=param_dtype,
      max_input_len=encoder.get("max_position_embeddings", 8192))


def _hf_name(path: tuple[str, ...]) -> tuple[str, bool]:
  """(HF tensor name, transpose) of one of our parameter paths."""
  stack = path[0]
  if path[1] == "token_embedder":
    return f"model.{stack}.embed_tokens.weight", False
  if path[1] in ("encoder_norm", "decoder_norm"):
    return f"model.{stack}.norm.weight", False
  layer = f"model.{stack}.layers.{int(path[1].removeprefix('layers_'))}"
  module = _SUBLAYERS[path[2]]
  if module.endswith("layernorm"):
    return f"{layer}.{module}.weight", False
  return f"{layer}.{module}.{_LEAVES[path[3]]}.weight", True


def load_t5gemma(path: str, *, dtype: str = "float32",
                 param_dtype: str = "float32") -> tuple[T5GemmaConfig, Any]:
  """Loads an HF T5GemmaForConditionalGeneration directory.

  Args:
    path: directory with config.json and the weights, local or gs:// (then
      fetched into a temporary directory first, as `hf.load_t5` does).
    dtype: compute dtype of the returned config.
    param_dtype: dtype of the returned parameters.

  Returns:
    (T5GemmaConfig, parameter tree of numpy arrays).

  Raises:
    CheckpointNotFoundError: missing directory, config or weights.
    UnsupportedCheckpointError: not a T5Gemma, or a variant we cannot run
      (another activation or rotary scheme, an untied output layer).
    MissingParameterError, ParameterShapeError: the weights do not fit.
  """
  with hf.local_directory(path) as local:
    return _load_local(local, dtype, param_dtype)


def _read_config(path: str) -> dict[str, Any]:
  hf_config, config_file = hf_files.read_config(path, (MODEL_TYPE,),
                                                "load_t5gemma")
  architectures = hf_config.get("architectures") or [ARCHITECTURE]
  if ARCHITECTURE not in architectures:
    raise UnsupportedCheckpointError(
        f"{config_file}: model_type={hf_config.get('model_type')!r}, "
        f"architectures={architectures}; load_t5gemma reads model_type "
        f"{MODEL_TYPE!r} with {ARCHITECTURE} (hf.load_t5 reads T5)")
  return hf_config


def _load_local(path: str, dtype: str,
                param_dtype: str) -> tuple[T5GemmaConfig, Any]:
  config = t5gemma_config_from_hf(_read_config(path), dtype=dtype,
                                  param_dtype=param_dtype)
  tensors = hf.Tensors(path)
  embedding = "model.decoder.embed_tokens.weight"
  if LM_HEAD in tensors and embedding in tensors and not np.array_equal(
      tensors.get(LM_HEAD), tensors.get(embedding)):
    raise UnsupportedCheckpointError(
        f"{path}: {LM_HEAD} differs from {embedding}; T5Gemma ties them "
        "(tie_word_embeddings) and an untied output layer is not supported")
  params: dict[str, Any] = {}
  for ours, shape_dtype in hf.tree_paths(
      T5GemmaDef(config).param_shapes()):
    name, transpose = _hf_name(ours)
    value = hf.convert_tensor(
        tensors, name, ours, shape_dtype.shape, transpose, param_dtype, None)
    hf.set_path(params, ours, value)
  return config, params


# --- Export: our T5Gemma -> a Hugging Face directory. ---


def _stack_to_hf(stack: StackConfig, vocab: int, final_cap) -> dict:
  return {
      "model_type": "t5_gemma_module",
      "vocab_size": vocab,
      "hidden_size": stack.emb_dim,
      "intermediate_size": stack.mlp_dim,
      "num_hidden_layers": stack.num_layers,
      "num_attention_heads": stack.num_heads,
      "num_key_value_heads": stack.num_kv_heads,
      "head_dim": stack.head_dim,
      "hidden_activation": "gelu_pytorch_tanh",
      # transformers' config declares an int (and refuses a float).
      "query_pre_attn_scalar": (int(stack.query_pre_attn_scalar)
                                if float(stack.query_pre_attn_scalar)
                                .is_integer()
                                else stack.query_pre_attn_scalar),
      "attn_logit_softcapping": stack.attn_logit_softcapping,
      "final_logit_softcapping": final_cap,
      "sliding_window": stack.sliding_window,
      "layer_types": list(stack.layer_types),
      "rope_parameters": {"rope_type": "default",
                          "rope_theta": stack.rope_theta},
      "rms_norm_eps": stack.layer_norm_epsilon,
      "attention_bias": False,
      "pad_token_id": t5gemma.PAD_ID, "eos_token_id": t5gemma.EOS_ID,
      "bos_token_id": t5gemma.BOS_ID,
      "tie_word_embeddings": True,
      # transformers' defaults, written as its save_pretrained writes them.
      "attention_dropout": 0.0, "dropout_rate": 0.0,
      "initializer_range": 0.02, "use_cache": True,
  }


def hf_config_from_t5gemma(config: T5GemmaConfig) -> dict[str, Any]:
  """The HF config.json dict of one of our T5GemmaConfigs (the inverse of
  `t5gemma_config_from_hf` up to dtype/param_dtype)."""
  encoder = _stack_to_hf(config.encoder, config.vocab_size,
                         config.final_logit_softcapping)
  encoder["max_position_embeddings"] = config.max_input_len
  decoder = _stack_to_hf(config.decoder, config.vocab_size,
                         config.final_logit_softcapping)
  decoder["max_position_embeddings"] = config.max_input_len
  decoder["cross_attention_hidden_size"] = config.encoder.emb_dim
  encoder["is_decoder"], decoder["is_decoder"] = False, True
  return {
      "architectures": [ARCHITECTURE], "model_type": MODEL_TYPE,
      "encoder": encoder, "decoder": decoder,
      "vocab_size": config.vocab_size, "is_encoder_decoder": True,
      "tie_word_embeddings": True, "dropout_rate": 0.0,
      "attention_dropout": 0.0, "classifier_dropout_rate": 0.0,
      "initializer_range": 0.02,
      "pad_token_id": t5gemma.PAD_ID, "eos_token_id": t5gemma.EOS_ID,
      "bos_token_id": t5gemma.BOS_ID,
      "decoder_start_token_id": t5gemma.BOS_ID,
      "dtype": str(jnp.dtype(config.param_dtype)),
  }


def save_t5gemma(model: Any, directory: str, *,
                 overwrite: bool = False) -> str:
  """Writes a T5Gemma `Model` as an HF T5GemmaForConditionalGeneration
  directory (config.json + model.safetensors), which transformers'
  `from_pretrained` and `load_t5gemma` both read (the latter giving back
  the same config and bit-identical parameters).

  Raises:
    TypeError: not a T5Gemma model.
    CheckpointError, MissingParameterError, ParameterShapeError: the
      parameters do not fit the config (`hf_io.export_tensors`).
    FileExistsError: `directory` holds a checkpoint and not overwrite.
  """
  config = getattr(getattr(model, "definition", None), "config", None)
  if not isinstance(config, T5GemmaConfig):
    raise TypeError(f"save_t5gemma exports T5Gemma models only; got config "
                    f"{type(config).__name__} (hf.save_t5 exports T5)")
  tensors = hf_files.export_tensors(T5GemmaDef(config), model.params,
                                    _hf_name)
  return hf_files.write_directory(directory, tensors,
                                  hf_config_from_t5gemma(config), overwrite)
