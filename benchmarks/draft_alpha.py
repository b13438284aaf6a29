r"""Acceptance rate alpha of each demo draft against the demo target.

  python benchmarks/draft_alpha.py [--examples=128] [--gamma=4]
  python benchmarks/draft_alpha.py --task=multi30k_ende_paragraphs_local \
      --split=train --examples=96 --max_decode_len=96
      # the same on a task's split, in batches of 32: e.g. the training
      # paragraphs the drafts were distilled on against the validation ones

Decodes the first --examples Multi30k validation sentences (needs
../shared/data) in one batch with each draft at temperature 0 and 1, and
prints the pooled alpha (`theory.pooled_alpha`: the mean of
sum_x min(p, q) over verified positions; docs/demo_models.md). With
--task, the first --examples of that task's --split instead
(`readers.load_examples`, tokenized with the target's vocabulary).
"""

from absl import app
from absl import flags

import specdec_jax as sd
from specdec_jax import theory
from specdec_jax.data import batching
from specdec_jax.data import tasks
from specdec_jax.data import text
from specdec_jax.data import readers

_TARGET = flags.DEFINE_string("target", "demo:target", "Target model spec.")
_DRAFTS = flags.DEFINE_list(
    "drafts", ["demo:draft_large", "demo:draft_base", "demo:draft_small"],
    "Draft model specs.")
_EXAMPLES = flags.DEFINE_integer(
    "examples", 128, "Examples measured: the first of the Multi30k "
    "validation sentences, or of --task's --split.")
_GAMMA = flags.DEFINE_integer("gamma", 4, "Draft tokens per iteration.")
_TASK = flags.DEFINE_string(
    "task", None, "A local task (e.g. multi30k_ende_local, "
    "multi30k_ende_paragraphs_local) to read --split of; None: the "
    "Multi30k validation sentences in one batch.")
_SPLIT = flags.DEFINE_string("split", "validation", "The split of --task.")
_MAX_DECODE_LEN = flags.DEFINE_integer("max_decode_len", 64,
                                       "Most tokens per output.")


def _batches(target):
  """int32 [B, L] input batches of the examples measured."""
  if _TASK.value is None:
    sentences = text.demo_sentences(
        _EXAMPLES.value, name="multi30k.val", language="en",
        data_dir=str(tasks.default_local_data_dir()))
    return [text.encode(target.vocab, sentences)]
  with tasks.override_config(
      vocab_path=target.vocab.sentencepiece_model_file):
    examples = readers.load_examples(_TASK.value, _SPLIT.value,
                                      max_examples=_EXAMPLES.value)
  return [b.input_ids for b in batching.batches(examples, batch_size=32,
                                                max_length=128)]


def main(argv):
  del argv
  target = sd.load_model(_TARGET.value)
  batches = _batches(target)
  for spec in _DRAFTS.value:
    draft = sd.load_model(spec)
    for temperature in (0.0, 1.0):
      stats = [sd.speculative_generate(
          target, draft, ids, gamma=_GAMMA.value,
          max_decode_len=_MAX_DECODE_LEN.value,
          temperature=temperature).stats for ids in batches]
      alpha = theory.pooled_alpha([s.alpha_sum.sum() for s in stats],
                                  [s.alpha_count.sum() for s in stats])
      print(f"{spec} T={temperature:g} alpha={alpha:.3f}", flush=True)


if __name__ == "__main__":
  app.run(main)
