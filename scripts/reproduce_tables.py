r"""Runs experiment configs and assembles Table 2 and Table 3.

  python scripts/reproduce_tables.py \
    --experiments='experiments/table2/*.gin' --gin_file=runs/tpu_v4.gin \
    --workdir=$WORKDIR/table2

Shared files (checkpoint macros, ende.gin, cnndm.gin, lm1b.gin) are left out
of the globs. Each experiment resumes where it stopped; --assemble_only
rebuilds the tables from finished workdirs.
"""

import os

from absl import flags

from specdec_jax.experiments import gin_flags
from specdec_jax.experiments import reproduce
from specdec_jax.data import tasks  # noqa: F401  (registers tasks and TaskConfig)

_EXPERIMENTS = flags.DEFINE_multi_string(
    "experiments", [], "Experiment gin files or globs (relative paths are "
    "also looked up under configs/).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Output directory.",
                               required=True)
_ASSEMBLE_ONLY = flags.DEFINE_bool("assemble_only", False,
                                   "Only rebuild the tables.")


def main(argv):
  del argv
  if not _ASSEMBLE_ONLY.value:
    files = reproduce.experiment_files(_EXPERIMENTS.value,
                                       gin_flags.CONFIGS_DIR)
    reproduce.run_configs(files, _WORKDIR.value, flags.FLAGS.gin_file,
                          flags.FLAGS.gin_bindings)
  tables = reproduce.assemble(_WORKDIR.value)
  for name in tables:
    print(open(os.path.join(_WORKDIR.value, f"{name}.md")).read())


if __name__ == "__main__":
  gin_flags.run(main)
