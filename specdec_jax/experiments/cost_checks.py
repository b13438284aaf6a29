"""Measured costs that contradict themselves: timed again once, then flagged.

A `make demo` on a busy machine printed "predicted 3.00x" beside a measured
speedup 0.42 of it, and a prediction with the verification cost (3.05x)
above the one without it (2.27x): the target's call on gamma + 1 tokens had
been timed cheaper than its call on one. Such numbers describe the
machine's interference, not the models, and a prediction built on them
says nothing. `contradictions` names what cannot be true of one
measurement:

  v < 1 on a CPU    a CPU does the work of every token it is given, so a
                    call on gamma + 1 tokens costs at least one on a single
                    token (an accelerator may verify for the price of a
                    step, and noise puts v either side of 1 there);
  c >= 1            the draft's step timed as slow as the target's while it
                    touches fewer parameters per token (c_hat < 1);
  spread > 2x       the slowest round of one timed step took over twice its
                    fastest: the machine changed speed under the
                    measurement.

`costs_file.load_or_measure` times a contradicting gamma's steps again once,
in rounds of their own; if the new costs still contradict, they are kept
with `cost_warning` (`flagged`), which the arm's rows carry (`report`) and
the demo's printed table marks.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

# The most the slowest round of one timed step may take over its fastest.
MAX_ROUND_SPREAD = 2.0
WARNING = "cost_warning"


def contradictions(costs: Mapping[str, Any], platform: str) -> list[str]:
  """What in one gamma's measured costs cannot be true (empty: nothing).

  Args:
    costs: `costs.measure_costs`'s dict: c, c_hat, verify_cost, and
      round_spread (absent or None where not measured: not judged).
    platform: the platform the steps were timed on (`jax.default_backend()`).

  Returns:
    One sentence per contradiction.
  """
  out = []
  v, c = costs.get("verify_cost"), costs.get("c")
  c_hat, spread = costs.get("c_hat"), costs.get("round_spread")
  if platform == "cpu" and v is not None and v < 1:
    out.append(f"verification timed at {v:.2f} target steps (< 1 on a CPU)")
  if (c is not None and c >= 1 and c_hat is not None
      and not math.isnan(c_hat) and c_hat < 1):
    out.append(f"c = {c:.2f} >= 1 for a draft of c_hat = {c_hat:.2f}")
  if spread is not None and spread > MAX_ROUND_SPREAD:
    out.append(f"a timed step's rounds spread {spread:.1f}x "
               f"(> {MAX_ROUND_SPREAD:g}x)")
  return out


def flagged(costs: Mapping[str, Any], platform: str) -> dict[str, Any]:
  """`costs` with `cost_warning` naming its contradictions, if any (and
  without an earlier one)."""
  out = {k: v for k, v in costs.items() if k != WARNING}
  found = contradictions(costs, platform)
  if found:
    out[WARNING] = ("costs contradict themselves after a second "
                    "measurement: " + "; ".join(found))
  return out
