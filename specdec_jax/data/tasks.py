"""seqio tasks for the paper's benchmarks, WMT EnDe, CNN/DM and lm1b, on or off.

Importing this module registers these seqio tasks:

- `wmt14_ende`: TFDS `wmt14_translate/de-en:1.0.0`; test is newstest2014.
- `wmt_t2t_ende`: TFDS `wmt_t2t_translate/de-en:1.0.0`, T5's EnDe data;
  validation is newstest2013, test newstest2014.
- `cnn_dailymail`: TFDS `cnn_dailymail:3.4.0`.
- `wmt14_ende_local`: aligned `.en`/`.de` text files, one segment a line;
  by default the test split is newstest2014.dev100 from the shared data.
- `multi30k_ende_local`: the same reader over Multi30k train/validation, the
  data the tiny demo models fit on a CPU.
- `multi30k_ende_paragraphs_local`: paragraphs of 2-5 consecutive Multi30k
  pairs of each split (`specdec_jax.data.paragraphs`, seed 0): the long-output
  task of the demo.
- `multi30k_ende_mix_local`: what the shipped demo models are fine-tuned on:
  its train split is every single Multi30k training pair followed by the
  training paragraphs; its validation split the single validation pairs, so
  the BLEU logged while training stays the sentence BLEU.
- `cnn_dailymail_local`: JSONL with `article`, `highlights` (and `id`); by
  default the test split is cnndm_test_frank250.dev100.jsonl.
- `lm1b`: TFDS `lm1b:1.1.0` (One Billion Word; splits train and test only),
  the data of the paper's GPT-like Table 3 rows.
- `lm1b_local`: text files, one sentence a line; no file by default
  (`TaskConfig.lm1b_files`).
- `wmt14_ende_prompt`, `wmt14_ende_local_prompt`, `cnn_dailymail_prompt`,
  `cnn_dailymail_local_prompt`: the same tasks for a decoder-only model
  (Gemma 3): `inputs` is the prompt, without EOS.
- `instructions_local`: JSONL instructions (databricks-dolly-15k's format:
  `instruction`, optional `context` and `response`); `inputs` is the
  instruction (a blank line, then the context, when there is one), without
  EOS, `targets` the response; no metric. No file by default
  (`TaskConfig.instruction_files`).

The translation and summarization tasks produce T5's text-to-text format:
`inputs` is "translate English to German: {en}" or "summarize: {article}",
`targets` the German reference or the highlights; both end in EOS. The lm1b
tasks feed a decoder-only language model: `inputs` is a prompt, the first
`TaskConfig.lm1b_prompt_words` (default 4) whitespace-separated words of the
sentence, WITHOUT EOS (the model continues it), and `targets` the rest of the
sentence (possibly empty), ending in EOS; sentences without a word are
dropped, and lm1b has no metric (Table 3 reports only alpha). Every task is
tokenized with the vocabulary `TaskConfig.vocab_path` names (by default T5's,
32000 pieces + `TaskConfig.vocab_extra_ids` = 100 sentinel ids; pad 0, EOS 1;
for lm1b point it at an 8k SentencePiece model, as the paper's GPT-like models
used); the raw strings stay in `inputs_pretokenized`/`targets_pretokenized`
(seqio's convention), and an `id` feature is kept where the source has one.

Three settings fit the pipeline to a vocabulary other than T5's (Gemma's, for
T5Gemma: configs/experiments/t5gemma/ende.gin and cnndm.gin set them):
`TaskConfig.vocab_extra_ids` (0: the SentencePiece model's ids alone),
`TaskConfig.inputs_bos` (each input starts with the model's BOS id, before its
tokens and EOS) and `TaskConfig.prompt_template` (the input text placed in a
template, e.g. `GEMMA_CHAT_TEMPLATE` for instruction-tuned checkpoints; the
default `PLAIN_PROMPT` leaves it as it is). `inputs_pretokenized` holds the
text after the template.

Where the data and the vocabulary live is a `TaskConfig`, bound with gin
(`TaskConfig.vocab_path = '...'`) or set from Python (`set_config`,
`override_config`). It is read when a dataset or the vocabulary is first used,
not at import, so bindings parsed after this module was imported still apply.
Nothing here downloads: an unprepared TFDS dataset is an error that says how to
prepare it, and the `*_local` tasks read plain files.

`FEATURE_LENGTHS` holds the lengths each task is meant to be decoded with;
`specdec_jax.data.batching` truncates inputs to them (keeping EOS last where the
inputs end in EOS, the first tokens of a prompt otherwise). TensorFlow and
seqio are imported here and in nothing the core library imports.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from pathlib import Path
from typing import Any, Iterator, Mapping

# First: TensorFlow's import quiet on a machine without a GPU.
from specdec_jax.data import tensorflow_env  # noqa: F401  # pylint: disable=unused-import
import gin
import seqio
import tensorflow as tf

from specdec_jax.data import bpe_vocabulary
from specdec_jax.data import local_files
from specdec_jax.infra import paths
from specdec_jax.data import metrics
from specdec_jax.data import text

DEFAULT_VOCAB_PATH = (
    "gs://t5-data/vocabs/cc_all.32000.100extra/sentencepiece.model")
# T5's sentinel ids: the default of `TaskConfig.vocab_extra_ids`. What a run
# uses is `current_config().vocab_extra_ids` (`get_vocabulary().extra_ids`).
NUM_EXTRA_IDS = 100
# `TaskConfig.prompt_template`'s placeholder for the task's input text, and
# the default template: the input as it is.
INPUT_PLACEHOLDER = "{input}"
PLAIN_PROMPT = INPUT_PLACEHOLDER
# The user turn and generation prompt of Gemma's chat template (Hugging
# Face's for Gemma and T5Gemma -it checkpoints) without its leading `<bos>`,
# which `TaskConfig.inputs_bos` adds as an id. `<start_of_turn>` (106) and
# `<end_of_turn>` (107) are single pieces of Gemma's SentencePiece model.
GEMMA_CHAT_TEMPLATE = ("<start_of_turn>user\n" + INPUT_PLACEHOLDER +
                       "<end_of_turn>\n<start_of_turn>model\n")
TRANSLATE_PREFIX = text.TRANSLATE_PREFIX
SUMMARIZE_PREFIX = text.SUMMARIZE_PREFIX
SHARED_DATA_ENV = local_files.SHARED_DATA_ENV
# Paths that start with this name files shipped inside the package, e.g.
# 'package:demo_data/sentences' or 'package:demo_models/target/vocab.model',
# so a gin file can point at them wherever the package is installed.
PACKAGE_PREFIX = "package:"
_PACKAGE_DIR = Path(__file__).resolve().parents[1]


def resolve_package_path(path: str) -> str:
  """`package:REL` as a path inside the installed package; others as given."""
  if path.startswith(PACKAGE_PREFIX):
    return str(_PACKAGE_DIR / path[len(PACKAGE_PREFIX):])
  return path

WMT14_ENDE = "wmt14_ende"
WMT_T2T_ENDE = "wmt_t2t_ende"
CNN_DAILYMAIL = "cnn_dailymail"
WMT14_ENDE_LOCAL = "wmt14_ende_local"
MULTI30K_ENDE_LOCAL = "multi30k_ende_local"
MULTI30K_ENDE_PARAGRAPHS_LOCAL = "multi30k_ende_paragraphs_local"
MULTI30K_ENDE_MIX_LOCAL = "multi30k_ende_mix_local"
CNN_DAILYMAIL_LOCAL = "cnn_dailymail_local"
LM1B = "lm1b"
LM1B_LOCAL = "lm1b_local"
INSTRUCTIONS_LOCAL = "instructions_local"
# The decoder-only form of a task: `inputs` is a prompt without EOS.
PROMPT_SUFFIX = "_prompt"
PROMPT_TASKS = tuple(name + PROMPT_SUFFIX for name in (
    "wmt14_ende", "wmt14_ende_local", "cnn_dailymail", "cnn_dailymail_local"))

_SPLITS = ("train", "validation", "test")
_LM1B_SPLITS = ("train", "test")  # lm1b has no validation split.

# T5 fine-tuned and evaluated both WMT EnDe and CNN/DM with 512 input and 512
# target tokens (t5/models/gin/sequence_lengths/{wmt_t2t_ende_v003,
# cnn_dailymail_v002}.gin). Inputs longer than 512 are truncated keeping EOS
# last: no newstest2014 sentence comes close, but most CNN/DM articles do (81
# of the 100 dev articles), exactly as in T5's own evaluation. The target
# length only bounds the reference token ids; the paper does not cut outputs
# short, so decode with max_decode_len = 512 and let EOS end each row (the
# longest dev reference is 83 tokens before EOS for EnDe, 232 for CNN/DM).
# Multi30k captions are short (at most 63 input and 74 target tokens with
# EOS), so 128 truncates nothing and keeps the tiny demo models' buffers small.
# lm1b sentences are short (about 25 words on average): the prompt is a
# handful of words, a few tokens with an 8k vocabulary, so 64 input tokens
# only ever cut a pathological "word" (a URL, a run of symbols), and 128 target
# tokens hold all but the rare very long sentence. Decode the lm1b rows with
# max_decode_len = 128 to match, which also keeps the GPT-like models'
# caches small.
FEATURE_LENGTHS: Mapping[str, Mapping[str, int]] = {
    WMT14_ENDE: {"inputs": 512, "targets": 512},
    WMT_T2T_ENDE: {"inputs": 512, "targets": 512},
    CNN_DAILYMAIL: {"inputs": 512, "targets": 512},
    WMT14_ENDE_LOCAL: {"inputs": 512, "targets": 512},
    MULTI30K_ENDE_LOCAL: {"inputs": 128, "targets": 128},
    # Paragraphs average 63 input and 60 target tokens; 128 cuts 0.1% of the
    # training paragraphs' inputs and 0.2% of their targets, and keeps the
    # demo models' max_input_len.
    MULTI30K_ENDE_PARAGRAPHS_LOCAL: {"inputs": 128, "targets": 128},
    MULTI30K_ENDE_MIX_LOCAL: {"inputs": 128, "targets": 128},
    CNN_DAILYMAIL_LOCAL: {"inputs": 512, "targets": 512},
    LM1B: {"inputs": 64, "targets": 128},
    LM1B_LOCAL: {"inputs": 64, "targets": 128},
    # Instructions (databricks-dolly-15k's, with their context) are short
    # beside an article; answers run long.
    INSTRUCTIONS_LOCAL: {"inputs": 512, "targets": 512},
}
FEATURE_LENGTHS.update({name: FEATURE_LENGTHS[name.removesuffix(
    PROMPT_SUFFIX)] for name in PROMPT_TASKS})


class VocabularyError(OSError):
  """The SentencePiece vocabulary file could not be read or parsed."""


class TfdsNotPreparedError(FileNotFoundError):
  """A TFDS dataset has not been downloaded and prepared in the data dir."""


def default_local_data_dir() -> Path:
  """`$SPECDEC_SHARED_DATA`, else the `shared/data` folder beside the repo."""
  if os.environ.get(SHARED_DATA_ENV):
    return Path(os.environ[SHARED_DATA_ENV])
  return Path(__file__).resolve().parents[3] / "shared" / "data"


@gin.configurable
@dataclasses.dataclass(frozen=True)
class TaskConfig:
  """Where the tasks find their vocabulary and data.

  Relative local paths resolve against `local_data_dir`; absolute paths and
  `gs://` paths are used as they are; `package:REL` names a file shipped in
  the package (`resolve_package_path`), e.g. the demo's data and vocabulary.

  Attributes:
    vocab_path: the SentencePiece model every task tokenizes with (default
      T5's cc_all.32000; Gemma's tokenizer.model for T5Gemma), or a
      checkpoint's tokenizer.json (Llama 3's, Qwen's: `bpe_vocabulary`,
      which reads tokenizer_config.json and generation_config.json beside
      it; no sentinels, whatever vocab_extra_ids says).
    vocab_extra_ids: sentinel ids appended to the SentencePiece model's
      pieces on load (`<extra_id_0>` the highest, seqio's order): T5's 100
      by default, 0 for a vocabulary without sentinels (Gemma's). The
      vocabulary's `vocab_size` counts them, and the target's must be at
      least that (`check_vocabulary_fits`).
    inputs_bos: whether each task's inputs start with the SentencePiece
      model's BOS id, before the tokens (and the EOS that ends encoder
      inputs): False for T5 (its vocabulary has no BOS), True for Gemma's
      (BOS 2, as Hugging Face's GemmaTokenizer adds it). A vocabulary
      without a BOS id is then an error. Targets never get one (the
      decoder starts from the model's start id).
    prompt_template: the text each task's input (the preprocessed text, task
      prefix included) is placed in; it holds `{input}` exactly once, and
      everything else is literal. The default `PLAIN_PROMPT` ("{input}")
      leaves the input as it is; any other template gets the input with
      leading and trailing whitespace stripped, as Gemma's chat template
      trims a message. `GEMMA_CHAT_TEMPLATE` is the format of T5Gemma's
      instruction-tuned (-it) checkpoints.
    tfds_data_dir: the TFDS data dir holding prepared datasets. None: seqio's
      override (t5x's --tfds_data_dir) or TFDS's default ($TFDS_DATA_DIR or
      ~/tensorflow_datasets).
    local_data_dir: base of relative local paths. None:
      `default_local_data_dir()`.
    wmt_ende_files: split -> path prefix of aligned `<prefix>.en` and
      `<prefix>.de` files (one segment a line) for `wmt14_ende_local`.
    multi30k_files: the same for the `multi30k_ende*_local` tasks.
    cnndm_files: split -> JSONL file, one object a line with string fields
      `article` and `highlights` (and optionally `id`), for
      `cnn_dailymail_local`.
    lm1b_files: split -> text file, one sentence a line, for `lm1b_local`;
      empty by default (there is no shared lm1b data).
    lm1b_prompt_words: how many leading words of an lm1b sentence form the
      prompt (`inputs`); the rest are the `targets`. At least 1.
    instruction_files: split -> JSONL file of instructions (`instruction`,
      optional `context` and `response`: databricks-dolly-15k's format) for
      `instructions_local`; empty by default.
  """

  vocab_path: str = DEFAULT_VOCAB_PATH
  vocab_extra_ids: int = NUM_EXTRA_IDS
  inputs_bos: bool = False
  prompt_template: str = PLAIN_PROMPT
  tfds_data_dir: str | None = None
  local_data_dir: str | None = None
  wmt_ende_files: Mapping[str, str] = dataclasses.field(
      default_factory=lambda: {"test": "newstest2014.dev100"})
  multi30k_files: Mapping[str, str] = dataclasses.field(
      default_factory=lambda: {"train": "multi30k.train",
                               "validation": "multi30k.val"})
  cnndm_files: Mapping[str, str] = dataclasses.field(
      default_factory=lambda: {"test": "cnndm_test_frank250.dev100.jsonl"})
  lm1b_files: Mapping[str, str] = dataclasses.field(default_factory=dict)
  lm1b_prompt_words: int = 4
  instruction_files: Mapping[str, str] = dataclasses.field(
      default_factory=dict)

  def __post_init__(self):
    extra = self.vocab_extra_ids
    if isinstance(extra, bool) or not isinstance(extra, int) or extra < 0:
      raise ValueError(
          f"TaskConfig.vocab_extra_ids must be an int >= 0 (T5's vocabulary "
          f"takes 100 sentinel ids, Gemma's 0), got {extra!r}.")
    if not isinstance(self.inputs_bos, bool):
      raise ValueError(f"TaskConfig.inputs_bos must be True or False, got "
                       f"{self.inputs_bos!r}.")
    template = self.prompt_template
    if (not isinstance(template, str)
        or template.count(INPUT_PLACEHOLDER) != 1):
      raise ValueError(
          f"TaskConfig.prompt_template must be a string holding "
          f"{INPUT_PLACEHOLDER!r} exactly once (where the input text goes), "
          f"got {template!r}; the input as it is: {PLAIN_PROMPT!r}.")

  def resolve(self, path: str) -> str:
    """`path` made absolute against `local_data_dir` unless it already is."""
    if path.startswith(PACKAGE_PREFIX):
      return resolve_package_path(path)
    if "://" in path or os.path.isabs(path):
      return path
    base = (resolve_package_path(self.local_data_dir) if self.local_data_dir
            else str(default_local_data_dir()))
    return os.path.join(base, path)


_config_override: TaskConfig | None = None


def current_config() -> TaskConfig:
  """The config in force: the one `set_config` installed, else gin's."""
  return _config_override if _config_override is not None else TaskConfig()


def set_config(config: TaskConfig | None) -> TaskConfig | None:
  """Installs `config` for every task (None: back to gin); returns the old."""
  global _config_override
  previous, _config_override = _config_override, config
  return previous


@contextlib.contextmanager
def override_config(**changes: Any) -> Iterator[TaskConfig]:
  """Within the block, `current_config()` with `changes` applied."""
  config = dataclasses.replace(current_config(), **changes)
  previous = set_config(config)
  try:
    yield config
  finally:
    set_config(previous)


# ------------------------------- vocabulary ----------------------------------


def _vocabulary_error(path: str, error: Exception) -> VocabularyError:
  local_copy = default_local_data_dir() / "t5" / "spiece.model"
  hint = (f" A local copy of the T5 vocabulary is at {local_copy}."
          if local_copy.exists() else "")
  return VocabularyError(
      f"Could not load the SentencePiece vocabulary from {path!r} "
      f"({type(error).__name__}: {error}). Point the tasks at a readable copy "
      "of the vocabulary (T5's cc_all.32000; for the lm1b tasks the 8k model "
      "your GPT-like models use): in gin "
      "`TaskConfig.vocab_path = '/path/to/spiece.model'` (or the flag "
      "--gin.TaskConfig.vocab_path=\"'/path/to/spiece.model'\"), in Python "
      "`tasks.set_config(tasks.TaskConfig(vocab_path=...))` or "
      f"`tasks.get_vocabulary(path)`.{hint}")


class _TaskVocabulary(seqio.SentencePieceVocabulary):
  """A SentencePieceVocabulary whose file and sentinels are looked up when it
  loads.

  Its sentinel count is always `current_config().vocab_extra_ids`; with no
  fixed path its file is `current_config().vocab_path`. So the tasks
  registered at import honour a vocabulary configured afterwards: if either
  setting changes, the next use loads anew. A file that does not load raises
  `VocabularyError` naming the path and the fix.
  """

  def __init__(self, path: str | None):
    super().__init__(path or "", extra_ids=NUM_EXTRA_IDS)
    self._fixed_path = path
    self._loaded_from = None

  @property
  def sentencepiece_model_file(self) -> str:
    return resolve_package_path(self._fixed_path or
                                current_config().vocab_path)

  @property
  def extra_ids(self) -> int:
    return current_config().vocab_extra_ids

  def _model_context(self):
    path, extra_ids = self.sentencepiece_model_file, self.extra_ids
    if self._model is None or self._loaded_from != (path, extra_ids):
      self._model = None
      self._loaded_from = (path, extra_ids)
      self._extra_ids = extra_ids  # what seqio's loader appends
      try:
        # A gs:// file comes through the one I/O layer (its endpoint,
        # bounded waits), not TensorFlow's own client: seqio reads the
        # local copy.
        self._sentencepiece_model_file = paths.local_copy(path)
        super()._model_context()
      except Exception as e:  # tf.errors, protobuf and sentencepiece errors.
        raise _vocabulary_error(path, e) from e
    return self._model


_CONFIGURED_VOCABULARY = bpe_vocabulary.ConfiguredVocabulary(
    lambda: resolve_package_path(current_config().vocab_path),
    _TaskVocabulary(None))


def get_vocabulary(path: str | None = None) -> seqio.Vocabulary:
  """The task vocabulary, loaded lazily on first use.

  Args:
    path: a SentencePiece model file or a tokenizer.json. None:
      `current_config().vocab_path`, looked up at each use (the vocabulary
      every task here uses).

  Returns:
    For a SentencePiece model, a seqio vocabulary with
    `current_config().vocab_extra_ids` sentinels (looked up at each load):
    pad 0, EOS 1, `vocab_size` 32100 for T5's (UNK 2, 100 sentinels),
    256000 for Gemma's (BOS 2, none); its first use raises
    `VocabularyError` if the file does not load. For a tokenizer.json,
    `bpe_vocabulary.TaskBpeVocabulary` (no sentinels).
  """
  if path is None:
    return _CONFIGURED_VOCABULARY
  if bpe_vocabulary.is_tokenizer_json(path):
    return bpe_vocabulary.TaskBpeVocabulary(resolve_package_path(path))
  return _TaskVocabulary(path)


def _output_features(inputs_eos: bool = True) -> dict[str, seqio.Feature]:
  """inputs and targets in the configured vocabulary; targets end in EOS.

  Args:
    inputs_eos: whether `inputs` end in EOS: True for encoder inputs, False
      for a decoder-only prompt, which the model continues (an EOS there
      would tell it the text is over). `append_eos_after_trim` and
      `specdec_jax.data.batching` both honour the feature's `add_eos`.
  """
  vocab = get_vocabulary()
  return {"inputs": seqio.Feature(vocab, add_eos=inputs_eos),
          "targets": seqio.Feature(vocab, add_eos=True)}


# ------------------------------ preprocessors --------------------------------


def _with_id(example: Mapping[str, tf.Tensor], out: dict[str, tf.Tensor]):
  if "id" in example:
    out["id"] = example["id"]
  return out


@seqio.map_over_dataset
def translate_en_to_de(
    example: Mapping[str, tf.Tensor]) -> dict[str, tf.Tensor]:
  """{'en', 'de'[, 'id']} -> {'inputs': prefix + en, 'targets': de[, 'id']}."""
  return _with_id(example, {
      "inputs": tf.strings.join([TRANSLATE_PREFIX, example["en"]]),
      "targets": example["de"]})


@seqio.map_over_dataset
def summarize_article(
    example: Mapping[str, tf.Tensor]) -> dict[str, tf.Tensor]:
  """{'article', 'highlights'[, 'id']} -> {'inputs', 'targets'[, 'id']}."""
  return _with_id(example, {
      "inputs": tf.strings.join([SUMMARIZE_PREFIX, example["article"]]),
      "targets": example["highlights"]})


def lm1b_prompt_and_continuation(dataset: tf.data.Dataset) -> tf.data.Dataset:
  """{'text'[, 'id']} -> {'inputs': prompt, 'targets': continuation[, 'id']}.

  The prompt is the sentence's first `TaskConfig.lm1b_prompt_words` words,
  the continuation the rest (empty for a shorter sentence), each joined by
  single spaces; SentencePiece marks a word start itself, so the two
  tokenized halves read as the sentence. Sentences without a word are
  dropped: a decoder-only model has nothing to continue.

  Args:
    dataset: examples with a string `text` (and optionally `id`).

  Returns:
    The split examples.
  """
  n = current_config().lm1b_prompt_words  # Read when the pipeline is built.
  if not isinstance(n, int) or n < 1:
    raise ValueError(f"TaskConfig.lm1b_prompt_words must be an int >= 1 (the "
                     f"prompt needs a word), got {n!r}.")

  def split(example: Mapping[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    words = tf.strings.split(example["text"])
    return _with_id(example, {
        "inputs": tf.strings.reduce_join(words[:n], separator=" "),
        "targets": tf.strings.reduce_join(words[n:], separator=" ")})

  dataset = dataset.filter(
      lambda ex: tf.size(tf.strings.split(ex["text"])) > 0)
  return dataset.map(split, num_parallel_calls=tf.data.AUTOTUNE)


@seqio.map_over_dataset
def instruction_and_response(
    example: Mapping[str, tf.Tensor]) -> dict[str, tf.Tensor]:
  """{'instruction', 'context', 'response'[, 'id']} -> {'inputs': the
  instruction, then a blank line and the context when there is one;
  'targets': the response[, 'id']}."""
  context = example["context"]
  joined = tf.strings.join([example["instruction"], "\n\n", context])
  return _with_id(example, {
      "inputs": tf.where(tf.strings.length(context) > 0, joined,
                         example["instruction"]),
      "targets": example["response"]})


def apply_prompt_template(dataset: tf.data.Dataset) -> tf.data.Dataset:
  """Places each example's `inputs` text in `TaskConfig.prompt_template`.

  The template is read when the pipeline is built. `PLAIN_PROMPT` returns
  the dataset as it is; another template gets the input stripped of
  leading and trailing whitespace in place of its `{input}`.

  Args:
    dataset: examples with a string `inputs`.

  Returns:
    The examples, `inputs` templated.
  """
  template = current_config().prompt_template
  if template == PLAIN_PROMPT:
    return dataset
  before, after = template.split(INPUT_PLACEHOLDER)

  def wrap(example: Mapping[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    return {**example, "inputs": tf.strings.join(
        [before, tf.strings.strip(example["inputs"]), after])}

  return dataset.map(wrap, num_parallel_calls=tf.data.AUTOTUNE)


def prepend_bos_to_inputs(
    dataset: tf.data.Dataset,
    output_features: Mapping[str, seqio.Feature]) -> tf.data.Dataset:
  """With `TaskConfig.inputs_bos`, tokenized `inputs` start with BOS.

  Read when the pipeline is built; without the setting the dataset is
  returned as it is.

  Args:
    dataset: tokenized examples (int `inputs`).
    output_features: the task's; `inputs`' vocabulary gives the BOS id.

  Returns:
    The examples, `inputs` = [BOS] + tokens.

  Raises:
    ValueError: the SentencePiece model defines no BOS id.
  """
  if not current_config().inputs_bos:
    return dataset
  vocab = output_features["inputs"].vocabulary
  bos = vocab.bos_id
  if bos is None or bos < 0:
    raise ValueError(
        f"TaskConfig.inputs_bos is True but the vocabulary "
        f"{current_config().vocab_path!r} defines no BOS id (T5's, the "
        "demo's and Qwen's have none): set TaskConfig.inputs_bos = False, or "
        "point TaskConfig.vocab_path at the model's own tokenizer (Gemma's "
        "tokenizer.model has BOS 2, Llama 3's tokenizer.json 128000).")

  def prepend(example: Mapping[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    inputs = example["inputs"]
    return {**example, "inputs": tf.concat(
        [tf.constant([bos], dtype=inputs.dtype), inputs], axis=0)}

  return dataset.map(prepend, num_parallel_calls=tf.data.AUTOTUNE)


# After the task's text preprocessor: the template, tokens, BOS, EOS.
_TOKENIZE_BOS_AND_EOS = (apply_prompt_template,
                         seqio.preprocessors.tokenize,
                         prepend_bos_to_inputs,
                         seqio.preprocessors.append_eos_after_trim)

# ------------------------------- TFDS sources --------------------------------


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


class _TfdsSource(seqio.TfdsDataSource):
  """A TFDS source that reads `TaskConfig.tfds_data_dir` when it loads.

  It never downloads (read_only), and an unprepared dataset raises
  `TfdsNotPreparedError` with the command that prepares it.
  """

  def __init__(self, tfds_name: str, offline_task: str,
               splits: tuple[str, ...] = _SPLITS):
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


# ------------------------------- local sources -------------------------------


def _split_path(task: str, field: str, split: str) -> str:
  config = current_config()
  files = getattr(config, field)
  if split not in files:
    raise ValueError(
        f"Task {task!r} has no file configured for split {split!r} "
        f"(configured: {sorted(files)}). Set `TaskConfig.{field}`, e.g. in gin "
        f"`TaskConfig.{field} = {{'{split}': '/path/to/file'}}`.")
  return config.resolve(files[split])



def _split_paths(task: str, field: str) -> local_files.SplitPath:
  """split -> the resolved path `TaskConfig.<field>` gives it (read at use)."""
  return lambda split: _split_path(task, field, split)


# ------------------------------- registration --------------------------------


def _register(name: str, source: seqio.DataSource, text_preprocessor,
              metric_fn, *, inputs_eos: bool = True) -> None:
  """Adds a task: text preprocessor, prompt template, tokenize, BOS, EOS;
  no metric if None."""
  # Re-importing (e.g. importlib.reload in a notebook) must not fail on the
  # duplicate name.
  if name in seqio.TaskRegistry.names():
    seqio.TaskRegistry.remove(name)
  seqio.TaskRegistry.add(
      name, source=source, output_features=_output_features(inputs_eos),
      preprocessors=[text_preprocessor, *_TOKENIZE_BOS_AND_EOS],
      metric_fns=[] if metric_fn is None else [metric_fn])


def _register_all() -> None:
  _register(WMT14_ENDE, _TfdsSource("wmt14_translate/de-en:1.0.0",
                                    WMT14_ENDE_LOCAL),
            translate_en_to_de, metrics.bleu)
  _register(WMT_T2T_ENDE, _TfdsSource("wmt_t2t_translate/de-en:1.0.0",
                                      WMT14_ENDE_LOCAL),
            translate_en_to_de, metrics.bleu)
  _register(CNN_DAILYMAIL, _TfdsSource("cnn_dailymail:3.4.0",
                                       CNN_DAILYMAIL_LOCAL),
            summarize_article, metrics.rouge)
  for name, field, fn, prep, metric_fn in (
      (WMT14_ENDE_LOCAL, "wmt_ende_files", local_files.parallel_text_fn,
       translate_en_to_de, metrics.bleu),
      (MULTI30K_ENDE_LOCAL, "multi30k_files", local_files.parallel_text_fn,
       translate_en_to_de, metrics.bleu),
      (CNN_DAILYMAIL_LOCAL, "cnndm_files", local_files.jsonl_fn,
       summarize_article, metrics.rouge)):
    source = seqio.FunctionDataSource(
        fn(name, field, _split_paths(name, field)), splits=_SPLITS)
    _register(name, source, prep, metric_fn)
  for name, singles, eval_paragraphs in (
      (MULTI30K_ENDE_PARAGRAPHS_LOCAL, False, True),
      (MULTI30K_ENDE_MIX_LOCAL, True, False)):
    source = seqio.FunctionDataSource(local_files.paragraphs_fn(
        name, "multi30k_files", _split_paths(name, "multi30k_files"),
        singles_in_train=singles, paragraphs_in_eval=eval_paragraphs),
                                      splits=_SPLITS)
    _register(name, source, translate_en_to_de, metrics.bleu)
  # Table 3 measures only alpha on lm1b: no metric, and a prompt without EOS.
  _register(LM1B, _TfdsSource("lm1b:1.1.0", LM1B_LOCAL, _LM1B_SPLITS),
            lm1b_prompt_and_continuation, None, inputs_eos=False)
  _register(LM1B_LOCAL, seqio.FunctionDataSource(
      local_files.sentences_fn(LM1B_LOCAL, "lm1b_files",
                               _split_paths(LM1B_LOCAL, "lm1b_files")),
      splits=_SPLITS),
            lm1b_prompt_and_continuation, None, inputs_eos=False)
  # Decoder-only models (Gemma 3) continue a prompt: the same tasks without
  # the inputs' EOS, and instructions to answer (no metric).
  for name in PROMPT_TASKS:
    task = seqio.get_mixture_or_task(name.removesuffix(PROMPT_SUFFIX))
    _register(name, task.source, task.preprocessors[0],
              task.metric_fns[0] if task.metric_fns else None,
              inputs_eos=False)
  _register(INSTRUCTIONS_LOCAL, seqio.FunctionDataSource(
      local_files.instructions_fn(
          INSTRUCTIONS_LOCAL, "instruction_files",
          _split_paths(INSTRUCTIONS_LOCAL, "instruction_files")),
      splits=_SPLITS), instruction_and_response, None, inputs_eos=False)


_register_all()


def get_task(name: str) -> seqio.Task:
  """The registered seqio task `name` (one of FEATURE_LENGTHS or any other)."""
  try:
    return seqio.get_mixture_or_task(name)
  except ValueError as e:
    raise ValueError(f"Unknown task {name!r}; this module registers "
                     f"{sorted(FEATURE_LENGTHS)}. ({e})") from e


def feature_lengths(name: str) -> Mapping[str, int]:
  """{'inputs': L_in, 'targets': L_out} for a task registered here."""
  if name not in FEATURE_LENGTHS:
    raise ValueError(f"No feature lengths for task {name!r}; known: "
                     f"{sorted(FEATURE_LENGTHS)}. Pass lengths explicitly.")
  return FEATURE_LENGTHS[name]
