"""Timed model steps (c, the walltime ratio) and counted parameters (c_hat).

c is the paper's cost coefficient: the time of one draft run over the time of
one target run, both jitted, on the same inputs and cache length as real
decoding. We time a `lax.fori_loop` of many cached `extend` calls inside one
jitted function, so Python dispatch does not inflate the (tiny) draft step.
An experiment times these loops between its decoding rounds, one per round
(`RoundRobinTimer`), so that the c and v it predicts with describe the
machine its decodes met.

Dimension letters: B batch, L input length, K tokens per extend call.
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import sampling
from specdec_jax.decoding import api
from specdec_jax.decoding import engine
from specdec_jax.decoding.protocol import ModelDef
from specdec_jax.decoding.protocol import Model
from specdec_jax.experiments import best_of


@functools.lru_cache(maxsize=32)
def _build_prefill(definition: ModelDef, num_positions: int,
                   compiler_options: tuple = ()):
  """jit(params, input_ids) -> (cache, start_pos) with `num_positions`
  decoder positions: one program per model and cache size, shared by all
  its timed loops."""

  def prefill(params, input_ids):
    pre = definition.prefill(params, input_ids, num_positions)
    return pre.cache, pre.start_pos

  return engine.jit_with_options(prefill, compiler_options)


@functools.lru_cache(maxsize=32)
def _build_timed_loop(definition: ModelDef, num_tokens: int, steps: int,
                      compiler_options: tuple = ()):
  """jit(params, cache, start_pos) -> scalar: `steps` extends of K tokens."""

  def loop(params, cache, start_pos):
    batch = start_pos.shape[0]

    def body(i, carry):
      cache, acc = carry
      positions = start_pos[:, None] + i * num_tokens + jnp.arange(num_tokens)
      # Feed back the argmax so each step depends on the previous one, as in
      # decoding (and nothing can be hoisted out of the loop).
      tokens = jnp.broadcast_to(acc[:, None], (batch, num_tokens))
      logits, cache = definition.extend(params, cache, tokens, positions)
      # Every position's logits are read, as a verification reads them, so
      # XLA may not drop any of the output layer from the timed call.
      return cache, jnp.max(sampling.argmax(logits), axis=1)

    _, acc = jax.lax.fori_loop(0, steps, body,
                               (cache, jnp.zeros((batch,), jnp.int32)))
    return acc

  return engine.jit_with_options(loop, compiler_options)


# Timed caches hold a multiple of this many positions.
POSITION_QUANTUM = 16


def padded_positions(cache_positions: int) -> int:
  """`cache_positions` rounded up to a multiple of POSITION_QUANTUM.

  Decoding at gamma uses max_decode_len + gamma + 1 positions, so without
  rounding every gamma of a sweep compiles its own timing loops for the
  target and draft steps; rounded, one loop per model serves all the
  gammas of a run (64 + 2 .. 64 + 8 positions all time at 80). The few
  extra positions add the same small attention cost to the draft step, the
  target step and the verification, so c and v, which are ratios, barely
  move.
  """
  q = POSITION_QUANTUM
  return -(-int(cache_positions) // q) * q


# One timing: (model, tokens per call, cache positions); tokens per call
# PREFILL times the model's prefill (a T5 encoder and the cache set-up).
Request = tuple[Model, int, int]
PREFILL = 0


def _timing_key(request: Request, input_ids, steps: int, repeats: int,
                options: tuple):
  model, num_tokens, cache_positions = request
  # A model by its definition and the identity of its parameters, which live
  # as long as the run: `Model` wrappers are rebuilt per call (a cascade's
  # top model), and a freed wrapper's id may come back for another model.
  return (model.definition, id(model.params), num_tokens,
          padded_positions(cache_positions), tuple(np.shape(input_ids)),
          steps, repeats, options)


def _spread_key(key) -> tuple:
  """Where a `timings` dict keeps a step's slowest round over its fastest."""
  return ("round_spread", key)


