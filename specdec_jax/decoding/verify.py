"""One verification step: Algorithm 1 applied to a drafter's proposal.

Every verifier calls `verify`: the engine (the target checking the top-level
drafter) and a cascade (its middle model checking its inner drafter).
Horizontal drafters verify nothing themselves (their parts' tokens are
checked by whoever called them). It does the accept/reject, the residual,
the correction or bonus token, and splices them into the tokens the row
appends; `counted_positions` says which verified positions enter the
counters (`drafters.verified_level`), so every level counts alike.

The fast greedy path. With temperature 0, p and q are one-hot, and
Algorithm 1 accepts a draft token iff it is the verifier's argmax and
otherwise emits that argmax: an argmax and a comparison give the same
tokens and counters with no [V]-sized sampling work. It is taken when
`fast_greedy(sampler, draft_sample)` says so: greedy decoding with the
exact draft sampler (a test's deliberately wrong `draft_sample` must go
through the general path, and tests compare both).

Dimension letters: B batch, G most draft tokens per proposal, V vocabulary.
"""

from __future__ import annotations

from typing import Any, Callable

import flax
import jax
import jax.numpy as jnp

from specdec_jax import sampling
from specdec_jax import theory
from specdec_jax.decoding.drafters import Proposal
from specdec_jax.tokens import EOS_ID


def fast_greedy(sampler: sampling.SamplingConfig,
                draft_sample: Callable | None) -> bool:
  """Whether verification (and drafting) may take the argmax-only path:
  greedy decoding with the exact draft sampler (`draft_sample` None)."""
  return sampler.greedy and draft_sample is None


@flax.struct.dataclass
class Verdict:
  """What one verification decided, per row.

  Attributes:
    accepted: int32 [B] in [0, G], leading draft tokens accepted.
    next: int32 [B], the verifier's token after them (the correction at the
      first rejection, the bonus token after a full accept).
    tokens: int32 [B, G + 1], the accepted draft tokens then `next` (entries
      past accepted + 1 are meaningless).
    count: int32 [B] tokens of `tokens` the row emits: accepted + 1, cut
      after the first EOS among them (the caller cuts further at its
      length limit).
    beta: float32 [B, G], sum_x min(p, q) at each draft position (the
      verifier's p; one-hot match on the fast greedy path).
    accept_prob: float32 [B, G], min(1, p(x)/q(x)) of each draft token (1
      or 0 when greedy).
    probs: float32 [B, G + 1, V], the verifier's p (None on the fast greedy
      path), for a caller that needs it again (a cascade proposes it as q).
  """

  accepted: jax.Array
  next: jax.Array
  tokens: jax.Array
  count: jax.Array
  beta: jax.Array
  accept_prob: jax.Array
  probs: Any


def verify(logits: jax.Array, prop: Proposal, key: jax.Array,
           sampler: sampling.SamplingConfig, *, lenience: Any = 1.0,
           fast: bool = False) -> Verdict:
  """Algorithm 1 on the verifier's logits [B, G+1, V] over `prop`.

  Args:
    logits: the verifier's logits at the G + 1 positions after the pending
      token (position i scores draft token i; position G the bonus).
    prop: the proposal (tokens [B, G] with their q, `length` [B] proposed).
    key: one PRNG key per row [B] for the accept/residual draws.
    sampler: the transform of logits into p (the drafter used the same).
    lenience: l in (0, 1] (a float or a traced scalar); 1 is exact.
    fast: the fast greedy path (see `fast_greedy`).
  """
  tokens, length = prop.tokens, prop.length
  gamma = tokens.shape[1]
  positions = jnp.arange(gamma + 1)[None, :]
  if fast:
    best = sampling.argmax(logits)                           # [B, G+1]
    match = (best[:, :gamma] == tokens) & (positions[:, :gamma]
                                           < length[:, None])
    # Leading matches: the first mismatch's index (gamma if none).
    accepted = jnp.min(jnp.where(match, gamma, positions[:, :gamma]), 1)
    nxt = jnp.take_along_axis(best, accepted[:, None], axis=1)[:, 0]
    beta = accept_prob = match.astype(jnp.float32)
    p = None
  else:
    p = sampler.probs(logits)
    accepted, nxt = sampling.speculative_accept(key, tokens, prop.probs, p,
                                                lenience,
                                                num_proposed=length)
    beta = theory.acceptance_rate(p[:, :gamma], prop.probs)
    p_x = jnp.take_along_axis(p[:, :gamma], tokens[..., None], -1)[..., 0]
    q_x = jnp.take_along_axis(prop.probs, tokens[..., None], -1)[..., 0]
    accept_prob = jnp.where(q_x > 0, jnp.minimum(
        1.0, p_x / jnp.maximum(q_x, 1e-30)), 0.0)
  return _verdict(tokens, accepted, nxt, beta, accept_prob, p)


