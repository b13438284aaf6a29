"""Trains the demo models' SentencePiece vocabulary (shared EN+DE, T5 ids).

  .venv/bin/python scripts/train_vocab.py
      # -> workdir/demo/vocab/multi30k_ende_4k.model (4000 pieces, ~10 s)
  .venv/bin/python scripts/train_vocab.py --vocab_size=8000 \
      --output_prefix=workdir/demo/vocab/multi30k_ende_8k

Source-side lines get the task's input prefix, as the task feeds them.
"""

import os

from absl import flags

from specdec_jax.launch import cli
from specdec_jax.data import shared_data
from specdec_jax.data import text
from specdec_jax.data import vocabularies

_DATA = str(shared_data.default_local_data_dir())
_SOURCE_FILES = flags.DEFINE_list(
    "source_files", [os.path.join(_DATA, "multi30k.train.en")],
    "English text files; each line gets --source_prefix.")
_TARGET_FILES = flags.DEFINE_list(
    "target_files", [os.path.join(_DATA, "multi30k.train.de")],
    "German text files, used as they are.")
_SOURCE_PREFIX = flags.DEFINE_string("source_prefix", text.TRANSLATE_PREFIX,
                                     "Text put before each source line.")
_VOCAB_SIZE = flags.DEFINE_integer("vocab_size", 4000,
                                   "Pieces, the 3 special ones included.")
_OUTPUT_PREFIX = flags.DEFINE_string(
    "output_prefix", "workdir/demo/vocab/multi30k_ende_4k",
    "Writes <prefix>.model and <prefix>.vocab.")


def main(argv):
  del argv
  path = vocabularies.train_vocab(
      _SOURCE_FILES.value + _TARGET_FILES.value, _OUTPUT_PREFIX.value,
      vocab_size=_VOCAB_SIZE.value,
      line_prefixes={f: _SOURCE_PREFIX.value for f in _SOURCE_FILES.value})
  print(path)


if __name__ == "__main__":
  cli.run(main)
