"""Paragraphs of consecutive sentence pairs: the demo's long-output task.

A paragraph joins 2-5 consecutive pairs of a parallel corpus, in order, with
one space between sentences on both sides, so that its translation is the
translations of its sentences in the same order. The demo models are
fine-tuned on single Multi30k pairs mixed with paragraphs of its training
pairs, and `make demo` decodes paragraphs built from its own demo sentences
(`specdec_jax/demo_data/paragraphs.{en,de}`, written by
`scripts/build_paragraphs.py`). Everything here is a pure function of its
arguments and the seed: the same corpus always yields the same paragraphs.
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
# 24 paragraphs of 2-5 of the 40 demo sentences average 44 German tokens
# (the demo vocabulary, EOS included), against 12.6 for a sentence.
DEMO_PARAGRAPHS = 24


def _read_lines(path: str) -> list[str]:
  with open(path, encoding="utf-8") as f:
    lines = f.read().split("\n")
  return lines[:-1] if lines and lines[-1] == "" else lines


def demo_paragraphs(data_dir: str = DEMO_DATA, sentences: str = "sentences"
                    ) -> tuple[list[str], list[str]]:
  """The demo's English and German paragraphs, from its sentences.

  `DEMO_PARAGRAPHS` paragraphs of 2-5 consecutive pairs of
  `<data_dir>/<sentences>.{en,de}`, seed 0, wrapping around at the end.
  """
  return build_paragraphs(
      _read_lines(os.path.join(data_dir, sentences + ".en")),
      _read_lines(os.path.join(data_dir, sentences + ".de")),
      count=DEMO_PARAGRAPHS)


def write_demo_paragraphs(data_dir: str = DEMO_DATA) -> list[str]:
  """Writes `<data_dir>/paragraphs.{en,de}`; returns their paths."""
  paths = []
  for side, lines in zip(("en", "de"), demo_paragraphs(data_dir)):
    path = os.path.join(data_dir, f"paragraphs.{side}")
    with open(path, "w", encoding="utf-8") as f:
      f.write("".join(line + "\n" for line in lines))
    paths.append(path)
  return paths
