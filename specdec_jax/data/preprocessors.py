"""The text preprocessors of the tasks (`tasks.py`): each turns a source's
raw example into T5's text-to-text `inputs`/`targets`, then the prompt
template, tokens, BOS and EOS follow (`TOKENIZE_BOS_AND_EOS`). Settings
(`task_config.TaskConfig`) are read when a pipeline is built.
"""

from __future__ import annotations

from typing import Mapping

# First: TensorFlow's import quiet on a machine without a GPU.
from specdec_jax.data import tensorflow_env  # noqa: F401  # pylint: disable=unused-import
import seqio
import tensorflow as tf

from specdec_jax.data.task_config import current_config
from specdec_jax.data.task_config import INPUT_PLACEHOLDER
from specdec_jax.data.task_config import PLAIN_PROMPT
from specdec_jax.data.task_config import prompt_text
from specdec_jax.data.task_config import SUMMARIZE_PREFIX
from specdec_jax.data.task_config import TRANSLATE_PREFIX

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

  The template is read when the pipeline is built (a checkpoint's chat
  template rendered then: `task_config.prompt_text`). `PLAIN_PROMPT` returns
  the dataset as it is; another template gets the input stripped of
  leading and trailing whitespace in place of its `{input}`.

  Args:
    dataset: examples with a string `inputs`.

  Returns:
    The examples, `inputs` templated.
  """
  template = prompt_text()
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
TOKENIZE_BOS_AND_EOS = (apply_prompt_template,
                         seqio.preprocessors.tokenize,
                         prepend_bos_to_inputs,
                         seqio.preprocessors.append_eos_after_trim)
