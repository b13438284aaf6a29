r"""How output length moves measured speedups toward Theorem 3.8.

  python benchmarks/length_effect.py [--examples=40] [--workdir=/tmp/length]

Theorem 3.8 counts tokens per target run for an endless output; a real one
ends inside a run, and the draft tokens that run accepted past EOS are lost.
The demo's captions give ~12-token outputs, where that costs a quarter of
the theorem's tokens per run at gamma = 7. This script runs the demo's
greedy rows (the shipped models, `configs/demo.gin`'s gammas, batch 1, the
same engine and timing as `make demo`) on two sets of Multi30k validation
sentences (needs ../shared/data): the --examples shortest-output and the
--examples longest-output pairs (by reference length), and prints, per row
and set: mean output length, alpha, tokens per target call against Theorem
3.1's, measured speedup, Theorem 3.8's prediction, the finite-length
prediction with the measured verification cost, and the ratios.
"""

import os

from absl import app
from absl import flags
from absl import logging

from specdec_jax import theory
from specdec_jax.data import tasks
from specdec_jax.data import text
from specdec_jax.tables import demo

flags.DEFINE_integer("examples", 40, "Sentences in each set.")
flags.DEFINE_string("data_dir", None, "Multi30k files (default: "
                    "../shared/data, as the local tasks find it).")
flags.DEFINE_string("workdir", "/tmp/specdec_length_effect", "Output folder.")
flags.DEFINE_integer("repeats", 3, "Timed repeats (the fastest is kept).")
args = flags.FLAGS
_ROWS = (("demo:draft_large", 4), ("demo:draft_base", 7),
         ("demo:draft_small", 4))


def _write_subset(out_dir, name, pairs):
  os.makedirs(out_dir, exist_ok=True)
  for lang, i in (("en", 0), ("de", 1)):
    with open(os.path.join(out_dir, f"{name}.{lang}"), "w") as f:
      f.write("".join(p[i] + "\n" for p in pairs))


def main(argv):
  del argv
  data_dir = args.data_dir or str(tasks.default_local_data_dir())
  logging.set_verbosity(logging.WARNING)
  en, de = (text.demo_sentences(name="multi30k.val", language=lang,
                                data_dir=data_dir) for lang in ("en", "de"))
  pairs = sorted(zip(en, de), key=lambda p: (len(p[1].split()), p[1]))
  sets = {"shortest": pairs[:args.examples], "longest": pairs[-args.examples:]}
  data = os.path.join(args.workdir, "data")
  for name, subset in sets.items():
    _write_subset(data, name, subset)
  print(f"{'set':9s} {'draft':12s} {'g':>2s} {'len':>5s} {'alpha':>6s} "
        f"{'tok/call':>8s} {'Thm3.1':>6s} {'speedup':>8s} {'Thm3.8':>7s} "
        f"{'ratio':>5s} {'len+v':>6s} {'ratio':>5s}")
  for name in sets:
    config = demo.DemoConfig(
        drafts=tuple((d, g) for d, g in _ROWS), temperatures=(0.0,),
        sweep_draft=None, max_decode_len=96, repeats=args.repeats,
        trace_examples=0, data_dir=data, sentences=name)
    rows = demo.run(config, os.path.join(args.workdir, name))
    for row in rows:
      calls = sum(row["accepted_histogram"])  # one entry per target call
      length = row["tokens_per_call"] * calls / row["examples"]
      yardstick = row["predicted_at_lengths_with_verify_cost"]
      print(f"{name:9s} {row['draft']:12s} {row['gamma']:2d} {length:5.1f} "
            f"{row['alpha']:6.3f} {row['tokens_per_call']:8.2f} "
            f"{float(theory.expected_tokens(row['alpha'], row['gamma'])):6.2f} "
            f"{row['speedup']:7.2f}x {row['predicted_speedup']:6.2f}x "
            f"{row['speedup'] / row['predicted_speedup']:5.2f} "
            f"{yardstick:5.2f}x {row['speedup'] / yardstick:5.2f}",
            flush=True)


if __name__ == "__main__":
  app.run(main)
