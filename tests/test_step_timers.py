"""Tests for experiments/step_timers.py: the timed loops behind c and v.

Every gamma of a run must time its model steps with the same compiled loop
(cache lengths rounded by `padded_positions`), so a sweep of gammas compiles
one step loop per model, not one per gamma; and the numbers it returns must
be the ratios they claim to be.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax import Model
from specdec_jax.decoding.protocol import Prefill
from specdec_jax.experiments import step_timers
from specdec_jax.experiments import compile_time
from specdec_jax.models import registry


def _tiny(layers, seed):
  cfg = registry.get_config("t5_1_1_tiny", vocab_size=128,
                            num_encoder_layers=layers,
                            num_decoder_layers=layers)
  definition = registry.make_def(cfg)
  return Model(definition, definition.init_params(jax.random.PRNGKey(seed)))


def test_padded_positions_rounds_up_to_the_quantum():
  q = step_timers.POSITION_QUANTUM
  assert [step_timers.padded_positions(n) for n in (1, q, q + 1, 2 * q)] == [
      q, q, 2 * q, 2 * q]


def test_gammas_of_one_run_share_the_step_loops():
  """Decoding 8 tokens at gamma 1 and 3 uses 10 and 12 cache positions: both
  time their target and draft steps with the same compiled programs (one
  prefill per model, one loop per model and width), so the second gamma
  compiles only its own verification loop; without the rounding of cache
  positions it would compile all five again."""
  target, draft = _tiny(2, 0), _tiny(1, 1)
  ids = np.array([[5, 6, 7, 1]], np.int32)
  with compile_time.compile_clock() as clock:
    first = step_timers.measure_costs(target, draft, ids, gamma=1,
                                cache_positions=8 + 1 + 1, repeats=1)
  # Prefill of the target and of the draft; target step, draft step,
  # verification of 2 tokens.
  assert clock.programs == 5
  with compile_time.compile_clock() as clock:
    second = step_timers.measure_costs(target, draft, ids, gamma=3,
                                 cache_positions=8 + 3 + 1, repeats=1)
  assert clock.programs == 1  # verification of 4 tokens only
  for m in (first, second):
    assert m["c"] == pytest.approx(m["draft_step_s"] / m["target_step_s"])
    for model in ("target", "draft"):
      assert m[f"{model}_prefill_s"] > 0
      assert m[f"{model}_prefill_cost"] == pytest.approx(
          m[f"{model}_prefill_s"] / m["target_step_s"])
    assert m["verify_cost"] == pytest.approx(
        m["verify_step_s"] / m["target_step_s"])
    assert all(m[k] > 0 for k in ("target_step_s", "draft_step_s",
                                  "verify_step_s"))


def test_shared_timings_time_each_model_step_once():
  """With one `timings` dict, two gammas and two drafts time the target's
  step once (every c and v then divides by the same number), each draft's
  step once and each verification width once."""
  target, draft_a, draft_b = _tiny(2, 0), _tiny(1, 1), _tiny(1, 2)
  ids = np.array([[5, 6, 7, 1]], np.int32)
  timings = {}
  runs = [step_timers.measure_costs(target, d, ids, gamma=g,
                              cache_positions=8 + g + 1, repeats=1,
                              timings=timings)
          for d in (draft_a, draft_b) for g in (1, 3)]
  # target step, verify 2 and 4 tokens, two draft steps, three prefills;
  # each with its round spread.
  assert len(timings) == 2 * 8
  assert all(0 < r["round_spread"] for r in runs)
  assert len({r["target_step_s"] for r in runs}) == 1
  assert runs[0]["verify_step_s"] == runs[2]["verify_step_s"]
  assert runs[0]["draft_step_s"] == runs[1]["draft_step_s"]
  assert runs[0]["draft_step_s"] != runs[2]["draft_step_s"]


@dataclasses.dataclass(frozen=True)
class _OneHotAt:
  """A model whose logits at call position k are one_hot(params[k]), so the
  timed loop's result shows which positions' logits it read."""

  vocab_size: int = 16
  max_input_len: int | None = None

  def prefill(self, params, input_ids, num_decode_positions):
    del params, num_decode_positions
    zeros = jnp.zeros((input_ids.shape[0],), jnp.int32)
    return Prefill(cache=zeros, start_token=zeros, start_pos=zeros)

  def extend(self, params, cache, tokens, positions):
    del positions
    logits = jax.nn.one_hot(params[:tokens.shape[1]], self.vocab_size)
    return jnp.broadcast_to(logits, tokens.shape + (self.vocab_size,)), cache


def test_timed_verification_reads_every_positions_logits():
  """A verification of K tokens uses the logits of all K positions, so its
  timing must too: XLA may drop computation nothing reads, and a loop that
  read only the last position's logits could time a cheaper call. Here only
  one position's logits differ from the plain parameters; the loop's result
  must see the first position as well as the last (reading the last
  position's argmax alone, as this loop once did, fails on position 0)."""
  definition = _OneHotAt()
  prefill = step_timers._build_prefill(definition, 16)  # pylint: disable=protected-access
  loop = step_timers._build_timed_loop(definition, 4, 2)  # pylint: disable=protected-access
  ids = np.array([[5, 1]], np.int32)
  cache, start = prefill(jnp.zeros(4, jnp.int32), ids)
  plain = loop(jnp.array([0, 0, 0, 0]), cache, start)
  first_differs = loop(jnp.array([7, 0, 0, 0]), cache, start)
  last_differs = loop(jnp.array([0, 0, 0, 9]), cache, start)
  assert int(plain[0]) == 0
  assert int(first_differs[0]) == 7
  assert int(last_differs[0]) == 9


def test_time_extends_times_each_step_once_and_keys_models_by_params():
  """One `time_extends` of several gammas' requests times each distinct
  (model, width) once, and later calls reuse the results. A model is known
  by its definition and parameters, not by its `Model` wrapper: a fresh
  wrapper of the same parameters (as a cascade's top model is rebuilt per
  call) finds its timing, while another model of the same definition (a
  wrapper whose id might be a freed one's) is timed on its own."""
  target, draft = _tiny(2, 0), _tiny(1, 1)
  ids = np.array([[5, 6, 7, 1]], np.int32)
  timings = {}
  requests = (step_timers.cost_requests(target, draft, 1, 10)
              + step_timers.cost_requests(target, draft, 3, 12))
  seconds = step_timers.time_extends(requests, ids, repeats=1, timings=timings)
  # Target and draft step, 2 and 4 tokens, target and draft prefill (each
  # with its round spread).
  assert len(timings) == 2 * 6
  assert seconds[0] == seconds[5] and seconds[1] == seconds[6]
  assert all(s > 0 for s in seconds)
  rewrapped = Model(draft.definition, draft.params)
  again = step_timers.measure_costs(target, rewrapped, ids, gamma=3,
                              cache_positions=12, repeats=1, timings=timings)
  assert len(timings) == 2 * 6 and again["draft_step_s"] == seconds[1]
  other = _tiny(1, 2)  # same definition as `draft`, other parameters
  step_timers.measure_costs(target, other, ids, gamma=3, cache_positions=12,
                      repeats=1, timings=timings)
  assert len(timings) == 2 * 8  # its step and its prefill


def test_round_robin_timer_times_loops_in_turn_and_tops_up_the_rest(
    monkeypatch):
  """Each tick times the next loop, in turn; a loop keeps its fastest
  timing; `fill` times only the loops still short of `repeats` timings
  (keeping what the ticks measured) and hands every loop on, as seconds
  per extend call, so `time_extends` then times none of them again."""
  target, draft = _tiny(2, 0), _tiny(1, 1)
  ids = np.array([[5, 6, 7, 1]], np.int32)
  requests = step_timers.cost_requests(target, draft, 1, 10)  # 5 distinct loops
  timer = step_timers.RoundRobinTimer(requests, ids, repeats=2)
  ran = []
  # Ticks: loops 0-4, then 0 and 1 again; fill: loops 2, 3 and 4 once more.
  readings = iter([3.0, 1.0, 4.0, 4.0, 4.0, 2.0, 5.0, 9.0, 6.0, 7.0])
  monkeypatch.setattr(step_timers.best_of, "best_time", lambda fn, repeats: (
      ran.append(fn) or (None, next(readings))))
  for _ in range(7):
    timer.tick()
  assert ran[5] is ran[0] and ran[6] is ran[1]
  assert len({id(fn) for fn in ran}) == 5
  timings = {}
  assert timer.fill(timings) == 3
  assert ran[7:] == ran[2:5]
  assert timer.fill({}) == 0  # every loop has its two timings
  # 16 positions: the target's and the draft's one-token loops run 15
  # steps, the 2-token verification 7; a prefill runs once.
  timed = []
  monkeypatch.setattr(step_timers.best_of, "best_time", lambda fn, repeats: (
      timed.append(fn) or (None, 1.0)))
  seconds = step_timers.time_extends(requests, ids, repeats=2, timings=timings)
  assert timed == [] and len(timings) == 2 * 5  # with the spreads
  assert seconds == [2.0 / 15, 1.0 / 15, 4.0 / 7, 4.0, 4.0]
  # Slowest over fastest reading: 3/2, 5/1, 9/4, 6/4, 7/4.
  assert step_timers.round_spreads(requests, ids, timings, repeats=2) == [
      1.5, 5.0, 2.25, 1.5, 1.75]
