"""Readers of the `*_local` tasks' plain files, as seqio dataset_fns.

`specdec_jax.data.tasks` registers each local task with one of these:

  parallel_text_fn   aligned `<prefix>.en` / `<prefix>.de` files, one
                     segment a line (WMT EnDe, Multi30k);
  paragraphs_fn      paragraphs of consecutive pairs of such files
                     (`specdec_jax.data.paragraphs`), optionally after
                     every single pair;
  jsonl_fn           one JSON object a line with `article` and `highlights`
                     (CNN/DM);
  instructions_fn    one JSON object a line with `instruction` and optional
                     `context` and `response` (databricks-dolly-15k's);
  sentences_fn       one sentence a line (lm1b).

Each takes the task's name and the `TaskConfig` field naming its files (both
for error messages only) and `split_path`, split -> the path to read, called
when the dataset is built (so gin bindings made after import apply). A
missing, empty or misaligned file is an error naming the file and the field
to fix.
"""

from __future__ import annotations

import json
from typing import Callable

# First: TensorFlow's import quiet on a machine without a GPU.
from specdec_jax.data import tensorflow_env  # noqa: F401  # pylint: disable=unused-import
import tensorflow as tf

from specdec_jax import errors
from specdec_jax.infra import paths
from specdec_jax.data import paragraphs
from specdec_jax.data.shared_data import SHARED_DATA_ENV

# Where the files the demo's tasks read come from, for the message of a
# missing one (a clone without the data folder beside it).
_SOURCES = {
    "multi30k": ("Multi30k's Task 1 captions are github.com/multi30k/dataset's "
                 "data/task1/raw/{train,val}.{en,de}.gz, gunzipped to "
                 "multi30k.{train,val}.{en,de}"),
}


class LocalDataError(ValueError, errors.UsageError):
  """A local data file that cannot be read as its task needs."""


class LocalDataNotFoundError(FileNotFoundError, errors.UsageError):
  """A local data file that is not there."""
SplitPath = Callable[[str], str]
DatasetFn = Callable[..., tf.data.Dataset]


def read_text(path: str, task: str, field: str) -> str:
  """A data file's text, local or gs:// (through `specdec_jax.infra.paths`)."""
  data = paths.read_bytes(path)
  if data is None:
    source = next((f" {text}." for key, text in _SOURCES.items()
                   if key in path.rsplit("/", 1)[-1]), "")
    raise LocalDataNotFoundError(
        f"Local data file not found: {path} (task {task!r}). Create it, or "
        f"point `TaskConfig.{field}` (or `TaskConfig.local_data_dir`, or "
        f"${SHARED_DATA_ENV}) at an existing file.{source}")
  try:
    return data.decode("utf-8")
  except UnicodeDecodeError as e:
    line = data[:e.start].count(b"\n") + 1
    raise LocalDataError(
        f"Local data file {path} (task {task!r}) is not UTF-8: line {line} "
        f"has the byte {data[e.start:e.start + 1]!r} ({e.reason}). Convert "
        f"the file to UTF-8 (e.g. iconv -f latin1 -t utf-8), or fix that "
        "line.") from None


def read_lines(path: str, task: str, field: str) -> list[str]:
  """One segment a line, surrounding whitespace (and '\\r') trimmed."""
  # str.splitlines would also split on U+2028 and friends inside a segment.
  lines = read_text(path, task, field).split("\n")
  if lines[-1] == "":  # The file's final newline ends a line, not starts one.
    lines.pop()
  if not lines:
    raise LocalDataError(f"Local data file {path} (task {task!r}) is empty.")
  return [line.strip() for line in lines]


def read_parallel(prefix: str, task: str,
                  field: str) -> tuple[list[str], list[str]]:
  """The lines of `<prefix>.en` and `<prefix>.de`, which must align."""
  en = read_lines(prefix + ".en", task, field)
  de = read_lines(prefix + ".de", task, field)
  if len(en) != len(de):
    raise LocalDataError(
        f"Misaligned parallel files for task {task!r}: {prefix}.en has "
        f"{len(en)} lines but {prefix}.de has {len(de)}.")
  # A blank segment would be decoded (and an empty reference scored).
  blank = [n for n, pair in enumerate(zip(en, de), start=1) if not all(pair)]
  if blank:
    raise LocalDataError(
        f"Parallel files {prefix}.en/.de (task {task!r}) have {len(blank)} "
        f"pair(s) with a blank line, at line(s) {blank[:10]}"
        f"{' ...' if len(blank) > 10 else ''}: delete those lines from both "
        "files (keeping them aligned).")
  return en, de


def parallel_text_fn(task: str, field: str,
                     split_path: SplitPath) -> DatasetFn:
  """A seqio dataset_fn over aligned `<prefix>.en`/`<prefix>.de` files."""

  def dataset_fn(split: str, shuffle_files: bool = False) -> tf.data.Dataset:
    del shuffle_files  # One file a language: nothing to shuffle.
    prefix = split_path(split)
    en, de = read_parallel(prefix, task, field)
    ids = [str(i) for i in range(len(en))]
    return tf.data.Dataset.from_tensor_slices({"en": en, "de": de, "id": ids})

  return dataset_fn


