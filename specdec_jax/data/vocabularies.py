"""Trains a small shared SentencePiece vocabulary with T5's special ids.

The demo models need a small vocabulary: with T5's 32k pieces the embedding
table alone of a 20M-parameter target would be most of it, and a draft of
1/100 of the target's size could not even hold its embedding. So we train a
unigram SentencePiece model on the task's own text (English and German
together, one vocabulary for both sides, as T5 does) with T5's conventions:
pad = 0, EOS = 1, UNK = 2 and no BOS.

`specdec_jax.data.tasks` wraps whatever model `TaskConfig.vocab_path` names in a
seqio vocabulary with 100 extra ids, so a model trained here with N pieces
gives token ids in [0, N + 100); size the models' `vocab_size` to at least
that (the demo configs round it up to a multiple of 128).

  path = train_vocab(["multi30k.train.en", "multi30k.train.de"],
                     "/tmp/vocab/multi30k_4k", vocab_size=4000,
                     line_prefixes={"multi30k.train.en":
                                    tasks.TRANSLATE_PREFIX})

The paper's GPT-like models use an 8k vocabulary of lm1b;
`readers.export_tfds_text` writes a sample of a prepared TFDS dataset (e.g. lm1b's train sentences) to
the text file `train_vocab` reads.
"""

from __future__ import annotations

import os
import tempfile
from typing import Mapping, Sequence

from specdec_jax.tokens import cut_at_stop
from specdec_jax.tokens import DEFAULT_STOP_IDS
from specdec_jax.tokens import EOS_ID
from specdec_jax.tokens import PAD_ID
from specdec_jax.tokens import UNK_ID


def detokenize(vocab, tokens,
               stop_ids: Sequence[int] = DEFAULT_STOP_IDS) -> str:
  """Text of one generated row: cut at its first stop id, pads dropped.

  Ids past the vocabulary's pieces (the padded rows of an embedding table
  rounded up to a multiple of 128) have no piece: they decode as UNK, or
  are left out by a vocabulary without one. Zeros are dropped as padding
  unless the vocabulary says it has no padding id (`pad_id` None: a
  tokenizer.json's, whose id 0 is a piece).

  Args:
    vocab: a seqio (or SentencePiece-like) vocabulary with `decode` and
      `vocab_size`.
    tokens: int [length], e.g. `DecodeResult.tokens[b]`.
    stop_ids: the ids that ended the row (the decoder's `stop_ids`; EOS
      by default): the text stops before the first of them.
  """
  ids = cut_at_stop(tokens, stop_ids)
  pad = getattr(vocab, "pad_id", PAD_ID)
  unk = getattr(vocab, "unk_id", UNK_ID)
  ids = [i if i < vocab.vocab_size else unk for i in ids
         if pad is None or i != pad]
  return vocab.decode([i for i in ids if i is not None and i >= 0])


def train_vocab(text_files: Sequence[str], output_prefix: str, *,
                vocab_size: int = 4000,
                line_prefixes: Mapping[str, str] | None = None,
                model_type: str = "unigram",
                character_coverage: float = 1.0,
                max_sentences: int = 0, seed: int = 0,
                num_threads: int = 2) -> str:
  """Trains a SentencePiece model on text files, one segment a line.

  Args:
    text_files: plain-text files; all of them feed one shared vocabulary.
    output_prefix: writes `<output_prefix>.model` and `.vocab`; parent
      directories are created.
    vocab_size: number of pieces, the 3 special ones included.
    line_prefixes: file -> text put before each of its lines. Give the task's
      input prefix ("translate English to German: ") for the source side so
      that the prefix words become single pieces, as they are seen in every
      input.
    model_type: "unigram" (T5's) or "bpe".
    character_coverage: 1.0 keeps every character (umlauts, accents).
    max_sentences: sample this many lines (0: use all of them).
    seed: seed of that sample.
    num_threads: trainer threads.

  Returns:
    The path of the `.model` file.

  Raises:
    FileNotFoundError: a text file is missing.
    ValueError: bad size or no text.
  """
  # sentencepiece only when a vocabulary is trained.
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top

  if vocab_size < 8:
    raise ValueError(f"vocab_size must be at least 8, got {vocab_size}.")
  if not text_files:
    raise ValueError("No text files to train the vocabulary on.")
  prefixes = dict(line_prefixes or {})
  unknown = sorted(set(prefixes) - set(text_files))
  if unknown:
    raise ValueError(f"line_prefixes names files not in text_files: "
                     f"{unknown}")
  for path in text_files:
    if not os.path.isfile(path):
      raise FileNotFoundError(f"Vocabulary text file not found: {path}")
  directory = os.path.dirname(os.path.abspath(output_prefix))
  os.makedirs(directory, exist_ok=True)
  # The trainer reads files, so prefixed lines go through one temporary file.
  with tempfile.NamedTemporaryFile("w", suffix=".txt", encoding="utf-8",
                                   dir=directory, delete=False) as corpus:
    lines = 0
    for path in text_files:
      prefix = prefixes.get(path, "")
      with open(path, encoding="utf-8") as f:
        for line in f:
          line = line.strip()
          if line:
            corpus.write(prefix + line + "\n")
            lines += 1
  # The sentence sample is drawn from SentencePiece's global generator.
  spm.set_random_generator_seed(seed)
  try:
    if not lines:
      raise ValueError(f"The text files {list(text_files)} hold no text.")
    spm.SentencePieceTrainer.train(
        input=corpus.name, model_prefix=output_prefix,
        vocab_size=vocab_size, model_type=model_type,
        character_coverage=character_coverage,
        pad_id=PAD_ID, eos_id=EOS_ID, unk_id=UNK_ID, bos_id=-1,
        pad_piece="<pad>", eos_piece="</s>", unk_piece="<unk>",
        input_sentence_size=max_sentences,
        shuffle_input_sentence=max_sentences > 0, num_threads=num_threads,
        # A tiny corpus may not support the requested size exactly; a
        # slightly smaller vocabulary is fine, a crash is not.
        hard_vocab_limit=False, minloglevel=2)
  finally:
    os.remove(corpus.name)
  return output_prefix + ".model"
