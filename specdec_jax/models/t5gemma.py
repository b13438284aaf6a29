"""T5Gemma (arXiv 2504.06225): Gemma 2 blocks as an encoder-decoder, behind
the `ModelDef` contract.

The architecture is transformers' `T5GemmaForConditionalGeneration`
(models/t5gemma/modeling_t5gemma.py, transformers 5.24): an encoder of
bidirectional Gemma 2 layers and a decoder of causal Gemma 2 layers with a
cross-attention sub-layer, each sub-layer wrapped in an RMS norm before and
after it (Gemma's norm: x / rms(x) * (1 + scale)); grouped-query attention
with rotary position embeddings (not on cross-attention); logits scaled by
query_pre_attn_scalar**-0.5 and soft-capped, tanh(x / c) * c; GeGLU MLPs
(tanh GELU gate times a linear branch); layers alternating sliding-window
(even indices) and global (odd) attention; token embeddings multiplied by
sqrt(d) on the way in; the output layer tied to the decoder's embedding,
its logits soft-capped. The encoder and the decoder have embeddings of
their own (9B-2B's stacks differ in width). Decoder start = BOS (2),
EOS 1, pad 0.

Sliding windows. A decoder query at position t sees keys at positions j
with t - W < j <= t; an encoder query at i sees keys at |i - j| <= W (both
exactly as transformers masks them). In the decoder the window is one more
mask on the position-addressed cache (`layers.attention_bias`), so every
layer keeps S slots and rollback, chunks and token trees work as for T5:
the cache does not shrink to W, the attention is exact.

The parameter tree:

  encoder/token_embedder/embedding                     [V, E]
  encoder/layers_{i}/{pre,post}_attention_norm/scale   [E]
  encoder/layers_{i}/attention/query/kernel            [E, N*H]
  encoder/layers_{i}/attention/{key,value}/kernel      [E, K*H]
  encoder/layers_{i}/attention/out/kernel              [N*H, E]
  encoder/layers_{i}/{pre,post}_mlp_norm/scale         [E]
  encoder/layers_{i}/mlp/{wi_0 (gate), wi_1 (up)}/kernel [E, F], mlp/wo [F, E]
  encoder/encoder_norm/scale                           [E]
  decoder/token_embedder/embedding                     [V, D] (also the output)
  decoder/layers_{i}/{pre,post}_self_attention_norm, self_attention,
      {pre,post}_cross_attention_norm, encoder_decoder_attention (key and
      value kernels [E, K*H]), {pre,post}_mlp_norm, mlp  (as above, over D)
  decoder/decoder_norm/scale                           [D]

Dimension letters: B batch, L encoder length, T tokens fed now, S decoder
cache slots (or keys), E encoder embed, D decoder embed, N query heads,
K key/value heads, G query heads per key/value head (N = K * G), H head
dim, F mlp hidden, V vocabulary.

Logical axes as for T5 (`layers`): kernels (`embed`, `joined_kv`) and
(`joined_kv`, `embed`), norms (`embed`,), embeddings (`vocab`, `embed`);
caches (`encoder_decoder.cache_logical_axes`, the same `T5Cache` pytree) with K as
`cache_heads`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp

from specdec_jax.models import gemma_layers
from specdec_jax.models import layers
from specdec_jax.models.gemma_layers import GLOBAL, SLIDING  # noqa: F401
from specdec_jax.models.gemma_layers import window_bias
from specdec_jax.models.encoder_decoder import DecoderStack
from specdec_jax.models.encoder_decoder import EncoderDecoderDef
from specdec_jax.models.encoder_decoder import EncoderDecoderModule

PAD_ID, EOS_ID, BOS_ID = 0, 1, 2


@dataclasses.dataclass(frozen=True)
class StackConfig:
  """One Gemma 2 stack (the encoder or the decoder) of a T5Gemma.

  Attributes:
    emb_dim: width (E for the encoder, D for the decoder).
    num_layers: depth.
    num_heads: N.
    num_kv_heads: K (N must be a multiple).
    head_dim: H.
    mlp_dim: F.
    query_pre_attn_scalar: attention logits are scaled by its -1/2 power.
    attn_logit_softcapping: c of tanh(x / c) * c on attention logits, or
      None.
    sliding_window: W of the sliding layers (None: every layer global).
    layer_types: per layer SLIDING or GLOBAL; None: transformers' default,
      sliding at even indices.
    rope_theta: rotary base.
    layer_norm_epsilon: RMS norm epsilon.
  """

  emb_dim: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  mlp_dim: int
  query_pre_attn_scalar: float = 256.0
  attn_logit_softcapping: float | None = 50.0
  sliding_window: int | None = 4096
  layer_types: tuple[str, ...] | None = None
  rope_theta: float = 10000.0
  layer_norm_epsilon: float = 1e-6

  def __post_init__(self):
    types = self.layer_types
    if types is None:
      types = tuple(SLIDING if i % 2 == 0 else GLOBAL
                    for i in range(self.num_layers))
    types = gemma_layers.check_layer_types(types, self.num_layers,
                                           self.sliding_window)
    if self.num_heads % self.num_kv_heads:
      raise ValueError(f"num_heads={self.num_heads} is not a multiple of "
                       f"num_kv_heads={self.num_kv_heads}")
    object.__setattr__(self, "layer_types", types)


@dataclasses.dataclass(frozen=True)
class T5GemmaConfig:
  """T5Gemma hyperparameters: two stacks and what they share.

  Attributes:
    vocab_size: V (256000 for the published checkpoints).
    encoder: the encoder stack (a StackConfig, or a dict of its fields as
      gin files and config.json hold them).
    decoder: the decoder stack.
    final_logit_softcapping: c of tanh(x / c) * c on the logits, or None.
    dtype: compute dtype of activations.
    param_dtype: dtype of the parameters.
    max_input_len: longest encoder input accepted.
  """

  vocab_size: int
  encoder: StackConfig
  decoder: StackConfig
  final_logit_softcapping: float | None = 30.0
  dtype: str = "float32"
  param_dtype: str = "float32"
  max_input_len: int = 8192

  def __post_init__(self):
    for name in ("encoder", "decoder"):
      stack = getattr(self, name)
      if isinstance(stack, Mapping):
        object.__setattr__(self, name, StackConfig(**stack))


def _common(cfg: T5GemmaConfig) -> dict[str, Any]:
  return dict(dtype=cfg.dtype, param_dtype=cfg.param_dtype)


def _norm(cfg: T5GemmaConfig, stack: StackConfig) -> gemma_layers.GemmaNorm:
  return gemma_layers.GemmaNorm(epsilon=stack.layer_norm_epsilon,
                                **_common(cfg))


def _attention(cfg: T5GemmaConfig, stack: StackConfig,
               rotary: bool = True) -> gemma_layers.Attention:
  """Gemma 2 attention: soft-capped logits, no QK-norm, one rotary base
  (none on cross-attention)."""
  return gemma_layers.Attention(
      num_heads=stack.num_heads, num_kv_heads=stack.num_kv_heads,
      head_dim=stack.head_dim, out_features=stack.emb_dim,
      query_pre_attn_scalar=stack.query_pre_attn_scalar,
      softcap=stack.attn_logit_softcapping,
      rotary=gemma_layers.Rotary(stack.rope_theta) if rotary else None,
      **_common(cfg))


def _mlp(cfg: T5GemmaConfig, stack: StackConfig) -> layers.MlpBlock:
  # GeGLU: wi_0 is transformers' gate_proj (tanh GELU), wi_1 its up_proj.
  return layers.MlpBlock(hidden_dim=stack.mlp_dim,
                         activations=("gelu", "linear"), **_common(cfg))


def _embedder(cfg: T5GemmaConfig, stack: StackConfig) -> layers.Embed:
  return layers.Embed(cfg.vocab_size, stack.emb_dim, **_common(cfg))


class EncoderLayer(nn.Module):
  """Bidirectional attention and MLP, each between two norms."""

  config: T5GemmaConfig

  def setup(self):
    cfg, s = self.config, self.config.encoder
    self.pre_attention_norm = _norm(cfg, s)
    self.attention = _attention(cfg, s)
    self.post_attention_norm = _norm(cfg, s)
    self.pre_mlp_norm = _norm(cfg, s)
    self.mlp = _mlp(cfg, s)
    self.post_mlp_norm = _norm(cfg, s)

  def __call__(self, x, positions, bias):
    """x [B, L, E], positions [1, L], bias [B, 1, L, L] -> [B, L, E]."""
    h = self.pre_attention_norm(x)
    kv = layers.KVCache.from_projection(
        *self.attention.project_kv(h, positions))
    x = x + self.post_attention_norm(self.attention(h, positions, kv, bias))
    return x + self.post_mlp_norm(self.mlp(self.pre_mlp_norm(x)))


class Encoder(nn.Module):
  """Embedding (times sqrt(E)), encoder layers, final norm."""

  config: T5GemmaConfig

  def setup(self):
    cfg = self.config
    self.token_embedder = _embedder(cfg, cfg.encoder)
    self.layers = [EncoderLayer(cfg) for _ in range(cfg.encoder.num_layers)]
    self.encoder_norm = _norm(cfg, cfg.encoder)

  def __call__(self, input_ids: jax.Array) -> jax.Array:
    """int [B, L] (0 = padding) -> encoded [B, L, E]."""
    s = self.config.encoder
    pos = jnp.arange(input_ids.shape[1])[None, :]
    # Only padding KEYS are masked (as transformers does).
    bias = layers.padding_bias(input_ids != PAD_ID)
    sliding = (bias if s.sliding_window is None
               else bias + window_bias(pos, pos, s.sliding_window, False))
    x = gemma_layers.embed(self.token_embedder, input_ids, s.emb_dim, self.config.dtype)
    for layer, kind in zip(self.layers, s.layer_types):
      x = layer(x, pos, sliding if kind == SLIDING else bias)
    return layers.constrain(self.encoder_norm(x), "batch", "length", "embed")


class DecoderLayer(nn.Module):
  """Causal self-attention, cross-attention and MLP, each between norms."""

  config: T5GemmaConfig

  def setup(self):
    cfg, s = self.config, self.config.decoder
    self.pre_self_attention_norm = _norm(cfg, s)
    self.self_attention = _attention(cfg, s)
    self.post_self_attention_norm = _norm(cfg, s)
    self.pre_cross_attention_norm = _norm(cfg, s)
    self.encoder_decoder_attention = _attention(cfg, s, rotary=False)
    self.post_cross_attention_norm = _norm(cfg, s)
    self.pre_mlp_norm = _norm(cfg, s)
    self.mlp = _mlp(cfg, s)
    self.post_mlp_norm = _norm(cfg, s)

  def cross_kv(self, encoded: jax.Array) -> layers.KVCache:
    """encoded [B, L, E] -> cross-attention keys/values (cache layout)."""
    return layers.KVCache.from_projection(
        *self.encoder_decoder_attention.project_kv(encoded, None))

  def __call__(self, x, positions, slots, self_bias, cross, cross_bias,
               cache):
    """One decoder layer on x [B, T, D]: ([B, T, D], the updated cache or
    None), as T5's, except that the T tokens rotate by their decoder
    `positions` [B, T] and are written at their cache `slots` [B, T] (the
    positions, but for a token tree's nodes), and `self_bias` is
    float32 [B, 1, T, S]: one mask for every head."""
    h = self.pre_self_attention_norm(x)
    k, v = self.self_attention.project_kv(h, positions)
    if cache is not None:
      cache = cache.write(k, v, slots)
      kv = cache
    else:
      kv = layers.KVCache.from_projection(k, v)
    x = x + self.post_self_attention_norm(
        self.self_attention(h, positions, kv, self_bias))
    h = self.pre_cross_attention_norm(x)
    x = x + self.post_cross_attention_norm(
        self.encoder_decoder_attention(h, None, cross, cross_bias))
    return x + self.post_mlp_norm(self.mlp(self.pre_mlp_norm(x))), cache


class Decoder(DecoderStack):
  """Embedding (times sqrt(D)), decoder layers, final norm, tied output
  layer with soft-capped logits."""

  config: T5GemmaConfig

  def setup(self):
    cfg = self.config
    self.token_embedder = _embedder(cfg, cfg.decoder)
    self.layers = [DecoderLayer(cfg) for _ in range(cfg.decoder.num_layers)]
    self.decoder_norm = _norm(cfg, cfg.decoder)

  def __call__(self, tokens, positions, cross, encoder_mask, cache,
               tree=None):
    """Runs the decoder on T tokens per row (`DecoderStack`)."""
    cfg, s = self.config, self.config.decoder
    uncached = cache is None
    key_pos, mask = layers.attention_bias(
        positions, None if uncached else cache[0].length, tree)
    sliding = (mask if s.sliding_window is None else
               mask + window_bias(positions, key_pos, s.sliding_window, True))
    if uncached:
      cache = (None,) * len(self.layers)
    cross_bias = layers.padding_bias(encoder_mask)
    slots = positions if tree is None else tree.slots
    y = gemma_layers.embed(self.token_embedder, tokens, s.emb_dim, cfg.dtype)
    new_cache = []
    for layer, kind, layer_cross, layer_cache in zip(
        self.layers, s.layer_types, cross, cache):
      y, layer_cache = layer(y, positions, slots,
                             sliding if kind == SLIDING else mask,
                             layer_cross, cross_bias, layer_cache)
      new_cache.append(layer_cache)
    y = self.decoder_norm(y)
    logits = gemma_layers.softcap(self.token_embedder.attend(y),
                                  cfg.final_logit_softcapping)
    logits = layers.constrain(logits, "batch", "length", "vocab")
    return logits, None if uncached else tuple(new_cache)


class T5GemmaTransformer(EncoderDecoderModule):
  """The encoder-decoder (the shared body, `EncoderDecoderModule`): two
  stacks, each with its own embedding."""

  config: T5GemmaConfig

  def setup(self):
    self.encoder = Encoder(self.config)
    self.decoder = Decoder(self.config)


@dataclasses.dataclass(frozen=True)
class T5GemmaDef(EncoderDecoderDef):
  """`ModelDef` for T5Gemma: a hashable definition; parameters travel
  separately.

  Attributes:
    config: the architecture.
  """

  module_class = T5GemmaTransformer
  start_id = BOS_ID
  config: T5GemmaConfig

  def decoder_kv_shape(self) -> tuple[int, int, int]:
    """(decoder layers, key/value heads, head dim): GQA's cache."""
    s = self.config.decoder
    return s.num_layers, s.num_kv_heads, s.head_dim
