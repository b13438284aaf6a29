"""What every encoder-decoder here shares (T5 in `t5.py`, T5Gemma in
`t5gemma.py`): the module's body (`EncoderDecoderModule`: encode, the
cross-attention keys/values, the cached decoder, the teacher-forced pass),
the decoding cache (`T5Cache`: the decoder's self-attention keys/values by
position, the cross-attention keys/values of the encoder output, the
encoder padding mask) with its logical axes, and the `ModelDef` half
(`EncoderDecoderDef`: prefill encodes once, extend runs the cached
decoder, copy_slots moves a token tree's accepted path).

Dimension letters: B batch, L encoder length, S decoder cache slots.
"""

from __future__ import annotations

from typing import Any, ClassVar

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp

from specdec_jax.decoding import protocol
from specdec_jax.decoding.protocol import Prefill
from specdec_jax.models import base
from specdec_jax.models import layers

P = jax.sharding.PartitionSpec
PAD_ID = 0  # input padding, for T5 and T5Gemma alike


class DecoderStack(nn.Module):
  """The decoder of an `EncoderDecoderModule`: `layers`, each with
  `cross_kv(encoded)`, and a `__call__(tokens, positions, cross,
  encoder_mask, cache, tree=None)` that runs it on T tokens per row:

    tokens: int [B, T].
    positions: int [B, T], their decoder positions.
    cross: per layer, KVCache of the encoder output.
    encoder_mask: bool [B, L].
    cache: per layer, KVCache of S slots; None for a plain causal pass over
      the T tokens (teacher forcing).
    tree: None, or a `protocol.TreeMask`: the T tokens are tree nodes
      written at its slots, seeing what it says.

  and returns (float32 logits [B, T, V], the updated caches or None).
  """

  def cross_kv(self, encoded: jax.Array) -> tuple[layers.KVCache, ...]:
    """Per layer, the keys/values of the encoder output [B, L, D]."""
    return tuple(layer.cross_kv(encoded) for layer in self.layers)


class EncoderDecoderModule(nn.Module):
  """The body of an encoder-decoder: a subclass's `setup` makes `encoder`
  (int [B, L] -> [B, L, D]) and `decoder` (`cross_kv(encoded)` and a cached
  `__call__(tokens, positions, cross, encoder_mask, cache, tree)`);
  `__call__` here is the uncached teacher-forced pass."""

  def encode(self, input_ids):
    return self.encoder(input_ids)

  def cross_kv(self, encoded):
    return self.decoder.cross_kv(encoded)

  def decode(self, tokens, positions, cross, encoder_mask, cache, tree=None):
    return self.decoder(tokens, positions, cross, encoder_mask, cache, tree)

  def __call__(self, input_ids: jax.Array,
               decoder_input_ids: jax.Array) -> jax.Array:
    """int [B, L], int [B, T] -> float32 logits [B, T, V]."""
    encoded = self.encode(input_ids)
    positions = jnp.broadcast_to(jnp.arange(decoder_input_ids.shape[1]),
                                 decoder_input_ids.shape)
    logits, _ = self.decode(decoder_input_ids, positions,
                            self.cross_kv(encoded), input_ids != PAD_ID,
                            None)
    return logits


@flax.struct.dataclass
class T5Cache:
  """Decoder state between `extend` calls.

  Attributes:
    self_attention: per decoder layer, keys/values by position (S slots).
    cross_attention: per decoder layer, keys/values of the encoder output
      (L positions), computed once in `prefill`.
    encoder_mask: bool [B, L], True on real (non-padding) input tokens.
  """

  self_attention: tuple[layers.KVCache, ...]
  cross_attention: tuple[layers.KVCache, ...]
  encoder_mask: jax.Array


def cache_logical_axes(cache: T5Cache) -> T5Cache:
  """The logical axis names of every leaf of `cache`, as PartitionSpecs."""
  kv = layers.KVCache.logical_axes()
  return T5Cache(
      self_attention=tuple(kv for _ in cache.self_attention),
      cross_attention=tuple(kv for _ in cache.cross_attention),
      encoder_mask=P("cache_batch", "cache_sequence"))


