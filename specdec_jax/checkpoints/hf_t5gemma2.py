"""Hugging Face `T5Gemma2ForConditionalGeneration` checkpoints: the text
model.

`load_t5gemma2` reads an HF T5Gemma 2 directory (config.json of
model_type `t5gemma2`, whose encoder holds a `text_config` and a vision
tower, and a decoder config; safetensors, sharded or not, float32 or
bfloat16; local or gs://) into our `models.t5gemma2`; the vision tower and
its projector are skipped, and a log line says so. The stacks' configs are
read as Gemma 3 text configs (`hf_gemma3.gemma3_config_from_hf`: either
rotary format, Gemma3TextConfig's defaults for what is left out).

Name mapping (Linear weights [out, in] transposed to [in, out]); E is
`model.encoder.` (as transformers 5 writes it) or
`model.encoder.text_model.`, D `model.decoder.`:
  E embed_tokens.weight [V, d]     -> token_embedder/embedding (also the
                                      decoder's and the output layer's)
  E embed_tokens.eoi_embedding [d] -> eoi_embedding
  E/D layers.i.self_attn.{q,k,v,o}_proj, {q,k}_norm
                                   -> {encoder,decoder}/layers_i/
                                      self_attention/...
  E/D layers.i.{pre,post}_self_attn_layernorm
                                   -> .../{pre,post}_self_attention_norm
  E/D layers.i.{pre,post}_feedforward_layernorm -> .../{pre,post}_mlp_norm
  E/D layers.i.mlp.{gate,up,down}_proj -> .../mlp/{wi_0,wi_1,wo}/kernel
  E/D norm.weight                  -> {encoder,decoder}/X_norm/scale
  D embed_tokens.*, lm_head.out_proj.weight: tied to the encoder's; a
      differing one is refused.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import numpy as np

from specdec_jax.checkpoints import hf
from specdec_jax.checkpoints import hf_files
from specdec_jax.checkpoints import hf_gemma3
from specdec_jax.checkpoints.errors import MissingParameterError
from specdec_jax.checkpoints.errors import UnsupportedCheckpointError
from specdec_jax.models import t5gemma2
from specdec_jax.models.t5gemma2 import T5Gemma2Config, T5Gemma2Def

MODEL_TYPE = "t5gemma2"
_ENCODER_PREFIXES = ("model.encoder.", "model.encoder.text_model.")
_DECODER = "model.decoder."
_SUBLAYERS = {
    "pre_self_attention_norm": "pre_self_attn_layernorm",
    "post_self_attention_norm": "post_self_attn_layernorm",
    "pre_mlp_norm": "pre_feedforward_layernorm",
    "post_mlp_norm": "post_feedforward_layernorm",
    "self_attention": "self_attn",
    "mlp": "mlp",
}


def t5gemma2_config_from_hf(hf_config: dict[str, Any], *,
                            dtype: str = "float32",
                            param_dtype: str = "float32",
                            where: str = "config.json") -> T5Gemma2Config:
  """Our T5Gemma2Config for an HF T5Gemma 2 config dict (config.json)."""
  encoder, decoder = hf_config.get("encoder"), hf_config.get("decoder")
  if not isinstance(encoder, dict) or not isinstance(decoder, dict):
    raise UnsupportedCheckpointError(
        f"{where}: a T5Gemma 2 config.json needs nested 'encoder' and "
        "'decoder' configs")
  text = encoder.get("text_config") or {}
  stacks = [hf_gemma3.gemma3_config_from_hf(
      {k: v for k, v in stack.items() if k != "model_type"}, dtype=dtype,
      param_dtype=param_dtype, where=f"{where} ({name})")
            for name, stack in (("encoder", text), ("decoder", decoder))]
  vocab = {s.vocab_size for s in stacks}
  if len(vocab) != 1:
    raise UnsupportedCheckpointError(
        f"{where}: encoder and decoder vocabularies differ ({sorted(vocab)})")
  eoi = hf_config.get("eoi_token_index", encoder.get("eoi_token_index",
                                                     t5gemma2.EOI_ID))
  return T5Gemma2Config(
      vocab_size=vocab.pop(), encoder=stacks[0], decoder=stacks[1],
      eoi_token_id=eoi, dtype=dtype, param_dtype=param_dtype,
      max_input_len=stacks[0].max_len)


def _hf_name(path: tuple[str, ...], encoder: str) -> tuple[str, bool]:
  """(HF tensor name, transpose) of one of our parameter paths."""
  if path[0] == "token_embedder":
    return f"{encoder}embed_tokens.weight", False
  if path[0] == "eoi_embedding":
    return f"{encoder}embed_tokens.eoi_embedding", False
  prefix = encoder if path[0] == "encoder" else _DECODER
  if path[1] in ("encoder_norm", "decoder_norm"):
    return f"{prefix}norm.weight", False
  layer = f"{prefix}layers.{int(path[1].removeprefix('layers_'))}"
  module = _SUBLAYERS[path[2]]
  if module.endswith("layernorm"):
    return f"{layer}.{module}.weight", False
  leaf = hf_gemma3.LEAVES[path[3]]
  return f"{layer}.{module}.{leaf}.weight", not leaf.endswith("_norm")


def load_t5gemma2(path: str, *, dtype: str = "float32",
                  param_dtype: str = "float32"
                  ) -> tuple[T5Gemma2Config, Any]:
  """Loads the text model of an HF T5Gemma2ForConditionalGeneration
  directory (local or gs://): (T5Gemma2Config, parameter tree of numpy
  arrays).

  Raises:
    CheckpointNotFoundError: missing directory, config or weights.
    UnsupportedCheckpointError: not a T5Gemma 2, or a variant we cannot run
      (another activation or rotary scheme, an untied output layer).
    MissingParameterError, ParameterShapeError: the weights do not fit.
  """
  with hf.local_directory(path) as local:
    hf_config, _ = hf_files.read_config(local, (MODEL_TYPE,),
                                        "load_t5gemma2")
    config = t5gemma2_config_from_hf(
        hf_config, dtype=dtype, param_dtype=param_dtype,
        where=os.path.join(path, hf.CONFIG_FILE))
    tensors = hf.Tensors(local)
    encoder = next((p for p in _ENCODER_PREFIXES
                    if f"{p}embed_tokens.weight" in tensors), None)
    if encoder is None:
      raise MissingParameterError(
          f"missing the token embedding in {path!r}: expected one of "
          f"{[p + 'embed_tokens.weight' for p in _ENCODER_PREFIXES]}")
    for name, tied in (
        (f"{_DECODER}embed_tokens.weight", f"{encoder}embed_tokens.weight"),
        ("lm_head.out_proj.weight", f"{encoder}embed_tokens.weight"),
        (f"{_DECODER}embed_tokens.eoi_embedding",
         f"{encoder}embed_tokens.eoi_embedding")):
      if name in tensors and not np.array_equal(tensors.get(name),
                                                tensors.get(tied)):
        raise UnsupportedCheckpointError(
            f"{path}: {name} differs from {tied}; T5Gemma 2 ties them and "
            "untied embeddings are not supported")
    params: dict[str, Any] = {}
    used = set()
    for ours, shape_dtype in hf.tree_paths(
        T5Gemma2Def(config).param_shapes()):
      name, transpose = _hf_name(ours, encoder)
      used.add(name)
      hf.set_path(params, ours, hf.convert_tensor(
          tensors, name, ours, shape_dtype.shape, transpose, param_dtype,
          None))
    skipped = [n for n in hf_files.tensor_names(local) if n not in used
               and not n.startswith((_DECODER + "embed_tokens", "lm_head"))]
    logging.info(
        "%s: read the text model of T5Gemma 2 (%d tensors) and skipped the "
        "%d tensors of the vision tower and its projector", path, len(used),
        len(skipped))
  return config, params
