"""The TFDS sources of the tasks (`tasks.py`): prepared datasets read from
`TaskConfig.tfds_data_dir`, never downloaded; an unprepared one raises
`TfdsNotPreparedError` with the command that prepares it.
"""

from __future__ import annotations

# First: TensorFlow's import quiet on a machine without a GPU.
from specdec_jax.data import tensorflow_env  # noqa: F401  # pylint: disable=unused-import
import seqio
import tensorflow as tf

from specdec_jax import errors
from specdec_jax.data.task_config import current_config

SPLITS = ("train", "validation", "test")


class TfdsNotPreparedError(FileNotFoundError, errors.UsageError):
  """A TFDS dataset has not been downloaded and prepared in the data dir."""


_TFDS_ERRORS = (AssertionError, KeyError, OSError, tf.errors.OpError)


def _not_prepared_error(tfds_name: str, data_dir: str | None, split: str,
                        error: Exception,
                        offline_task: str | None) -> TfdsNotPreparedError:
  # tensorflow_datasets only when a TFDS split is read.
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  data_dir = data_dir or tfds.core.constants.DATA_DIR
  offline = (f" Offline, use the task {offline_task!r} on local files "
             "instead." if offline_task else "")
  return TfdsNotPreparedError(
      f"TFDS dataset {tfds_name!r} (split {split!r}) is not prepared "
      f"in {data_dir} ({type(error).__name__}: {error}). Prepare it once "
      f"on a machine with network access: `tfds build {tfds_name} "
      f"--data_dir={data_dir}`, then point the tasks at that dir: gin "
      "`TaskConfig.tfds_data_dir = '<dir>'`, t5x's --tfds_data_dir, or "
      f"$TFDS_DATA_DIR.{offline}")


def read_tfds_split(tfds_name: str, split: str) -> tf.data.Dataset:
  """A prepared TFDS split in its stored order, read-only (never downloads).

  Args:
    tfds_name: e.g. "lm1b" (the version the installed TFDS builds) or
      "lm1b:1.1.0".
    split: a split name or slice, e.g. "train" or "train[:1000]".

  Returns:
    The raw examples, from `TaskConfig.tfds_data_dir` (else TFDS's default).

  Raises:
    TfdsNotPreparedError: the dataset is not prepared there; the message
      gives the `tfds build` command.
  """
  # tensorflow_datasets only when a TFDS split is read.
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  data_dir = current_config().tfds_data_dir
  try:
    # A builder only reads; nothing here calls download_and_prepare.
    builder = tfds.builder(tfds_name, data_dir=data_dir)
    return builder.as_dataset(split=split, shuffle_files=False)
  except _TFDS_ERRORS as e:
    raise _not_prepared_error(tfds_name, data_dir, split, e, None) from e


class TfdsSource(seqio.TfdsDataSource):
  """A TFDS source that reads `TaskConfig.tfds_data_dir` when it loads.

  It never downloads (read_only), and an unprepared dataset raises
  `TfdsNotPreparedError` with the command that prepares it.
  """

  def __init__(self, tfds_name: str, offline_task: str,
               splits: tuple[str, ...] = SPLITS):
    super().__init__(tfds_name=tfds_name, splits=splits, read_only=True)
    self._tfds_name = tfds_name
    self._offline_task = offline_task
    self._split_names = splits
    self._loaders: dict[str | None, seqio.LazyTfdsLoader] = {}

  @property
  def tfds_dataset(self) -> seqio.LazyTfdsLoader:
    data_dir = current_config().tfds_data_dir
    if data_dir not in self._loaders:
      self._loaders[data_dir] = seqio.LazyTfdsLoader(
          self._tfds_name, data_dir=data_dir,
          split_map={s: s for s in self._split_names}, read_only=True)
    return self._loaders[data_dir]

  def _not_prepared(self, split: str, error: Exception) -> TfdsNotPreparedError:
    return _not_prepared_error(self._tfds_name, self.tfds_dataset.data_dir,
                               split, error, self._offline_task)

  def _check_split(self, split: str) -> None:
    if split not in self._split_names:
      raise ValueError(f"TFDS dataset {self._tfds_name!r} has no split "
                       f"{split!r}; it has {list(self._split_names)}.")

  def get_dataset(self, split=None, shuffle=True, seed=None, shard_info=None,
                  **kwargs) -> tf.data.Dataset:
    split = split or "train"
    self._check_split(split)
    try:
      return super().get_dataset(split, shuffle, seed, shard_info, **kwargs)
    except _TFDS_ERRORS as e:
      raise self._not_prepared(split, e) from e

  def num_input_examples(self, split: str) -> int | None:
    self._check_split(split)
    try:
      return super().num_input_examples(split)
    except _TFDS_ERRORS as e:
      raise self._not_prepared(split, e) from e
