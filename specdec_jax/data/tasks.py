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
  `cnn_dailymail_local_prompt`, `multi30k_ende_local_prompt`: the same tasks
  for a decoder-only model (Gemma 3): `inputs` is the prompt, without EOS
  (the tiny Gemma 3 pair of configs/training/gemma3_tiny_*.gin trains and
  is measured on the Multi30k one).
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

from typing import Mapping

# First: TensorFlow's import quiet on a machine without a GPU.
from specdec_jax.data import tensorflow_env  # noqa: F401  # pylint: disable=unused-import
import seqio

from specdec_jax.data import local_files
from specdec_jax.data import metrics
# The tasks' settings, preprocessors and sources live in their own modules;
# their public names stay reachable here (`tasks.TaskConfig`, gin's
# `tasks.TaskConfig.vocab_path`, ...).
from specdec_jax.data.preprocessors import apply_prompt_template  # noqa: F401  (public)
from specdec_jax.data.preprocessors import instruction_and_response
from specdec_jax.data.preprocessors import lm1b_prompt_and_continuation
from specdec_jax.data.preprocessors import prepend_bos_to_inputs  # noqa: F401  (public)
from specdec_jax.data.preprocessors import summarize_article
from specdec_jax.data.preprocessors import TOKENIZE_BOS_AND_EOS
from specdec_jax.data.preprocessors import translate_en_to_de
from specdec_jax.data.task_config import CHECKPOINT_CHAT_TEMPLATE  # noqa: F401  (public)
from specdec_jax.data.task_config import current_config
from specdec_jax.data.task_config import output_features
from specdec_jax.data.task_config import default_local_data_dir  # noqa: F401  (public)
from specdec_jax.data.task_config import DEFAULT_VOCAB_PATH  # noqa: F401  (public)
from specdec_jax.data.task_config import GEMMA_CHAT_TEMPLATE  # noqa: F401  (public)
from specdec_jax.data.task_config import get_vocabulary  # noqa: F401  (public)
from specdec_jax.data.task_config import INPUT_PLACEHOLDER  # noqa: F401  (public)
from specdec_jax.data.task_config import NUM_EXTRA_IDS  # noqa: F401  (public)
from specdec_jax.data.task_config import override_config  # noqa: F401  (public)
from specdec_jax.data.task_config import PACKAGE_PREFIX  # noqa: F401  (public)
from specdec_jax.data.task_config import PLAIN_PROMPT  # noqa: F401  (public)
from specdec_jax.data.task_config import prompt_text  # noqa: F401  (public)
from specdec_jax.data.task_config import resolve_package_path  # noqa: F401  (public)
from specdec_jax.data.task_config import set_config  # noqa: F401  (public)
from specdec_jax.data.task_config import SHARED_DATA_ENV  # noqa: F401  (public)
from specdec_jax.data.task_config import SUMMARIZE_PREFIX  # noqa: F401  (public)
from specdec_jax.data.task_config import TaskConfig  # noqa: F401  (public)
from specdec_jax.data.task_config import TRANSLATE_PREFIX  # noqa: F401  (public)
from specdec_jax.data.task_config import VocabularyError  # noqa: F401  (public)
from specdec_jax.data.tfds_source import read_tfds_split  # noqa: F401  (public)
from specdec_jax.data.tfds_source import SPLITS as _SPLITS
from specdec_jax.data.tfds_source import TfdsNotPreparedError  # noqa: F401  (public)
from specdec_jax.data.tfds_source import TfdsSource as _TfdsSource

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
    "wmt14_ende", "wmt14_ende_local", "cnn_dailymail", "cnn_dailymail_local",
    "multi30k_ende_local"))

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
      name, source=source, output_features=output_features(inputs_eos),
      preprocessors=[text_preprocessor, *TOKENIZE_BOS_AND_EOS],
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
