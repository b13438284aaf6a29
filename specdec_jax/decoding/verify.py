"""Verification: one walk over what a drafter proposed.

A proposal is a static tree of draft tokens (`Proposal`, its `TreeShape`);
the paper's chain of gamma tokens is the tree with one child per depth.
`walk` decides every verification there is: the engine's (the target
checking the top-level drafter, a chain or a token tree) and a cascade's
(its middle model checking its inner drafter). It starts at the root and,
at each node, tests the children in rank order with the acceptance rule
(`acceptance.py`): child c_j, drawn from q with c_1..c_{j-1} removed
(renormalised: q_j), is accepted as the rule says against p_j, where p_1
is the verifier's p at the node and each rejection leaves
p_{j+1} = rule.residual(p_j, q_j) (recursive rejection sampling). The walk
moves to the accepted child; where every child is rejected (or the node
has none) it emits a draw of the last p_j, and after a leaf the bonus
token from p at the leaf. Each depth thus emits a sample of the
verifier's p (the paper's Theorem 3.5 applied to p_j and q_j in turn),
which keeps the output distribution exactly the verifier's. With one
child per depth this is Algorithm 1's accept/reject, residual, correction
and bonus token.

`counted_positions` says which verified positions enter the counters
(`drafters.verified_level`), so every level counts alike.

Dimension letters: B batch, M proposed nodes (the root excluded), D depth,
k most children of a node, G most draft tokens per chain, V vocabulary.
"""

from __future__ import annotations

from typing import Any

import flax
import jax
import jax.numpy as jnp

from specdec_jax import sampling
from specdec_jax.decoding import acceptance
from specdec_jax.decoding.protocol import chain_proposal
from specdec_jax.decoding.protocol import Proposal
from specdec_jax.decoding.tree_shape import TreeShape


@flax.struct.dataclass
class Verdict:
  """What one walk decided, per row.

  Attributes:
    accepted: int32 [B] in [0, D], draft tokens accepted (the walk's
      depth).
    next: int32 [B], the verifier's token after them (the correction at the
      first rejection, the bonus token after a leaf).
    tokens: int32 [B, D + 1], the accepted tokens then `next` (entries past
      accepted + 1 are meaningless).
    count: int32 [B] tokens of `tokens` the walk emits: accepted + 1 (the
      caller cuts after the first stop id among them,
      `cursor.Stream.first_stop`, and at its length limit).
    beta: float32 [B, D], sum_x min(p, q) at each node walked (a one-hot
      match of the first child under `Greedy`).
    accept_prob: float32 [B, D], min(1, p(x) / q(x)) of the first child of
      each node walked.
    probs: the verifier's P at every node ([B, M + 1, V] probabilities, or
      the argmax ids [B, M + 1] under `Greedy`), for a caller that needs it
      again (a cascade proposes it as q).
    path: int32 [B, D], the node reached at each depth (past the accepted
      ones: repeats of the last).
    rank: int32 [B, D], the rank of the child accepted at each depth
      walked, k where none was, k + 1 where the walk ended at a node
      without children.
    tested: bool [B, D], the depths where the walk tested children (the
      counters take only these).
    drafted: int32 [B, D], the draft tokens along the walk: the accepted
      ones, then the first-child line below where it stopped (for a chain,
      the proposal itself); for traces.
  """

  accepted: jax.Array
  next: jax.Array
  tokens: jax.Array
  count: jax.Array
  beta: jax.Array
  accept_prob: jax.Array
  probs: Any
  path: jax.Array
  rank: jax.Array
  tested: jax.Array
  drafted: jax.Array


def walk(rule: Any, p: jax.Array, prop: Proposal, shape: TreeShape,
         key: jax.Array) -> Verdict:
  """Walks `prop` (of static `shape`) from its root with `rule`.

  Args:
    rule: the acceptance rule (`acceptance.AcceptanceRule`; the loop's
      `rule=`, or `acceptance.rule_for`'s default).
    p: the verifier's `rule.target(...)` at every node: [B, M + 1, V] (or
      [B, M + 1] ids under `Greedy`); node 0 is the pending token.
    prop: the proposal (tokens, valid [B, M], probs [B, I, V] for the I
      internal nodes, or None when the rule uses no q).
    shape: its `TreeShape` (a chain: `TreeShape.chain(G)`).
    key: one PRNG key per row [B].
  """
  depth, width = shape.depth, shape.max_children
  # One uniform per (depth, child) and one for the emitted token.
  u = jax.vmap(lambda k: jax.random.uniform(k, (depth * width + 1,)))(key)
  if width == 1:
    return _walk_chain(rule, p, prop, u)
  return _walk_tree(rule, p, prop, shape, u)


