"""What a decode measured, per row: `DecodeStats`.

Both loops return one `DecodeStats` (a pytree, so it leaves the jitted loop
as it is and is fetched to the host with the tokens). Fields that only
speculative decoding fills are None after `generate`; the `trace_*` fields
are None unless `record_trace=True`.

Dimension letters: B batch, G gamma, T max_decode_len.
"""

from __future__ import annotations

from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import theory
from specdec_jax.decoding.protocol import Proposal


@flax.struct.dataclass
class DecodeStats:
  """Per-row counters of one decode (numpy on the host, jax in the loop).

  Attributes:
    length: int32 [B] tokens generated (the stop id that ended the row
      included).
    target_calls: int32 [B] target runs: one per token for `generate`, one
      per iteration (scoring gamma + 1 positions) for speculative decoding.
    draft_calls: int32 [B] draft steps (gamma per iteration).
    accepted_tokens: int32 [B] emitted tokens that came from the draft.
    target_tokens: int32 [B] emitted tokens that came from the target (the
      correction after a rejection, or the bonus token after a full accept);
      `accepted_tokens + target_tokens == length`.
    accepted_histogram: int32 [B, G + 1] iterations that accepted 0..G draft
      tokens.
    alpha_sum, alpha_count: float32 / int32 [B] the sum of
      beta = sum_x min(p, q) over the verified positions whose prefix was
      accepted, and their number; pooled over rows or examples by
      `theory.pooled_alpha` (each position weighs the same).
    alpha: float32 [B] alpha_sum / alpha_count: the row's beta, the
      acceptance rate Algorithm 1 expects (no sampling noise: computed from
      p and q, not drawn). A rule other than Algorithm 1 accepts at another
      rate: see `acceptance_rate`.
    proposed_tokens: int32 [B] draft tokens proposed (a tree: its depth per
      iteration); accepted_tokens / proposed_tokens is the share of the
      proposals kept.
    acceptance_rate: float32 [B] accepted_tokens / alpha_count: the
      acceptance the rule really had, measured at the positions alpha
      averages (each iteration's accepted ones and its first rejected one).
      Its expectation is alpha under an exact rule; a lenient rule moves
      it, not alpha.
    exact: True when the output is distributed exactly as the target's
      (every shipped rule at its defaults); False for a lossy rule
      (`rule.exact` False, or lenience < 1). Static: not an array.
    tokens_per_target_call: float32 [B] length / target_calls.
    trace_draft: int32 [B, T, G] draft tokens of iteration t (zeros past the
      row's last iteration).
    trace_accepted: int32 [B, T] accepted draft tokens of iteration t (-1
      past the row's last iteration).
    trace_next: int32 [B, T] the target's token appended in iteration t.
    proposal_histogram: int32 [B, G + 1] iterations that proposed k draft
      tokens (k >= 1; all at G without a `draft_stop` rule). With a rule,
      `draft_calls` counts the draft runs each row needed (rows that
      stopped proposing do not pay for the others).
    level_calls: int32 [B, D + 1] model runs per level: 0 the target, 1 the
      draft, 2 a cascade's drafter, ... (`target_calls`, `draft_calls`
      are levels 0 and 1). A horizontal drafter lists its early part's
      levels, then its late part's.
    level_alpha_sum, level_alpha_count: [B, D] as alpha_sum / alpha_count,
      for the acceptance of level i + 1's tokens by level i.
    level_alpha: float32 [B, D] their ratio (NaN where a level verified
      nothing, e.g. between a horizontal drafter's two parts);
      level_alpha[:, 0] is `alpha`.
    trace_proposed: int32 [B, T] draft tokens proposed in iteration t.
    stop_state: the `draft_stop` rule's final per-row statistics, a dict
      (ExpectedGainStop: `accept_sum`, `count` [B, bins]; see
      `stopping.calibration`), or None.
    rank_histogram: int32 [B, G, k + 1] with a token tree (G its depth, k
      its most children a node): at each depth walked, how often the child
      of each rank was accepted (k: none was); None without a tree.
    target_nonfinite, draft_nonfinite: bool [B] any logit the target (the
      draft) produced for the row was NaN or inf; None when decoding ran
      with on_nonfinite='ignore' (draft_nonfinite also after `generate`).
  """

  length: Any
  target_calls: Any
  draft_calls: Any = None
  accepted_tokens: Any = None
  target_tokens: Any = None
  accepted_histogram: Any = None
  alpha_sum: Any = None
  alpha_count: Any = None
  alpha: Any = None
  tokens_per_target_call: Any = None
  trace_draft: Any = None
  trace_accepted: Any = None
  trace_next: Any = None
  proposal_histogram: Any = None
  level_calls: Any = None
  level_alpha_sum: Any = None
  level_alpha_count: Any = None
  level_alpha: Any = None
  trace_proposed: Any = None
  stop_state: Any = None
  rank_histogram: Any = None
  target_nonfinite: Any = None
  draft_nonfinite: Any = None
  proposed_tokens: Any = None
  acceptance_rate: Any = None
  exact: Any = flax.struct.field(pytree_node=False, default=None)

  def pooled_alpha(self) -> float:
    """alpha over every verified position of every row."""
    return theory.pooled_alpha(np.asarray(self.alpha_sum),
                               np.asarray(self.alpha_count))

  def pooled_acceptance_rate(self) -> float:
    """`acceptance_rate` over every verified position of every row."""
    return theory.pooled_alpha(np.asarray(self.accepted_tokens, np.float64),
                               np.asarray(self.alpha_count))


