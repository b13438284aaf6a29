r"""Acceptance rate alpha of each demo draft against the demo target.

  python benchmarks/draft_alpha.py [--examples=128] [--gamma=4]

Decodes the first --examples Multi30k validation sentences (needs
../shared/data) in one batch with each draft at temperature 0 and 1, and
prints the pooled alpha (`theory.pooled_alpha`: the mean of
sum_x min(p, q) over verified positions; docs/demo_models.md).
"""

from absl import app
from absl import flags

import specdec_jax as sd
from specdec_jax.data import tasks
from specdec_jax.data import text

_TARGET = flags.DEFINE_string("target", "demo:target", "Target model spec.")
_DRAFTS = flags.DEFINE_list(
    "drafts", ["demo:draft_large", "demo:draft_base", "demo:draft_small"],
    "Draft model specs.")
_EXAMPLES = flags.DEFINE_integer("examples", 128,
                                 "Multi30k validation sentences.")
_GAMMA = flags.DEFINE_integer("gamma", 4, "Draft tokens per iteration.")


def main(argv):
  del argv
  target = sd.load_model(_TARGET.value)
  sentences = text.demo_sentences(
      _EXAMPLES.value, name="multi30k.val", language="en",
      data_dir=str(tasks.default_local_data_dir()))
  ids = text.encode(target.vocab, sentences)
  for spec in _DRAFTS.value:
    draft = sd.load_model(spec)
    for temperature in (0.0, 1.0):
      res = sd.speculative_generate(target, draft, ids, gamma=_GAMMA.value,
                                    max_decode_len=64,
                                    temperature=temperature)
      print(f"{spec} T={temperature:g} alpha={res.stats.pooled_alpha():.3f}",
            flush=True)


if __name__ == "__main__":
  app.run(main)
