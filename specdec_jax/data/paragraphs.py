"""Paragraphs of consecutive sentence pairs: the demo's long-output task.

A paragraph joins 2-5 consecutive pairs of a parallel corpus, in order, with
one space between sentences on both sides, so that its translation is the
translations of its sentences in the same order. The demo models are
fine-tuned on single Multi30k pairs mixed with paragraphs of its training
pairs, and `make demo` decodes sentences and paragraphs of consecutive
Multi30k validation pairs (`specdec_jax/demo_data/{sentences,paragraphs}.*`,
written by `scripts/build_paragraphs.py`: `demo_data`). Everything here is
a pure function of its arguments and the seed: the same corpus always yields
the same paragraphs.
"""

from __future__ import annotations

import os
from typing import Sequence

import numpy as np


def paragraph_spans(num_sentences: int, *, min_size: int = 2,
                    max_size: int = 5, seed: int = 0,
                    count: int | None = None) -> list[tuple[int, int]]:
  """(start, size) of each paragraph, walking the sentences in order.

  Sizes are drawn uniformly from [min_size, max_size] by a generator seeded
  with `seed`; each paragraph starts where the previous one ended.

  Args:
    num_sentences: length of the corpus.
    min_size, max_size: sentences per paragraph.
    seed: the size sequence's seed.
    count: None: one pass over the corpus, each sentence in at most one
      paragraph (a remainder shorter than `min_size` is left out). An int:
      exactly this many paragraphs, the walk wrapping around to the first
      sentence at the end (for a small corpus that must give many long
      paragraphs); a paragraph never holds a sentence twice.

  Returns:
    A list of (start, size); sentence i of a paragraph is
    (start + i) % num_sentences.
  """
  if not 1 <= min_size <= max_size:
    raise ValueError(f"need 1 <= min_size <= max_size, got {min_size}, "
                     f"{max_size}")
  if num_sentences < (min_size if count is None else max_size):
    raise ValueError(
        f"{num_sentences} sentences cannot make paragraphs of {min_size}-"
        f"{max_size}: lower max_size or give more sentences.")
  rng = np.random.default_rng(seed)
  spans, start = [], 0
  while count is None or len(spans) < count:
    size = int(rng.integers(min_size, max_size + 1))
    if count is None:
      size = min(size, num_sentences - start)
      if size < min_size:
        break
    spans.append((start % num_sentences, size))
    start += size
  return spans


def build_paragraphs(sources: Sequence[str], targets: Sequence[str], *,
                     min_size: int = 2, max_size: int = 5, seed: int = 0,
                     count: int | None = None
                     ) -> tuple[list[str], list[str]]:
  """Source and target paragraphs of consecutive aligned sentence pairs.

  Args:
    sources, targets: aligned sentences (e.g. English and German).
    min_size, max_size, seed, count: as in `paragraph_spans`.

  Returns:
    (source paragraphs, target paragraphs), aligned.
  """
  if len(sources) != len(targets):
    raise ValueError(f"misaligned corpus: {len(sources)} source and "
                     f"{len(targets)} target sentences")
  n = len(sources)
  spans = paragraph_spans(n, min_size=min_size, max_size=max_size, seed=seed,
                          count=count)

  def join(side, start, size):
    return " ".join(side[(start + i) % n].strip() for i in range(size))

  return ([join(sources, s, k) for s, k in spans],
          [join(targets, s, k) for s, k in spans])


DEMO_DATA = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "demo_data")
# The demo decodes real held-out text: the first DEMO_SENTENCES Multi30k
# validation pairs, and the first DEMO_PARAGRAPHS paragraphs of 2-5
# consecutive validation pairs (seed 0, one pass from the first pair, so no
# paragraph wraps around). No demo model trained on validation pairs
# (configs/training/*.gin train on the `train` split and its paragraphs).
# Validation captions are longer than the hand-written ones the demo had
# (18.4 German tokens with EOS against 12.6): 16 paragraphs (63 tokens on
# average, 1,014 in all) keep the paragraph rows' work where 24 paragraphs
# of 44 tokens had it.
DEMO_SENTENCES = 40
DEMO_PARAGRAPHS = 16
VALIDATION_STEM = "multi30k.val"  # <shared data>/multi30k.val.{en,de}


def _read_lines(path: str) -> list[str]:
  with open(path, encoding="utf-8") as f:
    lines = f.read().split("\n")
  return lines[:-1] if lines and lines[-1] == "" else lines


def demo_data(validation_prefix: str) -> dict[str, tuple[list[str],
                                                          list[str]]]:
  """The demo's sentences and paragraphs, from Multi30k validation.

  Args:
    validation_prefix: path of the validation files without `.en`/`.de`
      (e.g. `../shared/data/multi30k.val`).

  Returns:
    {"sentences": (English, German), "paragraphs": (English, German)}:
    the first `DEMO_SENTENCES` pairs, and `DEMO_PARAGRAPHS` paragraphs of
    2-5 consecutive pairs from the first pair on (`build_paragraphs`,
    seed 0).
  """
  en = _read_lines(validation_prefix + ".en")
  de = _read_lines(validation_prefix + ".de")
  if len(en) < 5 * DEMO_PARAGRAPHS:
    raise ValueError(
        f"{validation_prefix}.en has {len(en)} lines; the demo needs "
        f"{5 * DEMO_PARAGRAPHS} or more: point it at the 1,014-line "
        "Multi30k validation files.")
  return {"sentences": (en[:DEMO_SENTENCES], de[:DEMO_SENTENCES]),
          "paragraphs": build_paragraphs(en, de, count=DEMO_PARAGRAPHS)}


def write_demo_data(validation_prefix: str,
                    data_dir: str = DEMO_DATA) -> list[str]:
  """Writes `<data_dir>/{sentences,paragraphs}.{en,de}` from validation;
  returns their paths."""
  paths = []
  for stem, sides in demo_data(validation_prefix).items():
    for side, lines in zip(("en", "de"), sides):
      path = os.path.join(data_dir, f"{stem}.{side}")
      with open(path, "w", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in lines))
      paths.append(path)
  return paths
