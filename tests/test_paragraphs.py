"""Tests for specdec_jax.data.paragraphs and the paragraph tasks built on it.

Invariants: paragraphs join consecutive pairs in order, 2-5 at a time, and
are a pure function of the corpus and the seed (the same input always gives
the same paragraphs; another seed gives others, the negative control); a pass
over a corpus uses each pair at most once; the shipped demo sentences and
paragraphs are exactly the builder's output on Multi30k validation (real
held-out lines, consecutive in paragraphs) and the paragraphs are long
(40+ German tokens on average); the mix task trains on every single pair and
every paragraph and evaluates on single pairs.
"""

import os

import numpy as np
import pytest

from specdec_jax import load_model
from specdec_jax.data import paragraphs
from specdec_jax.data import tasks
from specdec_jax.data import readers


def _corpus(n):
  return ([f"en{i}." for i in range(n)], [f"de{i}." for i in range(n)])


def test_one_pass_joins_consecutive_pairs_in_order_once():
  """Sizes are 2-5; paragraph k starts where k-1 ended; each pair is used at
  most once and the uncovered tail is shorter than 2; sides stay aligned."""
  en, de = _corpus(103)
  spans = paragraphs.paragraph_spans(103)
  par_en, par_de = paragraphs.build_paragraphs(en, de)
  assert all(2 <= size <= 5 for _, size in spans)
  starts = np.cumsum([0] + [size for _, size in spans])
  assert [s for s, _ in spans] == starts[:-1].tolist()
  assert 103 - starts[-1] < 2
  assert len(set(size for _, size in spans)) == 4  # every size occurs
  for (start, size), e, d in zip(spans, par_en, par_de):
    assert e == " ".join(en[start:start + size])
    assert d == " ".join(de[start:start + size])


def test_builder_is_deterministic_and_seeded():
  """Same corpus and seed: the same paragraphs, call after call. Another
  seed: other sizes (the negative control that would catch a builder that
  ignored its seed, or a test that could not tell)."""
  en, de = _corpus(200)
  first = paragraphs.build_paragraphs(en, de, seed=0)
  assert paragraphs.build_paragraphs(en, de, seed=0) == first
  assert paragraphs.build_paragraphs(en, de, seed=1) != first


def test_counted_paragraphs_wrap_around_without_repeating_a_sentence():
  """count=N gives N paragraphs from a small corpus, wrapping at its end,
  never holding one sentence twice; too small a corpus is refused."""
  en, de = _corpus(7)
  par_en, _ = paragraphs.build_paragraphs(en, de, count=12)
  assert len(par_en) == 12
  for p in par_en:
    words = p.split()
    assert 2 <= len(words) <= 5 and len(set(words)) == len(words)
    first = int(words[0][2:-1])
    assert words == [f"en{(first + i) % 7}." for i in range(len(words))]
  with pytest.raises(ValueError, match="lower max_size"):
    paragraphs.paragraph_spans(4, count=3)


_VALIDATION = os.path.join(tasks.default_local_data_dir(),
                           paragraphs.VALIDATION_STEM)


@pytest.mark.skipif(not os.path.exists(_VALIDATION + ".en"),
                    reason="needs the Multi30k validation files "
                    "(../shared/data or $SPECDEC_SHARED_DATA)")
def test_shipped_demo_data_is_real_validation_text_and_long():
  """specdec_jax/demo_data/{sentences,paragraphs}.{en,de} == demo_data() on
  Multi30k validation (so scripts/build_paragraphs.py rebuilds them exactly):
  every demo sentence is a validation line, every paragraph is consecutive
  validation lines joined; 40 sentences, 16 paragraphs with German
  references of 40+ tokens on average that fit the demo's decoding limit
  and input bucket (128)."""
  built = paragraphs.demo_data(_VALIDATION)
  for stem, sides in built.items():
    for side, lines in zip(("en", "de"), sides):
      with open(os.path.join(paragraphs.DEMO_DATA, f"{stem}.{side}"),
                encoding="utf-8") as f:
        assert f.read().split("\n")[:-1] == lines, (stem, side)
  with open(_VALIDATION + ".en", encoding="utf-8") as f:
    val_en = f.read().split("\n")[:-1]
  joined = {" ".join(val_en[i:i + k]) for k in range(2, 6)
            for i in range(len(val_en) - k + 1)}
  assert len(built["sentences"][0]) == 40
  assert set(built["sentences"][0]) <= set(val_en)
  assert len(built["paragraphs"][0]) == paragraphs.DEMO_PARAGRAPHS == 16
  assert set(built["paragraphs"][0]) <= joined
  vocab = load_model("demo:draft_small").vocab
  lengths = [len(vocab.encode(p)) + 1 for p in built["paragraphs"][1]]
  assert np.mean(lengths) >= 40 and max(lengths) <= 128, lengths
  assert max(len(vocab.encode(tasks.TRANSLATE_PREFIX + p)) + 1
             for p in built["paragraphs"][0]) <= 128


def test_mix_task_holds_singles_then_paragraphs(tmp_path, tiny_vocab):
  """multi30k_ende_mix_local: train = every pair, then the paragraphs;
  validation = the single pairs. multi30k_ende_paragraphs_local: paragraphs
  in every split."""
  words = "the a house is wonderful cat sat on mat".split()
  en = [" ".join(words[i % 9:i % 9 + 3]) for i in range(12)]
  de = [s.upper() for s in en]
  for split in ("train", "val"):
    (tmp_path / f"{split}.en").write_text("".join(s + "\n" for s in en))
    (tmp_path / f"{split}.de").write_text("".join(s + "\n" for s in de))
  files = {"train": str(tmp_path / "train"),
           "validation": str(tmp_path / "val")}
  par_en, par_de = paragraphs.build_paragraphs(en, de)
  with tasks.override_config(vocab_path=tiny_vocab, multi30k_files=files):
    mix = readers.load_examples(tasks.MULTI30K_ENDE_MIX_LOCAL, "train")
    val = readers.load_examples(tasks.MULTI30K_ENDE_MIX_LOCAL, "validation")
    par = readers.load_examples(tasks.MULTI30K_ENDE_PARAGRAPHS_LOCAL,
                                 "validation")
  prefix = tasks.TRANSLATE_PREFIX
  assert [e.inputs_text for e in mix] == [prefix + s for s in en + par_en]
  assert [e.targets_text for e in mix] == de + par_de
  assert [e.targets_text for e in val] == de
  assert [e.targets_text for e in par] == par_de
  assert mix[12].id == f"p0+{len(par_en[0].split()) // 3}"
