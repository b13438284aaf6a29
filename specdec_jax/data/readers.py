"""Reading seqio tasks and TFDS datasets (TensorFlow) into plain numpy.

The TensorFlow side of `specdec_jax.data`: `load_examples` runs a task's
pipeline once, up front, and returns `batching.Example`s, so no TensorFlow
runs during the decode loop; `iterate_examples` also pads them into
`batching.Batch`es; `export_tfds_text` writes a text field of a prepared
TFDS split for `vocabularies.train_vocab`.

  for batch in iterate_examples("wmt14_ende_local", "test", batch_size=1):
    tokens = generate(model, batch.input_ids, ...)
"""

from __future__ import annotations

import os
from typing import Iterator, Sequence

import numpy as np
# Before seqio imports TensorFlow: its start-up quiet (`tensorflow_env`).
from specdec_jax.data import tensorflow_env  # noqa: F401  # pylint: disable=unused-import
import seqio

from specdec_jax.data import batching
from specdec_jax.data import tasks
from specdec_jax.tokens import EOS_ID


def _text(value, ids: np.ndarray, vocab) -> str:
  if value is None:
    return vocab.decode([int(t) for t in ids if t != EOS_ID])
  return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def shard_size(total: int, shard: tuple[int, int]) -> int:
  """How many of the first `total` examples of a split fall in `shard`
  (index, count) when example i goes to shard i % count."""
  index, count = shard
  return max(0, -(-(total - index) // count))


def load_examples(task_name: str, split: str, *,
                  max_examples: int | None = None,
                  shard: tuple[int, int] | None = None
                  ) -> list[batching.Example]:
  """Runs a seqio task's pipeline and returns its examples as numpy.

  Inputs and targets come back whole (seqio is asked for no sequence
  length); targets end in EOS, inputs too unless the task's inputs feature
  has add_eos=False (a decoder-only prompt, `Example.inputs_eos`). `batches`
  applies the truncation.

  Args:
    task_name: a registered seqio task, e.g. one of
      `specdec_jax.data.tasks.FEATURE_LENGTHS`.
    split: "train", "validation" or "test".
    max_examples: keep only the first this many (None: all); with `shard`,
      those of the split's first this many that are the shard's.
    shard: (index, count): read only this shard of the split, as a host of
      a multi-host slice does (seqio's `ShardInfo`). seqio gives shard
      `index` the examples i with i % count == index, before tokenizing
      them, where the source has fewer files than shards (every local
      task: the position of the shard's j-th example is j * count +
      index); a TFDS source with at least `count` files is split by files
      instead. A shard may be empty.

  Returns:
    The examples in the split's order (the shard's, in its order).
  """
  if max_examples is not None and max_examples < 1:
    raise ValueError(f"max_examples must be positive or None, got "
                     f"{max_examples}.")
  index, count = shard or (0, 1)
  if not 0 <= index < count:
    raise ValueError(f"shard {shard!r}: give (index, count) with "
                     "0 <= index < count.")
  task = tasks.get_task(task_name)
  vocab = task.output_features["inputs"].vocabulary
  inputs_eos = bool(task.output_features["inputs"].add_eos)
  # Loading now raises a VocabularyError as it is; inside the tf.data map it
  # would arrive wrapped in an autograph StagingError.
  _ = vocab.vocab_size
  dataset = task.get_dataset(
      sequence_length=None, split=split, shuffle=False,
      trim_output_features=False, try_in_mem_cache=False,
      shard_info=seqio.ShardInfo(index, count) if count > 1 else None)
  if max_examples is not None:
    dataset = dataset.take(shard_size(max_examples, (index, count)))
  examples = []
  for position, record in enumerate(dataset.as_numpy_iterator()):
    inputs = np.asarray(record["inputs"], dtype=np.int32)
    targets = np.asarray(record["targets"], dtype=np.int32)
    examples.append(batching.Example(
        id=_text(record.get("id", str(position * count + index)), inputs,
                 vocab),
        inputs=inputs, targets=targets,
        inputs_text=_text(record.get("inputs_pretokenized"), inputs, vocab),
        targets_text=_text(record.get("targets_pretokenized"), targets,
                           task.output_features["targets"].vocabulary),
        inputs_eos=inputs_eos))
  if not examples and count == 1:
    raise ValueError(f"Task {task_name!r} split {split!r} has no examples.")
  return examples


def iterate_examples(task_name: str, split: str, *, batch_size: int = 1,
                     buckets: Sequence[int] | None = None,
                     max_length: int | None = None,
                     max_examples: int | None = None) -> Iterator[batching.Batch]:
  """Loads a task split up front and iterates it in padded batches.

  Args:
    task_name: a registered seqio task.
    split: the split to read.
    batch_size: rows per batch (1: one example at a time).
    buckets: allowed row widths; default powers of two from 16 up to
      `max_length`.
    max_length: longest input row, EOS included; longer inputs are truncated
      keeping EOS last (a prompt without EOS keeps its first `max_length`
      tokens). Default the task's input feature length
      (`specdec_jax.data.tasks.FEATURE_LENGTHS`).
    max_examples: read only the first this many examples.

  Returns:
    An iterator of `Batch`es in the split's order.
  """
  if max_length is None:
    max_length = tasks.feature_lengths(task_name)["inputs"]
  batching.check_batching(batch_size, buckets, max_length)  # Fail before loading.
  examples = load_examples(task_name, split, max_examples=max_examples)
  return batching.batches(examples, batch_size=batch_size, buckets=buckets,
                 max_length=max_length)


def export_tfds_text(tfds_name: str, split: str, field: str, output: str, *,
                     max_examples: int | None = None) -> int:
  """Writes one text field of a prepared TFDS split to a file, one a line.

  The split is read in its stored order, read-only: nothing downloads, and
  an unprepared dataset raises `tasks.TfdsNotPreparedError` with the
  `tfds build` command. Whitespace runs (newlines included) inside a value
  become single spaces, so each value stays one line; empty values are
  skipped.

  Args:
    tfds_name: e.g. "lm1b"; read from `TaskConfig.tfds_data_dir`.
    split: e.g. "train".
    field: a string feature, e.g. "text".
    output: the text file to write; parent directories are created.
    max_examples: read only the first this many examples (None: all).

  Returns:
    The number of lines written.

  Raises:
    ValueError: `field` is not a feature of the dataset, or no line came out.
  """
  if max_examples is not None and max_examples < 1:
    raise ValueError(f"max_examples must be positive or None, got "
                     f"{max_examples}.")
  dataset = tasks.read_tfds_split(tfds_name, split)
  if field not in dataset.element_spec:
    raise ValueError(f"TFDS dataset {tfds_name!r} has no feature {field!r}; "
                     f"its features: {sorted(dataset.element_spec)}.")
  dataset = dataset.map(lambda example: example[field])
  if max_examples is not None:
    dataset = dataset.take(max_examples)
  os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
  lines = 0
  partial = output + ".partial"  # A killed export leaves no truncated file.
  with open(partial, "w", encoding="utf-8") as f:
    for value in dataset.as_numpy_iterator():
      line = " ".join(value.decode("utf-8").split())
      if line:
        f.write(line + "\n")
        lines += 1
  if not lines:
    os.remove(partial)
    raise ValueError(f"{tfds_name!r} split {split!r} field {field!r} held no "
                     "text.")
  os.replace(partial, output)
  return lines