def _parallel_paragraphs(task: str, field: str, split_path: SplitPath,
                         split: str, singles: bool) -> dict[str, list[str]]:
  """{'en', 'de', 'id'} of a split's paragraphs (after its single pairs).

  Ids are the sentence ids ('17') and 'p<start>+<size>' for a paragraph.
  """
  prefix = split_path(split)
  en, de = read_parallel(prefix, task, field)
  spans = paragraphs.paragraph_spans(len(en))
  par_en, par_de = paragraphs.build_paragraphs(en, de)
  rows = {"en": par_en, "de": par_de,
          "id": [f"p{start}+{size}" for start, size in spans]}
  if singles:
    rows = {"en": en + rows["en"], "de": de + rows["de"],
            "id": [str(i) for i in range(len(en))] + rows["id"]}
  return rows


def paragraphs_fn(task: str, field: str, split_path: SplitPath, *,
                  singles_in_train: bool,
                  paragraphs_in_eval: bool) -> DatasetFn:
  """A dataset_fn over paragraphs of aligned `.en`/`.de` files' pairs.

  Args:
    task, field: the task's name and its `TaskConfig` files field (for
      messages).
    split_path: split -> the file (prefix) to read.
    singles_in_train: the train split also holds every single pair.
    paragraphs_in_eval: other splits are paragraphs (else single pairs).
  """
  singles_only = parallel_text_fn(task, field, split_path)

  def dataset_fn(split: str, shuffle_files: bool = False) -> tf.data.Dataset:
    if split != "train" and not paragraphs_in_eval:
      return singles_only(split, shuffle_files)
    rows = _parallel_paragraphs(task, field, split_path, split,
                                singles=split == "train" and singles_in_train)
    return tf.data.Dataset.from_tensor_slices(rows)

  return dataset_fn


def jsonl_fn(task: str, field: str, split_path: SplitPath) -> DatasetFn:
  """A seqio dataset_fn over a JSONL file of articles and highlights."""

  def dataset_fn(split: str, shuffle_files: bool = False) -> tf.data.Dataset:
    del shuffle_files
    path = split_path(split)
    rows = {"article": [], "highlights": [], "id": []}
    for number, line in enumerate(read_lines(path, task, field), start=1):
      if not line:
        continue
      try:
        record = json.loads(line)
        article, highlights = record["article"], record["highlights"]
        if not (isinstance(article, str) and isinstance(highlights, str)):
          raise TypeError("'article' and 'highlights' must be strings")
      except (ValueError, KeyError, TypeError) as e:
        raise LocalDataError(
            f"{path} line {number} (task {task!r}) is not a JSON object with "
            f"string fields 'article' and 'highlights': {e!r}") from e
      # Without an id, a record is known by its position among the records.
      rows["id"].append(str(record.get("id", len(rows["id"]))))
      rows["article"].append(article)
      rows["highlights"].append(highlights)
    if not rows["id"]:
      raise LocalDataError(f"Local data file {path} (task {task!r}) is empty.")
    return tf.data.Dataset.from_tensor_slices(rows)

  return dataset_fn


def instructions_fn(task: str, field: str, split_path: SplitPath) -> DatasetFn:
  """A seqio dataset_fn over a JSONL file of instructions: each object a
  string `instruction`, optional strings `context` and `response` (empty
  when absent) and an optional `id` (else its position)."""

  def dataset_fn(split: str, shuffle_files: bool = False) -> tf.data.Dataset:
    del shuffle_files
    path = split_path(split)
    rows = {"instruction": [], "context": [], "response": [], "id": []}
    for number, line in enumerate(read_lines(path, task, field), start=1):
      if not line:
        continue
      try:
        record = json.loads(line)
        fields = [record["instruction"], record.get("context", ""),
                  record.get("response", "")]
        if not all(isinstance(f, str) for f in fields):
          raise TypeError("'instruction', 'context' and 'response' must be "
                          "strings")
      except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(
            f"{path} line {number} (task {task!r}) is not a JSON object with "
            f"a string 'instruction' (and optional string 'context' and "
            f"'response'): {e!r}") from e
      rows["id"].append(str(record.get("id", len(rows["id"]))))
      for key, value in zip(("instruction", "context", "response"), fields):
        rows[key].append(value)
    if not rows["id"]:
      raise ValueError(f"Local data file {path} (task {task!r}) is empty.")
    return tf.data.Dataset.from_tensor_slices(rows)

  return dataset_fn


def sentences_fn(task: str, field: str,
                 split_path: SplitPath) -> DatasetFn:
  """A seqio dataset_fn over a text file, one sentence a line."""

  def dataset_fn(split: str, shuffle_files: bool = False) -> tf.data.Dataset:
    del shuffle_files
    text = read_lines(split_path(split), task, field)
    # Ids are 0-based line numbers; blank lines are dropped later, so an id
    # still points at its line.
    ids = [str(i) for i in range(len(text))]
    return tf.data.Dataset.from_tensor_slices({"text": text, "id": ids})

  return dataset_fn
