"""Output quality of decoded text: corpus BLEU and ROUGE F-measures.

Both functions take the references first and the predictions second and
return a dict of floats, the signature of a seqio metric function, so they
serve as the `metric_fns` of the tasks in `specdec_jax.data.tasks` as well as on
their own. Scores are on a 0-100 scale (sacrebleu's BLEU scale; ROUGE
fractions are multiplied by 100 to match, as T5 reports them).

Speculative decoding leaves the output distribution unchanged, so these are a
check that the decoded text is sound (greedy speculative output is the
target's output token for token), not a quantity the method should move.
"""

from __future__ import annotations

import re
from typing import Sequence

import sacrebleu

ROUGE_KEYS = ("rouge1", "rouge2", "rougeL", "rougeLsum")

# A sentence ends at '.', '!' or '?' (plus closing quotes or brackets)
# followed by whitespace. This splits both detokenized model output ("Friday.
# Next") and the PTB-tokenized CNN/DM references ("Friday . Next").
_SENTENCE_END = re.compile(r"([.!?][\"'\u201d)\]]*)\s+")


def _check(targets: Sequence[str], predictions: Sequence[str]) -> None:
  if len(targets) != len(predictions):
    raise ValueError(f"{len(predictions)} predictions for {len(targets)} "
                     "references; they must pair up one to one.")
  if not targets:
    raise ValueError("No references and predictions to score.")
  for name, texts in (("reference", targets), ("prediction", predictions)):
    for i, text in enumerate(texts):
      if not isinstance(text, str):
        raise TypeError(f"{name} {i} is {type(text).__name__}, not str: "
                        "decode token ids to text before scoring.")


def bleu(targets: Sequence[str], predictions: Sequence[str], *,
         tokenize: str = "13a") -> dict[str, float]:
  """Corpus BLEU of detokenized predictions against one reference each.

  sacrebleu's corpus BLEU with its defaults (exponential smoothing, cased,
  brevity penalty over the whole corpus), i.e. the standard WMT score. Pass
  detokenized text, e.g. `vocab.decode(ids)`; sacrebleu tokenizes both sides
  itself.

  Args:
    targets: [n] reference strings.
    predictions: [n] predicted strings, aligned with `targets`.
    tokenize: sacrebleu tokenizer: "13a" (the WMT standard) or "intl" (what
      T5's evaluation used), among others.

  Returns:
    {"bleu": score in [0, 100]}.
  """
  _check(targets, predictions)
  result = sacrebleu.corpus_bleu(list(predictions), [list(targets)],
                                 tokenize=tokenize)
  return {"bleu": float(result.score)}


def _sentences_on_lines(text: str) -> str:
  # rougeLsum scores the union LCS over sentences, which rouge-score takes to
  # be the newline-separated lines of a summary.
  return _SENTENCE_END.sub(lambda m: m.group(1) + "\n", text.strip())


def rouge(targets: Sequence[str], predictions: Sequence[str], *,
          score_keys: Sequence[str] = ROUGE_KEYS) -> dict[str, float]:
  """Mean ROUGE F-measures of predictions against one reference each.

  rouge-score with the Porter stemmer (its standard settings for CNN/DM):
  text is lowercased and split on non-alphanumeric ASCII characters. Each
  example gets its F-measure and the result is the plain mean over examples,
  which is deterministic (T5's bootstrap median differs from it by noise
  only). `rougeLsum` is the summary-level LCS over sentences, found with a
  punctuation rule (sentence-final '.', '!' or '?' and whitespace), since
  neither the model output nor the references carry one sentence a line.

  Args:
    targets: [n] reference strings.
    predictions: [n] predicted strings, aligned with `targets`.
    score_keys: which of "rouge1", "rouge2", "rougeL", "rougeLsum" to report.

  Returns:
    {key: mean F-measure * 100} for each key in `score_keys`.
  """
  _check(targets, predictions)
  unknown = set(score_keys) - set(ROUGE_KEYS)
  if unknown or not score_keys:
    raise ValueError(f"score_keys must be a non-empty subset of {ROUGE_KEYS}, "
                     f"got {list(score_keys)}.")
  # rouge_score brings nltk: 1-2 s of every script's start, for CNN/DM only.
  from rouge_score import rouge_scorer  # pylint: disable=g-import-not-at-top
  scorer = rouge_scorer.RougeScorer(list(score_keys), use_stemmer=True)
  totals = dict.fromkeys(score_keys, 0.0)
  for target, prediction in zip(targets, predictions):
    if "rougeLsum" in totals:
      target = _sentences_on_lines(target)
      prediction = _sentences_on_lines(prediction)
    scores = scorer.score(target, prediction)
    for key in score_keys:
      totals[key] += scores[key].fmeasure
  return {key: 100.0 * total / len(targets) for key, total in totals.items()}
