"""Token trees: several draft candidates per position, verified in one call.

`tree(draft, shape)` builds a draft (a `Model` whose definition is a
`TreeDef`) that proposes a static tree of tokens instead of one chain: the
draft model expands the tree level by level, each node's children sampled
WITHOUT replacement from the draft's q at that node (or its top-k when
greedy); the target scores every node in one call, each node attending to
the committed tokens and its own ancestors at the position of its depth
(`protocol.TreeMask`); `verify.walk` walks the tree from the root
with recursive rejection sampling over each node's children, which keeps
the target's distribution exactly; then both models' caches keep the
accepted path only (`copy_slots` moves it into the slots of its
positions; the engine's rollback is then the chain's).

Shapes. A `TreeShape` lists each node's parent, breadth first. A shape by
branching per depth, (3, 2, 1, 1), gives every node of depth d the same
number of children; `TreeShape.best(profile, size)` builds the
Sequoia-style shape of `size` nodes with the largest expected accepted
length under a measured profile of acceptance per child rank
(`theory.tree_expected_tokens`).

Slots. Node i of the tree (0 the root, the pending token at relative index
n) is written at relative index n + i and sits at position n + depth(i);
the engine's buffers get `num_nodes - depth` extra positions for it.

Dimension letters: B batch, M tree nodes (root excluded), D depth, k most
children of a node, V vocabulary.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import sampling
from specdec_jax.decoding import composite
from specdec_jax.decoding import contract
from specdec_jax.decoding import protocol
from specdec_jax.decoding.cursor import ModelCursor
from specdec_jax.decoding.cursor import Stream
from specdec_jax.decoding.cursor import new_cursor
from specdec_jax.decoding.cursor import refeed_indices
from specdec_jax.decoding.drafters import level_stats
from specdec_jax.decoding.protocol import Proposal
from specdec_jax.decoding.protocol import Model
from specdec_jax.decoding.tree_shape import TreeShape



def as_shape(shape: Any) -> TreeShape:
  """A TreeShape from itself or from a branching per depth."""
  if isinstance(shape, TreeShape):
    return shape
  if isinstance(shape, (tuple, list)):
    return TreeShape.from_branching(shape)
  raise TypeError(f"a tree shape is a TreeShape or a branching per depth "
                  f"such as (3, 2, 1, 1), got {shape!r}.")


def _without_replacement(key: jax.Array, q: jax.Array, count: int):
  """`count` tokens [..., count] drawn from q [..., V] one after another,
  each from q with the earlier ones removed (renormalised), and whether
  each existed (False once q's support is used up)."""
  keys = jax.random.split(key, count)
  tokens, valid = [], []
  for j in range(count):
    mass = jnp.sum(q, axis=-1)
    u = jax.random.uniform(keys[j], q.shape[:-1] + (1,), jnp.float32)
    x = sampling.inverse_cdf(q, u)
    tokens.append(x)
    valid.append(mass > 0)
    q = jnp.where(jax.nn.one_hot(x, q.shape[-1], dtype=jnp.bool_), 0.0, q)
  return jnp.stack(tokens, -1), jnp.stack(valid, -1)


class TreeDrafter:
  """One draft model expanding a `TreeShape` level by level: it feeds its
  widest level in one call, and the nodes off the chain of its depth take
  num_nodes - depth scratch positions."""

  depth = 1
  checks_finite = True

  def __init__(self, definition: "TreeDef", sampler: sampling.SamplingConfig,
               refeed: int, rule: Any):
    self.definition = definition.draft
    self.shape = shape = definition.tree_shape
    self.gamma = shape.depth
    self.sampler = sampler
    self.refeed = refeed
    self.rule = rule
    self.extra_width = shape.num_nodes - shape.depth
    widest = max(len(level) for level in shape.levels[1:-1]) if (
        shape.depth > 1) else 1
    self.calls = (protocol.ModelCall(("draft",), self.definition,
                                     max(refeed + 1, widest)),)

  def __repr__(self) -> str:
    return (f"TreeDrafter({type(self.definition).__name__}, "
            f"shape={self.shape.describe()})")

  def init(self, params, input_ids, num_positions, check_finite=True):
    return new_cursor(self.definition, params["draft"], input_ids,
                      num_positions, check_finite)

  def nonfinite(self, cursor: ModelCursor):
    return cursor.nonfinite

  def _children(self, logits, key, count):
    """Children tokens [B, K, count], valid [B, K, count] and q [B, K, V]
    (None when greedy) of nodes with logits [B, K, V]."""
    if not self.rule.uses_q:
      _, top = jax.lax.top_k(logits, count)
      return top.astype(jnp.int32), jnp.ones(top.shape, jnp.bool_), None
    q = self.sampler.probs(logits)
    tokens, valid = _without_replacement(key, q, count)
    return tokens, valid, q

  def propose(self, params, cursor: ModelCursor, stream: Stream, keys,
              keep=None, limit=None):
    """The tree for every row: (Proposal, the cursor, level stats).

    keys: [B, D] PRNG keys, one per level expanded; `keep` and `limit`
    must be None (stop rules take chains only: `checks.check_tree`).
    """
    del keep, limit
    shape, d = self.shape, self.definition
    params = params["draft"]
    n = stream.length
    batch = n.shape[0]
    logits, cursor = cursor.extend(d, params, stream,
                                   refeed_indices(n, self.refeed))
    level_logits = logits[:, -1:]                               # the root
    tokens = jnp.zeros((batch, shape.verified), jnp.int32)
    valid = jnp.ones((batch, shape.verified), jnp.bool_)
    probs = []
    calls = jnp.ones((batch,), jnp.int32)
    for depth in range(shape.depth):
      level = shape.levels[depth]
      count = int(shape.num_children[level].max())
      key = jax.vmap(lambda k, depth=depth: jax.random.fold_in(k, depth))(
          keys[:, depth])
      if not self.rule.uses_q:
        kids, kid_valid, q = self._children(level_logits, None, count)
      else:
        kids, kid_valid, q = jax.vmap(self._children, in_axes=(0, 0, None))(
            level_logits, key, count)
      if q is not None:
        probs.append(q)
      # Node v of the next level is child rank(v) of its parent.
      below = shape.levels[depth + 1]
      parent_at = np.searchsorted(level, np.asarray(shape.parents)[below - 1])
      rank = shape.ranks[below]
      tokens = tokens.at[:, below].set(kids[:, parent_at, rank])
      valid = valid.at[:, below].set(kid_valid[:, parent_at, rank]
                                     & valid[:, level[parent_at]])
      if depth + 1 < shape.depth:
        level_logits, cursor = cursor.extend_tree(
            d, params, tokens[:, below], n, shape, below)
        calls = calls + 1
    proposal = Proposal(
        tokens=tokens[:, 1:], valid=valid[:, 1:],
        probs=jnp.concatenate(probs, axis=1) if probs else None,
        conf=jnp.zeros((batch, shape.depth), jnp.float32),
        length=jnp.full((batch,), shape.depth, jnp.int32))
    return proposal, cursor, level_stats(calls[:, None])

  def commit(self, cursor: ModelCursor, n: jax.Array,
             path: jax.Array) -> ModelCursor:
    """After verification: the draft's cache keeps the accepted path (the
    nodes of its last level were never fed; their slots get refed)."""
    return cursor.keep_path(self.definition, n, path)


@dataclasses.dataclass(frozen=True)
class TreeDef(composite.CompositeDef):
  """A draft model proposing a token tree; parameters {"draft": ...}.

  Attributes:
    draft: the draft model's definition (it must take `TreeMask` chunks and
      have `copy_slots`).
    tree_shape: the static `TreeShape`.
  """

  draft: Any
  tree_shape: TreeShape

  what = "a token tree"

  def parts(self) -> tuple[tuple[str, Any], ...]:
    return (("draft", self.draft),)

  def make_drafter(self, gamma, sampler, refeed, rule):
    del gamma  # the depth
    return TreeDrafter(self, sampler, refeed, rule)


def tree(draft: Model, shape: Any) -> Model:
  """A draft that proposes a token tree (see the module docstring).

  Args:
    draft: the draft model (T5, GPT-like or an n-gram drafter; not a
      cascade).
    shape: a `TreeShape`, or a branching per depth such as (3, 2, 1, 1).

  Returns:
    A `Model` usable as the draft of `speculative_generate` and
    `SpeculativeDecoder`, with gamma equal to the tree's depth.
  """
  if not isinstance(draft, Model):
    raise TypeError(f"tree: draft must be a specdec_jax.Model, got "
                    f"{type(draft).__name__}.")
  if not contract.is_model(draft.definition):
    what = getattr(draft.definition, "what",
                   type(draft.definition).__name__)
    raise TypeError(f"tree: the draft must be a plain model, got {what}"
                    f"; a tree expands one model's distribution level by "
                    f"level (a cascade, a horizontal drafter or prompt "
                    f"lookup is not supported).")
  if not hasattr(draft.definition, "copy_slots"):
    raise TypeError(
        f"tree: {type(draft.definition).__name__} cannot take token trees "
        f"(it needs extend(..., tree=) and copy_slots, as T5, the GPT-like "
        f"model and the n-gram drafters have).")
  return Model(definition=TreeDef(draft.definition, as_shape(shape)),
               params={"draft": draft.params}, vocab=draft.vocab)