@flax.struct.dataclass
class Trace:
  """The per-iteration record of a speculative loop (`record_trace=True`).

  Attributes:
    draft: int32 [B, T, G], the draft tokens of iteration t (along the
      walked path for a tree).
    accepted: int32 [B, T], draft tokens accepted (-1: no iteration).
    next: int32 [B, T], the target's token appended.
    proposed: int32 [B, T], draft tokens proposed.
  """

  draft: jax.Array
  accepted: jax.Array
  next: jax.Array
  proposed: jax.Array

  @classmethod
  def empty(cls, batch: int, max_decode_len: int, gamma: int) -> "Trace":
    zeros = jnp.zeros((batch, max_decode_len), jnp.int32)
    return cls(draft=jnp.zeros((batch, max_decode_len, gamma), jnp.int32),
               accepted=jnp.full((batch, max_decode_len), -1, jnp.int32),
               next=zeros, proposed=zeros)


@flax.struct.dataclass
class Counters:
  """What the speculative loop counts as it goes (`DecodeStats`'s fields of
  the same names; D levels below the target, k a tree's most children).

  Attributes:
    target_calls, draft_calls, accepted_tokens, target_tokens: int32 [B].
    accepted_histogram, proposal_histogram: int32 [B, G + 1].
    alpha_sum: float32 [B]; alpha_count: int32 [B].
    level_calls: int32 [B, D + 1]; level_alpha_sum: float32 [B, D];
      level_alpha_count: int32 [B, D].
    rank_histogram: int32 [B, G, k + 1] with a token tree, else None.
    trace: the `Trace` with `record_trace`, else None.
  """

  target_calls: jax.Array
  draft_calls: jax.Array
  accepted_tokens: jax.Array
  target_tokens: jax.Array
  accepted_histogram: jax.Array
  proposal_histogram: jax.Array
  alpha_sum: jax.Array
  alpha_count: jax.Array
  level_calls: jax.Array
  level_alpha_sum: jax.Array
  level_alpha_count: jax.Array
  rank_histogram: Any = None
  trace: Any = None

  @classmethod
  def zeros(cls, batch: int, gamma: int, depth: int, max_decode_len: int,
            record_trace: bool, tree_width: int | None = None) -> "Counters":
    """All counters at zero (and the trace empty, with `record_trace`)."""
    zeros = jnp.zeros((batch,), jnp.int32)
    hist = jnp.zeros((batch, gamma + 1), jnp.int32)
    return cls(
        target_calls=zeros, draft_calls=zeros, accepted_tokens=zeros,
        target_tokens=zeros, accepted_histogram=hist,
        proposal_histogram=hist,
        alpha_sum=jnp.zeros((batch,), jnp.float32), alpha_count=zeros,
        level_calls=jnp.zeros((batch, depth + 1), jnp.int32),
        level_alpha_sum=jnp.zeros((batch, depth), jnp.float32),
        level_alpha_count=jnp.zeros((batch, depth), jnp.int32),
        rank_histogram=None if tree_width is None else jnp.zeros(
            (batch, gamma, tree_width + 1), jnp.int32),
        trace=(Trace.empty(batch, max_decode_len, gamma) if record_trace
               else None))

  def decode_stats(self, length: jax.Array, **more: Any) -> DecodeStats:
    """The `DecodeStats` of a finished loop whose rows have `length` [B]."""
    trace = self.trace
    depths = jnp.arange(self.proposal_histogram.shape[1])
    proposed = jnp.sum(self.proposal_histogram * depths, axis=1)
    return DecodeStats(
        length=length,
        target_calls=self.target_calls, draft_calls=self.draft_calls,
        accepted_tokens=self.accepted_tokens,
        target_tokens=self.target_tokens,
        accepted_histogram=self.accepted_histogram,
        proposal_histogram=self.proposal_histogram,
        alpha_sum=self.alpha_sum, alpha_count=self.alpha_count,
        alpha=self.alpha_sum / jnp.maximum(self.alpha_count, 1),
        level_calls=self.level_calls, level_alpha_sum=self.level_alpha_sum,
        level_alpha_count=self.level_alpha_count,
        level_alpha=jnp.where(
            self.level_alpha_count > 0,
            self.level_alpha_sum / jnp.maximum(self.level_alpha_count, 1),
            jnp.nan),
        tokens_per_target_call=length / jnp.maximum(self.target_calls, 1),
        proposed_tokens=proposed,
        acceptance_rate=(self.accepted_tokens
                         / jnp.maximum(self.alpha_count, 1)),
        rank_histogram=self.rank_histogram,
        trace_draft=None if trace is None else trace.draft,
        trace_accepted=None if trace is None else trace.accepted,
        trace_next=None if trace is None else trace.next,
        trace_proposed=None if trace is None else trace.proposed,
        **more)


@flax.struct.dataclass
class Iteration:
  """What one iteration of the speculative loop did, per row (the record
  `SpeculativeDecoder.iterate` yields).

  Attributes:
    proposal: the drafter's `Proposal` (tokens [B, M], length [B], ...).
    accepted: int32 [B] draft tokens the walk accepted.
    tokens: int32 [B, G + 1] the walk's tokens: the accepted ones, then the
      target's correction or bonus token.
    emitted: int32 [B] how many of `tokens` the row appended (cut after a
      stop id and at max_decode_len; 0 for a row already done).
    counters: the `stats.Counters` after the iteration.
  """

  proposal: Proposal
  accepted: jax.Array
  tokens: jax.Array
  emitted: jax.Array
  counters: Counters

  def new_tokens(self, row: int) -> np.ndarray:
    """The tokens row `row` appended in this iteration (on the host)."""
    return np.asarray(self.tokens)[row, :int(np.asarray(self.emitted)[row])]
