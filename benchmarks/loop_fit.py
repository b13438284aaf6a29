r"""Where a finished run's rows fall short of their prediction, from its files.

  python benchmarks/loop_fit.py [--workdir=results/demo]

Reads the rows a `make demo` (or any experiment run) wrote and needs no
model: for each row folder under --workdir that holds `examples.jsonl` and
`costs.json`, and each gamma, it prints

- the measured speedup against `predicted_at_lengths_with_verify_cost`
  (Theorem 3.8 at the outputs' lengths and the measured verification cost,
  the demo's yardstick) and against `predicted_with_prefill` (the same with
  both models' prefills), and their ratios;
- a line fitted across the row's examples, time = fixed + per-call x calls,
  for the target alone (calls = tokens) and for speculative decoding (calls
  = target calls, i.e. iterations), against what `costs.json` timed on its
  own: one target step and its prefill; gamma draft steps + one
  verification, and both prefills. The fitted iteration minus the timed one
  is what an iteration of the loop costs beyond its model calls (the
  draft's refeed, acceptance, buffers, caches evicted between the two
  models), the part Theorem 3.8's cost model leaves out;
- the alpha a draft would need for the row to reach --goal (default 2.5x)
  at the same gamma, costs and output lengths (greedy outputs are the
  target's, whatever the draft): for the yardstick itself, and for the
  measured speedup if the row kept its efficiency (speedup over
  `predicted_with_prefill`). "-" where even alpha = 1 falls short.

With few distinct call counts per row (a sentence takes 2-5 iterations) the
fit is noisy; read it across rows, not one number at a time.
"""

import json
import os

from absl import app
from absl import flags
import numpy as np

from specdec_jax import theory
from specdec_jax.experiments import records
from specdec_jax.experiments import workdir as workdir_lib

flags.DEFINE_string("workdir", "results/demo", "A finished run's folder (a "
                    "row folder, or a folder of row folders as the demo "
                    "writes).")
flags.DEFINE_float("goal", 2.5, "The speedup to solve alpha for.")
args = flags.FLAGS


def _row_dirs(root):
  if os.path.exists(os.path.join(root, "examples.jsonl")):
    return [root]
  return [os.path.join(root, d) for d in sorted(os.listdir(root))
          if os.path.exists(os.path.join(root, d, "examples.jsonl"))
          and os.path.exists(os.path.join(root, d, "costs.json"))]


def _fit(calls, seconds):
  """(fixed, per call) in ms of seconds = fixed + per_call * calls; NaNs
  when every example made the same number of calls."""
  calls = np.asarray(calls, np.float64)
  if len(set(calls.tolist())) < 2:
    return float("nan"), float("nan")
  per_call, fixed = np.polyfit(calls, np.asarray(seconds) * 1e3, 1)
  return fixed, per_call


def _report(row_dir):
  done = [records.ExampleRecord.from_json(r) for r in workdir_lib.read_done(
      os.path.join(row_dir, "examples.jsonl"), truncate=False)]
  with open(os.path.join(row_dir, "costs.json")) as f:
    costs_by_gamma = json.load(f)
  name = os.path.basename(os.path.normpath(row_dir))
  base = [r.baseline for r in done]
  b_fixed, b_step = _fit([len(b.tokens) for b in base],
                         [b.time_s for b in base])
  for g, cost in sorted(costs_by_gamma.items(), key=lambda kv: int(kv[0])):
    gamma = int(g)
    spec = [r.speculative[gamma] for r in done if gamma in r.speculative]
    if len(spec) != len(done):
      continue
    speedup = sum(b.time_s for b in base) / sum(s.time_s for s in spec)
    alpha = theory.pooled_alpha([s.alpha_sum for s in spec],
                                [s.alpha_count for s in spec])
    lengths = [len(s.tokens) for s in spec]
    yardstick = theory.walltime_improvement_at_lengths(
        alpha, gamma, cost["c"], lengths, verify_cost=cost["verify_cost"])
    with_prefill = theory.walltime_improvement_at_lengths(
        alpha, gamma, cost["c"], lengths, verify_cost=cost["verify_cost"],
        target_prefill=cost["target_prefill_cost"],
        draft_prefill=cost["draft_prefill_cost"])
    need_yardstick = theory.alpha_for_improvement(
        args.goal, gamma, cost["c"], cost["verify_cost"], lengths=lengths)
    need_measured = theory.alpha_for_improvement(
        args.goal * with_prefill / speedup, gamma, cost["c"],
        cost["verify_cost"], lengths=lengths,
        target_prefill=cost["target_prefill_cost"],
        draft_prefill=cost["draft_prefill_cost"])
    s_fixed, s_iter = _fit([s.target_calls for s in spec],
                           [s.time_s for s in spec])
    timed_iter = (gamma * cost["draft_step_s"] + cost["verify_step_s"]) * 1e3
    print(f"{name:30s} {gamma:2d} {alpha:6.3f} {speedup:6.2f}x "
          f"{yardstick:6.2f}x {speedup / yardstick:5.2f} "
          f"{with_prefill:6.2f}x {speedup / with_prefill:5.2f} | "
          f"{b_fixed:6.2f} + {b_step:5.2f} ({cost['target_prefill_s'] * 1e3:5.2f}"
          f" + {cost['target_step_s'] * 1e3:5.2f}) | "
          f"{s_fixed:6.2f} + {s_iter:5.2f} "
          f"({(cost['target_prefill_s'] + cost['draft_prefill_s']) * 1e3:5.2f}"
          f" + {timed_iter:5.2f}) | {s_iter - timed_iter:5.2f} | "
          f"{_alpha(need_yardstick)} {_alpha(need_measured)}")


def _alpha(alpha):
  return "    -" if np.isnan(alpha) else f"{alpha:5.3f}"


def main(argv):
  del argv
  dirs = _row_dirs(args.workdir)
  if not dirs:
    raise SystemExit(f"no finished rows (examples.jsonl and costs.json) in "
                     f"{args.workdir}: run `make demo` or an experiment first")
  print("row                             γ      α  speedup "
        "at_len+v ratio +prefill ratio | target alone: fit fixed + per step "
        "(timed prefill + step), ms | speculative: fit fixed + per "
        "iteration (timed prefills + γ draft steps + verify), ms | "
        "iteration beyond its timed calls, ms | alpha for --goal: "
        "yardstick, measured at the row's efficiency")
  for row_dir in dirs:
    _report(row_dir)


if __name__ == "__main__":
  app.run(main)
