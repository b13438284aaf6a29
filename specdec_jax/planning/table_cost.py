"""What a reproduction will cost, projected before anything runs.

`scripts/reproduce_tables.py` prints this before its first decode, so that
`--max_examples` can be chosen knowing the bill. The projection is a
roofline from shapes alone (no compile, no checkpoint read):

  target step  = decoder weight bytes per device / the chip's HBM bandwidth
  c            = the draft's step over the target's, the same way
  one example  = L target steps for the baseline, plus L / speedup(alpha,
                 gamma, c) (Theorem 3.8) for each gamma of each row, times
                 the run's repeats

with L a typical output length of the task and alpha the paper's Table 2
value for the row (rows the paper has no alpha for are counted at the
target's own pace). Rows that share a baseline (`reproduce.share_groups`)
pay for it once. Prefill, compilation and loading are left out, so real
runs take longer; the number is for choosing how many examples to run.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from specdec_jax import theory
from specdec_jax.experiments import fit
from specdec_jax.infra import chips
from specdec_jax.experiments import experiment
from specdec_jax.planning import plan

# Mean output tokens with EOS under T5's vocabulary, measured on the files
# in shared/data: the 100 newstest2014 references (33.6) and the 100 CNN/DM
# test highlights (79.4).
TYPICAL_OUTPUT_TOKENS = {"ende": 34, "cnndm": 79}

# Examples in the splits the configs decode (TFDS's split sizes).
SPLIT_EXAMPLES = {("wmt14_ende", "test"): 3003,
                  ("wmt_t2t_ende", "test"): 3003,
                  ("cnn_dailymail", "test"): 11490,
                  ("cnn_dailymail", "validation"): 13368}


@dataclasses.dataclass(frozen=True)
class RowCost:
  """One row's projected seconds (None, with `why`, when not projected)."""

  name: str
  examples: int | None
  baseline_seconds: float | None  # the whole split's baseline decodes
  speculative_seconds: float | None  # every gamma's decodes
  why: str = ""


def _task_key(task: str) -> str | None:
  return "cnndm" if "cnn" in task else "ende" if "ende" in task else None


def row_cost(config: experiment.ExperimentConfig,
             chip: chips.Chip) -> RowCost:
  """The projected seconds of one experiment's decodes on `chip`."""
  name = config.name or str(config.draft)
  examples = config.max_examples or SPLIT_EXAMPLES.get(
      (config.task, config.split))
  length = TYPICAL_OUTPUT_TOKENS.get(_task_key(config.task))
  if examples is None or length is None:
    return RowCost(name, examples, None, None,
                   f"no typical size known for {config.task}/{config.split}"
                   "; set ExperimentConfig.max_examples")
  try:
    shape = fit.run_shape(config)
  except experiment.ConfigError as e:
    return RowCost(name, examples, None, None, str(e))
  weights = plan.decoder_step_bytes(shape)
  step = weights["target"] / chip.hbm_bytes_per_s
  c = weights["draft"] / weights["target"]
  tokens = min(length, config.max_decode_len)
  baseline = examples * config.repeats * tokens * step
  row = plan.paper_row(config)
  gammas = config.gammas()
  gammas = (shape.gamma,) if isinstance(gammas, str) else gammas
  speculative = 0.0
  for gamma in gammas:
    speedup = 1.0 if row is None else float(
        theory.walltime_improvement(row[1], gamma, c))
    speculative += baseline / speedup
  return RowCost(name, examples, baseline, speculative)


def project(groups: Sequence[Sequence[experiment.ExperimentConfig]],
            chip: chips.Chip) -> tuple[float, list[str]]:
  """Seconds for every group (each baseline once) and lines describing it.

  Args:
    groups: experiments that share a baseline, as `reproduce` runs them.
    chip: the chip each run decodes on (one run at a time).

  Returns:
    (total seconds of the projected rows, human-readable lines).
  """
  total, lines = 0.0, []
  for group in groups:
    costs = [row_cost(c, chip) for c in group]
    projected = [r for r in costs if r.baseline_seconds is not None]
    for r in costs:
      if r.baseline_seconds is None:
        lines.append(f"  {r.name}: not projected ({r.why})")
    if not projected:
      continue
    baseline = max(r.baseline_seconds for r in projected)
    seconds = baseline + sum(r.speculative_seconds for r in projected)
    total += seconds
    lines.append(
        f"  {', '.join(r.name for r in projected)}: {projected[0].examples} "
        f"examples, {_hours(seconds)} (baseline {_hours(baseline)}, decoded "
        f"once for {len(projected)} row{'s' * (len(projected) > 1)})")
  lines.insert(0, f"projected decode time on one {chip.name} chip: "
               f"{_hours(total)} (roofline from shapes; prefill, compiles "
               "and loading not counted)")
  return total, lines


def _hours(seconds: float) -> str:
  if seconds < 3600:
    return f"{seconds / 60:.1f} min"
  return f"{seconds / 3600:.1f} h"
