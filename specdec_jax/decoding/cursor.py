"""Per-row decoding positions shared by the engine and the drafters.

A row's decoder sequence is its model's `start_token` (relative index 0)
followed by the generated tokens (relative indices 1, 2, ...); the model-level
position of relative index i is `start_pos + i` (see `protocol.py`).

Dimension letters: B batch, K new tokens, V vocabulary.
"""

from __future__ import annotations

from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.decoding.protocol import ModelDef
from specdec_jax.decoding.protocol import TreeMask
from specdec_jax.decoding.tree_shape import TreeShape
from specdec_jax.tokens import DEFAULT_STOP_IDS
from specdec_jax.tokens import is_stop


@flax.struct.dataclass
class Stream:
  """The per-row decoding position shared by all models of one loop.

  Attributes:
    tokens: int32 [B, W] generated tokens; entries at or past `length` are
      scratch (overwritten later, zeroed in the result).
    length: int32 [B] number of tokens generated so far.
    done: bool [B] the row emitted a stop id or reached its most tokens.
    stop_ids: the ids that end a row (static, part of the pytree's
      structure: the loop's `stop_ids`, EOS alone by default).
  """

  tokens: jax.Array
  length: jax.Array
  done: jax.Array
  stop_ids: tuple[int, ...] = flax.struct.field(pytree_node=False,
                                                default=DEFAULT_STOP_IDS)

  def first_stop(self, tokens: jax.Array, count: jax.Array) -> jax.Array:
    """int32 [B]: the index of the first stop id among the first `count`
    [B] of `tokens` [B, K] (K where there is none): a row appending them
    emits min(count, first_stop + 1) and ends if the stop id is among
    those."""
    k = tokens.shape[1]
    idx = jnp.arange(k)[None, :]
    hit = is_stop(tokens, self.stop_ids) & (idx < count[:, None])
    return jnp.min(jnp.where(hit, idx, k), axis=1).astype(jnp.int32)

  @classmethod
  def empty(cls, batch: int, width: int, stop_ids: tuple) -> "Stream":
    """No token yet in any of `batch` rows of `width` positions."""
    return cls(tokens=jnp.zeros((batch, width), jnp.int32),
               length=jnp.zeros((batch,), jnp.int32),
               done=jnp.zeros((batch,), jnp.bool_), stop_ids=stop_ids)

  def advance(self, new_tokens: jax.Array, num_new: jax.Array,
              max_decode_len: int) -> tuple["Stream", jax.Array]:
    """Appends the first `num_new` [B] of `new_tokens` [B, K] to the rows
    not done, cut after the first stop id and at `max_decode_len`; returns
    the new stream and the tokens each row really emitted, int32 [B]."""
    first_stop = self.first_stop(new_tokens, num_new)
    emitted = jnp.minimum(num_new, first_stop + 1)
    emitted = jnp.minimum(emitted, max_decode_len - self.length)
    emitted = jnp.where(self.done, 0, emitted)
    length = self.length + emitted
    done = self.done | (first_stop < emitted) | (length >= max_decode_len)
    tokens = write_rows(self.tokens, self.length, new_tokens)
    # Rows already done keep their buffer as it was.
    tokens = jnp.where(self.done[:, None], self.tokens, tokens)
    return self.replace(tokens=tokens, length=length, done=done), emitted

  def finished(self, max_decode_len: int) -> jax.Array:
    """int32 [B, T]: the tokens, 0 at and past each row's length."""
    tokens = self.tokens[:, :max_decode_len]
    keep = jnp.arange(max_decode_len)[None, :] < self.length[:, None]
    return jnp.where(keep, tokens, 0)


