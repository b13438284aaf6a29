"""A decoder-only GPT-like language model behind the `ModelDef` contract.

The paper's GPT-like models (97M target, 6M draft, lm1b) are plain
pre-layernorm decoder-only Transformers. This one is built from the same
blocks as T5 and uses T5X's decoder-only layout (t5x/examples/decoder_only),
so checkpoints of that T5X example load as they are:

  decoder/token_embedder/embedding                       [V, D]
  decoder/relpos_bias/rel_embedding                      [N, R]
  decoder/layers_{i}/pre_self_attention_layer_norm/scale [D]
  decoder/layers_{i}/self_attention/{query,key,value}/kernel  [D, N*H]
  decoder/layers_{i}/self_attention/out/kernel           [N*H, D]
  decoder/layers_{i}/pre_mlp_layer_norm/scale            [D]
  decoder/layers_{i}/mlp/wi/kernel [D, F] (or wi_0, wi_1), mlp/wo/kernel [F, D]
  decoder/decoder_norm/scale                             [D]
  decoder/logits_dense/kernel                            [D, V] (untied only)

Positions: T5 relative position biases (unidirectional, bucketed key-query
distance) rather than learned absolute or rotary embeddings. They depend on
positions only through differences, need no table sized to a maximum length,
and are exactly what the T5X decoder-only example trains. Norms are T5's RMS
norm, layers have no biases, and query scaling lives in the query kernel.

Decoding. `prefill` feeds the whole 0-padded prompt [B, L] at positions
0..L-1, filling slots 0..L-1 of every layer's cache. A row of l real
tokens (a prompt to continue, e.g. the lm1b tasks' first words, or a row
ending in EOS where a task asks for one) then starts at start_pos = l - 1
with its last real token; slots l..L-1 hold keys of padding, but a query
at position t only sees slots j <= t and every slot up to t is rewritten
with a real token before any query reaches it.

Dimension letters: B batch, L prompt length, T tokens fed now, S cache
slots, D embed, N heads, H head dim, F mlp hidden, V vocabulary,
R relative-position buckets.

Cache logical axes (`cache_logical_axes`): keys [B, N, H, S] are
(`cache_batch`, `cache_heads`, `cache_kv`, `cache_sequence`), values
[B, N, S, H] (`cache_batch`, `cache_heads`, `cache_sequence`, `cache_kv`),
see `layers.KVCache`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp

from specdec_jax.decoding import protocol
from specdec_jax.decoding.protocol import Prefill
from specdec_jax.models import base
from specdec_jax.models import layers


@dataclasses.dataclass(frozen=True)
class GPTConfig:
  """Decoder-only architecture hyperparameters (T5X decoder-only names).

  Attributes:
    vocab_size: V.
    emb_dim: D.
    num_heads: N.
    num_layers: depth.
    head_dim: H.
    mlp_dim: F.
    max_len: longest prompt accepted (`max_input_len`); relative positions
      impose no hard limit on the decoded length.
    mlp_activations: ('gelu',) by default, GPT's activation.
    logits_via_embedding: tied output layer, decoder output scaled by
      emb_dim**-0.5 first (as in T5X); False: separate `logits_dense`.
    relative_attention_num_buckets: R.
    relative_attention_max_distance: distance sharing the last bucket.
    dtype: compute dtype of activations.
    param_dtype: dtype of the parameters.
    layer_norm_epsilon: RMS norm epsilon.
  """

  vocab_size: int
  emb_dim: int = 512
  num_heads: int = 8
  num_layers: int = 6
  head_dim: int = 64
  mlp_dim: int = 2048
  max_len: int = 512
  mlp_activations: tuple[str, ...] = ("gelu",)
  logits_via_embedding: bool = False
  relative_attention_num_buckets: int = 32
  relative_attention_max_distance: int = 128
  dtype: str = "float32"
  param_dtype: str = "float32"
  layer_norm_epsilon: float = 1e-6

  def __post_init__(self):
    object.__setattr__(self, "mlp_activations", tuple(self.mlp_activations))
    for name in self.mlp_activations:
      layers.activation(name)  # raises on an unknown name


@flax.struct.dataclass
class GPTCache:
  """Decoder state between `extend` calls.

  Attributes:
    layers: per layer, keys/values of S slots by position (`layers.KVCache`).
  """

  layers: tuple[layers.KVCache, ...]


def cache_logical_axes(cache: GPTCache) -> GPTCache:
  """The logical axis names of every leaf of `cache`, as PartitionSpecs."""
  kv = layers.KVCache.logical_axes()
  return GPTCache(layers=tuple(kv for _ in cache.layers))


class DecoderLayer(nn.Module):
  """Pre-norm causal self-attention + MLP block."""

  config: GPTConfig

  def setup(self):
    cfg = self.config
    common = dict(dtype=cfg.dtype, param_dtype=cfg.param_dtype)
    self.pre_self_attention_layer_norm = layers.RmsNorm(
        epsilon=cfg.layer_norm_epsilon, **common)
    self.self_attention = layers.MultiHeadAttention(
        num_heads=cfg.num_heads, head_dim=cfg.head_dim,
        out_features=cfg.emb_dim, **common)
    self.pre_mlp_layer_norm = layers.RmsNorm(
        epsilon=cfg.layer_norm_epsilon, **common)
    self.mlp = layers.MlpBlock(hidden_dim=cfg.mlp_dim,
                               activations=cfg.mlp_activations, **common)

  def __call__(self, x, positions, bias, cache):
    """x [B, T, D], positions [B, T] (the cache slots written), bias
    [B, N, T, S], cache or None."""
    h = self.pre_self_attention_layer_norm(x)
    k, v = self.self_attention.project_kv(h)
    if cache is not None:
      cache = cache.write(k, v, positions)
      kv = cache
    else:
      kv = layers.KVCache.from_projection(k, v)
    x = x + self.self_attention(h, kv, bias)
    return x + self.mlp(self.pre_mlp_layer_norm(x)), cache


class Decoder(nn.Module):
  """Embedding, decoder layers, final norm and output layer."""

  config: GPTConfig

  def setup(self):
    cfg = self.config
    common = dict(dtype=cfg.dtype, param_dtype=cfg.param_dtype)
    self.token_embedder = layers.Embed(cfg.vocab_size, cfg.emb_dim, **common)
    self.relpos_bias = layers.RelativePositionBias(
        num_heads=cfg.num_heads,
        num_buckets=cfg.relative_attention_num_buckets,
        max_distance=cfg.relative_attention_max_distance,
        bidirectional=False, **common)
    self.layers = [DecoderLayer(cfg) for _ in range(cfg.num_layers)]
    self.decoder_norm = layers.RmsNorm(epsilon=cfg.layer_norm_epsilon,
                                       **common)
    if not cfg.logits_via_embedding:
      self.logits_dense = layers.DenseGeneral(
          cfg.vocab_size, kernel_axes=("embed", "vocab"), dtype="float32",
          param_dtype=cfg.param_dtype)

  def __call__(self, tokens, positions, cache, return_logits=True,
               tree=None):
    """Runs the decoder on T tokens per row.

    Args:
      tokens: int [B, T].
      positions: int [B, T], their positions.
      cache: per layer KVCache of S slots, or None for a plain causal
        pass over the T tokens.
      return_logits: False skips the output layer (prefill needs none).
      tree: None, or a `protocol.TreeMask`: the T tokens are tree nodes
        written at its slots, seeing what it says.

    Returns:
      (float32 logits [B, T, V] or None, the updated caches or None).
    """
    cfg = self.config
    key_pos, mask = layers.attention_bias(
        positions, None if cache is None else cache[0].length, tree)
    caches = (None,) * len(self.layers) if cache is None else cache
    bias = self.relpos_bias(positions, key_pos) + mask
    slots = positions if tree is None else tree.slots
    y = self.token_embedder(tokens)
    new_cache = []
    for layer, layer_cache in zip(self.layers, caches):
      y, layer_cache = layer(y, slots, bias, layer_cache)
      new_cache.append(layer_cache)
    new_cache = None if cache is None else tuple(new_cache)
    if not return_logits:
      return None, new_cache
    y = self.decoder_norm(y).astype(jnp.float32)
    if cfg.logits_via_embedding:
      logits = self.token_embedder.attend(y * cfg.emb_dim**-0.5)
    else:
      logits = self.logits_dense(y)
    return layers.constrain(logits, "batch", "length", "vocab"), new_cache


class DecoderOnlyTransformer(nn.Module):
  """Wrapper giving a decoder-only model T5X's `decoder/` name scope: one
  per family, whose subclass names its `decoder_class` (a module of the
  family's config whose `__call__` is `Decoder.__call__`'s)."""

  decoder_class: ClassVar[type]
  config: Any

  def setup(self):
    self.decoder = self.decoder_class(self.config)

  def decode(self, tokens, positions, cache, return_logits=True, tree=None):
    return self.decoder(tokens, positions, cache, return_logits, tree)

  def __call__(self, tokens: jax.Array) -> jax.Array:
    """Uncached causal pass: int [B, T] -> float32 logits [B, T, V]."""
    positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
    logits, _ = self.decoder(tokens, positions, None)
    return logits


class GPTTransformer(DecoderOnlyTransformer):
  """The GPT-like model under `decoder/`."""

  decoder_class = Decoder


class DecoderOnlyDef(base.FlaxModelDef):
  """The `ModelDef` half every decoder-only model here shares (the GPT-like
  model, and Gemma 3 in `gemma3.py`): its module has `decode(tokens,
  positions, cache, return_logits, tree)` and `__call__(tokens)`, its cache
  is a `GPTCache`, and its config a `max_len` (the longest prompt) and a
  `dtype`. A subclass is a frozen dataclass with a `config` that sets
  `module_class` and defines `kv_shape() -> (layers, key/value heads, head
  dim)`, the shape of its cache."""

  family = protocol.DECODER_ONLY
  num_init_inputs = 1

  @property
  def max_input_len(self) -> int | None:
    return self.config.max_len

  def cache_logical_axes(self, cache: GPTCache) -> GPTCache:
    return cache_logical_axes(cache)

  def forward(self, params: Any, tokens: jax.Array) -> jax.Array:
    """Uncached causal pass: int [B, T] -> float32 logits [B, T, V]."""
    return self._apply(params, tokens, method=self.module_class.__call__)

  def prefill(self, params: Any, input_ids: jax.Array,
              num_decode_positions: int) -> Prefill:
    """Feeds the prompt and allocates L + num_decode_positions + 1 slots.

    Args:
      params: the parameter tree.
      input_ids: int [B, L], 0-padded on the right: the prompts.
      num_decode_positions: decoder positions after the start position.

    Returns:
      `Prefill` whose start token is the last real token of each row, at
      start_pos = row length - 1 (an all-padding row starts at 0).
    """
    cfg = self.config
    batch, length = input_ids.shape
    if length > cfg.max_len:
      raise ValueError(
          f"prompt length {length} exceeds max_len={cfg.max_len}; truncate "
          f"the prompts or raise {type(cfg).__name__}.max_len")
    slots = length + num_decode_positions + 1
    num_layers, heads, head_dim = self.kv_shape()
    cache = GPTCache(layers=tuple(
        layers.KVCache.zeros(batch, slots, heads, head_dim, cfg.dtype)
        for _ in range(num_layers)))
    positions = jnp.broadcast_to(jnp.arange(length), input_ids.shape)
    _, kv = self._apply(params, input_ids, positions, cache.layers, False,
                        method=self.module_class.decode)
    # Length = one past the last non-padding token, so a 0 inside a row
    # cannot cut the prompt short.
    nonpad = (input_ids != 0) * jnp.arange(1, length + 1)
    start_pos = jnp.maximum(jnp.max(nonpad, axis=1), 1) - 1
    start_token = jnp.take_along_axis(input_ids, start_pos[:, None], axis=1)
    cache = GPTCache(layers=kv)
    cache = base.constrain_cache(cache, cache_logical_axes(cache))
    return Prefill(cache=cache,
                   start_token=start_token[:, 0].astype(jnp.int32),
                   start_pos=start_pos.astype(jnp.int32))

  def extend(self, params: Any, cache: GPTCache, tokens: jax.Array,
             positions: jax.Array,
             tree: Any = None) -> tuple[jax.Array, GPTCache]:
    """Feeds tokens [B, K] at positions [B, K]; see `ModelDef.extend`."""
    logits, kv = self._apply(params, tokens, positions, cache.layers, True,
                             tree, method=self.module_class.decode)
    cache = GPTCache(layers=kv)
    return logits, base.constrain_cache(cache, cache_logical_axes(cache))

  def copy_slots(self, cache: GPTCache, src: jax.Array,
                 dst: jax.Array) -> GPTCache:
    """The entries of slots `src` [B, D] copied to `dst` [B, D] (see
    `protocol`: a token tree's accepted path; a rotary key was rotated by
    its node's position, the one it moves to)."""
    cache = GPTCache(layers=tuple(kv.copy_slots(src, dst)
                                  for kv in cache.layers))
    return base.constrain_cache(cache, cache_logical_axes(cache))


@dataclasses.dataclass(frozen=True)
class GPTDef(DecoderOnlyDef):
  """`ModelDef` for the decoder-only model.

  Attributes:
    config: the architecture.
  """

  module_class = GPTTransformer
  config: GPTConfig

  def kv_shape(self) -> tuple[int, int, int]:
    """(layers, heads, head dim) of the cache."""
    cfg = self.config
    return cfg.num_layers, cfg.num_heads, cfg.head_dim
