r"""Acceptance rate alpha of each demo draft against the demo target.

  python benchmarks/draft_alpha.py [--examples=128] [--gamma=4]

Decodes the first --examples Multi30k validation sentences (needs
../shared/data) in one batch with each draft at temperature 0 and 1, and
prints the pooled alpha: sum(alpha_sum) / sum(alpha_count), the mean of
sum_x min(p, q) over verified positions (docs/demo_models.md).
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

import specdec_jax as sd  # noqa: E402
from specdec_jax.data import tasks  # noqa: E402


def main():
  p = argparse.ArgumentParser()
  p.add_argument("--target", default="demo:target")
  p.add_argument("--drafts", default="demo:draft_large,demo:draft_base,"
                 "demo:draft_small")
  p.add_argument("--examples", type=int, default=128)
  p.add_argument("--gamma", type=int, default=4)
  args = p.parse_args()
  target = sd.load_model(args.target)
  path = os.path.join(str(tasks.default_local_data_dir()), "multi30k.val.en")
  with open(path) as f:
    lines = [line.strip() for line in f][:args.examples]
  rows = [target.vocab.encode("translate English to German: " + s) + [1]
          for s in lines]
  ids = np.zeros((len(rows), max(map(len, rows))), np.int32)
  for i, row in enumerate(rows):
    ids[i, :len(row)] = row
  for spec in args.drafts.split(","):
    draft = sd.load_model(spec)
    for temperature in (0.0, 1.0):
      res = sd.speculative_generate(target, draft, ids, gamma=args.gamma,
                                    max_decode_len=64,
                                    temperature=temperature)
      alpha = res.stats.pooled_alpha()
      print(f"{spec} T={temperature:g} alpha={alpha:.3f}", flush=True)


if __name__ == "__main__":
  main()
