r"""Writes tiny random checkpoints shaped like a family's downloads.

  python scripts/tiny_checkpoints.py --family=t5gemma --out_dir=/tmp/t5gemma_tiny
  python scripts/run_experiment.py \
    --gin_file=experiments/t5gemma/ende_s_s_t0.gin \
    --gin_file=/tmp/t5gemma_tiny/tiny.gin --workdir=/tmp/t5gemma_tiny/run

A T5Gemma target and draft as Hugging Face directories, a Gemma-like
tokenizer.model and three EnDe sentences; `tiny.gin` points the T5Gemma
rows' macros at them, so a row runs end to end offline on a CPU (a dry run
of the road, not of the numbers: docs/t5gemma.md).
"""

from absl import flags

from specdec_jax.launch import cli
from specdec_jax.experiments import tiny_checkpoints

_FAMILY = flags.DEFINE_enum("family", "t5gemma", ["t5gemma"],
                            "The family whose downloads to imitate.")
_OUT_DIR = flags.DEFINE_string("out_dir", None, "Folder to write (local).",
                               required=True)


def main(argv):
  del argv
  tiny_checkpoints.write_t5gemma(_OUT_DIR.value)
  print(f"{_OUT_DIR.value}/tiny.gin")


if __name__ == "__main__":
  cli.run(main)
