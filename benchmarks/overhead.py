r"""How much the decoding loop itself costs, against Theorem 3.8.

  python benchmarks/overhead.py --target=demo:target --draft=demo:draft_small
  python benchmarks/overhead.py --draft=demo:draft_base --inputs=paragraphs \
      --max_decode_len=96 --gammas=7     # the demo's long outputs
  python benchmarks/overhead.py --target=t5_1_1_tiny --draft=t5_tiny
      # random weights: alpha ~ 0.2, shows the loop's own cost

For each gamma it decodes the same inputs with the target alone and with
speculative decoding (compile excluded, results fetched to the host, the
fastest of --repeats rounds, each round timing the target alone, the
speculative decode and both prefills in turn), and prints: alpha, c, the
measured speedup, Theorem 3.8's prediction and their ratio, and the
prediction with the measured verification cost priced in
(`theory.walltime_improvement_measured`).

Then it splits the time. Both decoders first run the encoders once per
input (`prefill`, timed on its own: the target's for the baseline, target's
and draft's for speculative decoding), a fixed cost Theorem 3.8 leaves out.
What remains is divided by the number of target calls: one speculative
iteration = gamma draft steps + one verification of gamma + 1 tokens (both
timed in isolation by `specdec_jax.experiments.step_timers`) + the rest
(sampling, acceptance, cache and buffer updates inside the while_loop,
per-call host work); and one
plain step for comparison. Because every call also pays fixed costs beyond
the prefill (setup, dispatch, fetching results) which that average spreads
over a few iterations, a second line fits time = fixed + per-iteration *
iterations (and the same for plain steps) across the sentences.

A third line splits that rest. Three loops run the model calls of an
iteration and nothing else (no sampling, acceptance or buffer updates),
timed together in interleaved rounds: the draft's calls (its two-token
refeed and gamma - 1 steps), the verification, and both in turn. "both"
minus the two parts is what the models cost each other by sharing the
machine's caches (each verification streams the target's weights through
them, evicting the draft's); the fitted iteration minus "both" is the
loop's own bookkeeping.
"""

import functools

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

import specdec_jax as sd
from specdec_jax import sampling
from specdec_jax import theory
from specdec_jax.data import text
from specdec_jax.experiments import step_timers
from specdec_jax.experiments import best_of

flags.DEFINE_string("target", "demo:target", "Target model spec.")
flags.DEFINE_string("draft", "demo:draft_small", "Draft model spec.")
flags.DEFINE_list("gammas", ["1", "2", "3", "4", "5", "6", "7"],
                  "Gammas to measure.")
flags.DEFINE_integer("examples", 8, "Inputs, decoded one at a time.")
flags.DEFINE_integer("max_decode_len", 64, "Most tokens per output.")
flags.DEFINE_integer("repeats", 5, "Timed repeats (the fastest is kept).")
flags.DEFINE_float("temperature", 0.0, "Sampling temperature.")
flags.DEFINE_enum("inputs", "sentences", ["sentences", "paragraphs"],
                  "Which shipped demo texts to decode (trained models).")
args = flags.FLAGS


def _inputs(model, batch, length, seed=0):
  if model.vocab is not None:
    return text.encode(model.vocab,
                       text.demo_sentences(batch, name=args.inputs))
  rng = np.random.default_rng(seed)
  return np.array([list(rng.integers(3, model.vocab_size, length - 1)) + [1]
                   for _ in range(batch)], np.int32)


def _prefill_timer(model, num_positions):
  fn = jax.jit(lambda params, ids: model.definition.prefill(
      params, ids, num_positions).cache)
  return lambda ids: jax.block_until_ready(fn(model.params, ids))