def _prepare_loops(requests: Sequence[Request], input_ids: np.ndarray, *,
                   steps: int, repeats: int, options: tuple,
                   skip) -> tuple[list, dict]:
  """Each request's key, and a compiled, run-once loop for each key not in
  `skip`: ({key: (run, extends per run)}); see `time_extends`."""
  keys = [_timing_key(r, input_ids, steps, repeats, options)
          for r in requests]
  ids = jnp.asarray(input_ids, jnp.int32)
  loops, prefilled = {}, {}
  for key, (model, num_tokens, cache_positions) in zip(keys, requests):
    if key in skip or key in loops:
      continue
    positions = padded_positions(cache_positions)
    prefill = functools.partial(
        _build_prefill(model.definition, positions, options), model.params,
        ids)
    if num_tokens == PREFILL:
      n, run = 1, prefill
    else:
      # One prefill per model and cache size; the loops start from its
      # cache (each loop's updates are to its own copy: jit does not
      # donate it).
      cache_key = (model.definition, id(model.params), positions)
      if cache_key not in prefilled:
        prefilled[cache_key] = jax.block_until_ready(prefill())
      cache, start_pos = prefilled[cache_key]
      n = max(1, min(steps, (positions - 1) // num_tokens))
      loop = _build_timed_loop(model.definition, num_tokens, n, options)
      run = functools.partial(loop, model.params, cache, start_pos)
    jax.block_until_ready(run())  # compile
    loops[key] = (run, n)
  return keys, loops


def time_extends(requests: Sequence[Request], input_ids: np.ndarray, *,
                 steps: int = 16, repeats: int = 5,
                 timings: dict | None = None,
                 compiler_options: Any = None) -> list[float]:
  """Seconds of one cached `extend` call for each request, timed together.

  Every request's loop is compiled and run once untimed, then all are timed
  in `repeats` interleaved rounds, each keeping its fastest
  (`best_of.best_times`): the numbers this module divides by one another
  (c, v) then share the machine's slow and quiet stretches.

  Args:
    requests: (model, num_tokens, cache_positions) triples. num_tokens: K
      tokens fed per call (1 for a decoding step, gamma + 1 for a
      verification; PREFILL for the prefill). cache_positions: decoder
      positions the cache holds (decoding uses max_decode_len + gamma + 1),
      since attention cost grows with it; rounded up by `padded_positions`.
    input_ids: int32 [B, L] inputs (as in decoding).
    steps: extend calls per timed loop (capped so the positions fit).
    repeats: timed rounds.
    timings: a dict of earlier results to reuse and extend, keyed by model,
      tokens per call, padded positions, input shape, steps, repeats and
      compiler options (see `measure_costs`; `RoundRobinTimer.fill` fills
      it from timings taken between other work).
    compiler_options: XLA options of the timed programs, as decoding gets
      them (`speculative_generate(compiler_options=...)`).

  Returns:
    Seconds per extend call, one per request. `timings` also gets each
    step's slowest round over its fastest (`round_spreads`).
  """
  timings = {} if timings is None else timings
  keys, loops = _prepare_loops(
      requests, input_ids, steps=steps, repeats=repeats,
      options=api.compiler_options_key(compiler_options), skip=timings)
  # Interleaved rounds, as `best_of.best_times`, keeping every round: the
  # spread says whether the machine held still (`cost_checks`).
  rounds = [[best_of.best_time(run, 1)[1] for run, _ in loops.values()]
            for _ in range(repeats)]
  for i, (key, (_, n)) in enumerate(loops.items()):
    times = [r[i] for r in rounds]
    timings[key] = min(times) / n
    timings[_spread_key(key)] = max(times) / min(times)
  return [timings[key] for key in keys]


def round_spreads(requests: Sequence[Request], input_ids: np.ndarray,
                  timings: dict, *, steps: int = 16, repeats: int = 5,
                  compiler_options: Any = None) -> list[float | None]:
  """Each timed request's slowest round over its fastest, from `timings`
  (None where it was not recorded); arguments as `time_extends`."""
  options = api.compiler_options_key(compiler_options)
  return [timings.get(_spread_key(
      _timing_key(r, input_ids, steps, repeats, options))) for r in requests]


class RoundRobinTimer:
  """Times the loops of `time_extends`, one per `tick`, between other work.

  A run that times its decodes in interleaved rounds (`best_of.best_runs`)
  calls `tick` once per round: each call times the next loop in turn, so
  every loop is timed again and again over the whole run, in the same
  stretches of the machine as the decodes, and keeps its fastest time. The
  costs divided into a prediction (c, v) then describe the machine the
  decodes met, not the one of a later minute. `fill` tops up the loops
  timed fewer than `repeats` times (in interleaved rounds of their own)
  and hands every loop's time to `time_extends`'s `timings` dict.

  Args:
    requests, input_ids, steps, repeats, compiler_options: as in
      `time_extends`; every loop is compiled here.
    skip: keys already timed (a `timings` dict): not compiled nor timed.
  """

  def __init__(self, requests: Sequence[Request], input_ids: np.ndarray, *,
               steps: int = 16, repeats: int = 5, compiler_options: Any = None,
               skip=()):
    _, self._loops = _prepare_loops(
        requests, input_ids, steps=steps, repeats=repeats,
        options=api.compiler_options_key(compiler_options), skip=skip)
    self._order = list(self._loops)
    self._repeats = repeats
    self._next = 0
    self._best = dict.fromkeys(self._order, float("inf"))
    self._worst = dict.fromkeys(self._order, 0.0)
    self._count = dict.fromkeys(self._order, 0)

  def _time(self, key) -> None:
    _, seconds = best_of.best_time(self._loops[key][0], 1)
    self._best[key] = min(self._best[key], seconds)
    self._worst[key] = max(self._worst[key], seconds)
    self._count[key] += 1

  def tick(self) -> None:
    """Times the next loop once (nothing when there are none)."""
    if self._order:
      self._time(self._order[self._next % len(self._order)])
      self._next += 1

  def fill(self, timings: dict) -> int:
    """Times each loop until it has been timed `repeats` times, in rounds
    over the loops still short, then puts every loop's fastest time into
    `timings` (seconds per extend call). Returns the timings it added."""
    added = 0
    while short := [k for k in self._order
                    if self._count[k] < self._repeats]:
      for key in short:
        self._time(key)
        added += 1
    for key in self._order:
      timings[key] = self._best[key] / self._loops[key][1]
      timings[_spread_key(key)] = self._worst[key] / self._best[key]
    return added


def time_extend(model: Model, input_ids: np.ndarray, *, num_tokens: int = 1,
                cache_positions: int = 64, steps: int = 16,
                repeats: int = 5) -> float:
  """Seconds of one cached `extend` of `num_tokens` tokens per row (one
  request of `time_extends`, timed alone)."""
  return time_extends([(model, num_tokens, cache_positions)], input_ids,
                      steps=steps, repeats=repeats)[0]


def cost_requests(target: Model, draft: Model, gamma: int,
                  cache_positions: int) -> list[Request]:
  """What `measure_costs` times: the target's step, the draft's step, a
  verification of gamma + 1 tokens and both models' prefills."""
  return [(target, 1, cache_positions), (draft, 1, cache_positions),
          (target, gamma + 1, cache_positions),
          (target, PREFILL, cache_positions), (draft, PREFILL, cache_positions)]


def count_params(params: Any) -> int:
  return int(sum(np.prod(x.shape) for x in jax.tree.leaves(params)))


def decode_params(model: Model) -> int:
  """Parameters touched per decoded token (an encoder's run once per example,
  so it is excluded; n-gram tables count 0, they do no arithmetic)."""
  params = model.params
  if isinstance(params, dict) and "log_probs" in params:
    return 0
  if isinstance(params, dict) and "encoder" in params:
    params = {k: v for k, v in params.items() if k != "encoder"}
  return count_params(params)


def measure_costs(target: Model, draft: Model, input_ids: np.ndarray, *,
                  gamma: int, cache_positions: int, repeats: int = 5,
                  timings: dict | None = None,
                  compiler_options: Any = None) -> dict[str, float]:
  """c, c_hat and the verification cost for one input shape.

  Args:
    target, draft: the models.
    input_ids: int32 [B, L] inputs of the shape decoded.
    gamma: draft tokens per iteration (the verification scores gamma + 1).
    cache_positions: decoder positions of the caches (`time_extend`).
    repeats: timed loops per number (the fastest counts).
    timings: a dict to share `time_extends` results across calls of one
      run: the gammas and drafts of a run then time the target's step once,
      each draft's step once and each verification width once, and every c
      and v of the run divides by the same target step. Fill it first with
      one `time_extends` of every call's `cost_requests` to time them all
      in the same rounds.
    compiler_options: XLA options of the timed programs (`time_extends`).

  Returns:
    target_step_s, draft_step_s: seconds per one-token step;
    verify_step_s: seconds for one target call on gamma + 1 tokens;
    c: draft_step_s / target_step_s (the paper's c);
    verify_cost: verify_step_s / target_step_s (1 in the paper's model of a
      parallel target; larger where the device is not idle, e.g. CPUs);
    c_hat: ratio of parameters touched per token (~ arithmetic per token);
    target_prefill_s, draft_prefill_s: seconds of each model's prefill of
      `input_ids` (paid once per input; for a cascade, its top model's);
    target_prefill_cost, draft_prefill_cost: the same in target steps;
    round_spread: the largest slowest-over-fastest round of the three
      steps (None where `timings` came without it).
  """
  timings = {} if timings is None else timings
  requests = cost_requests(target, draft, gamma, cache_positions)
  target_s, draft_s, verify_s, target_pre_s, draft_pre_s = time_extends(
      requests, input_ids, repeats=repeats, timings=timings,
      compiler_options=compiler_options)
  spreads = round_spreads(requests[:3], input_ids, timings, repeats=repeats,
                          compiler_options=compiler_options)
  target_ops = decode_params(target)
  return {
      "target_step_s": target_s,
      "draft_step_s": draft_s,
      "verify_step_s": verify_s,
      "target_prefill_s": target_pre_s,
      "draft_prefill_s": draft_pre_s,
      "c": draft_s / target_s,
      "verify_cost": verify_s / target_s,
      "target_prefill_cost": target_pre_s / target_s,
      "draft_prefill_cost": draft_pre_s / target_s,
      "c_hat": (decode_params(draft) / target_ops if target_ops
                else float("nan")),
      "round_spread": (None if None in spreads else max(spreads)),
  }
