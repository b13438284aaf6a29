"""Flax T5 (v1.0 and v1.1) encoder-decoder behind the `ModelDef` contract.

The parameter tree has T5X's names and layouts, so a T5X checkpoint loads as
it is once its `target/` prefix is stripped:

  token_embedder/embedding                          [V, D]
  encoder/relpos_bias/rel_embedding                 [N, R]
  encoder/layers_{i}/pre_attention_layer_norm/scale [D]
  encoder/layers_{i}/attention/{query,key,value}/kernel  [D, N*H]
  encoder/layers_{i}/attention/out/kernel           [N*H, D]
  encoder/layers_{i}/pre_mlp_layer_norm/scale       [D]
  encoder/layers_{i}/mlp/wi/kernel                  [D, F]  (or wi_0, wi_1)
  encoder/layers_{i}/mlp/wo/kernel                  [F, D]
  encoder/encoder_norm/scale                        [D]
  decoder/relpos_bias/rel_embedding                 [N, R]
  decoder/layers_{i}/pre_self_attention_layer_norm, self_attention,
      pre_cross_attention_layer_norm, encoder_decoder_attention,
      pre_mlp_layer_norm, mlp                       (as above)
  decoder/decoder_norm/scale                        [D]
  decoder/logits_dense/kernel                       [D, V]  (untied only)

Decoding. `prefill` runs the encoder once and stores, per decoder layer, the
cross-attention keys/values of the encoder output, plus the encoder padding
mask; the decoder self-attention cache has one slot per decoder position.
`extend` scatters the keys/values of its K tokens into their slots, then a
query at position t attends to slots j <= t with the relative position bias
of (t - j). Nothing else tracks a length, so rollback is free.

Dimension letters: B batch, L encoder length, T decoder tokens fed now,
S decoder cache slots, D embed, N heads, H head dim, F mlp hidden,
V vocabulary, R relative-position buckets.

Cache logical axes (`cache_logical_axes`): keys [B, N, H, S or L] are
(`cache_batch`, `cache_heads`, `cache_kv`, `cache_sequence`), values
[B, N, S or L, H] (`cache_batch`, `cache_heads`, `cache_sequence`,
`cache_kv`), see `layers.KVCache`; the encoder mask [B, L] is
(`cache_batch`, `cache_sequence`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from specdec_jax.models import layers
# The half every encoder-decoder shares, and its names as `t5.X`.
from specdec_jax.models.encoder_decoder import cache_logical_axes  # noqa: F401  (public)
from specdec_jax.models.encoder_decoder import DecoderStack
from specdec_jax.models.encoder_decoder import EncoderDecoderDef
from specdec_jax.models.encoder_decoder import EncoderDecoderModule
from specdec_jax.models.encoder_decoder import T5Cache  # noqa: F401  (public)


@dataclasses.dataclass(frozen=True)
class T5Config:
  """T5 architecture hyperparameters (T5X's names).

  Attributes:
    vocab_size: V (32128 for the public checkpoints).
    emb_dim: D.
    num_heads: N.
    num_encoder_layers: encoder depth.
    num_decoder_layers: decoder depth.
    head_dim: H.
    mlp_dim: F.
    mlp_activations: ('relu',) for T5 v1.0, ('gelu', 'linear') for v1.1.
    logits_via_embedding: tied output layer (v1.0); the decoder output is
      then scaled by emb_dim**-0.5 before the tied projection. False means a
      separate `logits_dense` kernel and no scaling (v1.1).
    relative_attention_num_buckets: R.
    relative_attention_max_distance: distance sharing the last bucket.
    dtype: compute dtype of activations ('float32', 'bfloat16').
    param_dtype: dtype of the parameters.
    max_input_len: longest encoder input accepted.
    layer_norm_epsilon: RMS norm epsilon.
  """

  vocab_size: int
  emb_dim: int = 512
  num_heads: int = 8
  num_encoder_layers: int = 6
  num_decoder_layers: int = 6
  head_dim: int = 64
  mlp_dim: int = 2048
  mlp_activations: tuple[str, ...] = ("relu",)
  logits_via_embedding: bool = False
  relative_attention_num_buckets: int = 32
  relative_attention_max_distance: int = 128
  dtype: str = "float32"
  param_dtype: str = "float32"
  max_input_len: int = 512
  layer_norm_epsilon: float = 1e-6

  def __post_init__(self):
    # Gin and JSON hand over lists; a tuple keeps the config hashable.
    object.__setattr__(self, "mlp_activations", tuple(self.mlp_activations))
    for name in self.mlp_activations:
      layers.activation(name)  # raises on an unknown name


def _common(cfg: T5Config) -> dict[str, Any]:
  return dict(dtype=cfg.dtype, param_dtype=cfg.param_dtype)


def _attention(cfg: T5Config) -> layers.MultiHeadAttention:
  return layers.MultiHeadAttention(
      num_heads=cfg.num_heads, head_dim=cfg.head_dim, out_features=cfg.emb_dim,
      **_common(cfg))


def _norm(cfg: T5Config) -> layers.RmsNorm:
  return layers.RmsNorm(epsilon=cfg.layer_norm_epsilon, **_common(cfg))


def _mlp(cfg: T5Config) -> layers.MlpBlock:
  return layers.MlpBlock(hidden_dim=cfg.mlp_dim,
                         activations=cfg.mlp_activations, **_common(cfg))


def _relpos(cfg: T5Config, bidirectional: bool) -> layers.RelativePositionBias:
  return layers.RelativePositionBias(
      num_heads=cfg.num_heads,
      num_buckets=cfg.relative_attention_num_buckets,
      max_distance=cfg.relative_attention_max_distance,
      bidirectional=bidirectional, **_common(cfg))


class EncoderLayer(nn.Module):
  """Pre-norm self-attention + MLP block of the encoder."""

  config: T5Config

  def setup(self):
    self.pre_attention_layer_norm = _norm(self.config)
    self.attention = _attention(self.config)
    self.pre_mlp_layer_norm = _norm(self.config)
    self.mlp = _mlp(self.config)

  def __call__(self, x: jax.Array, bias: jax.Array) -> jax.Array:
    """x [B, L, D], bias [B, N, L, L] -> [B, L, D]."""
    h = self.pre_attention_layer_norm(x)
    kv = layers.KVCache.from_projection(*self.attention.project_kv(h))
    x = x + self.attention(h, kv, bias)
    return x + self.mlp(self.pre_mlp_layer_norm(x))


class Encoder(nn.Module):
  """Token embedding, encoder layers, final norm."""

  config: T5Config
  embedder: layers.Embed

  def setup(self):
    cfg = self.config
    self.relpos_bias = _relpos(cfg, bidirectional=True)
    self.layers = [EncoderLayer(cfg) for _ in range(cfg.num_encoder_layers)]
    self.encoder_norm = _norm(cfg)

  def __call__(self, input_ids: jax.Array) -> jax.Array:
    """int [B, L] (0 = padding) -> encoded [B, L, D]."""
    length = input_ids.shape[1]
    pos = jnp.arange(length)[None, :]
    # Only padding KEYS are masked (as HF does): outputs at padding positions
    # are then finite and equal HF's, and nothing downstream reads them.
    bias = self.relpos_bias(pos, pos) + layers.padding_bias(input_ids > 0)
    x = self.embedder(input_ids)
    for layer in self.layers:
      x = layer(x, bias)
    return layers.constrain(self.encoder_norm(x), "batch", "length", "embed")


class DecoderLayer(nn.Module):
  """Pre-norm causal self-attention, cross-attention and MLP block."""

  config: T5Config

  def setup(self):
    cfg = self.config
    self.pre_self_attention_layer_norm = _norm(cfg)
    self.self_attention = _attention(cfg)
    self.pre_cross_attention_layer_norm = _norm(cfg)
    self.encoder_decoder_attention = _attention(cfg)
    self.pre_mlp_layer_norm = _norm(cfg)
    self.mlp = _mlp(cfg)

  def cross_kv(self, encoded: jax.Array) -> layers.KVCache:
    """encoded [B, L, D] -> cross-attention keys/values (cache layout)."""
    return layers.KVCache.from_projection(
        *self.encoder_decoder_attention.project_kv(encoded))

  def __call__(self, x, positions, self_bias, cross, cross_bias, cache):
    """One decoder layer.

    Args:
      x: [B, T, D].
      positions: int [B, T], the cache slots of the T tokens (their
        decoder positions, except for the nodes of a token tree).
      self_bias: float32 [B, N, T, S] (S = T when uncached).
      cross: KVCache of the encoder output (L positions).
      cross_bias: float32 [B, 1, 1, L].
      cache: KVCache of S slots, or None to attend to the T tokens only.

    Returns:
      ([B, T, D], the updated cache or None).
    """
    h = self.pre_self_attention_layer_norm(x)
    k, v = self.self_attention.project_kv(h)
    if cache is not None:
      cache = cache.write(k, v, positions)
      kv = cache
    else:
      kv = layers.KVCache.from_projection(k, v)
    x = x + self.self_attention(h, kv, self_bias)
    h = self.pre_cross_attention_layer_norm(x)
    x = x + self.encoder_decoder_attention(h, cross, cross_bias)
    return x + self.mlp(self.pre_mlp_layer_norm(x)), cache


class Decoder(DecoderStack):
  """Token embedding, decoder layers, final norm and output layer."""

  config: T5Config
  embedder: layers.Embed

  def setup(self):
    cfg = self.config
    self.relpos_bias = _relpos(cfg, bidirectional=False)
    self.layers = [DecoderLayer(cfg) for _ in range(cfg.num_decoder_layers)]
    self.decoder_norm = _norm(cfg)
    if not cfg.logits_via_embedding:
      # float32 so the logits keep full precision under bfloat16 compute.
      self.logits_dense = layers.DenseGeneral(
          cfg.vocab_size, kernel_axes=("embed", "vocab"), dtype="float32",
          param_dtype=cfg.param_dtype)

  def __call__(self, tokens, positions, cross, encoder_mask, cache,
               tree=None):
    """Runs the decoder on T tokens per row (`DecoderStack`); without a
    cache the keys are the tokens themselves at `positions`."""
    cfg = self.config
    uncached = cache is None
    key_pos, mask = layers.attention_bias(
        positions, None if uncached else cache[0].length, tree)
    if uncached:
      cache = (None,) * len(self.layers)
    self_bias = self.relpos_bias(positions, key_pos) + mask
    cross_bias = layers.padding_bias(encoder_mask)
    slots = positions if tree is None else tree.slots
    y = self.embedder(tokens)
    new_cache = []
    for layer, layer_cross, layer_cache in zip(self.layers, cross, cache):
      y, layer_cache = layer(y, slots, self_bias, layer_cross, cross_bias,
                             layer_cache)
      new_cache.append(layer_cache)
    y = self.decoder_norm(y).astype(jnp.float32)
    if cfg.logits_via_embedding:
      logits = self.embedder.attend(y * cfg.emb_dim**-0.5)
    else:
      logits = self.logits_dense(y)
    logits = layers.constrain(logits, "batch", "length", "vocab")
    return logits, None if uncached else tuple(new_cache)


class T5Transformer(EncoderDecoderModule):
  """The T5 encoder-decoder (the shared body, `EncoderDecoderModule`), its
  embedding shared by the encoder and the decoder."""

  config: T5Config

  def setup(self):
    cfg = self.config
    self.token_embedder = layers.Embed(cfg.vocab_size, cfg.emb_dim,
                                       **_common(cfg))
    self.encoder = Encoder(cfg, self.token_embedder)
    self.decoder = Decoder(cfg, self.token_embedder)


@dataclasses.dataclass(frozen=True)
class T5Def(EncoderDecoderDef):
  """`ModelDef` for T5: a hashable definition; parameters travel separately.

  Attributes:
    config: the architecture.
  """

  module_class = T5Transformer
  config: T5Config

  def decoder_kv_shape(self) -> tuple[int, int, int]:
    """(decoder layers, heads, head dim) of the self-attention cache."""
    cfg = self.config
    return cfg.num_decoder_layers, cfg.num_heads, cfg.head_dim
