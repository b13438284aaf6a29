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

from specdec_jax.models import layers
from specdec_jax.models.encoder_decoder import DecoderStack
from specdec_jax.models.encoder_decoder import EncoderDecoderDef
from specdec_jax.models.encoder_decoder import EncoderDecoderModule

PAD_ID, EOS_ID, BOS_ID = 0, 1, 2
SLIDING, GLOBAL = "sliding_attention", "full_attention"


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
    types = tuple(types)  # gin and JSON hand over lists
    if len(types) != self.num_layers or set(types) - {SLIDING, GLOBAL}:
      raise ValueError(
          f"layer_types must give {SLIDING!r} or {GLOBAL!r} for each of the "
          f"{self.num_layers} layers, got {types}")
    if self.sliding_window is None and SLIDING in types:
      raise ValueError("sliding layers need a sliding_window: set one, or "
                       f"make every layer {GLOBAL!r}")
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


def softcap(x: jax.Array, cap: float | None) -> jax.Array:
  """tanh(x / cap) * cap (Gemma 2's soft-capping); x itself for None."""
  return x if cap is None else jnp.tanh(x / cap) * cap


def rope(x: jax.Array, positions: jax.Array, theta: float) -> jax.Array:
  """Rotary embedding of x [B, T, N, H] at positions int [B, T] (or
  [1, T]): the two halves of H are rotated together (transformers'
  `rotate_half`), angles computed in float32."""
  half = x.shape[-1] // 2
  inv_freq = 1.0 / (theta ** (jnp.arange(0, 2 * half, 2, dtype=jnp.float32)
                              / (2 * half)))
  angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, T, H/2]
  angles = jnp.concatenate([angles, angles], -1)[:, :, None, :]
  cos, sin = jnp.cos(angles).astype(x.dtype), jnp.sin(angles).astype(x.dtype)
  rotated = jnp.concatenate([-x[..., half:], x[..., :half]], -1)
  return x * cos + rotated * sin


def window_bias(query_pos: jax.Array, key_pos: jax.Array, window: int,
                causal: bool) -> jax.Array:
  """float32 [B, 1, T, S] bias hiding keys outside a query's window:
  t - W < j (causal) or |t - j| <= W (bidirectional), as transformers."""
  distance = query_pos[:, None, :, None] - key_pos[:, None, None, :]
  inside = distance < window if causal else jnp.abs(distance) <= window
  return layers.mask_to_bias(inside)


class GemmaNorm(layers.RmsNorm):
  """Gemma's RMS norm: x / rms(x) * (1 + scale), in float32, scale init 0
  (T5's `layers.RmsNorm` multiplies by the scale itself, in the compute
  dtype; the fields are the same)."""

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    """[..., D] -> [..., D] in `dtype`."""
    y = layers.rms_normalize(x, self.epsilon)
    scale = layers._param(  # pylint: disable=protected-access
        self, "scale", nn.initializers.zeros, (x.shape[-1],),
        self.param_dtype, ("embed",))
    return (y * (1.0 + scale.astype(jnp.float32))).astype(self.dtype)


