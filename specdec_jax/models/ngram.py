"""Unigram and bigram drafters (Table 3's weakest approximation models).

They fit the `ModelDef` protocol, so the engine drafts with them exactly as
with a neural draft. Their parameters are log-probability tables estimated
from a token corpus with add-k smoothing; they need no cache (the bigram only
looks at the token it is fed).

Dimension letters: B batch, K new tokens, V vocabulary.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Sequence

import jax.numpy as jnp
import numpy as np

from specdec_jax.decoding import protocol
from specdec_jax.decoding.protocol import Prefill
from specdec_jax.decoding.protocol import Model
from specdec_jax.tokens import DECODER_START_ID


@dataclasses.dataclass(frozen=True)
class NgramDef:
  """A unigram (order 1) or bigram (order 2) drafter.

  Attributes:
    vocab: vocabulary size V.
    order: 1 or 2.
    decoder_only: True when drafting for a decoder-only target (the start
      token is the last prompt token); False for encoder-decoder targets
      (the start token is the decoder start id 0, like T5).
  """

  vocab: int
  order: int = 2
  decoder_only: bool = False

  # Its drafts ignore the input row, so rows need not end in EOS for it
  # (`checks.check_inputs`).
  reads_inputs = False

  @property
  def family(self) -> str:
    return (protocol.DECODER_ONLY if self.decoder_only
            else protocol.ENCODER_DECODER)

  @property
  def vocab_size(self) -> int:
    return self.vocab

  @property
  def max_input_len(self) -> None:
    return None

  def prefill(self, params, input_ids, num_decode_positions):
    del params, num_decode_positions
    batch = input_ids.shape[0]
    if self.decoder_only:
      length = jnp.sum(input_ids != 0, axis=1).astype(jnp.int32)
      start = jnp.take_along_axis(input_ids, (length - 1)[:, None], 1)[:, 0]
      return Prefill(cache={}, start_token=start.astype(jnp.int32),
                     start_pos=length - 1)
    return Prefill(cache={},
                   start_token=jnp.full((batch,), DECODER_START_ID, jnp.int32),
                   start_pos=jnp.zeros((batch,), jnp.int32))

  def extend(self, params, cache, tokens, positions, tree=None):
    del positions, tree  # the logits depend on the token alone
    logp = params["log_probs"]
    if self.order == 1:
      logits = jnp.broadcast_to(logp, tokens.shape + logp.shape[-1:])
    else:
      logits = logp[tokens]
    return logits.astype(jnp.float32), cache

  def copy_slots(self, cache, src, dst):
    del src, dst  # nothing is cached
    return cache


def fit_ngram(sequences: Iterable[Sequence[int]], vocab_size: int, *,
              order: int = 2, smoothing: float = 0.1,
              decoder_only: bool = False) -> Model:
  """Estimates an n-gram drafter from token sequences.

  Args:
    sequences: token id sequences (e.g. tokenized targets, EOS included). For
      the bigram each sequence is preceded by the decoder start id 0 (or, for
      decoder-only models, sequences should include their prompt).
    vocab_size: V, the target's vocabulary size.
    order: 1 (unigram) or 2 (bigram).
    smoothing: add-k pseudo-count for every (context, token) pair.
    decoder_only: see `NgramDef`.

  Returns:
    A `Model` with params {"log_probs": [V] or [V, V] float32}.
  """
  if order not in (1, 2):
    raise ValueError(f"order must be 1 (unigram) or 2 (bigram), got {order}.")
  if smoothing <= 0:
    raise ValueError(f"smoothing must be > 0 so that every token keeps some "
                     f"probability, got {smoothing}.")
  shape = (vocab_size,) if order == 1 else (vocab_size, vocab_size)
  counts = np.full(shape, smoothing, np.float64)
  seen = 0
  for seq in sequences:
    seq = np.asarray(seq, np.int64)
    if seq.size and (seq.min() < 0 or seq.max() >= vocab_size):
      raise ValueError(f"token ids must be in [0, {vocab_size}), got "
                       f"{seq.min()}..{seq.max()}.")
    seen += seq.size
    if order == 1:
      np.add.at(counts, seq, 1.0)
    else:
      prev = seq[:-1] if decoder_only else np.concatenate(
          [[DECODER_START_ID], seq[:-1]])
      cur = seq[1:] if decoder_only else seq
      np.add.at(counts, (prev, cur), 1.0)
  if seen == 0:
    raise ValueError("fit_ngram got no tokens: pass a non-empty corpus.")
  log_probs = np.log(counts / counts.sum(axis=-1, keepdims=True))
  definition = NgramDef(vocab=vocab_size, order=order,
                        decoder_only=decoder_only)
  return Model(definition=definition,
               params={"log_probs": log_probs.astype(np.float32)})
