r"""Picks gamma for each demo draft from measured alpha and costs.

  python benchmarks/choose_gamma.py [--examples=128]
  python benchmarks/choose_gamma.py --task=multi30k_ende_paragraphs_local \
      --max_decode_len=96          # the demo's paragraph rows

For each draft: alpha at temperature 0 and 1 over the task's validation
examples (Multi30k sentences by default; batched; alpha does not depend on
gamma), c and the cost of
verifying gamma + 1 tokens, then the gamma maximising Theorem 3.8 and the
gamma maximising E[tokens] / (gamma c + verify_cost(gamma)), the same
expected-speedup formula with the target call priced as measured on this
machine (on a CPU, verifying 8 tokens costs about twice one step, where the
paper's accelerators pay about the same). The verification costs enter as
a straight line fitted to the eight timings (`costs.linear_verify_costs`):
on a shared 2-core machine one timing of v(gamma) moves by 0.2-0.4 steps
from run to run, more than v changes from one gamma to the next, so the
argmax over raw timings jumped between gamma 1 and 7 for the same draft
(printed too, for comparison). Needs ../shared/data.

  --matmuls=eigen   times the costs with XLA's Eigen matmuls
                    (`api.CPU_EIGEN_MATMULS`) instead of YNNPACK. Eigen's v
                    is not a line in gamma (on one machine flat from 2 to 7
                    tokens, lower from 8), so read the raw-timing choice.
"""

from absl import app
from absl import flags
import numpy as np

import specdec_jax as sd
from specdec_jax import theory
from specdec_jax.data import batching
from specdec_jax.data import tasks
from specdec_jax.data import readers
from specdec_jax.decoding import api
from specdec_jax.experiments import costs

flags.DEFINE_string("target", "demo:target", "Target model spec.")
flags.DEFINE_list("drafts", ["demo:draft_large", "demo:draft_base",
                             "demo:draft_small"], "Draft model specs.")
flags.DEFINE_string("task", "multi30k_ende_local",
                    "Validation examples: multi30k_ende_local (sentences) or "
                    "multi30k_ende_paragraphs_local (paragraphs).")
flags.DEFINE_integer("examples", 128, "Validation examples used.")
flags.DEFINE_integer("max_decode_len", 64, "Most tokens per output.")
flags.DEFINE_integer("max_gamma", 8, "Largest gamma considered.")
flags.DEFINE_enum("matmuls", "default", ["default", "eigen"],
                  "XLA:CPU's matmul library for the cost timings: its "
                  "default (YNNPACK for two or more rows) or Eigen.")
args = flags.FLAGS


def main(argv):
  del argv
  target = sd.load_model(args.target)
  with tasks.override_config(vocab_path=target.vocab.sentencepiece_model_file):
    examples = readers.load_examples(args.task, "validation",
                                      max_examples=args.examples)
  batches = list(batching.batches(examples, batch_size=32, max_length=128))
  one = next(batching.batches(examples[:1], batch_size=1, max_length=128))
  options = api.CPU_EIGEN_MATMULS if args.matmuls == "eigen" else None
  for spec in args.drafts:
    draft = sd.load_model(spec)
    alphas = {}
    for temperature in (0.0, 1.0):
      probes = [sd.speculative_generate(target, draft, batch.input_ids,
                                        gamma=4,
                                        max_decode_len=args.max_decode_len,
                                        temperature=temperature).stats
                for batch in batches]
      alphas[temperature] = theory.pooled_alpha(
          [s.alpha_sum.sum() for s in probes],
          [s.alpha_count.sum() for s in probes])
    gammas = np.arange(1, args.max_gamma + 1)
    # Every step and width timed in the same rounds (costs.time_extends).
    timings = {}
    costs.time_extends(
        [r for g in gammas for r in costs.cost_requests(
            target, draft, int(g), args.max_decode_len + int(g) + 1)],
        one.input_ids, timings=timings, compiler_options=options)
    measured = [costs.measure_costs(
        target, draft, one.input_ids, gamma=int(g),
        cache_positions=args.max_decode_len + int(g) + 1, timings=timings,
        compiler_options=options) for g in gammas]
    c = float(np.median([m["c"] for m in measured]))
    verify = np.array([m["verify_cost"] for m in measured])
    fitted = costs.linear_verify_costs(gammas, verify)
    print(f"{spec}: c={c:.4f} verify_cost(gamma=1..{args.max_gamma})="
          f"{np.round(verify, 2).tolist()}, fitted {fitted[0]:.2f} .. "
          f"{fitted[-1]:.2f}")
    for temperature, alpha in alphas.items():
      thm = theory.walltime_improvement(alpha, gammas, c)
      cpu = theory.walltime_improvement_measured(alpha, gammas, c, fitted)
      raw = theory.walltime_improvement_measured(alpha, gammas, c, verify)
      print(f"  T={temperature:g} alpha={alpha:.3f}  Theorem 3.8 best gamma "
            f"{gammas[thm.argmax()]} ({thm.max():.2f}x); with the fitted "
            f"verify cost best gamma {gammas[cpu.argmax()]} "
            f"({cpu.max():.2f}x; raw timings: {gammas[raw.argmax()]})",
            flush=True)


if __name__ == "__main__":
  app.run(main)
