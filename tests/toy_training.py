"""A toy translation corpus and a tiny trained model, shared by the training
tests (tests/test_train.py, tests/test_train_resume.py): a word-for-word
English->German "translation" over a 16-word lexicon and a vocabulary
trained on it, so nothing needs /work/shared or the network. Test modules
import the fixtures by name; each module trains `trained` once.
"""

import json
import os
import random

import jax
import pytest

from specdec_jax import checkpoints
from specdec_jax.data import tasks
from specdec_jax.data import vocabularies
from specdec_jax.training import train
from tests import helpers

LEXICON = {
    "red": "rot", "dog": "Hund", "cat": "Katze", "runs": "rennt",
    "sleeps": "schläft", "big": "groß", "small": "klein", "the": "der",
    "a": "ein", "house": "Haus", "tree": "Baum", "man": "Mann",
    "woman": "Frau", "sees": "sieht", "green": "grün", "blue": "blau"}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  """(vocab path); the Multi30k task reads the toy files meanwhile."""
  root = tmp_path_factory.mktemp("corpus")
  rng = random.Random(0)
  for split, size in (("train", 256), ("val", 16)):
    with open(root / f"{split}.en", "w") as en, open(root / f"{split}.de",
                                                     "w") as de:
      for _ in range(size):
        words = [rng.choice(list(LEXICON)) for _ in range(rng.randint(3, 7))]
        en.write(" ".join(words) + "\n")
        de.write(" ".join(LEXICON[w] for w in words) + "\n")
  vocab = vocabularies.train_vocab(
      [str(root / "train.en"), str(root / "train.de")], str(root / "vocab"),
      vocab_size=64,
      line_prefixes={str(root / "train.en"): tasks.TRANSLATE_PREFIX})
  files = {"train": str(root / "train"), "validation": str(root / "val")}
  with tasks.override_config(multi30k_files=files):
    yield vocab


TINY = {"vocab_size": 192, "num_encoder_layers": 1, "num_decoder_layers": 1}


def config(workdir, vocab, **overrides):
  """10 steps of a 1+1-layer T5 (one batch shape), dropout on, no eval."""
  settings = dict(
      model="t5_tiny", model_overrides=TINY, vocab_path=vocab,
      length_buckets=(64,), batch_tokens=0, batch_size=32, num_steps=10,
      learning_rate=1e-2, warmup_steps=3, dropout_rate=0.1, log_every=1,
      eval_examples=0, bleu_examples=0, checkpoint_every=0,
      workdir=str(workdir))
  settings.update(overrides)
  return train.TrainConfig(**settings)


@pytest.fixture(scope="module")
def trained(corpus, tmp_path_factory):
  """(workdir, result, names of the programs it compiled) of one run with
  evaluation and two checkpoints."""
  workdir = tmp_path_factory.mktemp("trained")
  # Its compiles are counted (tests/test_train.py): none from another module
  # of this worker that trained the same programs first.
  jax.clear_caches()
  with helpers.CompileCounter() as compiles:
    result = train.train(config(workdir, corpus, eval_examples=None,
                                bleu_examples=4, max_decode_len=8,
                                checkpoint_every=5))
  return workdir, result, compiles.names


def rows(workdir, kind="train"):
  """The `kind` rows of a run's metrics.jsonl."""
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [r for r in map(json.loads, f) if r["kind"] == kind]


def params(workdir):
  """The parameters of the model a run exported."""
  return checkpoints.load_model(os.path.join(workdir, "model")).params
