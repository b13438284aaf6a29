"""Flax linen building blocks shared by the T5 and GPT-like models.

Everything here follows T5X's parameter names and layouts (so T5X checkpoints
load as they are) but is written for a position-addressed KV cache that takes
a chunk of several tokens at a time (see `specdec_jax.decoding.protocol`).

Dimension letters:
  B batch, T query length (tokens fed now), S key length (cache slots or
  keys), D embed (d_model), N heads, H head dim, F mlp hidden,
  V vocabulary, R relative-position buckets.

Logical axis names. Parameters: `embed`, `mlp`, `heads`, `kv`, `joined_kv`
(heads*head_dim flattened, T5X's 2-D attention kernels), `vocab`,
`relpos_buckets`. Activations: `batch`, `length`, `embed`, `heads`, `kv`,
`mlp`, `vocab`. KV caches: `cache_batch`, `cache_sequence`, `cache_heads`,
`cache_kv` (see `KVCache.logical_axes`). Constraints are no-ops until a sharding
module installs rules with `nn.logical_axis_rules`.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, Sequence

import flax
import flax.linen as nn
from flax import errors as flax_errors
import jax
import jax.numpy as jnp
import numpy as np

Dtype = Any
Initializer = Callable[..., jax.Array]
P = jax.sharding.PartitionSpec

# Large enough to zero a masked logit after softmax, small enough to stay
# finite in bfloat16 and float32 alike.
NEG_INF = -1e10

# Logical names of the cached keys [B, N, H, S] and values [B, N, S, H].
KEY_CACHE_AXES = P("cache_batch", "cache_heads", "cache_kv", "cache_sequence")
VALUE_CACHE_AXES = P("cache_batch", "cache_heads", "cache_sequence",
                     "cache_kv")


def constrain(x: jax.Array, *names: str | None) -> jax.Array:
  """Annotates an activation with logical axis names (no-op without rules)."""
  return nn.with_logical_constraint(x, names)


# T5 v1.1's "gated-gelu" is the tanh approximation (HF calls it gelu_new);
# flax's `nn.gelu` defaults to that approximation, as T5X relies on.
_ACTIVATIONS: tuple[tuple[str, Callable[[jax.Array], jax.Array]], ...] = (
    ("relu", nn.relu),
    ("gelu", functools.partial(nn.gelu, approximate=True)),
    ("gelu_new", functools.partial(nn.gelu, approximate=True)),
    ("gelu_exact", functools.partial(nn.gelu, approximate=False)),
    ("silu", nn.silu),
    ("linear", lambda x: x),
)
ACTIVATION_NAMES = tuple(name for name, _ in _ACTIVATIONS)


def activation(name: str) -> Callable[[jax.Array], jax.Array]:
  """Returns the activation function called `name` (see ACTIVATION_NAMES)."""
  for known, fn in _ACTIVATIONS:
    if known == name:
      return fn
  raise ValueError(
      f"unknown MLP activation {name!r}; expected one of {ACTIVATION_NAMES}")


def _param(module: nn.Module, name: str, init: Initializer,
           shape: Sequence[int], dtype: Dtype, axes: Sequence[str | None]):
  """A parameter carrying its logical axis names (boxed at init time).

  An existing parameter (apply) is read directly and its shape compared
  with `shape`: Flax's `param` would trace the initializer (`eval_shape`)
  at every call only to learn that shape, a fifth of the time tracing a
  decoding loop."""
  shape = tuple(int(d) for d in shape)
  if (not module.is_mutable_collection("params")
      and module.has_variable("params", name)):
    value = nn.meta.unbox(module.get_variable("params", name))
    if tuple(np.shape(value)) != shape:
      raise flax_errors.ScopeParamShapeError(
          name, module.scope.path_text, tuple(np.shape(value)), shape)
    return value
  return module.param(name, nn.with_logical_partitioning(init, tuple(axes)),
                      shape, jnp.dtype(dtype))


def rms_normalize(x: jax.Array, epsilon: float) -> jax.Array:
  """float32 x / rms(x) over the last axis, the mean square taken in
  float32 whatever x's dtype: what T5's and Gemma's norms share (they
  differ in the scale only)."""
  x32 = x.astype(jnp.float32)
  return x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1,
                                      keepdims=True) + epsilon)


class RmsNorm(nn.Module):
  """T5 layer norm: x / rms(x) * scale, no mean subtraction and no bias.

  The mean square is taken in float32 whatever the compute dtype, as T5X and
  HF do, so bfloat16 activations do not lose the normalisation.

  Attributes:
    epsilon: added to the mean square.
    dtype: output dtype.
    param_dtype: dtype of `scale` [D].
    axis_name: the logical name of `scale`'s axis (`kv` for a per-head
      QK-norm, as Qwen 3's).
  """

  epsilon: float = 1e-6
  dtype: Dtype = "float32"
  param_dtype: Dtype = "float32"
  axis_name: str = "embed"

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    """[..., D] -> [..., D] in `dtype`."""
    y = rms_normalize(x, self.epsilon).astype(self.dtype)
    scale = _param(self, "scale", nn.initializers.ones, (x.shape[-1],),
                   self.param_dtype, (self.axis_name,))
    return y * scale.astype(self.dtype)


class DenseGeneral(nn.Module):
  """A linear map over one or more trailing axes, bias-free unless asked.

  The kernel is stored 2-D, [prod(input axes), prod(features)], exactly as
  T5X stores it, and reshaped on use.

  Attributes:
    features: output feature shape, e.g. V or (N, H).
    axis: input axes contracted, e.g. -1 or (-2, -1).
    kernel_axes: logical names of the 2-D kernel.
    dtype: compute dtype (inputs and kernel are cast to it).
    param_dtype: dtype of the stored kernel.
    kernel_init: initializer of the 2-D kernel.
    use_bias: add a `bias` [prod(features)] (named by the kernel's output
      axis; zeros at init), as Qwen 2's query, key and value projections.
  """

  features: int | Sequence[int]
  axis: int | Sequence[int] = -1
  kernel_axes: Sequence[str | None] = ()
  dtype: Dtype = "float32"
  param_dtype: Dtype = "float32"
  kernel_init: Initializer = nn.initializers.variance_scaling(
      1.0, "fan_in", "truncated_normal")
  use_bias: bool = False

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    features = ((self.features,) if isinstance(self.features, int)
                else tuple(self.features))
    axis = (self.axis,) if isinstance(self.axis, int) else tuple(self.axis)
    axis = tuple(a % x.ndim for a in axis)
    in_shape = tuple(x.shape[a] for a in axis)
    kernel = _param(self, "kernel", self.kernel_init,
                    (math.prod(in_shape), math.prod(features)),
                    self.param_dtype, self.kernel_axes)
    kernel = kernel.astype(self.dtype).reshape(in_shape + features)
    x = x.astype(self.dtype)
    y = jax.lax.dot_general(
        x, kernel, ((axis, tuple(range(len(axis)))), ((), ())))
    if not self.use_bias:
      return y
    bias = _param(self, "bias", nn.initializers.zeros, (math.prod(features),),
                  self.param_dtype, tuple(self.kernel_axes)[-1:])
    return y + bias.astype(self.dtype).reshape(features)


class Embed(nn.Module):
  """Token embedding table [V, D], also usable as the tied output layer.

  Attributes:
    num_embeddings: V.
    features: D.
    dtype: dtype of the looked-up vectors.
    param_dtype: dtype of the table.
    embedding_init: T5X initialises with a unit normal.
  """

  num_embeddings: int
  features: int
  dtype: Dtype = "float32"
  param_dtype: Dtype = "float32"
  embedding_init: Initializer = nn.initializers.normal(stddev=1.0)

  def setup(self):
    self.embedding = _param(self, "embedding", self.embedding_init,
                            (self.num_embeddings, self.features),
                            self.param_dtype, ("vocab", "embed"))

  def __call__(self, ids: jax.Array) -> jax.Array:
    """int [B, T] -> [B, T, D]."""
    x = jnp.take(self.embedding, ids, axis=0).astype(self.dtype)
    return constrain(x, "batch", "length", "embed")

  def attend(self, x: jax.Array) -> jax.Array:
    """[B, T, D] -> float32 logits [B, T, V] against the table."""
    return jnp.einsum("BTD,VD->BTV", x.astype(jnp.float32),
                      self.embedding.astype(jnp.float32))


def _log_bucket_table(num_buckets: int, max_distance: int) -> np.ndarray:
  """Bucket of each non-negative distance n = 0..max(max_distance, R).

  Computed once in numpy float32 with the same formula (and epsilon) as T5X,
  so the result never depends on the accelerator's `log`; distances past the
  end of the table all fall in the last bucket.
  """
  max_exact = num_buckets // 2
  n = np.arange(max(max_distance, num_buckets) + 1)
  large = max_exact + (
      np.log(n.astype(np.float32) / max_exact + np.finfo(np.float32).eps)
      / np.log(max_distance / max_exact) * (num_buckets - max_exact)
  ).astype(np.int32)
  large = np.minimum(large, num_buckets - 1)
  return np.where(n < max_exact, n, large).astype(np.int32)


def relative_position_bucket(relative_position: jax.Array, *,
                             bidirectional: bool, num_buckets: int,
                             max_distance: int) -> jax.Array:
  """T5's bucketing of `key_position - query_position` into [0, R).

  Small distances get their own bucket, larger ones share log-spaced buckets,
  and everything at or beyond `max_distance` shares the last one. A
  unidirectional (decoder) bias folds keys after the query into bucket 0;
  they are masked anyway.

  Args:
    relative_position: int array, key position minus query position.
    bidirectional: whether keys after the query get buckets of their own.
    num_buckets: R.
    max_distance: distance from which all keys share the last bucket.

  Returns:
    int32 array of the same shape, values in [0, R).
  """
  n = -relative_position.astype(jnp.int32)
  if bidirectional:
    per_side = num_buckets // 2
    offset = jnp.where(n < 0, per_side, 0)
    n = jnp.abs(n)
  else:
    per_side = num_buckets
    offset = 0
    n = jnp.maximum(n, 0)
  table = jnp.asarray(_log_bucket_table(per_side, max_distance))
  return offset + table[jnp.minimum(n, table.shape[0] - 1)]


class RelativePositionBias(nn.Module):
  """T5 relative position biases, one scalar per (head, bucket).

  Attributes:
    num_heads: N.
    num_buckets: R.
    max_distance: see `relative_position_bucket`.
    bidirectional: True for the encoder, False for decoders.
    dtype: unused for the bias itself, which stays float32 because it is
      added to float32 attention logits.
    param_dtype: dtype of `rel_embedding` [N, R].
  """

  num_heads: int
  num_buckets: int = 32
  max_distance: int = 128
  bidirectional: bool = True
  dtype: Dtype = "float32"
  param_dtype: Dtype = "float32"
  embedding_init: Initializer = nn.initializers.variance_scaling(
      1.0, "fan_avg", "uniform")

  @nn.compact
  def __call__(self, query_pos: jax.Array, key_pos: jax.Array) -> jax.Array:
    """Bias from positions.

    Args:
      query_pos: int [B, T] (or [1, T]).
      key_pos: int [B, S] (or [1, S]).

    Returns:
      float32 [B, N, T, S].
    """
    table = _param(self, "rel_embedding", self.embedding_init,
                   (self.num_heads, self.num_buckets), self.param_dtype,
                   ("heads", "relpos_buckets"))
    bucket = relative_position_bucket(
        key_pos[:, None, :] - query_pos[:, :, None],
        bidirectional=self.bidirectional, num_buckets=self.num_buckets,
        max_distance=self.max_distance)                   # [B, T, S]
    bias = jnp.take(table.astype(jnp.float32), bucket, axis=1)  # [N,B,T,S]
    return jnp.moveaxis(bias, 0, 1)


def mask_to_bias(mask: jax.Array) -> jax.Array:
  """bool mask (True = may attend) -> float32 additive bias (0 or NEG_INF)."""
  return jnp.where(mask, 0.0, NEG_INF).astype(jnp.float32)


def causal_bias(query_pos: jax.Array, key_pos: jax.Array) -> jax.Array:
  """A query at position t sees keys at positions j <= t.

  This one rule is all the cache needs: slots past a row's current position
  hold stale or unwritten values and are hidden by it.

  Args:
    query_pos: int [B, T].
    key_pos: int [B, S] (or [1, S]).

  Returns:
    float32 [B, 1, T, S] additive bias.
  """
  return mask_to_bias(key_pos[:, None, None, :] <= query_pos[:, None, :, None])


def attention_bias(query_pos: jax.Array, cache_length: int | None,
                   tree: Any = None) -> tuple[jax.Array, jax.Array]:
  """(key positions [B or 1, S], mask bias [B, 1, T, S]) of a decoder pass.

  Without a cache (`cache_length` None) the keys are the T queries
  themselves; with one, slot j holds position j and the causal rule hides
  stale slots (`causal_bias`); with a token tree (`protocol.TreeMask`) the
  tree's own key positions and visibility replace both.
  """
  if tree is not None:
    key_pos, visible = tree.expand(cache_length)
    return key_pos, mask_to_bias(visible[:, None])
  key_pos = (query_pos if cache_length is None
             else jnp.arange(cache_length)[None, :])
  return key_pos, causal_bias(query_pos, key_pos)


def padding_bias(key_valid: jax.Array) -> jax.Array:
  """bool [B, S] (True = real key) -> float32 [B, 1, 1, S] additive bias."""
  return mask_to_bias(key_valid[:, None, None, :])


@flax.struct.dataclass
class KVCache:
  """Keys and values of one attention layer, laid out by position.

  The layouts are the ones the two attention matmuls read without a copy:
  keys [B, N, H, S] (queries [T, H] times keys [H, S] per head) and values
  [B, N, S, H] (weights [T, S] times values [S, H]). Storing keys as
  [B, S, N, H] instead made XLA transpose every layer's whole cache on every
  decoding step.

  Attributes:
    key: [B, N, H, S]; column j holds the key of the token at position j.
    value: [B, N, S, H]; row j holds its value.
  """

  key: jax.Array
  value: jax.Array

  @classmethod
  def from_projection(cls, key: jax.Array, value: jax.Array) -> "KVCache":
    """Keys and values as projected ([B, S, N, H] each), in cache layout."""
    return cls(constrain(jnp.transpose(key, (0, 2, 3, 1)), *KEY_CACHE_AXES),
               constrain(jnp.transpose(value, (0, 2, 1, 3)),
                         *VALUE_CACHE_AXES))

  @classmethod
  def zeros(cls, batch: int, length: int, num_heads: int, head_dim: int,
            dtype: Dtype) -> "KVCache":
    return cls(jnp.zeros((batch, num_heads, head_dim, length), dtype),
               jnp.zeros((batch, num_heads, length, head_dim), dtype))

  @classmethod
  def logical_axes(cls) -> "KVCache":
    """The logical axis names of both leaves, as PartitionSpecs."""
    return cls(KEY_CACHE_AXES, VALUE_CACHE_AXES)

  @property
  def length(self) -> int:
    """S, the number of slots."""
    return self.key.shape[-1]

  def write(self, key: jax.Array, value: jax.Array,
            positions: jax.Array) -> "KVCache":
    """Scatters new keys/values into their slots (each row at its own offset).

    A slot is overwritten, never accumulated into, so a repeated position
    with the same token and a rewrite after rollback are both harmless.
    Positions past the end of the cache are dropped.

    Args:
      key: [B, T, N, H], as projected.
      value: [B, T, N, H].
      positions: int [B, T].

    Returns:
      The updated cache.
    """
    if positions.size == 1:
      # One (row, slot) pair (batch 1, one token: every plain decoding step).
      # XLA turns such a scatter into a dynamic-update-slice, fuses a copy of
      # it into each reader and then copies the whole cache around it: 64
      # cache-sized copies per step of the demo target, about 10% of its step
      # (`tests/test_t5.py` counts them). The same pair given twice stays a
      # scatter, done in place; writing a slot twice with the same values is
      # harmless, as above.
      key, value, positions = (jnp.concatenate([a, a], axis=1)
                               for a in (key, value, positions))
    rows = jnp.arange(positions.shape[0])[:, None]
    # Advanced indices split by slices put their broadcast dims [B, T] first,
    # so the updates are [B, T, N, H] in both layouts.
    new_key = self.key.at[rows, :, :, positions].set(
        key.astype(self.key.dtype), mode="drop")
    new_value = self.value.at[rows, :, positions, :].set(
        value.astype(self.value.dtype), mode="drop")
    return KVCache(constrain(new_key, *KEY_CACHE_AXES),
                   constrain(new_value, *VALUE_CACHE_AXES))


  def copy_slots(self, src: jax.Array, dst: jax.Array) -> "KVCache":
    """Copies the keys/values of slots `src` [B, D] to slots `dst` [B, D]
    (each row its own; read before anything is written, so the two may
    overlap; destinations past the end are dropped). Moves the accepted
    path of a token tree into the slots of its positions."""
    rows = jnp.arange(src.shape[0])[:, None]
    # Laid out like freshly projected keys (heads where the cache has
    # them): left free, the partitioner gathered a model-parallel cache's
    # heads onto every device to pick the columns, and copied it.
    key = constrain(self.key[rows, :, :, src],        # [B, D, N, H]
                    "batch", "length", "heads", "kv")
    value = constrain(self.value[rows, :, src, :],
                      "batch", "length", "heads", "kv")
    return self.write(key, value, dst)


class MultiHeadAttention(nn.Module):
  """T5X-layout multi-head attention with separately usable projections.

  `project_kv` and `__call__` are split so that callers can cache keys and
  values (decoder self-attention) or compute them once (cross-attention).
  As in T5, attention logits are NOT scaled by 1/sqrt(H) at run time: the
  scaling lives in the query kernel (folded into its initialiser here, and
  into the trained weights of T5 checkpoints).

  Attributes:
    num_heads: N.
    head_dim: H.
    out_features: D of the output projection.
    dtype: compute dtype; logits and softmax are float32 regardless.
    param_dtype: dtype of the kernels.
    kernel_init: initializer of the 2-D kernels.
  """

  num_heads: int
  head_dim: int
  out_features: int
  dtype: Dtype = "float32"
  param_dtype: Dtype = "float32"
  kernel_init: Initializer = nn.initializers.variance_scaling(
      1.0, "fan_in", "normal")

  def setup(self):
    proj = functools.partial(
        DenseGeneral, features=(self.num_heads, self.head_dim), axis=-1,
        kernel_axes=("embed", "joined_kv"), dtype=self.dtype,
        param_dtype=self.param_dtype)
    depth_scaling = math.sqrt(self.head_dim)
    query_init = lambda *a: self.kernel_init(*a) / depth_scaling
    self.query = proj(kernel_init=query_init)
    self.key = proj(kernel_init=self.kernel_init)
    self.value = proj(kernel_init=self.kernel_init)
    self.out = DenseGeneral(
        features=self.out_features, axis=(-2, -1),
        kernel_axes=("joined_kv", "embed"), dtype=self.dtype,
        param_dtype=self.param_dtype, kernel_init=self.kernel_init)

  def project_kv(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """[B, S, D] -> (keys, values), each [B, S, N, H]."""
    k = constrain(self.key(x), "batch", "length", "heads", "kv")
    v = constrain(self.value(x), "batch", "length", "heads", "kv")
    return k, v

  def __call__(self, x: jax.Array, kv: KVCache, bias: jax.Array) -> jax.Array:
    """Attends queries from `x` to the given keys/values.

    Args:
      x: [B, T, D] query inputs.
      kv: keys and values in cache layout (`KVCache.from_projection` for
        freshly projected ones).
      bias: float32, broadcastable to [B, N, T, S]: relative position bias
        plus NEG_INF where attention is not allowed.

    Returns:
      [B, T, D] in the compute dtype.
    """
    q = constrain(self.query(x), "batch", "length", "heads", "kv")
    logits = jnp.einsum("BTNH,BNHS->BNTS", q, kv.key.astype(self.dtype),
                        preferred_element_type=jnp.float32)
    weights = jax.nn.softmax(logits + bias, axis=-1).astype(self.dtype)
    # Produce [B, N, T, H] and swap, rather than asking for [B, T, N, H]
    # directly: given the latter, XLA on CPU lays the product out with T
    # minor and runs it as a plain (unfused) dot: plain dots took 1.33 ms
    # of a 12-token speculative decode, 0.50 ms with this form
    # (`benchmarks/profile_loop.py --gamma=7`).
    out = jnp.einsum("BNTS,BNSH->BNTH", weights, kv.value.astype(self.dtype))
    out = constrain(jnp.swapaxes(out, 1, 2), "batch", "length", "heads", "kv")
    return constrain(self.out(out), "batch", "length", "embed")


class MlpBlock(nn.Module):
  """T5 feed-forward block: wo(prod_i act_i(wi_i(x))).

  One activation gives `wi`/`wo` (T5 v1.0, ReLU); several give `wi_0`,
  `wi_1`, ... whose activations are multiplied (T5 v1.1 gated GELU is
  ('gelu', 'linear')).

  Attributes:
    hidden_dim: F.
    activations: activation names, see ACTIVATION_NAMES.
    dtype: compute dtype.
    param_dtype: dtype of the kernels.
  """

  hidden_dim: int
  activations: Sequence[str] = ("relu",)
  dtype: Dtype = "float32"
  param_dtype: Dtype = "float32"
  kernel_init: Initializer = nn.initializers.variance_scaling(
      1.0, "fan_in", "truncated_normal")

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    """[B, T, D] -> [B, T, D]."""
    hidden = None
    for i, name in enumerate(self.activations):
      h = DenseGeneral(
          self.hidden_dim, kernel_axes=("embed", "mlp"), dtype=self.dtype,
          param_dtype=self.param_dtype, kernel_init=self.kernel_init,
          name="wi" if len(self.activations) == 1 else f"wi_{i}")(x)
      h = activation(name)(h)
      hidden = h if hidden is None else hidden * h
    hidden = constrain(hidden, "batch", "length", "mlp")
    out = DenseGeneral(
        x.shape[-1], kernel_axes=("mlp", "embed"), dtype=self.dtype,
        param_dtype=self.param_dtype, kernel_init=self.kernel_init,
        name="wo")(hidden)
    return constrain(out, "batch", "length", "embed")
