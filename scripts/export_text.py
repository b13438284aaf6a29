r"""Writes one text field of a prepared TFDS split to a file, one a line.

The input of scripts/train_vocab.py for datasets that are not plain files,
e.g. the 8k lm1b vocabulary of the paper's GPT-like models:

  .venv/bin/python scripts/export_text.py --tfds_name=lm1b --split=train \
      --field=text --max_examples=2000000 \
      --tfds_data_dir=gs://YOUR_BUCKET/tfds \
      --output=workdir/lm1b/vocab/lm1b_train_2m.txt

Reads TFDS read-only (nothing downloads); an unprepared dataset fails with
the `tfds build` command that prepares it. Prints the number of lines.
"""

from absl import flags

from specdec_jax.launch import cli
from specdec_jax.data import tasks
from specdec_jax.data import readers

_TFDS_NAME = flags.DEFINE_string("tfds_name", None,
                                 "e.g. lm1b or lm1b:1.1.0.", required=True)
_SPLIT = flags.DEFINE_string("split", "train", "Split (or slice) to read.")
_FIELD = flags.DEFINE_string("field", "text", "The string feature to write.")
_MAX_EXAMPLES = flags.DEFINE_integer("max_examples", 0,
                                     "Read the first this many (0: all).")
_OUTPUT = flags.DEFINE_string("output", None, "Text file to write.",
                              required=True)
_TFDS_DATA_DIR = flags.DEFINE_string(
    "tfds_data_dir", None, "TFDS data dir (default: $TFDS_DATA_DIR or "
    "~/tensorflow_datasets).")


def main(argv):
  del argv
  with tasks.override_config(tfds_data_dir=_TFDS_DATA_DIR.value):
    lines = readers.export_tfds_text(
        _TFDS_NAME.value, _SPLIT.value, _FIELD.value, _OUTPUT.value,
        max_examples=_MAX_EXAMPLES.value or None)
  print(f"{lines} lines -> {_OUTPUT.value}")


if __name__ == "__main__":
  cli.run(main)
