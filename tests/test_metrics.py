"""Tests for specdec_jax.data.metrics on small cases worked out by hand."""

import math

import pytest

from specdec_jax.data import metrics

pytestmark = pytest.mark.quick  # `make test-quick`

REF = "the cat sat on the mat"


def test_bleu_identical_text_is_100():
  """A perfect corpus scores exactly 100 with either tokenizer."""
  refs = [REF, "Das Haus ist wunderbar."]
  assert metrics.bleu(refs, refs)["bleu"] == pytest.approx(100.0)
  assert metrics.bleu(refs, refs, tokenize="intl")["bleu"] == pytest.approx(
      100.0)


def test_bleu_partial_overlap_matches_hand_computation():
  """BLEU is the geometric mean of clipped n-gram precisions times the
  brevity penalty.

  "the cat sat on the mat" vs the reference "the cat sat on a mat" (6 words
  each, so no brevity penalty):
    1-grams 5/6 ('the' is clipped to its one reference count),
    2-grams 3/5 (the cat, cat sat, sat on), 3-grams 2/4, 4-grams 1/3;
    BLEU = (5/6 * 3/5 * 2/4 * 1/3) ** (1/4) = (1/12) ** 0.25 = 53.728...
  "the cat sat on the" vs REF: every n-gram matches, but 5 words against 6
  gives the brevity penalty exp(1 - 6/5) = 81.873...
  """
  score = metrics.bleu(["the cat sat on a mat"], [REF])["bleu"]
  assert score == pytest.approx(100 * (1 / 12) ** 0.25, abs=1e-6)
  score = metrics.bleu([REF], ["the cat sat on the"])["bleu"]
  assert score == pytest.approx(100 * math.exp(1 - 6 / 5), abs=1e-6)
  assert metrics.bleu([REF], ["dogs bark loudly"])["bleu"] == 0.0


def test_bleu_is_corpus_level():
  """Counts pool over segments before the geometric mean, so a corpus of a
  perfect and a disjoint 6-word segment scores (6/12 * 5/10 * 4/8 * 3/6)**.25
  = 50, not the mean of the sentence scores (100 and 0)."""
  refs = [REF, "one two three four five six"]
  preds = [REF, "seven eight nine ten eleven twelve"]
  assert metrics.bleu(refs, preds)["bleu"] == pytest.approx(50.0, abs=1e-6)


def test_rouge_identical_text_is_100():
  """Identical text has F-measure 1, reported as 100, for every key."""
  scores = metrics.rouge([REF, "cats sleep."], [REF, "cats sleep."])
  assert set(scores) == set(metrics.ROUGE_KEYS)
  for value in scores.values():
    assert value == pytest.approx(100.0)


def test_rouge_partial_overlap_matches_hand_computation():
  """"the cat lay on the mat" vs REF, 6 words each so F = P = R:
  ROUGE-1 5/6 (the x2, cat, on, mat), ROUGE-2 3/5 (the cat, on the,
  the mat), ROUGE-L 5/6 (LCS "the cat on the mat")."""
  scores = metrics.rouge([REF], ["the cat lay on the mat"])
  assert scores["rouge1"] == pytest.approx(100 * 5 / 6)
  assert scores["rouge2"] == pytest.approx(100 * 3 / 5)
  assert scores["rougeL"] == pytest.approx(100 * 5 / 6)


def test_rouge_stems_and_averages_over_examples():
  """The Porter stemmer makes 'cats' match 'cat'; the corpus score is the
  plain mean of per-example F-measures: (100 + 0) / 2 = 50."""
  stemmed = metrics.rouge(["the cat sat"], ["the cats sat"],
                          score_keys=["rouge1"])
  assert stemmed == {"rouge1": pytest.approx(100.0)}
  mean = metrics.rouge(["the cat sat", "dogs bark"], ["the cat sat", "x y"],
                       score_keys=["rouge1"])
  assert mean["rouge1"] == pytest.approx(50.0)


def test_rougelsum_splits_sentences():
  """Two sentences in swapped order: the LCS over the whole text is 3 of 6
  words (ROUGE-L 50), but the summary-level LCS matches each reference
  sentence in full (ROUGE-Lsum 100), for PTB-tokenized references
  ("c ." ) and detokenized predictions ("c.") alike."""
  scores = metrics.rouge(["a b c . d e f ."], ["d e f. a b c."],
                         score_keys=["rougeL", "rougeLsum"])
  assert scores["rougeL"] == pytest.approx(50.0)
  assert scores["rougeLsum"] == pytest.approx(100.0)


def test_metrics_reject_misuse():
  """Mismatched, empty or undecoded inputs and unknown keys fail loudly."""
  for metric in (metrics.bleu, metrics.rouge):
    with pytest.raises(ValueError, match="pair up"):
      metric([REF, REF], [REF])
    with pytest.raises(ValueError, match="No references"):
      metric([], [])
    with pytest.raises(TypeError, match="decode"):
      metric([REF], [[5, 6, 1]])
  with pytest.raises(ValueError, match="score_keys"):
    metrics.rouge([REF], [REF], score_keys=["rouge3"])
