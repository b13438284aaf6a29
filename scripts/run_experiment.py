r"""Runs one speculative decoding experiment from gin configs.

  python scripts/run_experiment.py \
    --gin_file=configs/experiments/table2/ende_small_t0.gin \
    --gin.experiment.ExperimentConfig.max_examples=20 \
    --workdir=/tmp/ende_small_t0

Writes examples.jsonl (resumable), summary.json, table.md/.csv and plots to
the workdir; see specdec_jax/experiments/experiment.py. On a multi-host job
(`--coordinator_address`, `--process_count`, `--process_index`, or
`distributed = True` on a TPU slice) every process runs this same command
and process 0 writes.
"""

# pylint: disable=g-import-not-at-top,wrong-import-position
if __name__ == "__main__":
  # A multi-host launch (--coordinator_address) reruns this command in a
  # supervised child first thing, before the imports below (TensorFlow,
  # seqio): this process then only relays the child's output and reports a
  # lost peer host (specdec_jax/launch/supervise.py).
  import sys
  from specdec_jax.launch import supervise
  supervise.supervise_flagged_launch(sys.argv)

import dataclasses

from absl import flags
from absl import logging
import gin

from specdec_jax.infra import multihost
from specdec_jax.infra import paths
from specdec_jax.experiments import experiment
from specdec_jax.experiments import report
from specdec_jax.launch import gin_flags
from specdec_jax.experiments import workdir
from specdec_jax.data import tasks  # noqa: F401  (registers tasks and TaskConfig)

_WORKDIR = flags.DEFINE_string("workdir", None, "Output directory.",
                               required=True)
_OVERWRITE = flags.DEFINE_bool(
    "overwrite", False, "Delete the workdir's results of other settings and "
    "start over (otherwise such a rerun is refused).")


def main(argv):
  del argv
  gin_flags.parse(flags.FLAGS.gin_file, flags.FLAGS.gin_bindings)
  config = gin.get_configurable(experiment.ExperimentConfig)()
  if _OVERWRITE.value:
    config = dataclasses.replace(config, overwrite=True)
  gin_flags.simulate_cpu_devices(config.mesh_shape, flags.FLAGS.process_count)
  gin_flags.initialize_distributed(config.distributed)
  primary = gin_flags.is_primary()
  # A run refused before its first example (a missing checkpoint) leaves a
  # fresh workdir as it found it, so the fixed command is not refused.
  with workdir.left_as_found(_WORKDIR.value, primary):
    # A refused rerun writes nothing (not even config.gin) into the
    # workdir; process 0 decides, and every process stops with its message.
    multihost.on_primary(
        lambda: workdir.refuse_other_settings(_WORKDIR.value, config))
    if primary:
      gin_flags.write_config(_WORKDIR.value)
    summary = experiment.run(config, _WORKDIR.value)
  if not primary:
    return
  gin_flags.write_operative_config(_WORKDIR.value)
  logging.info("%s", report.closing_line(summary))
  print(paths.read_text(paths.join(_WORKDIR.value, "table.md")))


if __name__ == "__main__":
  gin_flags.run(main)
