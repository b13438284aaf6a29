"""Training data: tokenized examples in numpy, cut into a few batch shapes.

Every example gets a key, (input width, target width), from the length
buckets; keys with less than one full batch fold into the smallest kept key
that holds them, else into one catch-all key. A key's batches have a fixed
number of rows (`batch_size`, or as many as fit in `batch_tokens` padded
tokens); a short last batch is filled with empty rows of zero loss weight,
so no example is dropped. Each epoch shuffles examples within keys, then the
order of the batches, from (seed, epoch) alone: step s always sees the same
batch, which is all the data position a checkpoint needs.

On several processes each reads only its share of the split (`load_split`,
seqio's shard: example i is process i % P's) and tells the others its
examples' lengths: every process then makes the one-process run's batches
from the lengths alone, and fills the rows of each batch it read (the
others' rows are zeros; `placement.Placement.join_shares` adds the shares
up on the devices).

Dimension letters: B batch rows, L input width, T target width.
"""

from __future__ import annotations

import collections
from typing import Any, Sequence

from absl import logging
import jax
import numpy as np

from specdec_jax.data import batching
from specdec_jax.data import readers
from specdec_jax.infra import multihost
from specdec_jax.tokens import EOS_ID


class BucketedData:
  """Tokenized examples in numpy, cut into batches of a few static shapes.

  Attributes:
    inputs, targets: [N] int32 rows; targets end in EOS, inputs too except
      a decoder-only prompt (`batching.Example.inputs_eos`). None for an
      example another process read (`shared`).
    lengths: int [N, 2], every example's input and target lengths.
    shared: whether other processes hold some of the rows (`batch` fills
      this process's share of each batch).
    decoder_only: one row per example (inputs + targets) instead of two.
    groups: key (widths) -> indices of its examples.
    rows: key -> rows per batch.
    batches_per_epoch: batches that cover every example once.
  """

  def __init__(self, inputs, targets, buckets: Sequence[int], *,
               decoder_only: bool, batch_tokens: int, batch_size: int,
               seed: int, lengths=None):
    """`lengths` (int [N, 2]) is required where rows are None."""
    self.inputs, self.targets = inputs, targets
    self.decoder_only, self._seed = decoder_only, seed
    self.shared = any(a is None for a in inputs)
    if lengths is None:
      if self.shared:
        raise ValueError("BucketedData: rows another process holds (None) "
                         "need every example's `lengths`.")
      lengths = [(len(a), len(b)) for a, b in zip(inputs, targets)]
    self.lengths = np.asarray(lengths, np.int64).reshape(-1, 2)
    if len(self.lengths) != len(inputs):
      raise ValueError(f"BucketedData: {len(self.lengths)} lengths for "
                       f"{len(inputs)} examples.")
    # Rows are bucketed as in decoding (`batching.bucket_length`). Rows are
    # already cut to the configured lengths, and the longest one is always
    # allowed: past the largest bucket it is a width of its own (folded with
    # other rare shapes below), never truncated here.
    longest = max((a + b if decoder_only else max(a, b)
                   for a, b in self.lengths.tolist()), default=1)
    buckets = tuple(buckets) + ((longest,) if longest > max(buckets) else ())
    bucket = lambda n: batching.bucket_length(n, buckets)
    keys = [(bucket(a + b),) if decoder_only else (bucket(a), bucket(b))
            for a, b in self.lengths.tolist()]
    rows = lambda key: (max(1, batch_tokens // sum(key)) if batch_tokens > 0
                        else batch_size)
    counts = collections.Counter(keys)
    kept = sorted((k for k, n in counts.items() if n >= rows(k)),
                  key=lambda k: (np.prod(k), k))
    # A rare key would compile the step for a batch or two: fold it into the
    # smallest kept key that holds it, else into one catch-all key.
    rare = [k for k in counts if k not in kept]
    catch_all = tuple(np.max(rare, axis=0).tolist()) if rare else None
    remap = {k: next((c for c in kept if all(a >= b for a, b in zip(c, k))),
                     catch_all) for k in rare}
    self.groups = collections.defaultdict(list)
    for index, key in enumerate(keys):
      self.groups[remap.get(key, key)].append(index)
    self.rows = {key: rows(key) for key in self.groups}
    self.batches_per_epoch = sum(-(-len(v) // self.rows[k])
                                 for k, v in self.groups.items())

  def shapes(self) -> list[tuple[int, ...]]:
    """(rows, widths...) of every batch shape: one compile each."""
    return sorted((self.rows[k],) + k for k in self.groups)

  def epoch(self, epoch: int | None) -> list[tuple[tuple[int, ...], Any]]:
    """An epoch's batches as (key, example indices); None: unshuffled."""
    rng = None if epoch is None else np.random.default_rng([self._seed, epoch])
    order = []
    for key in sorted(self.groups):
      members = np.asarray(self.groups[key])
      members = members if rng is None else rng.permutation(members)
      size = self.rows[key]
      order += [(key, members[i:i + size])
                for i in range(0, len(members), size)]
    return order if rng is None else [order[i] for i in
                                      rng.permutation(len(order))]

  def batch(self, key: tuple[int, ...], indices) -> dict[str, np.ndarray]:
    """The padded arrays of one batch; missing rows are all padding, and so
    (all zeros) are the rows of examples another process holds.

    Returns:
      T5: int32 `inputs` [B, L], `decoder_inputs` and `targets` [B, T],
      float32 `weights` [B, T]. GPT-like: no `inputs`, T = the row width.
    """
    rows, width = self.rows[key], key[-1]
    out = {"decoder_inputs": np.zeros((rows, width), np.int32),
           "targets": np.zeros((rows, width), np.int32),
           "weights": np.zeros((rows, width), np.float32)}
    dec, tgt, weights = out["decoder_inputs"], out["targets"], out["weights"]
    if not self.decoder_only:
      out["inputs"] = np.zeros((rows, key[0]), np.int32)
    for r, i in enumerate(indices):
      a, b = self.inputs[i], self.targets[i]
      if a is None:  # another process's row
        continue
      if self.decoder_only:
        row = np.concatenate([a, b])
        dec[r, :len(row)] = row
        tgt[r, :len(row) - 1] = row[1:]
        # The logit at position j predicts token j + 1: weigh targets only.
        weights[r, len(a) - 1:len(row) - 1] = 1.0
      else:
        out["inputs"][r, :len(a)] = a
        tgt[r, :len(b)] = b
        dec[r, 1:len(b)] = b[:-1]
        weights[r, :len(b)] = 1.0
    return out


def share_rows(inputs: Sequence[np.ndarray], targets: Sequence[np.ndarray],
               lengths: Sequence[np.ndarray], process: int):
  """One process's rows among every process's, in the split's order.

  Args:
    inputs, targets: the rows process `process` read (its share).
    lengths: every process's int [n_p, 2] input and target lengths, in
      process order (`multihost.gather_rows`).
    process: this process's index.

  Returns:
    (inputs, targets, lengths) of every example, round robin over the
    shares (as seqio deals examples out: the j-th of process p's is the
    split's j * P + p-th where the shares are even), rows None where
    another process holds them.
  """
  order = sorted((j, p) for p, n in enumerate(lengths) for j in range(len(n)))
  ours = [p == process for _, p in order]
  return ([inputs[j] if mine else None for (j, _), mine in zip(order, ours)],
          [targets[j] if mine else None for (j, _), mine in zip(order, ours)],
          np.asarray([lengths[p][j] for j, p in order]).reshape(-1, 2))


def load_split(config: Any, split: str, limit: int | None,
               decoder_only: bool, keep: int | None = None,
               share: bool = False):
  """(examples, BucketedData of the first `keep`) of a split, rows cut.

  Args:
    config: a `train.TrainConfig`.
    split: the split to read.
    limit: read only the split's first this many examples (None: all).
    decoder_only: one row per example (GPT-like).
    keep: the BucketedData holds the first this many (None: all).
    share: on several processes, read only this process's share (example
      i is process i % P's: seqio's shard, as on a multi-host slice); the
      processes exchange their examples' lengths (every process must call
      this at the same point), and the BucketedData has every example's
      length and this process's rows. `examples` are then this process's.
      The batches are the one-process run's wherever seqio deals the
      examples out one by one and no preprocessor drops any (every local
      task but lm1b's; a TFDS source of at least P files is split by
      file); elsewhere still every example once an epoch.
  """
  if share and keep is not None:
    raise ValueError("load_split: a shared split is read whole (keep=None).")
  processes = jax.process_count() if share else 1
  shard = (jax.process_index(), processes) if processes > 1 else None
  examples = readers.load_examples(config.task, split, max_examples=limit,
                                   shard=shard)
  max_in, max_tgt = config.max_lengths()

  def clip(tokens, n, eos=True):
    if len(tokens) <= n:
      return tokens
    # A decoder-only prompt has no EOS to keep: its first n tokens, as seqio.
    return np.append(tokens[:n - 1], EOS_ID) if eos else tokens[:n]

  inputs = [clip(e.inputs, max_in, e.inputs_eos) for e in examples[:keep]]
  targets = [clip(e.targets, max_tgt) for e in examples[:keep]]
  lengths = None
  if shard is not None:
    shares = multihost.gather_rows(
        np.asarray([(len(a), len(b)) for a, b in zip(inputs, targets)],
                   np.int32).reshape(-1, 2))
    inputs, targets, lengths = share_rows(inputs, targets, shares, shard[0])
    if not inputs:
      raise ValueError(f"Task {config.task!r} split {split!r} has no "
                       "examples.")
    logging.info("%d processes read the %d examples of %s, each its "
                 "share: %s examples", processes, len(inputs), split,
                 ", ".join(str(len(x)) for x in shares))
  return examples, BucketedData(
      inputs, targets, config.length_buckets, decoder_only=decoder_only,
      batch_tokens=config.batch_tokens, batch_size=config.batch_size,
      seed=config.seed, lengths=lengths)
