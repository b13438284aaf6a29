"""T5Gemma 2, the text model: Gemma 3 blocks as an encoder-decoder, behind
the `ModelDef` contract.

The architecture is transformers' `T5Gemma2ForConditionalGeneration`
(models/t5gemma2, transformers 5.24) without its vision tower:
  * an encoder of bidirectional Gemma 3 layers (`gemma3.DecoderLayer`
    without a cache: QK-norm, local and global layers with their own
    rotary bases, the global ones linearly scaled) whose local layers see an
    uneven window: a query at i sees keys at i - (W+1)//2 < j <= i + W//2;
  * a decoder of causal Gemma 3 layers whose self-attention is merged with
    cross-attention: the encoder output goes through the SAME key and value
    projections (and key norm, no rotary), and one softmax runs over the
    decoder's own keys (windowed on local layers) and the encoder's
    (padding masked) together;
  * one embedding for the encoder, the decoder and the output layer, times
    sqrt(d) (the factor rounded to the parameters' dtype), with the
    end-of-image id (`eoi_token_id`, an image marker) embedded as a learnt
    vector of its own; logits optionally soft-capped.
Both stacks share the width and the vocabulary. Decoder start = BOS (2),
EOS 1, pad 0.

The parameter tree:

  token_embedder/embedding               [V, D] (encoder, decoder, output)
  eoi_embedding                          [D]
  encoder/layers_{i}/...                 as gemma3's decoder layers
  encoder/encoder_norm/scale             [D]
  decoder/layers_{i}/...                 as gemma3's decoder layers
  decoder/decoder_norm/scale             [D]

Dimension letters: B batch, L encoder length, T tokens fed now, S decoder
cache slots, D width, V vocabulary. Caches are `t5.T5Cache`s (the decoder's
self-attention keys, and per layer the encoder output's keys and values).
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp

from specdec_jax.models import gemma3
from specdec_jax.models import gemma_layers
from specdec_jax.models import layers
from specdec_jax.models.gemma3 import Gemma3Config
from specdec_jax.models.gemma_layers import SLIDING
from specdec_jax.models.t5 import EncoderDecoderDef

PAD_ID, EOS_ID, BOS_ID = 0, 1, 2
EOI_ID = 256_000  # <end_of_image> in Gemma 3's tokenizer


@dataclasses.dataclass(frozen=True)
class T5Gemma2Config:
  """T5Gemma 2 hyperparameters: two Gemma 3 stacks and what they share.

  Attributes:
    vocab_size: V (262144 for the published checkpoints).
    encoder: the encoder stack (a Gemma3Config, or a dict of its fields
      without vocab_size, dtype and param_dtype, which come from here).
    decoder: the decoder stack (its final_logit_softcapping is the
      output's).
    eoi_token_id: the id embedded as `eoi_embedding` (None: none is).
    dtype: compute dtype of activations.
    param_dtype: dtype of the parameters.
    max_input_len: longest encoder input accepted.
  """

  vocab_size: int
  encoder: Gemma3Config
  decoder: Gemma3Config
  eoi_token_id: int | None = EOI_ID
  dtype: str = "float32"
  param_dtype: str = "float32"
  max_input_len: int = 32768

  def __post_init__(self):
    shared = dict(vocab_size=self.vocab_size, dtype=self.dtype,
                  param_dtype=self.param_dtype)
    for name in ("encoder", "decoder"):
      stack = getattr(self, name)
      stack = (Gemma3Config(**{**stack, **shared}) if isinstance(
          stack, Mapping) else dataclasses.replace(stack, **shared))
      object.__setattr__(self, name, stack)
    if self.encoder.emb_dim != self.decoder.emb_dim:
      raise ValueError(
          f"T5Gemma 2's stacks share one width (and embedding): encoder "
          f"{self.encoder.emb_dim}, decoder {self.decoder.emb_dim}")

  @property
  def emb_dim(self) -> int:
    return self.decoder.emb_dim


def encoder_window_bias(positions: jax.Array, window: int) -> jax.Array:
  """float32 [1, 1, L, L] bias of the encoder's local layers: query i sees
  keys i - (W+1)//2 < j <= i + W//2, as transformers' T5Gemma 2 masks them
  (positions int [1, L])."""
  distance = positions[:, None, :, None] - positions[:, None, None, :]
  inside = (((distance >= 0) & (distance < (window + 1) // 2))
            | ((distance < 0) & (-distance < window // 2 + 1)))
  return layers.mask_to_bias(inside)


class Encoder(nn.Module):
  """Bidirectional Gemma 3 layers and the final norm."""

  config: Gemma3Config

  def setup(self):
    cfg = self.config
    self.layers = [gemma3.DecoderLayer(cfg, kind) for kind in cfg.layer_types]
    self.encoder_norm = gemma_layers.GemmaNorm(
        epsilon=cfg.layer_norm_epsilon, dtype=cfg.dtype,
        param_dtype=cfg.param_dtype)

  def __call__(self, x: jax.Array, mask: jax.Array) -> jax.Array:
    """x [B, L, D] embedded, mask bool [B, L] (False: padding) -> [B, L, D]."""
    cfg = self.config
    pos = jnp.arange(x.shape[1])[None, :]
    bias = layers.padding_bias(mask)  # only padding KEYS, as transformers
    sliding = (bias if cfg.sliding_window is None
               else bias + encoder_window_bias(pos, cfg.sliding_window))
    for layer, kind in zip(self.layers, cfg.layer_types):
      x, _ = layer(x, pos, pos, sliding if kind == SLIDING else bias, None)
    return layers.constrain(self.encoder_norm(x), "batch", "length", "embed")


class Decoder(nn.Module):
  """Causal Gemma 3 layers with merged attention, and the final norm."""

  config: Gemma3Config

  def setup(self):
    cfg = self.config
    self.layers = [gemma3.DecoderLayer(cfg, kind) for kind in cfg.layer_types]
    self.decoder_norm = gemma_layers.GemmaNorm(
        epsilon=cfg.layer_norm_epsilon, dtype=cfg.dtype,
        param_dtype=cfg.param_dtype)

  def cross_kv(self, encoded: jax.Array) -> tuple[layers.KVCache, ...]:
    return tuple(layer.cross_kv(encoded) for layer in self.layers)

  def __call__(self, y, positions, cross, encoder_mask, cache, tree=None):
    """y [B, T, D] embedded at `positions` [B, T]; cross: per layer the
    encoder output's keys/values, encoder_mask bool [B, L]; cache: per
    layer KVCache of S slots, or None -> ([B, T, D], caches or None)."""
    y, cache = gemma3.run_layers(self.config, self.layers, y, positions,
                                 cache, tree, cross,
                                 layers.padding_bias(encoder_mask))
    return self.decoder_norm(y), cache


class T5Gemma2Transformer(nn.Module):
  """The encoder-decoder; `__call__` is the uncached teacher-forced pass."""

  config: T5Gemma2Config

  def setup(self):
    cfg = self.config
    self.token_embedder = layers.Embed(cfg.vocab_size, cfg.emb_dim,
                                       dtype=cfg.dtype,
                                       param_dtype=cfg.param_dtype)
    self.eoi_embedding = layers._param(  # pylint: disable=protected-access
        self, "eoi_embedding", nn.initializers.zeros, (cfg.emb_dim,),
        cfg.param_dtype, ("embed",))
    self.encoder = Encoder(cfg.encoder)
    self.decoder = Decoder(cfg.decoder)

  def embed(self, ids: jax.Array) -> jax.Array:
    """int [B, T] -> [B, T, D]: the scaled embedding, `eoi_embedding` (not
    scaled) at the end-of-image id."""
    cfg = self.config
    x = gemma_layers.embed(self.token_embedder, ids, cfg.emb_dim, cfg.dtype,
                           round_to=cfg.param_dtype)
    if cfg.eoi_token_id is None:
      return x
    return jnp.where((ids == cfg.eoi_token_id)[..., None],
                     self.eoi_embedding.astype(cfg.dtype), x)

  def encode(self, input_ids):
    return self.encoder(self.embed(input_ids), input_ids != PAD_ID)

  def cross_kv(self, encoded):
    return self.decoder.cross_kv(encoded)

  def decode(self, tokens, positions, cross, encoder_mask, cache, tree=None):
    """float32 logits [B, T, V] (soft-capped as the decoder's config says)
    and the updated caches (or None)."""
    y, cache = self.decoder(self.embed(tokens), positions, cross,
                            encoder_mask, cache, tree)
    logits = gemma_layers.softcap(self.token_embedder.attend(y),
                                  self.config.decoder.final_logit_softcapping)
    return layers.constrain(logits, "batch", "length", "vocab"), cache

  def __call__(self, input_ids: jax.Array,
               decoder_input_ids: jax.Array) -> jax.Array:
    """int [B, L], int [B, T] -> float32 logits [B, T, V]."""
    encoded = self.encode(input_ids)
    positions = jnp.broadcast_to(jnp.arange(decoder_input_ids.shape[1]),
                                 decoder_input_ids.shape)
    logits, _ = self.decode(decoder_input_ids, positions,
                            self.cross_kv(encoded), input_ids != PAD_ID, None)
    return logits


@dataclasses.dataclass(frozen=True)
class T5Gemma2Def(EncoderDecoderDef):
  """`ModelDef` for T5Gemma 2: a hashable definition; parameters travel
  separately.

  Attributes:
    config: the architecture.
  """

  module_class = T5Gemma2Transformer
  start_id = BOS_ID
  config: T5Gemma2Config

  def decoder_kv_shape(self) -> tuple[int, int, int]:
    """(decoder layers, key/value heads, head dim): GQA's cache."""
    s = self.config.decoder
    return s.num_layers, s.num_kv_heads, s.head_dim