class Attention(nn.Module):
  """Grouped-query attention with rotary positions and soft-capped logits.

  Attributes:
    stack: the stack's config (heads, head dim, scalar, soft-cap).
    out_features: width of the output (the stack's).
    rotary: rotary embeddings on queries and keys (not cross-attention).
    dtype: compute dtype; logits and softmax are float32.
    param_dtype: dtype of the kernels.
  """

  stack: StackConfig
  out_features: int
  rotary: bool = True
  dtype: Any = "float32"
  param_dtype: Any = "float32"

  def setup(self):
    s = self.stack
    proj = lambda heads: layers.DenseGeneral(
        features=(heads, s.head_dim), kernel_axes=("embed", "joined_kv"),
        dtype=self.dtype, param_dtype=self.param_dtype)
    self.query = proj(s.num_heads)
    self.key = proj(s.num_kv_heads)
    self.value = proj(s.num_kv_heads)
    self.out = layers.DenseGeneral(
        features=self.out_features, axis=(-2, -1),
        kernel_axes=("joined_kv", "embed"), dtype=self.dtype,
        param_dtype=self.param_dtype)

  def project_kv(self, x: jax.Array, positions: jax.Array | None
                 ) -> tuple[jax.Array, jax.Array]:
    """x [B, S, D or E] -> (keys, values) [B, S, K, H]; keys rotated to
    `positions` [B, S] when rotary."""
    k = self.key(x)
    if self.rotary:
      k = rope(k, positions, self.stack.rope_theta)
    k = layers.constrain(k, "batch", "length", "heads", "kv")
    v = layers.constrain(self.value(x), "batch", "length", "heads", "kv")
    return k, v

  def __call__(self, x: jax.Array, positions: jax.Array | None,
               kv: layers.KVCache, bias: jax.Array) -> jax.Array:
    """Queries from x [B, T, D] at `positions` [B, T] attend to `kv`
    (keys [B, K, H, S], values [B, K, S, H]); bias float32 broadcastable
    to [B, 1, T, S] -> [B, T, D]."""
    s = self.stack
    q = self.query(x)
    if self.rotary:
      q = rope(q, positions, s.rope_theta)
    q = layers.constrain(q, "batch", "length", "heads", "kv")
    batch, length = q.shape[:2]
    groups = s.num_heads // s.num_kv_heads
    q = q.reshape(batch, length, s.num_kv_heads, groups, s.head_dim)
    logits = jnp.einsum("BTKGH,BKHS->BKGTS", q, kv.key.astype(self.dtype),
                        preferred_element_type=jnp.float32)
    logits = softcap(logits * s.query_pre_attn_scalar**-0.5,
                     s.attn_logit_softcapping)
    weights = jax.nn.softmax(logits + bias[:, :, None], axis=-1)
    out = jnp.einsum("BKGTS,BKSH->BTKGH", weights.astype(self.dtype),
                     kv.value.astype(self.dtype))
    out = out.reshape(batch, length, s.num_heads, s.head_dim)
    out = layers.constrain(out, "batch", "length", "heads", "kv")
    return layers.constrain(self.out(out), "batch", "length", "embed")


def _common(cfg: T5GemmaConfig) -> dict[str, Any]:
  return dict(dtype=cfg.dtype, param_dtype=cfg.param_dtype)


def _norm(cfg: T5GemmaConfig, stack: StackConfig) -> GemmaNorm:
  return GemmaNorm(epsilon=stack.layer_norm_epsilon, **_common(cfg))


def _mlp(cfg: T5GemmaConfig, stack: StackConfig) -> layers.MlpBlock:
  # GeGLU: wi_0 is transformers' gate_proj (tanh GELU), wi_1 its up_proj.
  return layers.MlpBlock(hidden_dim=stack.mlp_dim,
                         activations=("gelu", "linear"), **_common(cfg))


def _embedder(cfg: T5GemmaConfig, stack: StackConfig) -> layers.Embed:
  return layers.Embed(cfg.vocab_size, stack.emb_dim, **_common(cfg))


def _embed(embedder: layers.Embed, ids: jax.Array, width: int, dtype):
  """Embedding times sqrt(width), the factor rounded to the compute dtype
  as transformers rounds it."""
  return embedder(ids) * jnp.asarray(width**0.5, dtype)


class EncoderLayer(nn.Module):
  """Bidirectional attention and MLP, each between two norms."""

  config: T5GemmaConfig

  def setup(self):
    cfg, s = self.config, self.config.encoder
    self.pre_attention_norm = _norm(cfg, s)
    self.attention = Attention(s, s.emb_dim, **_common(cfg))
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
    x = _embed(self.token_embedder, input_ids, s.emb_dim, self.config.dtype)
    for layer, kind in zip(self.layers, s.layer_types):
      x = layer(x, pos, sliding if kind == SLIDING else bias)
    return layers.constrain(self.encoder_norm(x), "batch", "length", "embed")


class DecoderLayer(nn.Module):
  """Causal self-attention, cross-attention and MLP, each between norms."""

  config: T5GemmaConfig

  def setup(self):
    cfg, s = self.config, self.config.decoder
    self.pre_self_attention_norm = _norm(cfg, s)
    self.self_attention = Attention(s, s.emb_dim, **_common(cfg))
    self.post_self_attention_norm = _norm(cfg, s)
    self.pre_cross_attention_norm = _norm(cfg, s)
    self.encoder_decoder_attention = Attention(s, s.emb_dim, rotary=False,
                                               **_common(cfg))
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
    y = _embed(self.token_embedder, tokens, s.emb_dim, cfg.dtype)
    new_cache = []
    for layer, kind, layer_cross, layer_cache in zip(
        self.layers, s.layer_types, cross, cache):
      y, layer_cache = layer(y, positions, slots,
                             sliding if kind == SLIDING else mask,
                             layer_cross, cross_bias, layer_cache)
      new_cache.append(layer_cache)
    y = self.decoder_norm(y)
    logits = softcap(self.token_embedder.attend(y),
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