def _verdict(tokens, accepted, nxt, beta, accept_prob, p) -> Verdict:
  """The Verdict of accepting the first `accepted` [B] of the draft
  `tokens` [B, G] then emitting `nxt` [B]."""
  gamma = tokens.shape[1]
  positions = jnp.arange(gamma + 1)[None, :]
  new = jnp.concatenate([tokens, jnp.zeros_like(tokens[:, :1])], axis=1)
  new = jnp.where(positions == accepted[:, None], nxt[:, None], new)
  is_eos = (new == EOS_ID) & (positions <= accepted[:, None])
  first_eos = jnp.min(jnp.where(is_eos, positions, gamma + 1), axis=1)
  count = jnp.minimum(accepted + 1, first_eos + 1)
  return Verdict(accepted=accepted.astype(jnp.int32),
                 next=nxt.astype(jnp.int32), tokens=new,
                 count=count.astype(jnp.int32), beta=beta,
                 accept_prob=accept_prob, probs=p)


def verify_tree(logits: jax.Array, prop: Any, shape: Any, key: jax.Array,
                sampler: sampling.SamplingConfig, *, fast: bool = False,
                verifier: str = "exact") -> tuple[Verdict, jax.Array,
                                                  jax.Array]:
  """Walks a token tree from its root: one verification of a `TreeProposal`.

  At each node the children are tested in rank order by recursive
  rejection sampling: child c_j (drawn from q with c_1..c_{j-1} removed,
  renormalised: q_j) is accepted with probability min(1, p_j(c_j) /
  q_j(c_j)), where p_1 is the target's p at the node and each rejection
  leaves p_{j+1} = norm(max(0, p_j - q_j)); the walk moves to the accepted
  child, and where every child is rejected it emits a sample of the last
  residual. Each step outputs a sample of p_j given the rejections before
  it (the paper's Theorem: speculative sampling with q_j against p_j), so
  the token emitted at each depth follows the target's p exactly. After a
  leaf, the bonus token comes from p at the leaf. With the fast greedy
  path, the walk follows the child equal to the target's argmax.

  Args:
    logits: the target's logits [B, M + 1, V] at every node (0 the root).
    prop: the `trees.TreeProposal`.
    shape: its `trees.TreeShape`.
    key: one PRNG key per row [B].
    sampler: the transform of logits into p (the draft used the same).
    fast: the fast greedy path.
    verifier: "exact", or a deliberately wrong rule (`trees.VERIFIERS`).

  Returns:
    (the Verdict over the walked path, as over a chain of D tokens whose
    beta is sum_x min(p, q) at each node walked (the chain's alpha); the
    path int32 [B, D] of node indices (past the accepted ones: repeats of
    the last); rank int32 [B, D], the rank of the child accepted at each
    depth walked, k where none was, k + 1 where the walk ended at a node
    without children; tested bool [B, D], the depths where the walk tested
    children (the counters take only these)).
  """
  batch = logits.shape[0]
  depth, width = shape.depth, shape.max_children
  children = jnp.asarray(shape.children)
  num_children = jnp.asarray(shape.num_children)
  rows = jnp.arange(batch)
  if fast:
    best = sampling.argmax(logits)                               # [B, M+1]
    p = None
  else:
    p = sampler.probs(logits)
  keys = jax.vmap(lambda k: jax.random.split(k, depth + 1))(key)
  node = jnp.zeros((batch,), jnp.int32)
  searching = jnp.ones((batch,), jnp.bool_)
  accepted = jnp.zeros((batch,), jnp.int32)
  nxt = jnp.zeros((batch,), jnp.int32)
  path, ranks, betas, tested = [], [], [], []
  for d in range(depth):
    kids = children[node]                                        # [B, k]
    kid_tokens = jnp.take_along_axis(prop.tokens, kids, axis=1)
    kid_valid = ((jnp.arange(width)[None, :] < num_children[node][:, None])
                 & jnp.take_along_axis(prop.valid, kids, axis=1))
    if fast:
      target = best[rows, node]
      match = kid_valid & (kid_tokens == target[:, None])
      hit = jnp.any(match, axis=1)
      rank = jnp.min(jnp.where(match, jnp.arange(width)[None, :], width), 1)
      betas.append((kid_valid[:, 0] & (kid_tokens[:, 0] == target)
                    ).astype(jnp.float32))
      stop_token = target
    else:
      p_cur = p[rows, node]                                      # [B, V]
      q_cur = prop.probs[rows, node]
      betas.append(jnp.sum(jnp.minimum(p_cur, q_cur), axis=-1))
      u = jax.vmap(lambda k: jax.random.uniform(k, (width + 1,)))(keys[:, d])
      hit = jnp.zeros((batch,), jnp.bool_)
      rank = jnp.full((batch,), width, jnp.int32)
      for j in range(width):
        x = kid_tokens[:, j]
        q_norm = q_cur / jnp.maximum(jnp.sum(q_cur, -1, keepdims=True), 1e-30)
        q_x = q_norm[rows, x]
        p_x = p_cur[rows, x]
        # r in (0, 1], as in `sampling.speculative_accept`.
        ok = (kid_valid[:, j] & ~hit & (q_x > 0)
              & ((1.0 - u[:, j]) * q_x <= p_x))
        rank = jnp.where(ok, j, rank)
        hit = hit | ok
        rejected = (kid_valid[:, j] & ~hit)[:, None]
        if verifier == "exact":
          p_cur = jnp.where(rejected, sampling.residual(p_cur, q_norm),
                            p_cur)
        removed = jax.nn.one_hot(x, q_cur.shape[-1], dtype=jnp.bool_)
        q_cur = jnp.where(rejected & removed, 0.0, q_cur)
      if verifier != "exact":
        # The deliberately wrong rule: siblings were tested against p
        # itself; the correction takes the first child's residual only.
        p_cur = sampling.residual(p[rows, node], prop.probs[rows, node])
      stop_token = sampling.inverse_cdf(p_cur, u[:, width:])
    chosen = jnp.take_along_axis(kids, jnp.minimum(rank, width - 1)[:, None],
                                 axis=1)[:, 0]
    nxt = jnp.where(searching & ~hit, stop_token, nxt)
    # A walk that stopped at a node without children (a shape whose
    # branches end above its depth) tested nothing there: rank width + 1,
    # which the counters drop, as they drop its beta (`tested`).
    tested.append(searching & (num_children[node] > 0))
    ranks.append(jnp.where(tested[-1], rank,
                           jnp.where(searching, width + 1, width)))
    step = searching & hit
    node = jnp.where(step, chosen, node)
    path.append(node)
    accepted = accepted + step
    searching = step
  # A walk that reached a leaf: the bonus token from p at the leaf.
  if fast:
    bonus = best[rows, node]
  else:
    bonus = sampling.inverse_cdf(
        p[rows, node], jax.vmap(lambda k: jax.random.uniform(k, (1,)))(
            keys[:, depth]))
  nxt = jnp.where(searching, bonus, nxt)
  path = jnp.stack(path, axis=1)
  path_tokens = jnp.take_along_axis(prop.tokens, path, axis=1)
  beta = jnp.stack(betas, axis=1)
  verdict = _verdict(path_tokens, accepted, nxt, beta,
                     jnp.zeros_like(beta), p)
  return verdict, path, jnp.stack(ranks, axis=1), jnp.stack(tested, axis=1)


def counted_positions(emitted: jax.Array, length: jax.Array,
                      gamma: int) -> jax.Array:
  """bool [B, G]: the draft positions whose verification the counters
  (alpha, beta sums, per-level counters, a stop rule's statistics) take:
  proposed (below `length` [B]) and emitted (below `emitted` [B], the
  tokens the row really appended, so nothing after an EOS or past the
  length limit; 0 for a row that was already done)."""
  limit = jnp.minimum(emitted, length)
  return jnp.arange(gamma)[None, :] < limit[:, None]
