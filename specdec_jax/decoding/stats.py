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
import numpy as np

from specdec_jax import theory


@flax.struct.dataclass
class DecodeStats:
  """Per-row counters of one decode (numpy on the host, jax in the loop).

  Attributes:
    length: int32 [B] tokens generated (EOS included).
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
    alpha: float32 [B] alpha_sum / alpha_count: the row's acceptance rate
      (no sampling noise: beta is computed from p and q, not drawn).
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

  def pooled_alpha(self) -> float:
    """alpha over every verified position of every row."""
    return theory.pooled_alpha(np.asarray(self.alpha_sum),
                               np.asarray(self.alpha_count))
