"""Tasks tokenized by a Hugging Face tokenizer.json (Llama 3's, Qwen's).

`TaskConfig.vocab_path` may name a checkpoint's tokenizer.json instead of a
SentencePiece model: the tasks then tokenize with it, through the
`tokens.BpeVocabulary` a checkpoint carries (the `tokenizers` library),
reading tokenizer_config.json and generation_config.json from the same
folder (local or gs://) for its EOS and BOS:

  TaskBpeVocabulary     that vocabulary as seqio's `Vocabulary` (its
                        TensorFlow side a `tf.numpy_function` over it);
  ConfiguredVocabulary  the vocabulary every task's features hold: the one
                        `TaskConfig.vocab_path` names when it is used, a
                        SentencePiece model or a tokenizer.json.

Ids: no sentinels (`extra_ids` 0) and no UNK (byte-level BPE has a piece
for every byte); a task's padding is 0 as everywhere, though 0 is a piece
here ('!'), which is why `vocabularies.detokenize` asks a vocabulary for
its `pad_id` (None here) before dropping zeros.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

# First: TensorFlow's import quiet on a machine without a GPU.
from specdec_jax.data import tensorflow_env  # noqa: F401  # pylint: disable=unused-import
import numpy as np
import seqio
import tensorflow as tf

from specdec_jax import tokens
from specdec_jax.infra import paths


def is_tokenizer_json(path: str) -> bool:
  """Whether `TaskConfig.vocab_path` names a tokenizer.json."""
  return path.endswith(".json")


@functools.lru_cache(maxsize=8)
def _read(path: str) -> tokens.BpeVocabulary:
  """The tokenizer.json at `path` with the files beside it (read once)."""
  folder = paths.split(path)[0]
  files = {name: paths.read_bytes(paths.join(folder, name))
           for name in tokens.BPE_FILES}
  files[tokens.TOKENIZER_FILE] = paths.read_bytes(path)
  if files[tokens.TOKENIZER_FILE] is None:
    raise FileNotFoundError(
        f"TaskConfig.vocab_path {path!r} does not exist: point it at the "
        "tokenizer.json of the checkpoint the target was trained with")
  return tokens.BpeVocabulary(
      {k: v for k, v in files.items() if v is not None}, source=path)


class TaskBpeVocabulary(seqio.Vocabulary):
  """seqio's `Vocabulary` over the tokenizer.json at `path` (see module).

  Args:
    path: the tokenizer.json file, local or gs://.
  """

  def __init__(self, path: str):
    super().__init__(extra_ids=0)
    self._path = path

  def __repr__(self) -> str:
    return f"TaskBpeVocabulary({self._path!r})"

  @property
  def vocabulary(self) -> tokens.BpeVocabulary:
    return _read(self._path)

  @property
  def tokenizer_file(self) -> str:
    return self._path

  @property
  def bos_id(self) -> int | None:
    bos = self.vocabulary.bos_id
    return None if bos < 0 else bos

  @property
  def eos_id(self) -> int | None:
    eos = self.vocabulary.eos_id
    return None if eos < 0 else eos

  @property
  def unk_id(self) -> None:
    return None

  @property
  def pad_id(self) -> None:
    return None

  @property
  def _base_vocab_size(self) -> int:
    return self.vocabulary.vocab_size

  def _encode(self, s: str) -> list[int]:
    return self.vocabulary.encode(s)

  def _decode(self, ids) -> str:
    return self.vocabulary.decode(ids)

  def decode(self, ids) -> str:
    """Text of `ids` up to the first EOS (excluded)."""
    return self.vocabulary.decode(np.asarray(ids).tolist())

  def _encode_tf(self, s: tf.Tensor) -> tf.Tensor:
    """A string scalar -> int32 [length]."""
    encode = lambda text: np.asarray(
        self.vocabulary.encode(text.decode("utf-8")), np.int32)
    ids = tf.numpy_function(encode, [s], tf.int32, stateful=False)
    ids.set_shape([None])
    return ids

  def _decode_tf(self, ids: tf.Tensor) -> tf.Tensor:
    decode = lambda row: np.asarray(
        self.vocabulary.decode(row.tolist()).encode("utf-8"), object)
    text = tf.numpy_function(decode, [ids], tf.string, stateful=False)
    text.set_shape([])
    return text

  def __eq__(self, other: Any) -> bool:
    return isinstance(other, TaskBpeVocabulary) and other._path == self._path

  def __hash__(self) -> int:
    return hash(self._path)


class ConfiguredVocabulary(seqio.Vocabulary):
  """The vocabulary `path_of()` names when it is used: a
  `TaskBpeVocabulary` for a tokenizer.json, else `sentencepiece` (a seqio
  SentencePiece vocabulary that looks the path up itself). Every other
  attribute is the chosen one's.

  Args:
    path_of: the configured path (`TaskConfig.vocab_path`), asked at each
      use.
    sentencepiece: the vocabulary of a SentencePiece model.
  """

  def __init__(self, path_of: Callable[[], str],
               sentencepiece: seqio.Vocabulary):
    super().__init__(extra_ids=0)
    self._path_of = path_of
    self._sentencepiece = sentencepiece

  def chosen(self) -> seqio.Vocabulary:
    """The vocabulary the configured path names now."""
    path = self._path_of()
    if is_tokenizer_json(path):
      return TaskBpeVocabulary(path)
    return self._sentencepiece

  def __getattr__(self, name: str) -> Any:
    if name.startswith("__") or name in ("_path_of", "_sentencepiece"):
      raise AttributeError(name)
    return getattr(self.chosen(), name)

  bos_id = property(lambda self: self.chosen().bos_id)
  eos_id = property(lambda self: self.chosen().eos_id)
  unk_id = property(lambda self: self.chosen().unk_id)
  pad_id = property(lambda self: self.chosen().pad_id)
  extra_ids = property(lambda self: self.chosen().extra_ids)
  vocab_size = property(lambda self: self.chosen().vocab_size)
  _base_vocab_size = property(
      lambda self: self.chosen()._base_vocab_size)  # pylint: disable=protected-access

  def encode(self, s):
    return self.chosen().encode(s)

  def decode(self, ids):
    return self.chosen().decode(ids)

  def encode_tf(self, s):
    return self.chosen().encode_tf(s)

  def decode_tf(self, ids):
    return self.chosen().decode_tf(ids)

  # seqio's abstract methods, answered by `encode` and friends above.
  _encode = encode
  _decode = decode
  _encode_tf = encode_tf
  _decode_tf = decode_tf
