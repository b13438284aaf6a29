"""seqio tasks for fine-tuning with T5X on the datasets docs/tpu.md prepares.

T5's own tasks (`wmt_t2t_ende_v003`, `cnn_dailymail_v002`) read TFDS
`wmt_t2t_translate/de-en:1.0.0` and `cnn_dailymail:3.1.0`, and live in the
`t5` package, which T5X's install does not bring. The T5X configs beside
this file import it instead (`import specdec_t5x_tasks`, with this folder on
PYTHONPATH); it needs only seqio and TensorFlow, which T5X installs, and
registers:

  specdec_wmt14_ende     TFDS wmt14_translate/de-en:1.0.0: WMT14 training
                         data, newstest2013 (validation), newstest2014
                         (test); "translate English to German: <en>" ->
                         <de>, as T5 formats it.
  specdec_cnn_dailymail  TFDS cnn_dailymail:3.4.0; "summarize: <article>"
                         -> <highlights>.

Both in T5's vocabulary with 100 extra ids (the one T5X's T5 1.1 configs
use), inputs and targets ending in EOS. T5X's `--tfds_data_dir` points both
at the prepared datasets (docs/tpu.md, step 3). It does not import
specdec_jax: T5X's pins (jax, flax, seqio from their repositories) live in
their own virtual environment.
"""

import functools

import seqio
import tensorflow as tf

VOCABULARY = seqio.SentencePieceVocabulary(
    "gs://t5-data/vocabs/cc_all.32000.100extra/sentencepiece.model")
_FEATURES = {
    name: seqio.Feature(vocabulary=VOCABULARY, add_eos=True, required=True)
    for name in ("inputs", "targets")}


def _pair(example, prefix, source, target):
  return {"inputs": tf.strings.join([prefix, example[source]]),
          "targets": example[target]}


def _register(name, tfds_name, prefix, source, target):
  seqio.TaskRegistry.add(
      name,
      source=seqio.TfdsDataSource(tfds_name=tfds_name),
      preprocessors=[
          seqio.map_over_dataset(functools.partial(
              _pair, prefix=prefix, source=source, target=target)),
          seqio.preprocessors.tokenize,
          seqio.CacheDatasetPlaceholder(),
          seqio.preprocessors.append_eos_after_trim,
      ],
      output_features=_FEATURES,
      metric_fns=[])


if "specdec_wmt14_ende" not in seqio.TaskRegistry.names():
  _register("specdec_wmt14_ende", "wmt14_translate/de-en:1.0.0",
            "translate English to German: ", "en", "de")
  _register("specdec_cnn_dailymail", "cnn_dailymail:3.4.0", "summarize: ",
            "article", "highlights")
