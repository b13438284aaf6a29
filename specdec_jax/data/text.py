"""Text in, ids out, without TensorFlow: task prefixes and the demo sentences.

The seqio tasks (`tasks`) prepend the same prefixes T5 was trained with;
scripts, benchmarks and tests that start from raw text use `encode` here so
their rows match what the tasks produce. The sentences shipped for the demo
(`specdec_jax/demo_data/`, written for this project) are read with
`demo_sentences`.
"""

from __future__ import annotations

import os
from typing import Sequence

import numpy as np

from specdec_jax.data import batching
from specdec_jax.tokens import EOS_ID

TRANSLATE_PREFIX = "translate English to German: "
SUMMARIZE_PREFIX = "summarize: "
DEMO_DATA = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "demo_data")


def demo_sentences(n: int | None = None, *, name: str = "sentences",
                   language: str = "en",
                   data_dir: str = DEMO_DATA) -> list[str]:
  """The first `n` (default all) lines of `<data_dir>/<name>.<language>`."""
  with open(os.path.join(data_dir, f"{name}.{language}")) as f:
    lines = [line.strip() for line in f if line.strip()]
  return lines[:n]


def encode(vocab, texts: Sequence[str], *, prefix: str = TRANSLATE_PREFIX,
           buckets: Sequence[int] | None = None) -> np.ndarray:
  """int32 [len(texts), width] encoder inputs: prefix + text + EOS, 0-padded.

  Args:
    vocab: a vocabulary with `encode(str) -> list[int]`.
    texts: the raw texts.
    prefix: prepended to each text (T5's task prefix).
    buckets: allowed widths (default: exactly the longest row).
  """
  rows = [list(vocab.encode(prefix + t)) + [EOS_ID] for t in texts]
  longest = max(len(r) for r in rows)
  return batching.batch_examples(rows, buckets or (longest,),
                                 max_length=max(buckets or (longest,)))
