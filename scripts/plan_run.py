r"""Plans a run before launching it: fit, collectives, projected speedup.

  python scripts/plan_run.py \
    --gin_file=experiments/table2/ende_small_t0.gin \
    --gin_file=runs/tpu_v4.gin --output=plan.json

Compiles the run's exact programs from abstract shapes on simulated CPU
devices shaped like its mesh (no checkpoint is read, no weight allocated)
and writes per-device memory, the decoding loop's collectives, per-step
costs and a roofline projection for --chip (see
specdec_jax/planning/plan.py). A config that cannot fit exits non-zero
with the numbers and the fix, before compiling anything.

  python scripts/plan_run.py --experiments='experiments/table2/*.gin' \
    --output=docs/tpu_projection.md

projects every Table 2 row on one TPU v4 chip, a v4-8 host (model
parallel) and one H100 and H200, and writes the Markdown tables
(see docs/tpu_projection.md). Rows without a published alpha (the T5Gemma
table) get Theorem 3.8's speedup over a sweep of alphas and the alpha at
which they break even; --figure draws those curves:

  python scripts/plan_run.py --experiments='experiments/t5gemma/*.gin' \
    --setups=tpu_v4_8,v5e_4,v6e_4 --output=docs/t5gemma_projection.md \
    --figure=docs/t5gemma_speedup_vs_alpha.png

A gin file that binds `distill.DistillConfig` (e.g.
training/distill_t5_1_1_small_from_xxl.gin) plans one distillation step
of the draft beside the sharded target instead of decoding: the step
scripts/train.py runs with the same gin files
(specdec_jax/planning/plan_training.py).
"""

import glob
import json
import os
import sys

# The host's CPU whatever the machine: on a TPU VM planning must neither take
# the chips from a running job nor be limited to the host's few of them.
# Simulated devices must exist before JAX starts its CPU backend.
os.environ["JAX_PLATFORMS"] = "cpu"
_FLAG = "--xla_force_host_platform_device_count"
if _FLAG not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                             f" {_FLAG}=16").strip()

from absl import flags  # noqa: E402
from absl import logging  # noqa: E402
import gin  # noqa: E402
import jax  # noqa: E402

from specdec_jax.data import tasks  # noqa: E402,F401  (registers TaskConfig)
from specdec_jax.infra import chips  # noqa: E402
from specdec_jax.experiments import experiment  # noqa: E402
from specdec_jax.launch import gin_flags  # noqa: E402
from specdec_jax.planning import plan  # noqa: E402
from specdec_jax.planning import plan_table  # noqa: E402
from specdec_jax.planning import plan_training  # noqa: E402
from specdec_jax.training import distill  # noqa: E402
from specdec_jax.training import train  # noqa: E402

_CHIP = flags.DEFINE_enum("chip", None, list(chips.CHIPS),
                          "Chip to project on (default: the chip of the "
                          "run's TPU topology, else tpu_v4).")
_OUTPUT = flags.DEFINE_string("output", None, "Write the plan (JSON) or, "
                              "with --experiments, the tables (Markdown).")
_EXPERIMENTS = flags.DEFINE_string(
    "experiments", None, "Glob of experiment gin files (relative to "
    "configs/) to project as a table instead of one run.")
_SETUPS = flags.DEFINE_string(
    "setups", None, "With --experiments: only the setups whose run config "
    "contains one of these comma-separated strings (default all of "
    "plan_table.SETUPS).")
_FIGURE = flags.DEFINE_string(
    "figure", None, "With --experiments: also draw Theorem 3.8's speedup "
    "against alpha for every planned row (PNG, local or gs://), one panel "
    "per setup.")
_VERIFY_WIDTHS = flags.DEFINE_list(
    "verify_widths", None, "Also compile the target's call on each of these "
    "numbers of tokens (a chain's gamma + 1, a token tree's nodes + 1) and "
    "report its memory and roofline time (`verification_widths`).")
_INPUT_LEN = flags.DEFINE_integer(
    "input_len", None, "Input length to plan for (default: the model's "
    "max_input_len, the longest row a run can meet).")


def _config(gin_files, bindings) -> experiment.ExperimentConfig:
  gin.clear_config()
  gin_flags.parse(gin_files, bindings)
  return gin.get_configurable(experiment.ExperimentConfig)()


