"""Trains a model as a gin file says; resumes from the workdir if restarted.

  .venv/bin/python scripts/train.py \
      --gin_file=configs/training/demo_target.gin \
      [--gin.train.TrainConfig.num_epochs=2] [--workdir=workdir/demo/target]

`--gin.NAME=VALUE` is short for `--gin_bindings='NAME = VALUE'` (strings
need their quotes: --gin.train.TrainConfig.teacher="'dir'"). The workdir gets
`config.gin` (the operative configuration) and everything `train.train`
writes. Compiled programs are cached in --compilation_cache_dir, so a resumed
run does not recompile.
"""

import dataclasses
import logging as py_logging
import os
import sys

from absl import app
from absl import flags
from absl import logging
import gin
import jax

from specdec_jax import train

_GIN_FILES = flags.DEFINE_multi_string(
    "gin_file", [], "Gin files, applied in order.")
_GIN_BINDINGS = flags.DEFINE_multi_string(
    "gin_bindings", [], "Gin bindings, applied after the files.")
_WORKDIR = flags.DEFINE_string("workdir", None,
                               "Overrides TrainConfig.workdir.")
_CACHE_DIR = flags.DEFINE_string(
    "compilation_cache_dir", "workdir/.jax_cache",
    "Persistent XLA compilation cache ('' to disable).")


def _parse_flags(argv):
  """t5x-style `--gin.NAME=VALUE` flags become --gin_bindings."""
  rest = []
  for arg in argv:
    if arg.startswith("--gin.") and "=" in arg:
      name, value = arg[len("--gin."):].split("=", 1)
      rest.append(f"--gin_bindings={name} = {value}")
    else:
      rest.append(arg)
  return flags.FLAGS(rest)


class _QuietOrbax(py_logging.Filter):
  """Orbax logs every checkpoint file at INFO; keep its warnings only."""

  def filter(self, record):
    return record.levelno >= py_logging.WARNING or "orbax" not in (
        record.pathname or "")


def main(argv):
  del argv
  logging.get_absl_logger().addFilter(_QuietOrbax())
  if _CACHE_DIR.value:
    jax.config.update("jax_compilation_cache_dir", _CACHE_DIR.value)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
  gin.add_config_file_search_path(os.getcwd())
  gin.parse_config_files_and_bindings(_GIN_FILES.value, _GIN_BINDINGS.value)
  config = gin.get_configurable(train.TrainConfig)()
  if _WORKDIR.value:
    config = dataclasses.replace(config, workdir=_WORKDIR.value)
  config.check()
  os.makedirs(config.workdir, exist_ok=True)
  with open(os.path.join(config.workdir, "config.gin"), "w") as f:
    f.write(gin.operative_config_str())
  result = train.train(config)
  logging.info("final metrics: %s", result)
  sys.exit(1 if result.get("stopped") else 0)


if __name__ == "__main__":
  app.run(main, flags_parser=_parse_flags)
