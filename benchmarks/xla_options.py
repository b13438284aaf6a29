r"""The demo target's step and verification costs under XLA:CPU options.

  python benchmarks/xla_options.py [--inputs=paragraphs] [--widths=4,5,9]

Which library XLA:CPU runs the matmuls with, and how, decides what
verifying gamma + 1 tokens costs (docs/benchmarks.md; the dated runs in
docs/log/benchmarks_history.md). On a new CPU, this times the demo
target's one-token step, its calls of --widths tokens (in target steps:
v), draft_base's step (c) and the target's prefill under each option set
below, all of one set in interleaved rounds
(`step_timers.time_extends`), and prints one line per set:

  default         XLA's defaults (YNNPACK for matmuls of two or more rows)
  eigen           Eigen for those matmuls (`api.CPU_EIGEN_MATMULS`)
  vector_512      xla_cpu_prefer_vector_width=512 (AVX-512 machines)
  onednn_dot      oneDNN for the dots, YNNPACK off
  xnnpack_dot     XNNPACK for each dot, YNNPACK off
  bfloat16        default options, the models' weights and compute in
                  bfloat16
  bfloat16_onednn bfloat16 with oneDNN dots (AMX on CPUs that have it)
  bfloat16_xnnpack bfloat16 with XNNPACK dots
  bf16_weights    weights stored in bfloat16, compute in float32

A set XLA rejects (an option this build lacks) prints its error and the
script goes on. Sets are timed one after another, so compare them on a
quiet machine or run the script twice.
"""

from absl import app
from absl import flags
import numpy as np

import specdec_jax as sd
from specdec_jax.data import text
from specdec_jax.decoding import api
from specdec_jax.experiments import step_timers

_INPUTS = flags.DEFINE_enum("inputs", "paragraphs",
                            ["sentences", "paragraphs"],
                            "Which shipped demo text the input is.")
_WIDTHS = flags.DEFINE_list("widths", ["4", "5", "9"],
                            "Tokens per verification call timed.")
_POSITIONS = flags.DEFINE_integer("cache_positions", 104,
                                  "Decoder positions of the caches.")

_NO_YNN = {"xla_cpu_experimental_ynn_fusion_type": ""}
OPTION_SETS = {
    "default": None,
    "eigen": api.CPU_EIGEN_MATMULS,
    "vector_512": {"xla_cpu_prefer_vector_width": 512},
    "onednn_dot": {"xla_cpu_experimental_onednn_fusion_type":
                   "LIBRARY_FUSION_TYPE_DOT", **_NO_YNN},
    "xnnpack_dot": {"xla_cpu_experimental_xnn_fusion_type":
                    "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT", **_NO_YNN},
    "bfloat16": None,
    "bfloat16_onednn": {"xla_cpu_experimental_onednn_fusion_type":
                        "LIBRARY_FUSION_TYPE_DOT", **_NO_YNN},
    "bfloat16_xnnpack": {"xla_cpu_experimental_xnn_fusion_type":
                         "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT", **_NO_YNN},
    "bf16_weights": None,
}


def main(argv):
  del argv
  widths = [int(w) for w in _WIDTHS.value]
  f32 = (sd.load_model("demo:target"), sd.load_model("demo:draft_base"))
  bf16 = tuple(sd.load_model(f"demo:{name}", dtype="bfloat16",
                             param_dtype="bfloat16")
               for name in ("target", "draft_base"))
  ids = np.asarray(text.encode(f32[0].vocab,
                               text.demo_sentences(1, name=_INPUTS.value)))
  bf16_weights = tuple(sd.load_model(f"demo:{name}", param_dtype="bfloat16")
                       for name in ("target", "draft_base"))
  for name, options in OPTION_SETS.items():
    target, draft = (bf16_weights if name == "bf16_weights"
                     else bf16 if name.startswith("bfloat16") else f32)
    requests = ([(target, 1, _POSITIONS.value)]
                + [(target, w, _POSITIONS.value) for w in widths]
                + [(draft, 1, _POSITIONS.value),
                   (target, step_timers.PREFILL, _POSITIONS.value)])
    try:
      seconds = step_timers.time_extends(requests, ids,
                                         compiler_options=options)
    except Exception as e:  # pylint: disable=broad-except
      print(f"{name:16s} rejected: {str(e).splitlines()[0][:160]}")
      continue
    step, rest = seconds[0], seconds[1:]
    vs = "  ".join(f"v({w}) {s / step:.2f}" for w, s in zip(widths, rest))
    print(f"{name:16s} step {step * 1e3:.2f} ms  {vs}  "
          f"c {rest[-2] / step:.3f}  prefill {rest[-1] / step:.2f} "
          f"({rest[-1] * 1e3:.1f} ms)", flush=True)


if __name__ == "__main__":
  app.run(main)