def _walk_tree(rule: Any, p: jax.Array, prop: Proposal, shape: TreeShape,
               u: jax.Array) -> Verdict:
  """`walk` one depth at a time (any shape)."""
  depth, width = shape.depth, shape.max_children
  batch = p.shape[0]
  children = jnp.asarray(shape.children)
  num_children = jnp.asarray(shape.num_children)
  rows = jnp.arange(batch)
  # Node tokens with the root's slot, so node ids index them directly.
  tokens = jnp.pad(prop.tokens, ((0, 0), (1, 0)))
  valid = jnp.pad(prop.valid, ((0, 0), (1, 0)))
  node = jnp.zeros((batch,), jnp.int32)
  searching = jnp.ones((batch,), jnp.bool_)
  accepted = jnp.zeros((batch,), jnp.int32)
  p_stop = p[rows, node]
  path, ranks, betas, probs_x, tested = [], [], [], [], []
  for d in range(depth):
    kids = children[node]                                        # [B, k]
    kid_tokens = jnp.take_along_axis(tokens, kids, axis=1)
    kid_valid = ((jnp.arange(width)[None, :] < num_children[node][:, None])
                 & jnp.take_along_axis(valid, kids, axis=1))
    p_cur = p[rows, node]
    q_cur = None if prop.probs is None else prop.probs[rows, node]
    x0 = kid_tokens[:, 0]
    betas.append(jnp.where(kid_valid[:, 0],
                           rule.overlap(p_cur, q_cur, x0), 0.0))
    probs_x.append(rule.accept_prob(rule.at(p_cur, x0), _at(q_cur, x0)))
    hit = jnp.zeros((batch,), jnp.bool_)
    rank = jnp.full((batch,), width, jnp.int32)
    for j in range(width):
      x = kid_tokens[:, j]
      if q_cur is not None and j:  # q with the elder siblings removed
        q_cur = q_cur / jnp.maximum(jnp.sum(q_cur, -1, keepdims=True), 1e-30)
      ok = (kid_valid[:, j] & ~hit
            & rule.accepts(u[:, d * width + j], rule.at(p_cur, x),
                           _at(q_cur, x)))
      rank = jnp.where(ok, j, rank)
      hit = hit | ok
      rejected = kid_valid[:, j] & ~hit
      p_cur = _where(rejected, rule.residual(p_cur, q_cur), p_cur)
      if q_cur is not None and j + 1 < width:
        removed = jax.nn.one_hot(x, q_cur.shape[-1], dtype=jnp.bool_)
        q_cur = jnp.where(rejected[:, None] & removed, 0.0, q_cur)
    p_stop = _where(searching & ~hit, p_cur, p_stop)
    # A walk that stopped at a node without children tested nothing there:
    # rank k + 1, which the counters drop, as they drop its beta.
    tested.append(searching & (num_children[node] > 0))
    ranks.append(jnp.where(tested[-1], rank,
                           jnp.where(searching, width + 1, width)))
    chosen = jnp.take_along_axis(kids, jnp.minimum(rank, width - 1)[:, None],
                                 axis=1)[:, 0]
    step = searching & hit
    node = jnp.where(step, chosen, node)
    path.append(node)
    accepted = accepted + step
    searching = step
  # A walk that reached a leaf: the bonus token from p at the leaf.
  p_stop = _where(searching, p[rows, node], p_stop)
  nxt = rule.draw(u[:, -1], p_stop)
  path = jnp.stack(path, axis=1)
  path_tokens = jnp.take_along_axis(tokens, path, axis=1)
  return _verdict(path_tokens, accepted, nxt, jnp.stack(betas, 1),
                  jnp.stack(probs_x, 1), p, path, jnp.stack(ranks, 1),
                  jnp.stack(tested, 1),
                  _drafted(tokens, path, accepted, shape))


