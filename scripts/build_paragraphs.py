r"""Writes the demo's inputs from Multi30k validation (deterministic).

  .venv/bin/python scripts/build_paragraphs.py
      # ../shared/data/multi30k.val.{en,de} ->
      # specdec_jax/demo_data/{sentences,paragraphs}.{en,de}

The first 40 validation pairs, and 16 paragraphs of 2-5 consecutive
validation pairs (seed 0) from the first pair on:
`specdec_jax.data.paragraphs.demo_data`. tests/test_paragraphs.py checks
that the shipped files are its output.
"""

import os

from absl import flags

from specdec_jax.launch import cli
from specdec_jax.data import paragraphs
from specdec_jax.data import shared_data

_VALIDATION = flags.DEFINE_string(
    "validation", None, "Multi30k validation files without .en/.de "
    "(default: <shared data>/multi30k.val, $SPECDEC_SHARED_DATA)")
_DATA_DIR = flags.DEFINE_string("data_dir", paragraphs.DEMO_DATA,
                                "Gets {sentences,paragraphs}.{en,de}")


def main(argv):
  del argv
  validation = _VALIDATION.value or os.path.join(
      shared_data.default_local_data_dir(), paragraphs.VALIDATION_STEM)
  for path in paragraphs.write_demo_data(validation, _DATA_DIR.value):
    print(path)


if __name__ == "__main__":
  cli.run(main)
