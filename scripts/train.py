"""Trains a model as a gin file says; resumes from the workdir if restarted.

  .venv/bin/python scripts/train.py \
      --gin_file=configs/training/demo_target.gin \
      [--gin.train.TrainConfig.num_epochs=2] [--workdir=workdir/demo/target]

`--gin.NAME=VALUE` is short for `--gin_bindings='NAME = VALUE'` (strings
need their quotes: --gin.train.TrainConfig.teacher="'dir'"). The workdir gets
`config.gin` (the operative configuration) and everything `train.train`
writes. Compiled programs are cached in --compilation_cache_dir (shared by
every script), so a resumed run does not recompile.
"""

import dataclasses
import signal
import sys

from absl import flags
from absl import logging
import gin

from specdec_jax.launch import gin_flags
from specdec_jax.training import train

_WORKDIR = flags.DEFINE_string("workdir", None,
                               "Overrides TrainConfig.workdir.")


def main(argv):
  del argv
  gin_flags.parse(flags.FLAGS.gin_file, flags.FLAGS.gin_bindings)
  config = gin.get_configurable(train.TrainConfig)()
  if _WORKDIR.value:
    config = dataclasses.replace(config, workdir=_WORKDIR.value)
  config.check()
  gin_flags.write_config(config.workdir)
  result = train.train(config)
  logging.info("final metrics: %s", result)
  if result.get("signal") == signal.SIGINT:  # Ctrl-C: gin_flags.run's line
    raise KeyboardInterrupt
  sys.exit(1 if result.get("stopped") else 0)


if __name__ == "__main__":
  gin_flags.run(main)