@flax.struct.dataclass
class ModelCursor:
  """One model's cache and where its decoder sequence starts.

  Attributes:
    cache: the model's cache pytree (see `ModelDef.extend`).
    start_token: int32 [B] token at relative index 0.
    start_pos: int32 [B] model position of relative index 0.
    nonfinite: bool [B], True once any logit this model produced for the
      row was NaN or inf; None when the loop was built without the check.
  """

  cache: Any
  start_token: jax.Array
  start_pos: jax.Array
  nonfinite: jax.Array | None = None

  def token_at(self, stream: Stream, index: jax.Array) -> jax.Array:
    """Tokens at relative indices `index` [B, K] of each row ([B, K])."""
    gathered = jnp.take_along_axis(stream.tokens, jnp.maximum(index - 1, 0),
                                   axis=1)
    return jnp.where(index == 0, self.start_token[:, None], gathered)

  def extend(self, model: ModelDef, params, stream: Stream,
             index: jax.Array) -> tuple[jax.Array, "ModelCursor"]:
    """Feeds the tokens at relative indices `index` [B, K]; logits [B, K, V]."""
    tokens = self.token_at(stream, index)
    return self.extend_tokens(model, params, tokens, index)

  def extend_tokens(self, model: ModelDef, params, tokens: jax.Array,
                    index: jax.Array) -> tuple[jax.Array, "ModelCursor"]:
    positions = self.start_pos[:, None] + index
    logits, cache = model.extend(params, self.cache, tokens, positions)
    return self.checked(logits, cache)

  def extend_tree(self, model: ModelDef, params, tokens: jax.Array,
                  n: jax.Array, shape: TreeShape,
                  nodes: np.ndarray) -> tuple[jax.Array, "ModelCursor"]:
    """Feeds the nodes `nodes` (static indices) of a token tree of `shape`
    rooted at relative index n [B] with `tokens` [B, K]: each at the
    position of its depth, in the slot n + its index, attending to the
    committed tokens and its own ancestors (`protocol.TreeMask`); logits
    [B, K, V]."""
    root = self.start_pos + n
    positions = root[:, None] + shape.depths[np.asarray(nodes)][None, :]
    logits, cache = model.extend(params, self.cache, tokens, positions,
                                 tree_mask(shape, root, nodes))
    return self.checked(logits, cache)

  def keep_path(self, model: ModelDef, n: jax.Array,
                path: jax.Array) -> "ModelCursor":
    """The cursor with a tree's accepted nodes `path` [B, D] (node indices
    of a tree rooted at relative index n [B]) moved to relative indices
    n + 1 .. n + D, the slots of their positions."""
    depth = path.shape[1]
    root = self.start_pos + n
    src = root[:, None] + path
    dst = root[:, None] + 1 + jnp.arange(depth)[None, :]
    return self.replace(cache=model.copy_slots(self.cache, src, dst))

  def checked(self, logits: jax.Array,
              cache: Any) -> tuple[jax.Array, "ModelCursor"]:
    """(float32 logits, the cursor on `cache`), its non-finite flag
    updated with the logits [B, K, V] the model just produced."""
    logits = logits.astype(jnp.float32)
    nonfinite = self.nonfinite
    if nonfinite is not None:
      # NaN or inf would otherwise turn into an arbitrary argmax or NaN
      # probabilities without a word. A sum is NaN or inf iff a term is (or
      # the finite terms overflow float32, which no sane logits do): one
      # add-reduction over logits that exist anyway (cost, measured:
      # docs/reliability.md).
      nonfinite = nonfinite | ~jnp.isfinite(jnp.sum(logits, axis=(1, 2)))
    return logits, self.replace(cache=cache, nonfinite=nonfinite)


def tree_mask(shape: TreeShape, root: jax.Array,
              nodes: np.ndarray) -> TreeMask:
  """The `TreeMask` of feeding `nodes` (static indices) of `shape` whose
  root is at cache slot `root` [B]."""
  nodes = np.asarray(nodes, np.int32)
  return TreeMask(root=root.astype(jnp.int32),
                  slots=root[:, None].astype(jnp.int32) + nodes[None, :],
                  sees=jnp.asarray(shape.ancestors[nodes]),
                  depth=jnp.asarray(shape.depths))


def new_cursor(model: ModelDef, params, input_ids, num_positions,
               check_finite: bool = True) -> ModelCursor:
  prefill = model.prefill(params, input_ids, num_positions)
  nonfinite = None
  if check_finite:
    nonfinite = jnp.zeros((input_ids.shape[0],), jnp.bool_)
  return ModelCursor(cache=prefill.cache,
                     start_token=prefill.start_token.astype(jnp.int32),
                     start_pos=prefill.start_pos.astype(jnp.int32),
                     nonfinite=nonfinite)


def write_rows(buffer: jax.Array, start: jax.Array, values: jax.Array):
  """buffer[b, start_b : start_b + K] = values[b] for each row."""
  return jax.vmap(lambda buf, s, v: jax.lax.dynamic_update_slice(
      buf, v, (s,) + (0,) * (buf.ndim - 1)))(buffer, start, values)


def refeed_indices(length: jax.Array, refeed: int) -> jax.Array:
  """int32 [B, refeed + 1]: relative indices length - refeed .. length,
  clamped at 0 (a repeated index 0 rewrites the start token's slot)."""
  offsets = jnp.arange(-refeed, 1, dtype=jnp.int32)
  return jnp.maximum(length[:, None] + offsets[None, :], 0)
