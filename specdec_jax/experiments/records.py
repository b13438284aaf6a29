"""What an experiment writes per example: typed records, one JSON line each.

`examples.jsonl` holds one `ExampleRecord` a line (flushed and fsynced as it
is produced, so a killed run resumes where it stopped). The JSON layout is
the dataclasses' fields, with `speculative` keyed by gamma as a string:

  {"id", "input_length", "target_text",
   "baseline": {"tokens", "time_s", "text", "target_calls"},
   "speculative": {"7": {"tokens", "time_s", "text", "target_calls",
                         "draft_calls", "accepted_histogram", "alpha",
                         "alpha_sum", "alpha_count", "proposal_histogram",
                         "level_calls", "level_alpha", "acceptance_rate",
                         "exact", "rank_histogram" (token trees)}}}
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from specdec_jax.data import vocabularies
from specdec_jax.tokens import DEFAULT_STOP_IDS


@dataclasses.dataclass(frozen=True)
class DecodeRecord:
  """One decode of one example (batch size 1).

  Attributes:
    tokens: the generated ids, the stop id that ended the row (EOS, or
      one of the run's `stop_ids`) included, nothing after it.
    time_s: seconds of the decode (the fastest of the repeats,
      `best_of.best_runs`).
    text: the detokenized output, cut before its first stop id.
    target_calls: target runs.
    draft_calls: draft steps (speculative decoding only; None otherwise).
    accepted_histogram: [gamma + 1] iterations that accepted 0..gamma draft
      tokens.
    alpha, alpha_sum, alpha_count: the example's acceptance rate and its
      parts (`DecodeStats`), pooled over examples by `theory.pooled_alpha`.
    proposal_histogram: [gamma + 1] iterations that proposed 0..gamma draft
      tokens (all at gamma without an adaptive stop rule).
    level_calls, level_alpha: per level of a cascade (the draft first),
      calls and acceptance rate.
    rank_histogram: [depth][k + 1] with a token tree: at each depth walked,
      the walks that accepted the child of each rank (k: none).
    acceptance_rate: accepted draft tokens over alpha_count, the measured
      acceptance beside alpha's expected one (`DecodeStats`).
    exact: False when a lossy acceptance rule decoded it (`DecodeStats`).
  """

  tokens: list[int]
  time_s: float
  text: str
  target_calls: int
  draft_calls: int | None = None
  accepted_histogram: list[int] | None = None
  alpha: float | None = None
  alpha_sum: float | None = None
  alpha_count: int | None = None
  proposal_histogram: list[int] | None = None
  level_calls: list[int] | None = None
  level_alpha: list[float] | None = None
  rank_histogram: list[list[int]] | None = None
  acceptance_rate: float | None = None
  exact: bool | None = None

  @classmethod
  def of(cls, result, seconds: float, vocab,
         stop_ids: Sequence[int] = DEFAULT_STOP_IDS) -> "DecodeRecord":
    """The record of row 0 of a `DecodeResult` decoded with `stop_ids`."""
    st = result.stats
    tokens = result.tokens[0, :int(st.length[0])].tolist()
    out = dict(tokens=tokens, time_s=float(seconds),
               text=vocabularies.detokenize(vocab, result.tokens[0],
                                            stop_ids),
               target_calls=int(st.target_calls[0]))
    if st.draft_calls is not None:
      out.update(
          draft_calls=int(st.draft_calls[0]),
          accepted_histogram=np.asarray(st.accepted_histogram[0]).tolist(),
          alpha=float(st.alpha[0]), alpha_sum=float(st.alpha_sum[0]),
          alpha_count=int(st.alpha_count[0]),
          proposal_histogram=np.asarray(st.proposal_histogram[0]).tolist(),
          level_calls=np.asarray(st.level_calls[0]).tolist(),
          level_alpha=np.asarray(st.level_alpha[0]).tolist(),
          acceptance_rate=float(st.acceptance_rate[0]),
          exact=None if st.exact is None else bool(st.exact))
    if st.rank_histogram is not None:
      out["rank_histogram"] = np.asarray(st.rank_histogram[0]).tolist()
    return cls(**out)

  def to_json(self) -> dict[str, Any]:
    return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}

  @classmethod
  def from_json(cls, data: dict[str, Any]) -> "DecodeRecord":
    return cls(**data)


@dataclasses.dataclass(frozen=True)
class ExampleRecord:
  """One example: the target alone and speculative decoding per gamma.

  Attributes:
    id: the task's example id.
    input_length: input tokens (EOS included, no padding).
    target_text: the reference output.
    baseline: the target alone (`generate`).
    speculative: gamma -> `speculative_generate` with that gamma.
  """

  id: str
  input_length: int
  target_text: str
  baseline: DecodeRecord
  speculative: dict[int, DecodeRecord]

  def to_json(self) -> dict[str, Any]:
    return {"id": self.id, "input_length": self.input_length,
            "target_text": self.target_text,
            "baseline": self.baseline.to_json(),
            "speculative": {str(g): r.to_json()
                            for g, r in self.speculative.items()}}

  @classmethod
  def from_json(cls, data: dict[str, Any]) -> "ExampleRecord":
    return cls(id=data["id"], input_length=data["input_length"],
               target_text=data["target_text"],
               baseline=DecodeRecord.from_json(data["baseline"]),
               speculative={int(g): DecodeRecord.from_json(r)
                            for g, r in data["speculative"].items()})
