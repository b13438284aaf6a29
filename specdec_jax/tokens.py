"""The special token ids, declared once, and the vocabulary that uses them.

T5's SentencePiece vocabularies (and every vocabulary this project trains)
reserve the first ids: pad 0, EOS 1, UNK 2. T5's decoder starts from the pad
id, so the decoder start token is 0 too. Models, data, training and the
engine all take these from here.

`SentencePieceVocabulary` is the vocabulary a checkpoint carries. It loads
SentencePiece directly: seqio's class of the same name imports TensorFlow
(seconds, and a page of TensorFlow log lines) for a model that only
decodes. Its ids, EOS handling, extra ids and `sp_model` bytes are seqio's
(tests/test_vocabulary.py compares the two on real text); the seqio tasks
(`specdec_jax.data.tasks`) keep seqio's own class, which their TensorFlow
pipelines need, and read the same file.
"""

from __future__ import annotations

import threading
from typing import Any, Iterable, Sequence

PAD_ID = 0
EOS_ID = 1
UNK_ID = 2
DECODER_START_ID = PAD_ID
# The ids that end a generated row unless a caller names others
# (`stop_ids=` of the decoders, e.g. (1, 107) for T5Gemma's -it checkpoints,
# which end a turn with <end_of_turn>).
DEFAULT_STOP_IDS = (EOS_ID,)


def is_stop(tokens: Any, stop_ids: Sequence[int]) -> Any:
  """Which of `tokens` (a numpy or jax int array, any shape) are stop ids.

  Args:
    tokens: int array.
    stop_ids: a non-empty tuple of ids (static: the comparisons unroll).

  Returns:
    A bool array of `tokens`' shape.
  """
  hit = tokens == stop_ids[0]
  for stop in stop_ids[1:]:
    hit = hit | (tokens == stop)
  return hit


def cut_at_stop(ids: Sequence[int],
                stop_ids: Sequence[int] = DEFAULT_STOP_IDS) -> list[int]:
  """The ids before the first stop id (all of them when none is there)."""
  ids = [int(t) for t in ids]
  stops = set(stop_ids)
  for i, t in enumerate(ids):
    if t in stops:
      return ids[:i]
  return ids

# SentencePiece's LoadFromSerializedProto is not thread-safe (seqio holds a
# lock for the same reason).
_LOAD_LOCK = threading.Lock()


class SentencePieceVocabulary:
  """A SentencePiece model with T5's conventions and `extra_ids` sentinels.

  As seqio's `SentencePieceVocabulary` (same file, same `extra_ids`, its
  default `reverse_extra_ids=True`): the sentinels are appended to the model
  as user-defined pieces `▁<extra_id_{i}>`, highest id for `<extra_id_0>`,
  so `vocab_size` counts them and text holding `<extra_id_3>` encodes to
  its sentinel id. The model loads on first use.

  Args:
    sentencepiece_model_file: a local `.model` file (checkpoints fetch a
      gs:// one through `specdec_jax.infra.paths` first).
    extra_ids: sentinel ids after the model's pieces (T5's 100).
  """

  def __init__(self, sentencepiece_model_file: str, extra_ids: int = 0):
    self._sentencepiece_model_file = sentencepiece_model_file
    self._extra_ids = int(extra_ids or 0)
    self._loaded: tuple[Any, bytes] | None = None

  def __repr__(self) -> str:
    return (f"SentencePieceVocabulary({self._sentencepiece_model_file!r}, "
            f"extra_ids={self._extra_ids})")

  def __getstate__(self) -> dict[str, Any]:
    # A processor does not pickle (gin deep-copies its arguments); it
    # reloads on first use.
    return {**self.__dict__, "_loaded": None}

  def __eq__(self, other: object) -> bool:
    return (isinstance(other, SentencePieceVocabulary) and
            (self._sentencepiece_model_file, self._extra_ids) ==
            (other._sentencepiece_model_file, other._extra_ids))

  def __hash__(self) -> int:
    return hash((self._sentencepiece_model_file, self._extra_ids))

  def _load(self) -> tuple[Any, bytes]:
    """(processor, serialized model with the sentinels), loaded once."""
    if self._loaded is None:
      # sentencepiece and protobuf only when text is encoded or decoded.
      import sentencepiece  # pylint: disable=g-import-not-at-top
      from sentencepiece import sentencepiece_model_pb2 as pb  # pylint: disable=g-import-not-at-top
      with open(self._sentencepiece_model_file, "rb") as f:
        proto = pb.ModelProto.FromString(f.read())
      # seqio's order: reversed, so that <extra_id_0> gets the highest id.
      for i in reversed(range(self._extra_ids)):
        proto.pieces.add(
            piece=f"▁<extra_id_{i}>", score=0.0,
            type=pb.ModelProto.SentencePiece.USER_DEFINED)
      serialized = proto.SerializeToString()
      processor = sentencepiece.SentencePieceProcessor()
      with _LOAD_LOCK:
        processor.LoadFromSerializedProto(serialized)
      self._loaded = (processor, serialized)
    return self._loaded

  def load_model(self) -> None:
    """Loads the model now (it would load on first use)."""
    self._load()

  @property
  def sentencepiece_model_file(self) -> str:
    return self._sentencepiece_model_file

  @property
  def extra_ids(self) -> int:
    return self._extra_ids

  @property
  def tokenizer(self) -> Any:
    """The `sentencepiece.SentencePieceProcessor` (sentinels included)."""
    return self._load()[0]

  @property
  def sp_model(self) -> bytes:
    """The serialized model, sentinels included (seqio's bytes)."""
    return self._load()[1]

  @property
  def vocab_size(self) -> int:
    """Ids in use: the model's pieces and the sentinels."""
    return self.tokenizer.GetPieceSize()

  @property
  def pad_id(self) -> int:
    return PAD_ID

  # SentencePiece's ids, -1 where the model defines none (as seqio's).
  @property
  def eos_id(self) -> int:
    return self.tokenizer.eos_id()

  @property
  def unk_id(self) -> int:
    return self.tokenizer.unk_id()

  @property
  def bos_id(self) -> int:
    return self.tokenizer.bos_id()

  def encode(self, s: str) -> list[int]:
    """Ids of `s`, without EOS (seqio's `encode`)."""
    return self.tokenizer.EncodeAsIds(s)

  def decode(self, ids: Iterable[int]) -> str:
    """Text of `ids` up to the first EOS; ids past `vocab_size` decode as
    UNK (seqio's `decode`).

    Args:
      ids: int [length], a list or a numpy row.
    """
    size, unk, eos = self.vocab_size, self.unk_id, self.eos_id
    clean = [unk if int(i) >= size else int(i) for i in ids]
    if eos in clean:
      clean = clean[:clean.index(eos) + 1]
    return self.tokenizer.DecodeIds(clean)
