r"""Where greedy drafts disagree with the target: by confidence and position.

  python benchmarks/agreement.py [--inputs=paragraphs] [--target=demo:target]
      [--drafts=demo:draft_large,demo:draft_base,demo:draft_small]

At temperature 0 a draft token is accepted iff it is the target's argmax
after the target's own prefix. This script decodes the shipped demo inputs
(`specdec_jax/demo_data/<inputs>.en`) with the target alone, greedy, runs
every model teacher-forced on those outputs, and prints how often each
draft's argmax equals the target's (the greedy acceptance rate of a draft
token, before the stop at the first rejection), split by

  * the target's own top-1 probability at that position: where the target
    itself hesitates between tokens, a draft's guess is close to a coin
    flip, whatever the draft;
  * the position in the output: whether drafts lose track later in a
    paragraph.

It also prints how often at least one of the first two drafts agrees (what
a second guess would buy). The split tells whether α is capped by the
drafts (a better draft helps) or by the target's uncertainty (a sharper
target helps); docs/demo_models.md uses it.
"""

from absl import app
from absl import flags
from absl import logging
import numpy as np

import specdec_jax as sd
from specdec_jax.data import text
from specdec_jax.tokens import EOS_ID

_INPUTS = flags.DEFINE_enum("inputs", "paragraphs", ["sentences", "paragraphs"],
                            "Shipped demo inputs to decode.")
_TARGET = flags.DEFINE_string("target", "demo:target", "Target model spec.")
_DRAFTS = flags.DEFINE_list(
    "drafts", ["demo:draft_large", "demo:draft_base", "demo:draft_small"],
    "Draft model specs.")
_MAX_DECODE_LEN = flags.DEFINE_integer("max_decode_len", 96,
                                       "Most tokens per output.")

CONFIDENCE_BINS = ((0.0, 0.5), (0.5, 0.7), (0.7, 0.9), (0.9, 1.01))
POSITION_BINS = ((0, 12), (12, 24), (24, 48), (48, 1 << 30))


def _teacher_forced_logits(model, ids, outputs):
  decoder_inputs = np.pad(outputs[:, :-1], ((0, 0), (1, 0)))
  return np.asarray(model.definition.forward(model.params, ids,
                                             decoder_inputs))


def _valid(outputs):
  """bool [B, T]: the output tokens up to and including each row's EOS."""
  ended = np.cumsum(outputs == EOS_ID, axis=1)
  return (ended == 0) | ((ended == 1) & (outputs == EOS_ID))


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  target = sd.load_model(_TARGET.value)
  ids = text.encode(target.vocab, text.demo_sentences(name=_INPUTS.value))
  outputs = sd.generate(target, ids,
                        max_decode_len=_MAX_DECODE_LEN.value).tokens
  valid = _valid(outputs)
  logits = _teacher_forced_logits(target, ids, outputs)
  target_argmax = logits.argmax(-1)
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  top1 = (probs / probs.sum(-1, keepdims=True)).max(-1)
  position = np.broadcast_to(np.arange(outputs.shape[1]), outputs.shape)
  print(f"{_INPUTS.value}: {len(ids)} inputs, {valid.sum()} target tokens; "
        f"the target's argmax reproduces its greedy output at "
        f"{(target_argmax == outputs)[valid].mean():.3f} of them")
  print("the target's top-1 probability is >= " + ", ".join(
      f"{lo:g} at {(top1[valid] >= lo).mean():.3f}"
      for lo, _ in CONFIDENCE_BINS[1:]) + " of them")
  agree = {}
  for spec in _DRAFTS.value:
    draft = sd.load_model(spec)
    agree[spec] = _teacher_forced_logits(draft, ids, outputs).argmax(
        -1) == target_argmax
    parts = []
    for lo, hi in CONFIDENCE_BINS:
      cell = valid & (top1 >= lo) & (top1 < hi)
      parts.append(f"[{lo:g},{min(hi, 1):g}) {agree[spec][cell].mean():.3f}")
    for lo, hi in POSITION_BINS:
      cell = valid & (position >= lo) & (position < hi)
      if cell.any():
        parts.append(f"pos {lo}+ {agree[spec][cell].mean():.3f}")
    print(f"{spec}: agree {agree[spec][valid].mean():.3f} | by target top-1: "
          + " ".join(parts[:len(CONFIDENCE_BINS)]) + " | by position: "
          + " ".join(parts[len(CONFIDENCE_BINS):]))
  if len(agree) >= 2:
    first_two = list(agree)[:2]
    either = agree[first_two[0]] | agree[first_two[1]]
    print(f"either of {' / '.join(first_two)}: {either[valid].mean():.3f}")


if __name__ == "__main__":
  app.run(main)