def _model_call_loops(target, draft, ids, gamma, num_positions, steps=16):
  """Timed callables of `steps` iterations' model calls: the draft's, the
  verification's, and both in turn (see the module docstring)."""
  t, d = target.definition, draft.definition

  def prefill(model):
    pre = jax.jit(lambda p, i: model.definition.prefill(p, i, num_positions))(
        model.params, ids)
    return pre.cache, pre.start_pos

  # Each iteration moves on by about what a good one accepts, so the
  # positions stay inside the cache for `steps` iterations.
  advance = max(1, min((gamma + 1) // 2,
                       (num_positions - gamma - 2) // steps))

  def drafting(params, cache, start, i, token):
    base = start[:, None] + i * advance
    logits, cache = d.extend(params, cache, jnp.repeat(token[:, None], 2, 1),
                             base + jnp.arange(2))
    token = sampling.argmax(logits[:, -1].astype(jnp.float32))
    for j in range(1, gamma):
      logits, cache = d.extend(params, cache, token[:, None], base + 1 + j)
      token = sampling.argmax(logits[:, 0].astype(jnp.float32))
    return cache, token

  def verifying(params, cache, start, i, token):
    positions = start[:, None] + i * advance + jnp.arange(gamma + 1)
    logits, cache = t.extend(params, cache,
                             jnp.repeat(token[:, None], gamma + 1, 1),
                             positions)
    best = sampling.argmax(logits.astype(jnp.float32))
    return cache, jnp.max(best, axis=1)

  def looped(parts):
    def run(params, caches, starts):
      def body(i, carry):
        caches, token = carry
        caches = list(caches)
        for k, part in enumerate(parts):
          caches[k], token = part(params[k], caches[k], starts[k], i, token)
        return tuple(caches), token
      token = jnp.zeros((ids.shape[0],), jnp.int32)
      return jax.lax.fori_loop(0, steps, body, (tuple(caches), token))[1]
    return jax.jit(run)

  (dc, ds), (tc, ts) = prefill(draft), prefill(target)
  loops = {"draft": ((drafting,), (draft.params,), (dc,), (ds,)),
           "verify": ((verifying,), (target.params,), (tc,), (ts,)),
           "both": ((drafting, verifying), (draft.params, target.params),
                    (dc, tc), (ds, ts))}
  fns = {}
  for name, (parts, params, caches, starts) in loops.items():
    fn = looped(parts)
    fns[name] = functools.partial(
        lambda fn, *a: jax.block_until_ready(fn(*a)), fn, params, caches,
        starts)
  return fns


def _fit(per_row, time_col, count_col):
  """Least squares time = fixed + per_unit * count over the sentences.

  Splits a decode's time into what every call pays once (prefill, setup,
  dispatch, fetching results) and what each step or iteration costs, which
  the averages above mix when sentences are a few iterations long. None
  when all sentences have the same count.
  """
  counts = np.array([r[count_col] for r in per_row], np.float64)
  times = np.array([r[time_col] for r in per_row], np.float64)
  if len(set(counts.tolist())) < 2:
    return None
  per_unit, fixed = np.polyfit(counts, times, 1)
  return fixed, per_unit


def main(argv):
  del argv
  target, draft = sd.load_model(args.target), sd.load_model(args.draft)
  rows = _inputs(target, args.examples, 24)
  decoders = sd.SpeculativeDecoder(
      target, draft, gamma=1, max_decode_len=args.max_decode_len,
      sampling=sd.sampling.SamplingConfig(args.temperature))
  print(f"target={args.target} draft={args.draft} examples={len(rows)} "
        f"temperature={args.temperature}")
  print("gamma  alpha      c  speedup  Thm3.8  ratio  with_v  ratio | "
        "prefill_ms base/spec | step_ms | iter_ms = draft + verify + rest")
  for gamma in [int(g) for g in args.gammas]:
    decoder = decoders.replace(gamma=gamma)
    width = args.max_decode_len + gamma + 1
    prefill_t = _prefill_timer(target, width)
    prefill_d = _prefill_timer(draft, width)
    base_s = spec_s = pre_t = pre_d = 0.0
    alpha_sums, alpha_counts, calls, tokens = [], [], 0, 0
    per_row = []  # (base s, spec s, tokens, target calls) of each sentence
    for i in range(len(rows)):
      ids = rows[i:i + 1]
      # The four timings of this sentence in interleaved rounds
      # (`best_of.best_runs`), so a slow stretch of the machine touches all
      # of them, not one.
      fns = [functools.partial(decoder.baseline, ids),
             functools.partial(decoder, ids),
             functools.partial(prefill_t, ids),
             functools.partial(prefill_d, ids)]
      for fn in fns:
        fn()  # compile
      (_, b), (res, s), (_, pt), (_, pd) = best_of.best_runs(fns, args.repeats)
      base_s, spec_s = base_s + b, spec_s + s
      pre_t, pre_d = pre_t + pt, pre_d + pd
      alpha_sums.append(float(res.stats.alpha_sum[0]))
      alpha_counts.append(int(res.stats.alpha_count[0]))
      calls += int(res.stats.target_calls[0])
      tokens += int(res.stats.length[0])
      per_row.append((b, s, int(res.stats.length[0]),
                      int(res.stats.target_calls[0])))
    alpha = theory.pooled_alpha(alpha_sums, alpha_counts)
    m = step_timers.measure_costs(target, draft, rows[:1], gamma=gamma,
                            cache_positions=width)
    predicted = float(theory.walltime_improvement(alpha, gamma, m["c"]))
    with_v = float(theory.walltime_improvement_measured(
        alpha, gamma, m["c"], m["verify_cost"]))
    speedup = base_s / spec_s
    n = len(rows)
    step = (base_s - pre_t) / tokens
    iteration = (spec_s - pre_t - pre_d) / calls
    draft_part = gamma * m["draft_step_s"]
    verify_part = m["verify_step_s"]
    print(f"{gamma:5d} {alpha:6.3f} {m['c']:6.3f} {speedup:7.2f}x "
          f"{predicted:6.2f}x {speedup / predicted:5.2f} {with_v:6.2f}x "
          f"{speedup / with_v:5.2f} | {pre_t / n * 1e3:5.2f}/"
          f"{(pre_t + pre_d) / n * 1e3:5.2f} | {step * 1e3:6.3f} | "
          f"{iteration * 1e3:6.3f} = {draft_part * 1e3:.3f} + "
          f"{verify_part * 1e3:.3f} + "
          f"{(iteration - draft_part - verify_part) * 1e3:.3f}", flush=True)
    fit_b, fit_s = _fit(per_row, 0, 2), _fit(per_row, 1, 3)
    if fit_b and fit_s:
      rest = fit_s[1] - draft_part - verify_part
      print(f"      fit over sentences: plain {fit_b[0] * 1e3:.2f} ms per "
            f"call + {fit_b[1] * 1e3:.3f} per step; speculative "
            f"{fit_s[0] * 1e3:.2f} ms per call + {fit_s[1] * 1e3:.3f} per "
            f"iteration (rest {rest * 1e3:.3f})",
            flush=True)
    steps = 16
    loops = _model_call_loops(target, draft, rows[:1], gamma, width, steps)
    for fn in loops.values():
      fn()  # compile
    part = dict(zip(loops, (s / steps for s in best_of.best_times(
        list(loops.values()), args.repeats))))
    fitted = fit_s[1] if fit_b and fit_s else iteration
    print(f"      model calls alone in one loop: draft "
          f"{part['draft'] * 1e3:.3f} + verify {part['verify'] * 1e3:.3f}, both "
          f"{part['both'] * 1e3:.3f} ms: the models cost each other "
          f"{(part['both'] - part['draft'] - part['verify']) * 1e3:.3f} ms, "
          f"the loop's bookkeeping {(fitted - part['both']) * 1e3:.3f} ms "
          f"of a {fitted * 1e3:.3f} ms iteration", flush=True)


if __name__ == "__main__":
  app.run(main)
