"""The special token ids, declared once, and the vocabularies that use them.

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
pipelines need, and read the same file. `BpeVocabulary` is the other kind a
checkpoint carries: a Hugging Face tokenizer.json (Llama 3's, Qwen's), read
with the `tokenizers` library (see its section below).
"""

from __future__ import annotations

import functools
import hashlib
import json
import threading
from typing import Any, Iterable, Mapping, Sequence

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


# ----------------------------------------------------------------------------
# The vocabulary of a Hugging Face `tokenizer.json`: the byte-level BPE
# tokenizers of Llama 3 and Qwen 3, through the `tokenizers` library.
#
# `BpeVocabulary` answers as `SentencePieceVocabulary` does (encode,
# decode, vocab_size, and the special ids) from the files a checkpoint
# directory holds, given as their contents (the checkpoint and data layers
# read them, locally or from gs://):
#
#   tokenizer.json          the tokenizer itself (required)
#   tokenizer_config.json   its BOS and EOS tokens, and the chat template
#   chat_template.jinja     the chat template, where transformers 5 saves it
#   generation_config.json  the ids that end a generated row (`eos_token_id`,
#                           e.g. Llama 3 Instruct's <|eot_id|> 128009 beside
#                           <|end_of_text|> 128001, Qwen's <|im_end|>)
#
# `encode` adds no special ids (a task adds BOS where the model wants one:
# `TaskConfig.inputs_bos`); special tokens written in the text, as a chat
# template writes them, become their ids. `decode` is the tokenizer's own,
# as transformers 5 decodes (it leaves BPE text uncleaned).
#
# Chat templates are Jinja programs (Llama 3's writes a dated system header,
# Qwen 3's thinking switches). The vocabulary carries the checkpoint's
# template as it is (`chat_template`, with `bos_token` and `eos_token` as
# text), and a run takes its prompt as a `{input}` template
# (`TaskConfig.prompt_template`): either written out, or 'checkpoint', the
# text the checkpoint's own template renders for one user message with the
# generation prompt (`data/chat_template.py` renders it as transformers
# does).
#
# Two checkpoints share a vocabulary when the same ids name the same pieces:
# `pieces_digest` hashes the tokenizer's pieces and special tokens with their
# ids, not the file's bytes, which differ between releases saved by
# different versions of the library.

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"
GENERATION_CONFIG_FILE = "generation_config.json"
BPE_FILES = (TOKENIZER_FILE, TOKENIZER_CONFIG_FILE, CHAT_TEMPLATE_FILE,
             GENERATION_CONFIG_FILE)


def pieces_digest(tokenizer_json: bytes) -> str:
  """The first 16 hex digits of the sha256 of a tokenizer.json's pieces
  and their ids (its BPE `model.vocab` and its added tokens, in id
  order)."""
  data = json.loads(tokenizer_json)
  pieces = list(data["model"]["vocab"].items()) + [
      (t["content"], t["id"]) for t in data.get("added_tokens", [])]
  pieces.sort(key=lambda item: item[1])
  return hashlib.sha256(json.dumps(pieces).encode()).hexdigest()[:16]


def _token(value: Any) -> str | None:
  """A special token as tokenizer_config.json writes it (a string, or an
  AddedToken dict with its `content`), or None."""
  return value.get("content") if isinstance(value, dict) else value


def _ids(value: Any) -> tuple[int, ...]:
  """generation_config.json's `eos_token_id` (an int or a list)."""
  if value is None:
    return ()
  return tuple(int(v) for v in (value if isinstance(value, list)
                                 else [value]))