def _walk_chain(rule: Any, p: jax.Array, prop: Proposal,
                u: jax.Array) -> Verdict:
  """`walk` where every node has one child (a chain of G tokens), every
  depth at once: the same rule calls on [B, G] instead of G steps on [B],
  the same uniforms, so the same verdict (`tests/test_trees.py` checks
  that they agree), with one residual instead of one per depth."""
  batch, gamma = prop.tokens.shape
  rows, depths = jnp.arange(batch), jnp.arange(gamma)[None, :]
  per_depth = lambda f: jax.vmap(f, in_axes=1, out_axes=1)
  x, q = prop.tokens, prop.probs
  p_x = per_depth(rule.at)(p[:, :gamma], x)
  q_x = None if q is None else per_depth(_at)(q, x)
  ok = prop.valid & rule.accepts(u[:, :gamma], p_x, q_x)
  accepted = jnp.sum(jnp.cumprod(ok.astype(jnp.int32), axis=1), axis=1)
  if q is None:
    beta = per_depth(lambda p_d, x_d: rule.overlap(p_d, None, x_d))(
        p[:, :gamma], x)
  else:
    beta = per_depth(rule.overlap)(p[:, :gamma], q, x)
  beta = jnp.where(prop.valid, beta, 0.0)
  # Where the walk stopped: a rejection of a proposed token leaves the
  # residual; past the proposal (or after a full accept) p itself.
  stop = jnp.minimum(accepted, gamma - 1)
  p_stop = p[rows, accepted]
  rejected = (accepted < gamma) & prop.valid[rows, stop]
  q_stop = None if q is None else q[rows, stop]
  p_stop = _where(rejected, rule.residual(p_stop, q_stop), p_stop)
  nxt = rule.draw(u[:, -1], p_stop)
  hit = depths < accepted[:, None]
  return _verdict(x, accepted, nxt, beta, rule.accept_prob(p_x, q_x), p,
                  path=jnp.where(hit, depths + 1, accepted[:, None]),
                  rank=jnp.where(hit, 0, 1),
                  tested=depths <= accepted[:, None], drafted=x)


def _at(q: Any, x: jax.Array) -> Any:
  """q(x) [B] of q [B, V], or None without q."""
  if q is None:
    return None
  return jnp.take_along_axis(q, x[:, None], axis=-1)[:, 0]


def _where(mask: jax.Array, a: jax.Array, b: jax.Array) -> jax.Array:
  """where(mask [B], a, b) for per-row values of any rank."""
  return jnp.where(mask.reshape(mask.shape + (1,) * (a.ndim - 1)), a, b)


def _drafted(tokens, path, accepted, shape: TreeShape) -> jax.Array:
  """int32 [B, D]: the accepted tokens, then the first-child line."""
  children = jnp.asarray(shape.children)
  has = jnp.asarray(shape.num_children > 0)
  prev = jnp.zeros_like(accepted)
  out = []
  for d in range(shape.depth):
    first = jnp.where(has[prev], children[prev, 0], 0)
    prev = jnp.where(d < accepted, path[:, d], first)
    out.append(jnp.where(prev > 0, jnp.take_along_axis(
        tokens, prev[:, None], axis=1)[:, 0], 0))
  return jnp.stack(out, axis=1)


def _verdict(path_tokens, accepted, nxt, beta, accept_prob, p, path, rank,
             tested, drafted) -> Verdict:
  """The Verdict of accepting the first `accepted` [B] of `path_tokens`
  [B, D] then emitting `nxt` [B]."""
  depth = path_tokens.shape[1]
  positions = jnp.arange(depth + 1)[None, :]
  new = jnp.concatenate([path_tokens, jnp.zeros_like(path_tokens[:, :1])], 1)
  new = jnp.where(positions == accepted[:, None], nxt[:, None], new)
  count = accepted + 1
  return Verdict(accepted=accepted.astype(jnp.int32),
                 next=nxt.astype(jnp.int32), tokens=new,
                 count=count.astype(jnp.int32), beta=beta,
                 accept_prob=accept_prob, probs=p, path=path, rank=rank,
                 tested=tested, drafted=drafted)


def verify_chain(rule: Any, sampler: Any, logits: jax.Array, prop: Proposal,
                 key: jax.Array) -> Verdict:
  """`walk` over a chain proposal (tokens [B, G]) with the verifier's
  logits [B, G + 1, V] at the pending token and each draft token."""
  shape = TreeShape.chain(prop.tokens.shape[1])
  return walk(rule, rule.target(sampler, logits), prop, shape, key)


