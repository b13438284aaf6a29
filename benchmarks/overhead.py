r"""How much the decoding loop itself costs, against Theorem 3.8.

  python benchmarks/overhead.py --target=demo:target --draft=demo:draft_small
  python benchmarks/overhead.py --target=t5_1_1_tiny --draft=t5_tiny
      # random weights: alpha ~ 0.2, shows the loop's own cost

For each gamma it decodes the same inputs with the target alone and with
speculative decoding (compile excluded, results fetched to the host, median
of --repeats), and prints: alpha, c, the measured speedup, Theorem 3.8's
prediction and their ratio; and the time of one speculative iteration split
into gamma draft steps, one verification of gamma + 1 tokens (both timed in
isolation by `specdec_jax.costs`) and the rest: sampling, acceptance and
bookkeeping inside the while_loop, plus the per-call host work
(argument checks, transfers) spread over the iterations.
"""

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

import specdec_jax as sd  # noqa: E402
from specdec_jax import costs, theory  # noqa: E402


def _inputs(model, batch, length, seed=0):
  if model.vocab is not None:
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(here, "..", "specdec_jax", "demo_data", "sentences.en")
    with open(path) as f:
      lines = [l.strip() for l in f if l.strip()][:batch]
    rows = [model.vocab.encode("translate English to German: " + l) + [1]
            for l in lines]
  else:
    rng = np.random.default_rng(seed)
    rows = [list(rng.integers(3, model.vocab_size, length - 1)) + [1]
            for _ in range(batch)]
  width = max(len(r) for r in rows)
  ids = np.zeros((len(rows), width), np.int32)
  for i, r in enumerate(rows):
    ids[i, :len(r)] = r
  return ids


def _median_time(fn, repeats):
  fn()  # compile
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    out = fn()
    times.append(time.perf_counter() - t0)
  return out, statistics.median(times)


def main():
  p = argparse.ArgumentParser()
  p.add_argument("--target", default="demo:target")
  p.add_argument("--draft", default="demo:draft_small")
  p.add_argument("--gammas", default="1,2,3,4,5,6,7")
  p.add_argument("--examples", type=int, default=8)
  p.add_argument("--max_decode_len", type=int, default=64)
  p.add_argument("--repeats", type=int, default=5)
  p.add_argument("--temperature", type=float, default=0.0)
  args = p.parse_args()
  target, draft = sd.load_model(args.target), sd.load_model(args.draft)
  rows = _inputs(target, args.examples, 24)
  kw = dict(max_decode_len=args.max_decode_len, temperature=args.temperature)
  print(f"target={args.target} draft={args.draft} examples={len(rows)} "
        f"temperature={args.temperature}")
  print("gamma  alpha      c  speedup  predicted  ratio | iter_ms = "
        "draft + verify + loop")
  for gamma in [int(g) for g in args.gammas.split(",")]:
    base_s = spec_s = 0.0
    alpha_sum = alpha_count = calls = 0
    for i in range(len(rows)):
      ids = rows[i:i + 1]
      _, b = _median_time(lambda: sd.generate(target, ids, **kw), args.repeats)
      res, s = _median_time(lambda: sd.speculative_generate(
          target, draft, ids, gamma=gamma, **kw), args.repeats)
      base_s, spec_s = base_s + b, spec_s + s
      alpha_sum += float(res.stats["alpha_sum"][0])
      alpha_count += int(res.stats["alpha_count"][0])
      calls += int(res.stats["target_calls"][0])
    alpha = alpha_sum / max(alpha_count, 1)
    m = costs.measure_costs(target, draft, rows[:1], gamma=gamma,
                            cache_positions=args.max_decode_len + gamma + 1)
    predicted = float(theory.walltime_improvement(alpha, gamma, m["c"]))
    speedup = base_s / spec_s
    iteration = spec_s / calls
    draft_part = gamma * m["draft_step_s"]
    verify_part = m["verify_step_s"]
    print(f"{gamma:5d} {alpha:6.3f} {m['c']:6.3f} {speedup:7.2f}x "
          f"{predicted:8.2f}x {speedup / predicted:6.2f} | "
          f"{iteration * 1e3:6.2f} = {draft_part * 1e3:.2f} + "
          f"{verify_part * 1e3:.2f} + "
          f"{(iteration - draft_part - verify_part) * 1e3:.2f}", flush=True)


if __name__ == "__main__":
  main()