class BpeVocabulary:
  """A tokenizer.json tokenizer as the project's vocabulary.

  Args:
    files: {file name: contents} of BPE_FILES; tokenizer.json is required.
    source: where they came from, for messages and `repr`.
  """

  def __init__(self, files: Mapping[str, bytes], source: str = ""):
    if TOKENIZER_FILE not in files:
      raise ValueError(f"no {TOKENIZER_FILE} in {source or 'the files'}")
    self._files = {name: bytes(data) for name, data in files.items()
                   if name in BPE_FILES and data is not None}
    self._source = source
    self._tokenizer = None
    config = json.loads(self._files.get(TOKENIZER_CONFIG_FILE, b"{}"))
    generation = json.loads(self._files.get(GENERATION_CONFIG_FILE, b"{}"))
    added = {t["content"]: t["id"] for t in
             json.loads(self._files[TOKENIZER_FILE]).get("added_tokens", [])}
    self._bos_token = _token(config.get("bos_token"))
    self._eos_token = _token(config.get("eos_token"))
    self._eos = added.get(self._eos_token)
    self._stop_ids = _ids(generation.get("eos_token_id"))
    if self._eos is None and self._stop_ids:
      self._eos = self._stop_ids[0]
    template = self._files.get(CHAT_TEMPLATE_FILE)
    self._chat_template = (template.decode("utf-8") if template is not None
                           else config.get("chat_template"))

  def __repr__(self) -> str:
    return f"BpeVocabulary({self._source!r})"

  def __getstate__(self) -> dict[str, Any]:
    # The Rust tokenizer does not pickle (gin deep-copies its arguments);
    # it reloads on first use.
    return {**self.__dict__, "_tokenizer": None}

  def __eq__(self, other: object) -> bool:
    return isinstance(other, BpeVocabulary) and self._files == other._files

  def __hash__(self) -> int:
    return hash(self.pieces_digest)

  @property
  def tokenizer(self) -> Any:
    """The `tokenizers.Tokenizer`, loaded on first use."""
    if self._tokenizer is None:
      # tokenizers only when text is encoded or decoded.
      import tokenizers  # pylint: disable=g-import-not-at-top
      self._tokenizer = tokenizers.Tokenizer.from_str(
          self._files[TOKENIZER_FILE].decode("utf-8"))
    return self._tokenizer

  def files(self) -> dict[str, bytes]:
    """{file name: contents} this vocabulary was read from (what an
    exported checkpoint writes beside its weights)."""
    return dict(self._files)

  @functools.cached_property
  def pieces_digest(self) -> str:
    """`pieces_digest` of the tokenizer.json: equal for two checkpoints
    whose ids name the same pieces (computed once: Llama 3's file is 9 MB
    of JSON)."""
    return pieces_digest(self._files[TOKENIZER_FILE])

  @property
  def vocab_size(self) -> int:
    """Ids the tokenizer defines, special tokens included (a model's
    embedding may have more rows: Qwen 3's 151936 for 151669 ids)."""
    return self.tokenizer.get_vocab_size(with_added_tokens=True)

  @property
  def pad_id(self) -> int | None:
    """None: a row is 0-padded whatever the tokenizer, and id 0 is a
    piece here ('!' in Llama 3's and Qwen's), not padding."""
    return None

  @property
  def bos_id(self) -> int:
    """The id the tokenizer puts before a text when asked for its special
    tokens (Llama 3's <|begin_of_text|> 128000); -1 where it puts none
    (Qwen's: its prompts start with the text)."""
    with_special = self.tokenizer.encode("a", add_special_tokens=True).ids
    plain = self.tokenizer.encode("a", add_special_tokens=False).ids
    added = with_special[:len(with_special) - len(plain)]
    return added[0] if len(added) == 1 and with_special[1:] == plain else -1

  @property
  def eos_id(self) -> int:
    """tokenizer_config.json's EOS token (else generation_config.json's
    first); -1 without one."""
    return -1 if self._eos is None else int(self._eos)

  @property
  def unk_id(self) -> int:
    return -1  # byte-level BPE has a piece for every byte

  @property
  def stop_ids(self) -> tuple[int, ...]:
    """The ids that end a generated row: generation_config.json's
    `eos_token_id` (all of them), else (eos_id,)."""
    return self._stop_ids or ((self.eos_id,) if self.eos_id >= 0 else ())

  @property
  def chat_template(self) -> str | None:
    """The checkpoint's chat template (Jinja source; `data/chat_template`
    renders it)."""
    return self._chat_template

  @property
  def bos_token(self) -> str | None:
    """tokenizer_config.json's BOS token as text (a chat template writes
    it), or None."""
    return self._bos_token

  @property
  def eos_token(self) -> str | None:
    """tokenizer_config.json's EOS token as text, or None."""
    return self._eos_token

  def encode(self, s: str) -> list[int]:
    """Ids of `s`, no special ids added (special tokens in the text are
    their ids)."""
    return self.tokenizer.encode(s, add_special_tokens=False).ids

  def decode(self, ids: Iterable[int],
             skip_special_tokens: bool = False) -> str:
    """Text of `ids` up to the first EOS (excluded), as the tokenizer
    decodes them; ids past `vocab_size` are dropped.

    Args:
      ids: int [length], a list or a numpy row.
      skip_special_tokens: leave out special tokens (BOS, chat markers).
    """
    size, eos = self.vocab_size, self.eos_id
    clean = [int(i) for i in ids]
    if eos in clean:
      clean = clean[:clean.index(eos)]
    return self.tokenizer.decode([i for i in clean if 0 <= i < size],
                                 skip_special_tokens=skip_special_tokens)
