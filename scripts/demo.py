r"""The main job on its embedded default: `make demo`.

  python scripts/demo.py --workdir=results/demo [--gin_file=demo.gin]
      [--gin.demo.DemoConfig.max_examples=5]

Runs the scaled Table 2 EnDe rows with the shipped demo models and prints
the table; see specdec_jax/experiments/demo.py and configs/demo.gin.
"""

import dataclasses
import os

from absl import flags
import gin

from specdec_jax.experiments import demo
from specdec_jax.experiments import gin_flags

_WORKDIR = flags.DEFINE_string("workdir", "results/demo", "Output directory.")
_OVERWRITE = flags.DEFINE_bool(
    "overwrite", True, "Start rows over whose results were made with other "
    "settings or another code version (rows with the same settings resume); "
    "--nooverwrite refuses such a rerun instead.")


def main(argv):
  del argv
  gin_flags.parse(flags.FLAGS.gin_file or ["demo.gin"],
                  flags.FLAGS.gin_bindings)
  config = gin.get_configurable(demo.DemoConfig)()
  config = dataclasses.replace(config, overwrite=_OVERWRITE.value)
  gin_flags.write_config(_WORKDIR.value)
  demo.run(config, _WORKDIR.value)
  print(open(os.path.join(_WORKDIR.value, "table.md")).read())
  print(f"Results, plots and traces: {_WORKDIR.value}/")


if __name__ == "__main__":
  gin_flags.run(main)