def main(argv):
  del argv
  # Plans compile each program once, and a TPU program compiled ahead of
  # time cannot be read back from JAX's persistent cache: keep it out.
  jax.config.update("jax_enable_compilation_cache", False)
  if _EXPERIMENTS.value:
    pattern = os.path.join(gin_flags.CONFIGS_DIR, _EXPERIMENTS.value)
    files = sorted(f for f in glob.glob(pattern)
                   if plan_table.is_row(os.path.basename(f)))
    if not files:
      raise SystemExit(f"no experiment configs match {pattern}")
    wanted = _SETUPS.value.split(",") if _SETUPS.value else [""]
    setups = [s for s in plan_table.SETUPS if any(w in s[1] for w in wanted)]
    text = plan_table.project_table(
        files, lambda f, run: _config([f, run], flags.FLAGS.gin_bindings),
        input_len=_INPUT_LEN.value, setups=setups,
        command="python scripts/plan_run.py " + " ".join(sys.argv[1:]),
        log=lambda line: logging.info("%s", line))
    if _OUTPUT.value:
      with open(_OUTPUT.value, "w") as f:
        f.write(text)
    if _FIGURE.value:
      plan_table.plot_alpha_sweep(_FIGURE.value, plan_table.read_rows(text))
    print(text)
    return
  config = _config(flags.FLAGS.gin_file, flags.FLAGS.gin_bindings)
  chip = chips.get_chip(_CHIP.value or (
      chips.get_topology(config.topology).chip if config.topology
      else "tpu_v4"))
  if "DistillConfig" in gin.config_str():
    # The step scripts/train.py runs for the same files (its TrainConfig),
    # else a DistillConfig's alone.
    training = gin.get_configurable(train.TrainConfig)()
    if training.onpolicy is None:
      training = gin.get_configurable(distill.DistillConfig)()
    result = plan_training.plan_distill_step(config, training, chip)
  else:
    try:
      result = plan.plan(config, chip, _INPUT_LEN.value)
    except experiment.ConfigError as e:
      raise SystemExit(f"plan_run: {e}") from None
    if _VERIFY_WIDTHS.value:
      result["verification_widths"] = plan.verification_costs(
          config, chip, _VERIFY_WIDTHS.value, _INPUT_LEN.value)
  text = json.dumps(result, indent=2, sort_keys=True)
  if _OUTPUT.value:
    with open(_OUTPUT.value, "w") as f:
      f.write(text + "\n")
  else:
    print(text)
  # The verdict last, where a terminal shows it.
  print(summary(result, _OUTPUT.value))


def summary(result: dict, output: str | None = None) -> str:
  """A few lines a person reads: what was planned, whether it fits, and
  (for a decoding run) the predicted speedup."""
  gb = 1e9
  kind = "distillation step" if result.get("kind") == "distill_step" else (
      "decoding run")
  lines = [
      f"plan of a {kind} on {result['devices']} x {result['chip']} (mesh "
      f"{tuple(result['mesh_shape'])}, {result['dtype']}), figures from "
      f"{result['compiler']}, compiled in {result['compile_seconds']:.0f} s",
      f"fits: {result['fits']}: peak {result['peak_bytes_per_device'] / gb:.1f}"
      f" GB of {result['hbm_bytes'] / gb:.1f} GB per device"
      + ("" if "peak_bytes_shape_estimate" not in result else
         f" (from shapes: {result['peak_bytes_shape_estimate'] / gb:.1f} GB)")]
  if "predicted_speedup" in result:
    def x(value):
      return "n/a" if value is None else f"{value:.2f}x"
    lines.append(
        f"predicted speedup {x(result['predicted_speedup'])} at gamma "
        f"{result['gamma']} (paper {x(result['paper_speedup'])}; c "
        f"{result['c']:.4f}, verification {result['verify_cost']:.2f} target "
        f"steps)")
  if result.get("tree"):
    lines.append(f"token tree {result['tree']} ({result['verified']} tokens "
                 f"verified a call): {result['expected_tokens_per_call']:.2f}"
                 f" expected tokens per call ({result['tree_rates_source']})")
  for row in result.get("verification_widths", ()):
    lines.append(f"  target call on {row['tokens']:>3} tokens: "
                 f"{row['roofline_seconds'] * 1e3:.2f} ms roofline "
                 f"({row['relative_to_one_token']:.2f} x one token), peak "
                 f"{row['peak_bytes'] / gb:.1f} GB")
  lines.append(f"full plan: {output}" if output else "full plan: above (JSON)")
  return "\n".join(lines)


if __name__ == "__main__":
  gin_flags.run(main)
