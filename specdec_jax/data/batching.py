"""Examples for decoding: task data as plain numpy, padded into length buckets.

`readers.load_examples` runs a seqio task's TensorFlow pipeline once, up front, and
keeps plain Python/numpy records, so no TensorFlow runs during (or competes
with) the decode loop. `batches` then pads them into `Batch`es ready for
`generate`: int32 input ids [batch, length], 0-padded on the right. Each row
ends in EOS (id 1) when the task's inputs do (encoder inputs, T5's tasks); a
decoder-only prompt (the lm1b tasks, whose `inputs` feature has
add_eos=False) is kept as it is, without EOS, for the model to continue. Row
widths are rounded up to a small set of bucket lengths (powers of two by
default) so the jitted decoder compiles one program per bucket instead of one
per input length.

Over-long inputs are truncated, not rejected: a row longer than `max_length`
(by default the task's input feature length, 512 for the paper's T5 tasks)
keeps its first `max_length - 1` tokens and then EOS, the same rule as
seqio's `append_eos_after_trim` that T5 evaluated with; a prompt without EOS
keeps its first `max_length` tokens, as seqio trims a feature without EOS.
`Batch.truncated` marks those rows. This module is numpy only: reading a
seqio task (TensorFlow) is `specdec_jax.data.readers`, whose
`iterate_examples(task, split)` does both steps:

  for batch in iterate_examples("wmt14_ende_local", "test", batch_size=1):
    tokens = generate(model, batch.input_ids, ...)
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Iterator, Sequence

import numpy as np

from specdec_jax.tokens import EOS_ID
from specdec_jax.tokens import PAD_ID


@dataclasses.dataclass(frozen=True)
class Example:
  """One task example, materialised.

  Attributes:
    id: the source's id, else the example's 0-based position in the split.
    inputs: int32 [length], the full tokenized input (not truncated;
      `batches` truncates), ending in EOS if `inputs_eos`.
    targets: int32 [length], the tokenized reference ending in EOS.
    inputs_text: the raw input, task prefix included.
    targets_text: the raw reference, what metrics compare against.
    inputs_eos: whether input rows end in EOS: the task's inputs feature's
      `add_eos`; False for a decoder-only prompt, which must not get one.
  """

  id: str
  inputs: np.ndarray
  targets: np.ndarray
  inputs_text: str
  targets_text: str
  inputs_eos: bool = True


@dataclasses.dataclass(frozen=True)
class Batch:
  """A padded batch of examples, ready for decoding.

  Attributes:
    input_ids: int32 [batch, bucket], 0-padded on the right; row i holds
      `input_lengths[i]` tokens, the last of them EOS unless the examples'
      inputs have no EOS (`Example.inputs_eos`, a decoder-only prompt).
    input_lengths: int32 [batch], tokens per row, any EOS included.
    truncated: bool [batch], whether the row was cut to `max_length`.
    ids: [batch] example ids.
    inputs_text: [batch] raw inputs (before any truncation).
    targets_text: [batch] raw references.
  """

  input_ids: np.ndarray
  input_lengths: np.ndarray
  truncated: np.ndarray
  ids: tuple[str, ...]
  inputs_text: tuple[str, ...]
  targets_text: tuple[str, ...]

  def __len__(self) -> int:
    return self.input_ids.shape[0]


def default_buckets(max_length: int, smallest: int = 16) -> tuple[int, ...]:
  """Powers of two from `smallest` up to `max_length`, and `max_length` itself.

  Args:
    max_length: the longest row a batch may hold.
    smallest: the shortest bucket; shorter rows are padded to it.

  Returns:
    Sorted bucket lengths, e.g. (16, 32, 64, 128, 256, 512) for 512.
  """
  if max_length < 1 or smallest < 1:
    raise ValueError(f"max_length ({max_length}) and smallest ({smallest}) "
                     "must be positive.")
  buckets, length = [], smallest
  while length < max_length:
    buckets.append(length)
    length *= 2
  return tuple(buckets) + (max_length,)


def _check_buckets(buckets: Iterable[int]) -> tuple[int, ...]:
  checked = tuple(sorted(set(int(b) for b in buckets)))
  if not checked or checked[0] < 1:
    raise ValueError(f"Bucket lengths must be positive integers, got "
                     f"{list(buckets)}.")
  return checked


def bucket_length(length: int, buckets: Sequence[int]) -> int:
  """The smallest bucket that holds `length` tokens."""
  for bucket in _check_buckets(buckets):
    if bucket >= length:
      return bucket
  raise ValueError(f"A row of {length} tokens exceeds the largest bucket "
                   f"({max(buckets)}); add a larger bucket or truncate.")


def _row(tokens: Sequence[int], max_length: int, index: int,
         add_eos: bool) -> list[int]:
  """`tokens` cut to `max_length`; with `add_eos`, ending in EOS kept last."""
  row = [int(t) for t in tokens]
  if not row:
    raise ValueError(f"Row {index} is empty; every input needs at least one "
                     "token" + (" before EOS." if add_eos else "."))
  if PAD_ID in row:
    raise ValueError(f"Row {index} contains the pad id {PAD_ID}, which "
                     f"models read as padding: {row}")
  if not add_eos:  # A prompt: the model continues its last token.
    return row[:max_length]
  if row[-1] != EOS_ID:
    row.append(EOS_ID)
  if len(row) > max_length:
    row = row[:max_length - 1] + [EOS_ID]
  return row


def batch_examples(token_lists: Sequence[Sequence[int]],
                   buckets: Sequence[int], *,
                   max_length: int | None = None,
                   add_eos: bool | Sequence[bool] = True) -> np.ndarray:
  """Pads token lists into one int32 [batch, bucket] array.

  With `add_eos` (encoder inputs), each row gets EOS appended unless it
  already ends in EOS and is cut to `max_length` tokens (the first
  `max_length - 1`, then EOS). Without it (a decoder-only prompt), a row is
  taken as it is and cut to its first `max_length` tokens. Rows are 0-padded
  on the right to the smallest bucket holding the longest row.

  Args:
    token_lists: [batch] sequences of token ids (no pad ids).
    buckets: allowed row widths.
    max_length: longest row kept, EOS included; default the largest bucket.
    add_eos: one flag for all rows, or [batch] flags, one a row.

  Returns:
    int32 [batch, bucket] input ids.
  """
  buckets = _check_buckets(buckets)
  max_length = buckets[-1] if max_length is None else int(max_length)
  if not 1 <= max_length <= buckets[-1]:
    raise ValueError(f"max_length {max_length} must be in [1, largest bucket "
                     f"{buckets[-1]}]; add a bucket of at least {max_length}.")
  if len(token_lists) == 0:  # pylint: disable=g-explicit-length-test
    raise ValueError("No token lists to batch.")
  if isinstance(add_eos, (bool, np.bool_)):
    add_eos = [bool(add_eos)] * len(token_lists)
  if len(add_eos) != len(token_lists):
    raise ValueError(f"add_eos has {len(add_eos)} flags for "
                     f"{len(token_lists)} rows.")
  rows = [_row(t, max_length, i, eos)
          for i, (t, eos) in enumerate(zip(token_lists, add_eos))]
  width = bucket_length(max(len(r) for r in rows), buckets)
  ids = np.full((len(rows), width), PAD_ID, dtype=np.int32)
  for i, row in enumerate(rows):
    ids[i, :len(row)] = row
  return ids


def check_batching(batch_size: int, buckets: Sequence[int] | None,
                    max_length: int) -> tuple[int, ...]:
  """Validated buckets (default `default_buckets(max_length)`)."""
  if batch_size < 1:
    raise ValueError(f"batch_size must be at least 1, got {batch_size}.")
  buckets = _check_buckets(
      default_buckets(max_length) if buckets is None else buckets)
  if not 1 <= max_length <= buckets[-1]:
    raise ValueError(f"max_length {max_length} must be in [1, largest bucket "
                     f"{buckets[-1]}]; add a bucket of at least {max_length}.")
  return buckets


def batches(examples: Sequence[Example], *, batch_size: int = 1,
            buckets: Sequence[int] | None = None,
            max_length: int) -> Iterator[Batch]:
  """Splits `examples` in order into `Batch`es of `batch_size` rows.

  The last batch holds the remainder and may be smaller. Arguments are
  checked here, before the first batch is requested.

  Args:
    examples: the examples, e.g. from `load_examples`.
    batch_size: rows per batch (1: one example at a time).
    buckets: allowed row widths; default `default_buckets(max_length)`.
    max_length: longest input row kept, EOS included; rows are truncated as
      `batch_examples` says, by each example's `inputs_eos`.

  Returns:
    An iterator of batches.
  """
  buckets = check_batching(batch_size, buckets, max_length)
  if not examples:
    raise ValueError("No examples to batch.")

  def generator() -> Iterator[Batch]:
    for start in range(0, len(examples), batch_size):
      chunk = examples[start:start + batch_size]
      input_ids = batch_examples([e.inputs for e in chunk], buckets,
                                 max_length=max_length,
                                 add_eos=[e.inputs_eos for e in chunk])
      yield Batch(
          input_ids=input_ids,
          input_lengths=(input_ids != PAD_ID).sum(axis=1).astype(np.int32),
          truncated=np.array([len(e.inputs) > max_length for e in chunk]),
          ids=tuple(e.id for e in chunk),
          inputs_text=tuple(e.inputs_text for e in chunk),
          targets_text=tuple(e.targets_text for e in chunk))

  return generator()