class EncoderDecoderDef(base.FlaxModelDef):
  """The `ModelDef` half every encoder-decoder here shares (T5, and T5Gemma
  in `t5gemma.py`): its module has `encode`, `cross_kv`, `decode` and
  `__call__`, and its cache is a `T5Cache`. A subclass is a frozen dataclass
  with a `config` that sets `module_class`, `start_id` (the decoder's first
  token) and defines `decoder_kv_shape() -> (decoder layers, key/value
  heads, head dim)`, the shape of its self-attention cache."""

  family = protocol.ENCODER_DECODER
  num_init_inputs = 2
  start_id: ClassVar[int] = 0

  @property
  def max_input_len(self) -> int | None:
    return self.config.max_input_len

  def cache_logical_axes(self, cache: T5Cache) -> T5Cache:
    return cache_logical_axes(cache)

  def encode(self, params: Any, input_ids: jax.Array) -> jax.Array:
    """int [B, L] -> encoder output [B, L, D] (compute dtype)."""
    return self._apply(params, input_ids, method=self.module_class.encode)

  def forward(self, params: Any, input_ids: jax.Array,
              decoder_input_ids: jax.Array) -> jax.Array:
    """Uncached teacher-forced pass: float32 logits [B, T, V]."""
    return self._apply(params, input_ids, decoder_input_ids,
                       method=self.module_class.__call__)

  def prefill(self, params: Any, input_ids: jax.Array,
              num_decode_positions: int) -> Prefill:
    """Encodes the inputs and allocates a cache of num_decode_positions + 1.

    Args:
      params: the parameter tree.
      input_ids: int [B, L], 0-padded on the right.
      num_decode_positions: decoder positions after the start token.

    Returns:
      `Prefill` with start_token `start_id` at start_pos 0.
    """
    cfg = self.config
    batch, length = input_ids.shape
    if length > cfg.max_input_len:
      raise ValueError(
          f"input length {length} exceeds max_input_len={cfg.max_input_len}; "
          f"truncate the inputs or raise {type(cfg).__name__}.max_input_len")
    encoded = self.encode(params, input_ids)
    cross = self._apply(params, encoded, method=self.module_class.cross_kv)
    num_layers, heads, head_dim = self.decoder_kv_shape()
    cache = T5Cache(
        self_attention=tuple(
            layers.KVCache.zeros(batch, num_decode_positions + 1, heads,
                                 head_dim, cfg.dtype)
            for _ in range(num_layers)),
        cross_attention=cross,
        encoder_mask=input_ids > 0)
    cache = base.constrain_cache(cache, cache_logical_axes(cache))
    return Prefill(cache=cache,
                   start_token=jnp.full((batch,), self.start_id, jnp.int32),
                   start_pos=jnp.zeros((batch,), jnp.int32))

  def extend(self, params: Any, cache: T5Cache, tokens: jax.Array,
             positions: jax.Array,
             tree: Any = None) -> tuple[jax.Array, T5Cache]:
    """Feeds tokens [B, K] at positions [B, K]; see `ModelDef.extend`."""
    logits, self_cache = self._apply(
        params, tokens, positions, cache.cross_attention, cache.encoder_mask,
        cache.self_attention, tree, method=self.module_class.decode)
    cache = cache.replace(self_attention=self_cache)
    return logits, base.constrain_cache(cache, cache_logical_axes(cache))

  def copy_slots(self, cache: T5Cache, src: jax.Array,
                 dst: jax.Array) -> T5Cache:
    """The decoder self-attention entries of slots `src` [B, D] copied to
    `dst` [B, D] (see `protocol`: a token tree's accepted path; a rotary
    key was rotated by its node's position, the one it moves to)."""
    cache = cache.replace(self_attention=tuple(
        kv.copy_slots(src, dst) for kv in cache.self_attention))
    return base.constrain_cache(cache, cache_logical_axes(cache))
