"""Tests for specdec_jax.training.teacher: the teacher translations that
sequence-level distillation trains on (scripts/teacher_outputs.py).

What a long data-writing run must guarantee: the files hold, line by line in
the split's order, the source and the teacher's greedy translation (the
reference where the teacher never ended); shards split the work and the
last one writes; a killed run resumes redoing only the example whose line
was cut; a rerun with other settings is refused, naming the fix.
"""

import dataclasses
import os

import numpy as np
import pytest

import specdec_jax as sd
from specdec_jax.data import batching
from specdec_jax.data import tasks
from specdec_jax.data import vocabularies
from specdec_jax.tokens import EOS_ID
from specdec_jax.training import teacher
from tests import helpers

WORDS = ["the cat sat on the mat", "a house", "the news today is wonderful",
         "das Haus", "a cat is on a mat today", "the mat", "news"]
SETTINGS = {"model": "toy", "task": "toy", "split": "train",
            "max_decode_len": 6, "max_examples": 0}


@pytest.fixture(scope="module")
def setup(tiny_vocab):
  vocab = tasks.get_vocabulary(tiny_vocab)
  model = dataclasses.replace(
      helpers.table_model(vocab.vocab_size, seed=3, eos_bias=1.5),
      vocab=vocab)
  examples = []
  for i, text in enumerate(WORDS):
    source = tasks.TRANSLATE_PREFIX + text
    examples.append(batching.Example(
        id=str(i), inputs=np.array(vocab.encode(source) + [EOS_ID], np.int32),
        targets=np.array(vocab.encode(text.upper()) + [EOS_ID], np.int32),
        inputs_text=source, targets_text=text.upper()))
  expected = []  # each example decoded alone: the translation or reference
  for e in examples:
    row = np.asarray(sd.generate(model, e.inputs[None], max_decode_len=6)
                     .tokens[0])
    expected.append(vocabularies.detokenize(vocab, row)
                    if (row == EOS_ID).any() else e.targets_text)
  return model, examples, expected


def _run(setup, output, logs=None, **kw):
  model, examples, _ = setup
  log = (lambda fmt, *a: logs.append(fmt % a)) if logs is not None else (
      lambda *a: None)
  return teacher.write_translations(
      model, examples, str(output), settings=kw.pop("settings", SETTINGS),
      batch_size=3, max_decode_len=6, log=log, **kw)


def test_shards_share_the_work_and_the_last_writes_aligned_files(
    setup, tmp_path):
  _, examples, expected = setup
  assert len(set(expected)) > 1  # the table model says different things
  out = tmp_path / "mix"
  assert _run(setup, out, shard=1, shards=2) is None  # shard 0 still to go
  assert not os.path.exists(f"{out}.de")
  summary = _run(setup, out, shard=0, shards=2)
  lines = lambda side: open(f"{out}.{side}", encoding="utf-8").read(
      ).splitlines()
  assert lines("en") == [" ".join(w.split()) for w in WORDS]
  assert lines("de") == [" ".join(t.split()) for t in expected]
  kept = sum(t == e.targets_text for t, e in zip(expected, examples))
  assert summary["examples"] == len(WORDS)
  assert summary["kept_reference"] + summary["equal_to_reference"] <= len(
      WORDS)
  assert summary["kept_reference"] <= kept


def test_a_killed_run_redoes_only_the_cut_line(setup, tmp_path):
  _, _, expected = setup
  out = tmp_path / "mix"
  _run(setup, out)
  partial = f"{out}.partial-0.jsonl"
  raw = open(partial, "rb").read()
  open(partial, "wb").write(raw[:len(raw) - 10])  # the last line is torn
  os.remove(f"{out}.de")
  logs = []
  _run(setup, out, logs)
  assert f"{len(WORDS) - 1} already translated, 1 to go" in logs[0]
  assert open(f"{out}.de", encoding="utf-8").read().splitlines() == [
      " ".join(t.split()) for t in expected]


def test_other_settings_or_inputs_are_refused(setup, tmp_path):
  model, examples, _ = setup
  out = tmp_path / "mix"
  _run(setup, out, shard=0, shards=3)
  with pytest.raises(ValueError, match="records another run.*delete"):
    _run(setup, out, settings=dict(SETTINGS, max_decode_len=7))
  with pytest.raises(ValueError, match="shard must be in"):
    _run(setup, out, shard=3, shards=3)
  bad = [dataclasses.replace(examples[0], inputs_text="summarize: x")]
  with pytest.raises(ValueError, match="not an English-German"):
    teacher.write_translations(model, bad, str(tmp_path / "bad"),
                               settings=SETTINGS)
