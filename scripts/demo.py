r"""The main job on its embedded default: `make demo`.

  python scripts/demo.py --workdir=results/demo [--gin_file=demo.gin]
      [--gin.demo.DemoConfig.max_examples=5]

Runs the scaled Table 2 EnDe rows with the shipped demo models and prints
a summary of the table (`demo.summary`; every column is in table.md); see
specdec_jax/tables/demo.py and configs/demo.gin.
"""

import dataclasses
import json
import os

from absl import flags
import gin

from specdec_jax.experiments import workdir
from specdec_jax.tables import demo
from specdec_jax.launch import gin_flags

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
  # Stopped before its first example: a fresh workdir is left as found.
  with workdir.left_as_found(_WORKDIR.value):
    gin_flags.write_config(_WORKDIR.value)
    table = demo.run(config, _WORKDIR.value)
  variant = None
  path = os.path.join(_WORKDIR.value, "variant.json")
  if config.variant == "fastest" and os.path.exists(path):
    with open(path) as f:
      variant = json.load(f)["chosen"]
  elif config.variant:
    variant = config.variant
  print(demo.summary(table, variant))
  print(f"All columns: {_WORKDIR.value}/table.md (and .csv); plots, traces "
        f"and timings: {_WORKDIR.value}/")


if __name__ == "__main__":
  gin_flags.run(main)
