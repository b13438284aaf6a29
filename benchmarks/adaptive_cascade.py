r"""Adaptive draft length and cascaded drafts against the best fixed gamma.

  python benchmarks/adaptive_cascade.py --examples=64 --workdir=/tmp/ac

For each draft: every fixed gamma in --fixed_gammas, ConfidenceStop at each
--thresholds and ExpectedGainStop (c and the verification cost's growth
measured here), both with gamma = --max_gamma; every --cascades chain
(MODEL<MODEL@GAMMA<...; 'bigram' is fit on Multi30k train) at each
--cascade_gammas; all side by side on the same Multi30k validation sentences
(batch 1, one input width, compile excluded, interleaved timing, each
variant's fastest repeat as in `experiments/timing.best_time`). Needs
../shared/data. Logic: `specdec_jax.experiments.compare_drafting`. Writes
table.md and rows.json to --workdir.
"""

import json
import os

from absl import app
from absl import flags

from specdec_jax.experiments import compare_drafting

_TARGET = flags.DEFINE_string("target", "demo:target", "Target model spec.")
_DRAFTS = flags.DEFINE_list(
    "drafts", ["demo:draft_large", "demo:draft_base", "demo:draft_small"],
    "Single drafts to compare.")
_FIXED = flags.DEFINE_list("fixed_gammas", ["1", "2", "3", "4", "5", "6",
                                            "7", "8"], "Fixed gammas.")
_MAX_GAMMA = flags.DEFINE_integer("max_gamma", 8, "gamma for the rules.")
_THRESHOLDS = flags.DEFINE_list("thresholds", ["0.4"],
                                "ConfidenceStop thresholds.")
_CASCADES = flags.DEFINE_list(
    "cascades", ["demo:draft_base<demo:draft_small@3",
                 "demo:draft_base<demo:draft_small@3<bigram@4",
                 "demo:draft_large<demo:draft_base@3<demo:draft_small@3"],
    "Cascades, top draft first.")
_CASCADE_GAMMAS = flags.DEFINE_list("cascade_gammas", ["4", "8"],
                                    "Outer gammas for the cascades.")
_EXAMPLES = flags.DEFINE_integer("examples", 64, "Validation sentences.")
_WIDTH = flags.DEFINE_integer("input_width", 32, "Input width (padding).")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.0, "Temperature.")
_MAX_LEN = flags.DEFINE_integer("max_decode_len", 64, "Most output tokens.")
_REPEATS = flags.DEFINE_integer("repeats", 2, "Timed repeats (min kept).")
_GROWTH = flags.DEFINE_float(
    "verify_growth", None, "ExpectedGainStop's verification cost growth per "
    "token (target steps); default: measured here (noisy on a busy machine).")
_PROBE = flags.DEFINE_integer("probe_examples", 32,
                              "Other sentences calibrating ExpectedGainStop.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Where to write outputs.")


def main(argv):
  del argv
  table, baseline, rows = compare_drafting.run_benchmark(
      target=_TARGET.value, drafts=_DRAFTS.value,
      fixed_gammas=[int(g) for g in _FIXED.value],
      max_gamma=_MAX_GAMMA.value,
      thresholds=[float(t) for t in _THRESHOLDS.value],
      cascades=_CASCADES.value,
      cascade_gammas=[int(g) for g in _CASCADE_GAMMAS.value],
      examples=_EXAMPLES.value, input_width=_WIDTH.value,
      temperature=_TEMPERATURE.value, max_decode_len=_MAX_LEN.value,
      repeats=_REPEATS.value, probe_examples=_PROBE.value,
      verify_growth=_GROWTH.value)
  print(table, flush=True)
  if _WORKDIR.value:
    os.makedirs(_WORKDIR.value, exist_ok=True)
    with open(os.path.join(_WORKDIR.value, "table.md"), "w") as f:
      f.write(table + "\n")
    with open(os.path.join(_WORKDIR.value, "rows.json"), "w") as f:
      json.dump({"baseline": baseline, "rows": rows}, f, indent=1)


if __name__ == "__main__":
  app.run(main)
