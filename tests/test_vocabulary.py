"""specdec_jax.tokens.SentencePieceVocabulary is seqio's, without TensorFlow.

Checkpoints load their vocabulary with SentencePiece directly so that a
user who only decodes never imports TensorFlow (tests/test_quiet_import.py);
the seqio tasks keep seqio's class. Both must number text alike, or a model
would be fed ids its vocabulary never meant. Invariant, on real text (the
shipped demo data, and the shared Multi30k, WMT and CNN/DM dev files with
T5's own vocabulary when ../shared/data is there): the same ids for every
line, the same text for every id row (EOS inside, sentinels, ids past the
vocabulary, pads), the same special ids, size and serialized model (whose
hash `decoding.protocol.vocab_fingerprint` compares).
"""

import json
import os
from pathlib import Path

import numpy as np
import pytest
import seqio

from specdec_jax import tokens
from specdec_jax.checkpoints import native

DEMO = Path(native.DEMO_DIR)
DEMO_VOCAB = DEMO / "target" / native.VOCAB_FILE
DEMO_DATA = Path(native.__file__).resolve().parents[1] / "demo_data"
SHARED = Path(os.environ.get("SPECDEC_SHARED_DATA")
              or Path(__file__).resolve().parents[2] / "shared" / "data")
T5_VOCAB = SHARED / "t5" / "spiece.model"


def _lines(*files: Path) -> list[str]:
  out = []
  for path in files:
    out += [line for line in path.read_text("utf-8").splitlines()
            if line.strip()]
  return out


def _shared_lines() -> list[str]:
  lines = _lines(*(SHARED / n for n in (
      "multi30k.val.en", "multi30k.val.de", "newstest2014.dev100.en",
      "newstest2014.dev100.de", "cnndm_test_frank250.dev100.source")))
  with open(SHARED / "cnndm_test_frank250.dev100.jsonl", encoding="utf-8") as f:
    lines += [str(v) for row in f for v in json.loads(row).values()][:200]
  return lines


def _assert_same(path: Path, texts: list[str], extra_ids: int = 100):
  ours = tokens.SentencePieceVocabulary(str(path), extra_ids=extra_ids)
  theirs = seqio.SentencePieceVocabulary(str(path), extra_ids=extra_ids)
  assert ours.sp_model == theirs.sp_model
  assert (ours.vocab_size, ours.extra_ids) == (theirs.vocab_size,
                                               theirs.extra_ids)
  assert ((ours.pad_id, ours.eos_id, ours.unk_id, ours.bos_id) ==
          (theirs.pad_id, theirs.eos_id, theirs.unk_id, theirs.bos_id))
  # Sentinels are pieces of text too (T5's span corruption writes them).
  texts = texts + ["a <extra_id_0> b <extra_id_99>", "<extra_id_7>.", ""]
  ids = [ours.encode(t) for t in texts]
  assert ids == [list(theirs.encode(t)) for t in texts]
  assert [ours.decode(r) for r in ids] == [theirs.decode(r) for r in ids]
  assert any(i >= ours.vocab_size - extra_ids for r in ids for i in r)
  # Generated rows: pads, an EOS mid-row (decoding stops there), sentinels
  # and ids past the vocabulary (an embedding rounded up to 128 rows).
  rng = np.random.default_rng(0)
  rows = rng.integers(0, ours.vocab_size + 50, size=(200, 40))
  rows[::3, 20] = tokens.EOS_ID
  rows[1::4, 30:] = tokens.PAD_ID
  assert ([ours.decode(r) for r in rows] ==
          [theirs.decode(r.tolist()) for r in rows])


def test_the_demo_vocabulary_numbers_the_demo_data_as_seqio_does():
  texts = _lines(*sorted(DEMO_DATA.glob("*.*")))
  assert len(texts) > 100
  manifest = json.loads((DEMO / "target" / native.CONFIG_FILE).read_text())
  _assert_same(DEMO_VOCAB, texts, manifest["vocab_extra_ids"])


@pytest.mark.skipif(not (T5_VOCAB.exists() and
                         (SHARED / "multi30k.val.en").exists()),
                    reason=f"shared data not found at {SHARED}")
def test_t5s_vocabulary_numbers_real_text_as_seqio_does():
  texts = _shared_lines()
  assert len(texts) > 2000
  _assert_same(T5_VOCAB, texts)
  _assert_same(DEMO_VOCAB, texts[:500])


def test_a_checkpoints_vocabulary_is_ours_and_keeps_its_extra_ids(tmp_path):
  """A restored model carries this class (no seqio), with the manifest's
  extra ids; saving it again records the same file and extra ids."""
  model = native.load_model("demo:draft_small")
  assert isinstance(model.vocab, tokens.SentencePieceVocabulary)
  assert model.vocab.extra_ids == 100
  out = native.save(model, str(tmp_path / "again"))
  again = native.restore(out)
  assert again.vocab.sp_model == model.vocab.sp_model
  assert again.vocab.extra_ids == 100
