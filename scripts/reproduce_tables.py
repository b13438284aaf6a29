r"""Runs experiment configs and assembles Table 2 and Table 3.

  python scripts/reproduce_tables.py \
    --experiments='experiments/table2/*.gin' --gin_file=runs/tpu_v4.gin \
    --workdir=$WORKDIR/table2

Shared files (checkpoint macros, ende.gin, cnndm.gin, lm1b.gin) are left out
of the globs. Rows that differ only in their draft run side by side on one
baseline decode per example. Before the first decode the projected time of
the whole table is printed (--max_examples caps every row). Each experiment
resumes where it stopped; --assemble_only rebuilds the tables from finished
workdirs, e.g. after running rows on separate chips (docs/tpu.md).
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

from absl import flags
import gin

import jax

from specdec_jax.infra import paths
from specdec_jax.infra import chips
from specdec_jax.experiments import experiment
from specdec_jax.experiments import workdir
from specdec_jax.launch import gin_flags
from specdec_jax.tables import reproduce
from specdec_jax.data import tasks  # noqa: F401  (registers tasks and TaskConfig)

_EXPERIMENTS = flags.DEFINE_multi_string(
    "experiments", [], "Experiment gin files or globs (relative paths are "
    "also looked up under configs/).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Output directory.",
                               required=True)
_ASSEMBLE_ONLY = flags.DEFINE_bool("assemble_only", False,
                                   "Only rebuild the tables.")
_MAX_EXAMPLES = flags.DEFINE_integer(
    "max_examples", None, "Decode the first N examples of every row "
    "(default: each config's own, the whole split unless it sets one).")
_CHIP = flags.DEFINE_enum(
    "chip", None, list(chips.CHIPS), "Chip the projected time is for "
    "(default: this machine's accelerator, else tpu_v4).")


def _chip() -> chips.Chip:
  if _CHIP.value:
    return chips.get_chip(_CHIP.value)
  return (chips.chip_of_device_kind(jax.local_devices()[0].device_kind)
          or chips.get_chip("tpu_v4"))


def main(argv):
  del argv
  # Before anything touches a device (the projection asks the chip): the
  # run files (--gin_file) say whether this is a multi-host job. Bindings
  # of what only the experiment files define are checked with each row.
  gin_flags.parse(flags.FLAGS.gin_file, flags.FLAGS.gin_bindings,
                  skip_unknown=True)
  gin_flags.initialize_distributed(
      gin.get_configurable(experiment.ExperimentConfig)().distributed)
  if not _ASSEMBLE_ONLY.value:
    files = reproduce.experiment_files(_EXPERIMENTS.value,
                                       gin_flags.search_paths())
    # Stopped before its first example: a fresh workdir is left as found.
    with workdir.left_as_found(_WORKDIR.value, gin_flags.is_primary()):
      reproduce.run_configs(files, _WORKDIR.value, flags.FLAGS.gin_file,
                            flags.FLAGS.gin_bindings, _MAX_EXAMPLES.value,
                            _chip())
  if not gin_flags.is_primary():  # process 0 of a multi-host job writes
    return
  tables = reproduce.assemble(_WORKDIR.value, require=_ASSEMBLE_ONLY.value)
  for name in tables:
    print(paths.read_text(paths.join(_WORKDIR.value, f"{name}.md")))


if __name__ == "__main__":
  gin_flags.run(main)
