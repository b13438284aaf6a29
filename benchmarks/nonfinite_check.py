r"""What the non-finite checks cost: decoding with and without, side by side.

  python benchmarks/nonfinite_check.py [--target=demo:target]
      [--draft=demo:draft_small] [--examples=8] [--repeats=21]

Decodes the first --examples shipped demo sentences (one batch) with
`generate` and `speculative_generate` (greedy and T=1), each with
on_nonfinite='error' (the default: a per-row NaN/inf flag reduced from
every logit on device) and on_nonfinite='ignore' (no check compiled in).
Both variants are compiled first, then called alternately (ABAB...) so that
drift hits both alike; each time is the fastest of --repeats
(`experiments/timing.py`'s rule). Prints both and their ratio, then the same
for `load_model` of the target with check_finite=True and False. Last, the
check's reduction alone, jitted on the logits of one target verification
[batch, gamma + 1, vocab] and one draft step [batch, 1, vocab] (fastest of
200; includes a dispatch the loop does not pay, so an upper bound on what
it adds per call): on a noisy machine this resolves what the side-by-side
ratio cannot. docs/reliability.md records the result.
"""

from absl import app
from absl import flags

import jax
import jax.numpy as jnp

import specdec_jax as sd
from specdec_jax.data import text
from specdec_jax.experiments import timing

_TARGET = flags.DEFINE_string("target", "demo:target", "Target model spec.")
_DRAFT = flags.DEFINE_string("draft", "demo:draft_small", "Draft model spec.")
_EXAMPLES = flags.DEFINE_integer("examples", 8, "Sentences in the batch.")
_GAMMA = flags.DEFINE_integer("gamma", 4, "Draft tokens per iteration.")
_MAX_DECODE_LEN = flags.DEFINE_integer("max_decode_len", 64, "Tokens a row.")
_REPEATS = flags.DEFINE_integer("repeats", 21, "Timed calls per variant.")


def _side_by_side(fns, repeats):
  """Fastest seconds of each fn, called alternately after one warm-up."""
  for fn in fns:
    fn()
  best = [float("inf")] * len(fns)
  for _ in range(repeats):
    for i, fn in enumerate(fns):
      best[i] = min(best[i], timing.best_time(fn, 1)[1])
  return best


def main(argv):
  del argv
  target, draft = sd.load_model(_TARGET.value), sd.load_model(_DRAFT.value)
  ids = text.encode(target.vocab, text.demo_sentences(_EXAMPLES.value))
  print(f"target={_TARGET.value} draft={_DRAFT.value} batch={ids.shape} "
        f"gamma={_GAMMA.value} max_decode_len={_MAX_DECODE_LEN.value} "
        f"repeats={_REPEATS.value}")
  print(f"{'decoder':<22} {'checked_ms':>10} {'unchecked_ms':>12} "
        f"{'ratio':>6}")
  kw = dict(max_decode_len=_MAX_DECODE_LEN.value)
  cases = [("generate T=0", lambda c: sd.generate(
      target, ids, on_nonfinite=c, **kw))]
  for temperature in (0.0, 1.0):
    cases.append((f"speculative T={temperature:g}", lambda c, t=temperature:
                  sd.speculative_generate(target, draft, ids,
                                          gamma=_GAMMA.value, temperature=t,
                                          on_nonfinite=c, **kw)))
  for name, fn in cases:
    checked, unchecked = _side_by_side(
        [lambda f=fn: f("error"), lambda f=fn: f("ignore")], _REPEATS.value)
    print(f"{name:<22} {checked * 1e3:10.2f} {unchecked * 1e3:12.2f} "
          f"{checked / unchecked:6.3f}", flush=True)
  checked, unchecked = _side_by_side(
      [lambda: sd.load_model(_TARGET.value, check_finite=True),
       lambda: sd.load_model(_TARGET.value, check_finite=False)],
      max(3, _REPEATS.value // 4))
  print(f"{'load_model target':<22} {checked * 1e3:10.2f} "
        f"{unchecked * 1e3:12.2f} {checked / unchecked:6.3f}")
  check = jax.jit(lambda x: jnp.isfinite(jnp.sum(x, axis=(1, 2))))
  for name, tokens in (("verification", _GAMMA.value + 1), ("draft step", 1)):
    logits = jnp.zeros((ids.shape[0], tokens, target.vocab_size), jnp.float32)
    check(logits).block_until_ready()
    _, seconds = timing.best_time(lambda x=logits: check(x), 200)
    print(f"check alone, {name} logits {tuple(logits.shape)}: "
          f"{seconds * 1e6:.1f} us")


if __name__ == "__main__":
  app.run(main)