def speculative_accept(
    rng: jax.Array,
    draft_tokens: jax.Array,
    draft_probs: jax.Array,
    target_probs: jax.Array,
    lenience: float = 1.0,
    num_proposed: jax.Array | None = None,
    rule: Any = None,
) -> tuple[jax.Array, jax.Array]:
  """Algorithm 1 on given probabilities: `walk` over a chain with
  `acceptance.Sampled(lenience)` (or `rule`), as a function of arrays.

  Draft token x_i is accepted while r_i * l * q_i(x_i) <= p_i(x_i) with
  r_i ~ U(0, 1]; at the first rejection (position n+1) the next token is
  drawn from norm(max(0, p_{n+1} - l * q_{n+1})), or from p_{n+1} if that
  residual is numerically zero; if all gamma are accepted it is the bonus
  token, drawn from p_{gamma+1}. With l = 1 the output is distributed
  exactly as the target's.

  Args:
    rng: one PRNG key, or one key per row ([B] typed keys or [B, 2] raw).
    draft_tokens: int32 [B, G], sampled from `draft_probs`.
    draft_probs: float [B, G, V], the q each draft token was sampled from.
    target_probs: float [B, G+1, V], p at each of the G+1 verified positions.
    lenience: l in (0, 1]; 1 is exact, smaller accepts more (lossy).
    num_proposed: optional int [B] in [1, G]: row b proposed only its first
      k_b tokens (an adaptive draft length); positions >= k_b are padding.
      They are never accepted, and when all k_b proposals are accepted the
      next token is drawn from p_{k_b + 1} itself (nothing was proposed
      there, so there is no residual). None means every row proposed G.
    rule: another acceptance rule whose P is probabilities (e.g.
      `sd.TypicalAcceptance()`); then `lenience` must stay 1.

  Returns:
    (num_accepted int32 [B] in [0, G], next_token int32 [B]).
  """
  if not isinstance(lenience, jax.Array):  # a traced one was checked
    lenience = sampling.validate_lenience(lenience)
  if rule is not None and (isinstance(lenience, jax.Array)
                           or lenience != 1.0):
    raise ValueError("speculative_accept: lenience is Sampled's setting; "
                     "with rule=, pass it in the rule.")
  batch, gamma = draft_tokens.shape
  if draft_probs.shape[:2] != (batch, gamma):
    raise ValueError(f"draft_probs {draft_probs.shape} does not match "
                     f"draft_tokens {draft_tokens.shape}.")
  if target_probs.shape[:2] != (batch, gamma + 1):
    raise ValueError(f"target_probs must be [batch, gamma+1, vocab] = "
                     f"[{batch}, {gamma + 1}, V], got {target_probs.shape}.")
  if jax.dtypes.issubdtype(rng.dtype, jax.dtypes.prng_key):
    keys = rng if rng.ndim == 1 else jax.random.split(rng, batch)
  else:
    keys = rng if rng.ndim == 2 else jax.random.split(rng, batch)
  length = (jnp.full((batch,), gamma, jnp.int32) if num_proposed is None
            else jnp.asarray(num_proposed, jnp.int32))
  prop = chain_proposal(draft_tokens.astype(jnp.int32),
                        jnp.asarray(draft_probs, jnp.float32),
                        jnp.zeros((batch, gamma), jnp.float32), length)
  verdict = walk(acceptance.Sampled(lenience) if rule is None else rule,
                 jnp.asarray(target_probs, jnp.float32), prop,
                 TreeShape.chain(gamma), keys)
  return verdict.accepted, verdict.next


def counted_positions(emitted: jax.Array, length: jax.Array,
                      gamma: int) -> jax.Array:
  """bool [B, G]: the draft positions whose verification the counters
  (alpha, beta sums, per-level counters, a stop rule's statistics) take:
  proposed (below `length` [B]) and emitted (below `emitted` [B], the
  tokens the row really appended, so nothing after a stop id or past the
  length limit; 0 for a row that was already done)."""
  limit = jnp.minimum(emitted, length)
  return jnp.arange(gamma)[None, :] < limit[:, None]

