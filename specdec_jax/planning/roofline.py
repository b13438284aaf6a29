"""Roofline times: what a step cannot beat on a chip (compute, HBM traffic,
collectives over the interconnect), and where speculative decoding breaks
even (the plan's arithmetic, from `compiled.py`'s figures).
"""

from __future__ import annotations

from specdec_jax import theory
from specdec_jax.infra import chips

# A step that accesses more than this many times its weights' bytes is
# flagged (e.g. a cache copied instead of updated in place).
BYTES_RATIO_FLAG = 2.0


def _collective_seconds(collectives, chip: chips.Chip, parts: int) -> float:
  """Ring-algorithm bandwidth time of `collectives` (latency ignored)."""
  if parts <= 1:
    return 0.0
  factor = {"all-reduce": 2 * (parts - 1) / parts,
            "all-gather": (parts - 1) / parts,
            "reduce-scatter": (parts - 1) / parts}
  return sum(c["count"] * c["bytes"] * factor.get(c["kind"], 1.0)
             for c in collectives) / chip.interconnect_bytes_per_s


def roofline_seconds(step: dict, chip: chips.Chip, parts: int,
                     num_bytes: float) -> float:
  """max(compute, HBM traffic of `num_bytes`) + collectives: a bound, not a
  measurement. Plans pass `step["bytes_from_shapes"]`; on a real device
  `benchmarks/gpu.py` passes its compiler's `step["bytes_accessed"]`."""
  return (max(step["flops"] / chip.bf16_flops,
              num_bytes / chip.hbm_bytes_per_s)
          + _collective_seconds(step["collectives"], chip, parts))


def break_even_alpha(gamma: int, c: float, verify_cost: float) -> float | None:
  """The alpha at which Theorem 3.8's speedup is 1, or None if none is.

  E[tokens] = (1 - alpha^(gamma+1)) / (1 - alpha) rises from 1 (alpha 0)
  to gamma + 1 (alpha -> 1); an iteration costs gamma c + v target steps.
  """
  cost = gamma * c + verify_cost
  if cost <= 1.0:
    return 0.0
  if cost >= gamma + 1:
    return None
  lo, hi = 0.0, 1.0
  for _ in range(60):
    mid = (lo + hi) / 2
    if theory.expected_tokens(mid, gamma) < cost:
      lo = mid
    else:
      hi = mid
  return hi
