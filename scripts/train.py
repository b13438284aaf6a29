r"""Trains a model as a gin file says; resumes from the workdir if restarted.

  .venv/bin/python scripts/train.py \
      --gin_file=configs/training/demo_target.gin \
      [--gin.train.TrainConfig.num_epochs=2] [--workdir=workdir/demo/target]

A run is num_steps or num_epochs long: a command-line binding of one
replaces the other that a gin file gives (--gin.train.TrainConfig.num_steps=2
trains 2 steps of a config written in epochs).

A run file (configs/runs/*.gin, the same ones run_experiment.py and
plan_run.py take) says which machine: its mesh, multi-host job and dtype.
  --gin_file=runs/cpu_8_model_parallel.gin   the (2, 4) mesh of a v4-8 on 8
                                             simulated CPU devices (set here)
  --gin_file=runs/tpu_v4_8_model_parallel.gin  the 4 chips of a v4-8 host
On several processes, run the SAME command on each, with
--coordinator_address, --process_count and --process_index (or a run file
with `distributed = True` on a TPU slice); process 0 writes.

`--gin.NAME=VALUE` is short for `--gin_bindings='NAME = VALUE'` (strings
need their quotes: --gin.train.TrainConfig.teacher="'dir'"). The workdir gets
`config.gin` (the operative configuration) and everything `train.train`
writes. Compiled programs are cached in --compilation_cache_dir (shared by
every script), so a resumed run does not recompile.
"""

# pylint: disable=g-import-not-at-top,wrong-import-position
if __name__ == "__main__":
  # A multi-host launch (--coordinator_address) reruns this command in a
  # supervised child first thing (specdec_jax/launch/supervise.py).
  import sys
  from specdec_jax.launch import supervise
  supervise.supervise_flagged_launch(sys.argv)

import dataclasses
import signal
import sys

from absl import flags
from absl import logging
import gin

from specdec_jax.launch import gin_flags
from specdec_jax.training import config as config_lib
from specdec_jax.training import train

_WORKDIR = flags.DEFINE_string("workdir", None,
                               "Overrides TrainConfig.workdir.")


def main(argv):
  del argv
  bindings = flags.FLAGS.gin_bindings
  gin_flags.parse(flags.FLAGS.gin_file,
                  bindings + config_lib.length_from_command_line(bindings))
  run = gin_flags.run_settings()
  gin_flags.simulate_cpu_devices(run["mesh_shape"], flags.FLAGS.process_count)
  config = gin.get_configurable(train.TrainConfig)().on_run(**run)
  if _WORKDIR.value:
    config = dataclasses.replace(config, workdir=_WORKDIR.value)
  config.check()
  gin_flags.initialize_distributed(config.distributed)
  if gin_flags.is_primary():
    gin_flags.write_config(config.workdir)
  result = train.train(config)
  logging.info("final metrics: %s", result)
  if result.get("signal") == signal.SIGINT:  # Ctrl-C: gin_flags.run's line
    raise KeyboardInterrupt
  sys.exit(1 if result.get("stopped") else 0)


if __name__ == "__main__":
  gin_flags.run(main)
