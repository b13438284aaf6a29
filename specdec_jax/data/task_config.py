"""Where the tasks find their vocabulary and data: `TaskConfig` (bound with
gin or set from Python, read when a dataset or the vocabulary is first
used), the constants its fields default to, and the vocabulary every task
tokenizes with (`get_vocabulary`). `tasks.py` registers the tasks; see its
docstring for what each reads.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from pathlib import Path
from typing import Any, Iterator, Mapping

# First: TensorFlow's import quiet on a machine without a GPU.
from specdec_jax.data import tensorflow_env  # noqa: F401  # pylint: disable=unused-import
from absl import logging
import gin
import seqio

from specdec_jax import errors
from specdec_jax.data import bpe_vocabulary
from specdec_jax.data import chat_template
from specdec_jax.infra import paths
from specdec_jax.data import text
from specdec_jax.data.shared_data import default_local_data_dir
from specdec_jax.data.shared_data import SHARED_DATA_ENV  # noqa: F401  (public)

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
# The chat template of the vocabulary's checkpoint (a tokenizer.json's),
# rendered for one user message: `prompt_text`.
CHECKPOINT_CHAT_TEMPLATE = chat_template.CHECKPOINT
TRANSLATE_PREFIX = text.TRANSLATE_PREFIX
SUMMARIZE_PREFIX = text.SUMMARIZE_PREFIX
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

class VocabularyError(OSError, errors.UsageError):
  """The SentencePiece vocabulary file could not be read or parsed."""


# Registered under `tasks` (its home before the split), so every binding
# written `tasks.TaskConfig.x` (gin files, --gin flags) still names it.
@gin.configurable(module="specdec_jax.data.tasks")
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
      instruction-tuned (-it) checkpoints. `CHECKPOINT_CHAT_TEMPLATE`
      ('checkpoint') renders the chat template of the tokenizer.json
      vocabulary's checkpoint (Llama 3's, Qwen 3's) for one user message
      and the generation prompt, as transformers does
      (`data/chat_template.py`), with `chat_template_kwargs`.
    chat_template_kwargs: the variables a checkpoint's chat template reads
      beyond its messages, for `prompt_template = 'checkpoint'`: e.g.
      {'enable_thinking': False} for Qwen 3, {'date_string': '26 Jul 2024'}
      for Llama 3 (whose 3.2 template writes today's date without it, so a
      resumed run could not tell its prompts from yesterday's).
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
  chat_template_kwargs: Mapping[str, Any] = dataclasses.field(
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
    if template != CHECKPOINT_CHAT_TEMPLATE and (
        not isinstance(template, str)
        or template.count(INPUT_PLACEHOLDER) != 1):
      raise ValueError(
          f"TaskConfig.prompt_template must be a string holding "
          f"{INPUT_PLACEHOLDER!r} exactly once (where the input text goes), "
          f"or {CHECKPOINT_CHAT_TEMPLATE!r} (the tokenizer's own chat "
          f"template), got {template!r}; the input as it is: "
          f"{PLAIN_PROMPT!r}.")
    if (not isinstance(self.chat_template_kwargs, Mapping)
        or not all(isinstance(k, str) and k.isidentifier()
                   for k in self.chat_template_kwargs)):
      raise ValueError(
          f"TaskConfig.chat_template_kwargs must map variable names to "
          f"values, e.g. {{'enable_thinking': False}}, got "
          f"{self.chat_template_kwargs!r}.")

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
  """The error for a vocabulary that does not load: the path, why, and
  where the vocabulary this path was meant to be usually comes from."""
  name = os.path.basename(str(path))
  if name.startswith("multi30k_"):
    hint = ("The demo's vocabulary ships with the package: "
            "'package:demo_models/target/vocab.model' (TrainConfig.vocab_path "
            "or TaskConfig.vocab_path); scripts/train_vocab.py makes this "
            "file from Multi30k's training text.")
  elif name.startswith("lm1b_"):
    hint = ("The lm1b tasks' 8k vocabulary is made by scripts/train_vocab.py "
            "(docs/tpu.md, Table 3).")
  elif name == "tokenizer.model":
    hint = ("Gemma's tokenizer.model comes with the checkpoint's Hugging "
            "Face directory.")
  else:
    local_copy = default_local_data_dir() / "t5" / "spiece.model"
    hint = ("T5's is cc_all.32000 (gs://t5-data/vocabs/cc_all.32000.100extra/"
            "sentencepiece.model" + (f", or the local copy {local_copy}"
                                     if local_copy.exists() else "") + ").")
  return VocabularyError(
      f"Could not load the SentencePiece vocabulary {path!r} "
      f"({type(error).__name__}: {error}). Point the config at a readable "
      "copy: gin `TaskConfig.vocab_path = '/path/to/spiece.model'` (training: "
      f"`TrainConfig.vocab_path`). {hint}")


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


def prompt_text(config: TaskConfig | None = None) -> str:
  """The `{input}` template a task's inputs are placed in.

  `config.prompt_template` as written, or for 'checkpoint' what the chat
  template of the tokenizer.json at `config.vocab_path` renders for one
  user message with the generation prompt (`chat_template.
  prompt_template`, with `config.chat_template_kwargs`; without the BOS
  token it writes first when `config.inputs_bos` adds BOS as an id).

  Raises:
    chat_template.ChatTemplateError: 'checkpoint' with a SentencePiece
      vocabulary or a tokenizer without a template, or a template that is
      not one `{input}` text.
  """
  config = config or current_config()
  if config.prompt_template != CHECKPOINT_CHAT_TEMPLATE:
    return config.prompt_template
  path = resolve_package_path(config.vocab_path)
  if not bpe_vocabulary.is_tokenizer_json(path):
    raise chat_template.ChatTemplateError(
        f"TaskConfig.prompt_template = {CHECKPOINT_CHAT_TEMPLATE!r} reads "
        f"the chat template beside a tokenizer.json (Llama 3's, Qwen 3's), "
        f"but TaskConfig.vocab_path is {config.vocab_path!r}: for Gemma's "
        "SentencePiece model use tasks.GEMMA_CHAT_TEMPLATE, or write the "
        "prompt's text with '{input}'.")
  vocab = bpe_vocabulary.TaskBpeVocabulary(path).vocabulary
  source = os.path.dirname(config.vocab_path) or config.vocab_path
  text = chat_template.prompt_template(
      vocab.chat_template, bos_token=vocab.bos_token,
      eos_token=vocab.eos_token, strip_bos=config.inputs_bos,
      source=source, **dict(config.chat_template_kwargs))
  logging.info("prompts: %s's chat template with %s: %r", source,
               dict(config.chat_template_kwargs), text)
  return text


def output_features(inputs_eos: bool = True) -> dict[str, seqio.Feature]:
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
