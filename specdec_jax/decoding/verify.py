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
  new = jnp.concatenate([tokens, jnp.zeros_like(tokens[:, :1])], axis=1)
  new = jnp.where(positions == accepted[:, None], nxt[:, None], new)
  is_eos = (new == EOS_ID) & (positions <= accepted[:, None])
  first_eos = jnp.min(jnp.where(is_eos, positions, gamma + 1), axis=1)
  count = jnp.minimum(accepted + 1, first_eos + 1)
  return Verdict(accepted=accepted.astype(jnp.int32),
                 next=nxt.astype(jnp.int32), tokens=new,
                 count=count.astype(jnp.int32), beta=beta,
                 accept_prob=accept_prob, probs=p)


def counted_positions(emitted: jax.Array, length: jax.Array,
                      gamma: int) -> jax.Array:
  """bool [B, G]: the draft positions whose verification the counters
  (alpha, beta sums, per-level counters, a stop rule's statistics) take:
  proposed (below `length` [B]) and emitted (below `emitted` [B], the
  tokens the row really appended, so nothing after an EOS or past the
  length limit; 0 for a row that was already done)."""
  limit = jnp.minimum(emitted, length)
  return jnp.arange(gamma)[None, :] < limit[:, None]
