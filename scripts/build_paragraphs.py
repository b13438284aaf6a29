r"""Writes the demo's paragraphs from its sentences (deterministic).

  .venv/bin/python scripts/build_paragraphs.py
      # specdec_jax/demo_data/sentences.{en,de} -> paragraphs.{en,de}

24 paragraphs of 2-5 consecutive demo sentence pairs (seed 0), the walk
wrapping around the 40 sentences: `specdec_jax.data.paragraphs.demo_paragraphs`.
tests/test_paragraphs.py checks that the shipped files are its output.
"""

from absl import app
from absl import flags

from specdec_jax.data import paragraphs

_DATA_DIR = flags.DEFINE_string("data_dir", paragraphs.DEMO_DATA,
                                "Holds sentences.{en,de}; gets paragraphs.*")


def main(argv):
  del argv
  for path in paragraphs.write_demo_paragraphs(_DATA_DIR.value):
    print(path)


if __name__ == "__main__":
  app.run(main)
