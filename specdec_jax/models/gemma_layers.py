"""What the Gemma families share: T5Gemma (`t5gemma.py`, Gemma 2 blocks),
Gemma 3 (`gemma3.py`) and T5Gemma 2 (`t5gemma2.py`, Gemma 3 blocks); the
Llama layout (`llama.py`: Llama 3, Qwen 3) attends and rotates with the
same pieces.

  GemmaNorm      x / rms(x) * (1 + scale), in float32
  rope           rotary embeddings, with transformers' linear scaling or
                 Llama 3's frequency-dependent scaling
  window_bias    a sliding window as one more mask on positions
  softcap        tanh(x / c) * c
  Attention      grouped-query attention: optional QK-norm, rotary base per
                 layer, logits scaled by query_pre_attn_scalar**-0.5 and
                 optionally soft-capped; `attend` takes several (keys,
                 values, bias) groups under one softmax (T5Gemma 2's merged
                 self and cross attention)
  embed          the token embedding times sqrt(width)

Every piece reads from a position-addressed cache (`layers.KVCache`), so
chunks, rollback and token trees work as the protocol says.

Dimension letters: B batch, T tokens fed now, S keys (cache slots), D
width, N query heads, K key/value heads, G query heads per key/value head
(N = K * G), H head dim.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from specdec_jax.models import layers

SLIDING, GLOBAL = "sliding_attention", "full_attention"


def check_layer_types(types: Sequence[str], num_layers: int,
                      sliding_window: int | None) -> tuple[str, ...]:
  """`types` as a tuple, after checking that it names SLIDING or GLOBAL for
  each of `num_layers` layers and that sliding layers have a window."""
  types = tuple(types)  # gin and JSON hand over lists
  if len(types) != num_layers or set(types) - {SLIDING, GLOBAL}:
    raise ValueError(
        f"layer_types must give {SLIDING!r} or {GLOBAL!r} for each of the "
        f"{num_layers} layers, got {types}")
  if sliding_window is None and SLIDING in types:
    raise ValueError("sliding layers need a sliding_window: set one, or "
                     f"make every layer {GLOBAL!r}")
  return types


def softcap(x: jax.Array, cap: float | None) -> jax.Array:
  """tanh(x / cap) * cap (Gemma 2's soft-capping); x itself for None."""
  return x if cap is None else jnp.tanh(x / cap) * cap


@dataclasses.dataclass(frozen=True)
class Rotary:
  """Rotary embedding settings of one layer.

  Attributes:
    theta: the base.
    scale: the scaling factor. Without `llama3_band`, transformers' linear
      scaling: every inverse frequency divided by it (Gemma 3's global
      layers use 8 from 4B up). With it, Llama 3's (`rope_type: llama3`,
      8 for Llama 3.1, 32 for 3.2): only the low frequencies are divided.
    llama3_band: None, or Llama 3's (low_freq_factor, high_freq_factor,
      original_max_position_embeddings) = (l, h, C): wavelengths above
      C / l are divided by `scale`, those below C / h kept, and those
      between interpolated linearly in C / wavelength.
  """

  theta: float = 10000.0
  scale: float = 1.0
  llama3_band: tuple[float, float, int] | None = None

  def inverse_frequencies(self, dim: int) -> jax.Array:
    """float32 [dim / 2], the angle per position of each pair of H."""
    inv_freq = 1.0 / (self.theta ** (
        jnp.arange(0, dim, 2, dtype=jnp.float32) / dim))
    if self.llama3_band is None:
      return inv_freq / jnp.float32(self.scale)
    low, high, original = self.llama3_band
    wavelength = 2 * math.pi / inv_freq
    smooth = (original / wavelength - low) / (high - low)
    between = (1 - smooth) * inv_freq / self.scale + smooth * inv_freq
    return jnp.where(wavelength > original / low, inv_freq / self.scale,
                     jnp.where(wavelength < original / high, inv_freq,
                               between))


def rope(x: jax.Array, positions: jax.Array, rotary: Rotary) -> jax.Array:
  """Rotary embedding of x [B, T, N, H] at positions int [B, T] (or
  [1, T]): the two halves of H are rotated together (transformers'
  `rotate_half`), angles computed in float32."""
  half = x.shape[-1] // 2
  inv_freq = rotary.inverse_frequencies(2 * half)
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


class GemmaNorm(nn.Module):
  """Gemma's RMS norm: x / rms(x) * (1 + scale), in float32, scale init 0.

  Attributes:
    epsilon: added to the mean square.
    dtype: output dtype.
    param_dtype: dtype of `scale` [D].
    axis_name: the logical name of `scale`'s axis (`kv` for QK-norm).
  """

  epsilon: float = 1e-6
  dtype: Any = "float32"
  param_dtype: Any = "float32"
  axis_name: str = "embed"

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    """[..., D] -> [..., D] in `dtype`."""
    y = layers.rms_normalize(x, self.epsilon)
    scale = layers._param(  # pylint: disable=protected-access
        self, "scale", nn.initializers.zeros, (x.shape[-1],),
        self.param_dtype, (self.axis_name,))
    return (y * (1.0 + scale.astype(jnp.float32))).astype(self.dtype)


# The RMS norms by name: Gemma's, and the plain one of the Llama layout.
NORMS = {"gemma": GemmaNorm, "rms": layers.RmsNorm}


class Attention(nn.Module):
  """Grouped-query attention of the Gemma families and the Llama layout.

  Queries and keys are projected, then (Gemma 3) RMS-normed per head
  (`query_norm`, `key_norm`), then rotated (when `rotary` is set); logits
  are float32, scaled by query_pre_attn_scalar**-0.5 and (Gemma 2)
  soft-capped.

  Attributes:
    num_heads: N.
    num_kv_heads: K (N must be a multiple).
    head_dim: H.
    out_features: D of the output.
    query_pre_attn_scalar: logits are scaled by its -1/2 power.
    softcap: c of tanh(x / c) * c on the logits, or None.
    rotary: the layer's rotary settings; None: no rotary (cross-attention).
    qk_norm: RMS-norm queries and keys per head (Gemma 3, Qwen 3).
    norm: the QK-norms' kind: "gemma" (`GemmaNorm`, 1 + scale) or "rms"
      (`layers.RmsNorm`, scale: Qwen 3's).
    qkv_bias: biases on the query, key and value projections (Qwen 2).
    epsilon: the QK-norms' epsilon.
    dtype: compute dtype; logits and softmax are float32.
    param_dtype: dtype of the kernels.
  """

  num_heads: int
  num_kv_heads: int
  head_dim: int
  out_features: int
  query_pre_attn_scalar: float
  softcap: float | None = None
  rotary: Rotary | None = None
  qk_norm: bool = False
  norm: str = "gemma"
  qkv_bias: bool = False
  epsilon: float = 1e-6
  dtype: Any = "float32"
  param_dtype: Any = "float32"

  def setup(self):
    proj = lambda heads: layers.DenseGeneral(
        features=(heads, self.head_dim), kernel_axes=("embed", "joined_kv"),
        dtype=self.dtype, param_dtype=self.param_dtype,
        use_bias=self.qkv_bias)
    self.query = proj(self.num_heads)
    self.key = proj(self.num_kv_heads)
    self.value = proj(self.num_kv_heads)
    self.out = layers.DenseGeneral(
        features=self.out_features, axis=(-2, -1),
        kernel_axes=("joined_kv", "embed"), dtype=self.dtype,
        param_dtype=self.param_dtype)
    if self.qk_norm:
      kind = NORMS[self.norm]
      norm = lambda: kind(epsilon=self.epsilon, dtype=self.dtype,
                          param_dtype=self.param_dtype, axis_name="kv")
      self.query_norm = norm()
      self.key_norm = norm()

  def _position(self, x, positions, norm):
    if self.qk_norm:
      x = norm(x)
    if self.rotary is not None and positions is not None:
      x = rope(x, positions, self.rotary)
    return layers.constrain(x, "batch", "length", "heads", "kv")

  def project_kv(self, x: jax.Array, positions: jax.Array | None
                 ) -> tuple[jax.Array, jax.Array]:
    """x [B, S, D] -> (keys, values) [B, S, K, H]; keys normed and rotated
    to `positions` [B, S] as the layer says (None: not rotated, as T5Gemma
    2's cross-attention keys)."""
    k = self._position(self.key(x), positions,
                       self.key_norm if self.qk_norm else None)
    v = layers.constrain(self.value(x), "batch", "length", "heads", "kv")
    return k, v

  def self_keys(self, x: jax.Array, positions: jax.Array, slots: jax.Array,
                cache: layers.KVCache | None
                ) -> tuple[layers.KVCache, layers.KVCache | None]:
    """Self-attention's keys: those of x [B, T, D] at `positions` [B, T],
    written into `cache` at `slots` [B, T] (the T positions, or a token
    tree's slots).

    Returns:
      (what the queries attend to: the whole updated cache, or without a
      cache these T keys/values in cache layout; the updated cache or
      None).
    """
    k, v = self.project_kv(x, positions)
    if cache is None:
      return layers.KVCache.from_projection(k, v), None
    cache = cache.write(k, v, slots)
    return cache, cache

  def queries(self, x: jax.Array, positions: jax.Array | None) -> jax.Array:
    """x [B, T, D] -> queries [B, T, N, H] (normed, rotated)."""
    return self._position(self.query(x), positions,
                          self.query_norm if self.qk_norm else None)

  def attend(self, q: jax.Array,
             groups_of_keys: Sequence[tuple[layers.KVCache, jax.Array]]
             ) -> jax.Array:
    """Queries q [B, T, N, H] attend to several groups of keys under one
    softmax.

    Args:
      q: from `queries`.
      groups_of_keys: (keys/values in cache layout, keys [B, K, H, S_i],
        values [B, K, S_i, H]; float32 bias broadcastable to [B, 1, T,
        S_i]) per group: one group for plain attention, self and cross
        keys for T5Gemma 2's merged attention. The softmax runs over all
        S_i keys together; no cache is copied to join them.

    Returns:
      [B, T, D] in the compute dtype.
    """
    batch, length = q.shape[:2]
    heads, groups = self.num_kv_heads, self.num_heads // self.num_kv_heads
    # A key/value head's G query heads and the T queries as one axis of
    # Q = G * T rows: rank-4 matmuls, as multi-head attention's. The rank-5
    # form ('BTKGH,BKHS->BKGTS') failed at run time on XLA:CPU with
    # bfloat16 compute once the keys came from a cache write ("Unsupported
    # element type for DotThunk: BF16 x BF16 = F32"; T5Gemma's prefill too).
    q = jnp.transpose(q.reshape(batch, length, heads, groups, self.head_dim),
                      (0, 2, 3, 1, 4)).reshape(batch, heads, groups * length,
                                               self.head_dim)
    logits = []
    for kv, bias in groups_of_keys:
      logit = jnp.einsum("BKQH,BKHS->BKQS", q, kv.key.astype(self.dtype),
                         preferred_element_type=jnp.float32)
      logit = softcap(logit * self.query_pre_attn_scalar**-0.5, self.softcap)
      logit = logit.reshape(batch, heads, groups, length, -1)
      logits.append(logit + bias[:, :, None])
    sizes = [logit.shape[-1] for logit in logits]
    weights = jax.nn.softmax(jnp.concatenate(logits, -1) if len(logits) > 1
                             else logits[0], axis=-1).astype(self.dtype)
    weights = weights.reshape(batch, heads, groups * length, -1)
    out, start = 0, 0
    for (kv, _), size in zip(groups_of_keys, sizes):
      part = jax.lax.slice_in_dim(weights, start, start + size, axis=-1)
      out = out + jnp.einsum("BKQS,BKSH->BKQH", part,
                             kv.value.astype(self.dtype))
      start += size
    out = jnp.transpose(out.reshape(batch, heads, groups, length,
                                    self.head_dim), (0, 3, 1, 2, 4))
    out = out.reshape(batch, length, self.num_heads, self.head_dim)
    out = layers.constrain(out, "batch", "length", "heads", "kv")
    return layers.constrain(self.out(out), "batch", "length", "embed")

  def __call__(self, x: jax.Array, positions: jax.Array | None,
               kv: layers.KVCache, bias: jax.Array) -> jax.Array:
    """Queries from x [B, T, D] at `positions` [B, T] attend to `kv`
    (keys [B, K, H, S], values [B, K, S, H]); bias float32 broadcastable
    to [B, 1, T, S] -> [B, T, D]."""
    return self.attend(self.queries(x, positions), [(kv, bias)])


def embed(embedder: layers.Embed, ids: jax.Array, width: int, dtype,
          round_to=None) -> jax.Array:
  """Embedding times sqrt(width), in `dtype`.

  transformers rounds the factor to a dtype before multiplying: T5Gemma to
  the compute dtype, Gemma 3 to the parameters' (`round_to`), and
  multiplies there; the product is then cast to `dtype`."""
  if round_to is None:
    return embedder(ids) * jnp.asarray(width**0.5, dtype)
  table = jnp.take(embedder.embedding, ids, axis=0)
  x = (table * jnp.asarray(width**0.5, round_to)).astype(dtype)
  return layers.constrain(x, "batch", "length", "embed")
