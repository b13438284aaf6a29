"""Tests for specdec_jax.data.batching: padding, bucketing and truncation, in numpy.

Everything here runs without TensorFlow; the task-backed path
(`load_examples`, `iterate_examples`) is tested in test_tasks.py.
"""

import dataclasses
import subprocess
import sys

import numpy as np
import pytest

from specdec_jax.data import batching


def _example(i, tokens):
  return batching.Example(id=str(i), inputs=np.asarray(tokens, np.int32),
                          targets=np.asarray([5, 1], np.int32),
                          inputs_text=f"in {i}", targets_text=f"out {i}")


def test_default_buckets_are_powers_of_two_up_to_max_length():
  """The decoder compiles one shape per bucket: few, doubling, covering max."""
  assert batching.default_buckets(512) == (16, 32, 64, 128, 256, 512)
  assert batching.default_buckets(100) == (16, 32, 64, 100)
  assert batching.default_buckets(8) == (8,)
  assert batching.default_buckets(128, smallest=8) == (8, 16, 32, 64, 128)


def test_bucket_length_picks_smallest_bucket_that_fits():
  """A row is padded to the first bucket >= its length, never beyond it."""
  buckets = (64, 16, 32)  # Order does not matter.
  assert batching.bucket_length(1, buckets) == 16
  assert batching.bucket_length(16, buckets) == 16
  assert batching.bucket_length(17, buckets) == 32
  assert batching.bucket_length(64, buckets) == 64
  with pytest.raises(ValueError, match="largest bucket"):
    batching.bucket_length(65, buckets)


def test_batch_examples_pads_right_and_ends_rows_in_eos():
  """Rows keep their tokens, end in EOS=1 (added once), then 0-padding."""
  ids = batching.batch_examples([[5, 6, 7, 1], [8, 9], [4]], buckets=(4, 8))
  assert ids.dtype == np.int32
  np.testing.assert_array_equal(ids, [[5, 6, 7, 1], [8, 9, 1, 0],
                                      [4, 1, 0, 0]])
  # A longer row moves the whole batch to the next bucket.
  ids = batching.batch_examples([[5, 6, 7, 8, 1], [4]], buckets=(4, 8))
  assert ids.shape == (2, 8)
  np.testing.assert_array_equal(ids[1], [4, 1, 0, 0, 0, 0, 0, 0])


def test_batch_examples_truncates_keeping_eos_last():
  """Over-long rows keep their first max_length-1 tokens, then EOS (seqio's
  append_eos_after_trim rule), whether or not they arrived with EOS."""
  ids = batching.batch_examples([list(range(3, 13)) + [1], list(range(3, 20))],
                                buckets=(4, 6), max_length=5)
  np.testing.assert_array_equal(ids, [[3, 4, 5, 6, 1, 0], [3, 4, 5, 6, 1, 0]])
  # Default max_length is the largest bucket.
  ids = batching.batch_examples([list(range(3, 13))], buckets=(4, 6))
  np.testing.assert_array_equal(ids, [[3, 4, 5, 6, 7, 1]])


def test_prompts_without_eos_are_kept_as_they_are():
  """A decoder-only prompt (add_eos=False) gets no EOS, which would tell the
  model the text is over; an over-long one keeps its first max_length tokens
  (seqio's trim of a feature without EOS); flags can differ row by row."""
  ids = batching.batch_examples([[5, 6, 7], [8, 9, 10, 11, 12, 13]], buckets=(4,),
                                add_eos=False)
  np.testing.assert_array_equal(ids, [[5, 6, 7, 0], [8, 9, 10, 11]])
  ids = batching.batch_examples([[5, 6, 7], [5, 6, 7]], buckets=(4, 8),
                                add_eos=[False, True])
  np.testing.assert_array_equal(ids, [[5, 6, 7, 0], [5, 6, 7, 1]])
  with pytest.raises(ValueError, match="2 flags for 1 rows"):
    batching.batch_examples([[5]], buckets=(8,), add_eos=[True, False])
  with pytest.raises(ValueError, match="Row 0 is empty"):
    batching.batch_examples([[]], buckets=(8,), add_eos=False)


def test_batches_follow_each_examples_inputs_eos():
  """`batches` truncates and ends each row by its example's `inputs_eos`:
  prompts keep their last real token last, and the lengths count no EOS."""
  prompts = [dataclasses.replace(_example(i, [3] * n), inputs_eos=False)
             for i, n in enumerate((2, 5, 20))]
  (batch,) = batching.batches(prompts, batch_size=3, buckets=(8, 16),
                              max_length=16)
  assert batch.input_ids.shape == (3, 16)
  np.testing.assert_array_equal(batch.input_lengths, [2, 5, 16])
  assert not (batch.input_ids == batching.EOS_ID).any()
  np.testing.assert_array_equal(batch.truncated, [False, False, True])


def test_batch_examples_rejects_bad_input():
  """User errors fail with a message, not a silently wrong batch."""
  with pytest.raises(ValueError, match="No token lists"):
    batching.batch_examples([], buckets=(8,))
  with pytest.raises(ValueError, match="Row 1 is empty"):
    batching.batch_examples([[5], []], buckets=(8,))
  with pytest.raises(ValueError, match="pad id"):
    batching.batch_examples([[5, 0, 6]], buckets=(8,))
  with pytest.raises(ValueError, match="largest bucket"):
    batching.batch_examples([[5]], buckets=(8,), max_length=9)
  with pytest.raises(ValueError, match="positive"):
    batching.batch_examples([[5]], buckets=(0, 8))


def test_batches_keep_order_sizes_and_metadata():
  """Batches follow the example order; the last holds the remainder; lengths,
  truncation flags, ids and texts line up with the rows."""
  examples = [_example(i, [3] * (i + 1) + [1]) for i in range(5)]
  examples.append(_example(5, [4] * 40 + [1]))
  out = list(batching.batches(examples, batch_size=4, buckets=(4, 8, 16),
                              max_length=16))
  assert [len(b) for b in out] == [4, 2]
  assert out[0].input_ids.shape == (4, 8)  # Longest row: 4 tokens + EOS = 5.
  assert out[1].input_ids.shape == (2, 16)
  np.testing.assert_array_equal(out[0].input_lengths, [2, 3, 4, 5])
  np.testing.assert_array_equal(out[1].input_lengths, [6, 16])
  np.testing.assert_array_equal(out[1].truncated, [False, True])
  assert out[1].input_ids[1, 15] == batching.EOS_ID
  assert out[0].ids == ("0", "1", "2", "3")
  assert out[1].inputs_text == ("in 4", "in 5")
  assert out[1].targets_text == ("out 4", "out 5")
  singles = list(batching.batches(examples, max_length=16))
  assert [b.input_ids.shape for b in singles] == [(1, 16)] * 6


def test_batches_check_arguments_before_iterating():
  """Bad settings raise when `batches` is called, before any decoding."""
  examples = [_example(0, [3, 1])]
  with pytest.raises(ValueError, match="batch_size"):
    batching.batches(examples, batch_size=0, max_length=8)
  with pytest.raises(ValueError, match="largest bucket"):
    batching.batches(examples, buckets=(4,), max_length=8)
  with pytest.raises(ValueError, match="No examples"):
    batching.batches([], max_length=8)


def test_data_module_imports_without_tensorflow():
  """The numpy half of the module must not pull in TensorFlow or seqio."""
  code = ("import sys, specdec_jax.data.batching; "
          "assert 'tensorflow' not in sys.modules, 'tensorflow'; "
          "assert 'seqio' not in sys.modules, 'seqio'")
  subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
