"""Tests for experiments/best_of.py: the timing rule and the compile
clock that tells a run's compilation apart from its decoding."""

import concurrent.futures
import time

import jax
import jax.numpy as jnp
import pytest

from specdec_jax.experiments import best_of

pytestmark = pytest.mark.quick  # `make test-quick`


def test_compile_clocks_count_their_own_block_and_nest():
  """A clock counts the programs compiled inside its block and no others;
  nested clocks both count the inner block, including two clocks that read
  the same (they are distinct objects); a cached program costs nothing."""
  x = jnp.arange(3.0)
  with best_of.compile_clock() as outer:
    with best_of.compile_clock() as inner:
      pass
    with best_of.compile_clock() as inner2:
      jax.jit(lambda v: v * 3.0 + 1.0)(x).block_until_ready()
    assert inner.programs == 0 and inner.seconds == 0.0
    assert inner2.programs == 1 and inner2.seconds > 0
  assert outer.programs == 1
  assert outer.seconds == pytest.approx(inner2.seconds)
  with best_of.compile_clock() as after:
    jax.jit(lambda v: v * 3.0 + 1.0)(x).block_until_ready()
  # A new lambda is a new program; the clocks closed above saw none of it.
  assert after.programs == 1 and outer.programs == 1


def test_compile_clock_counts_overlapping_events_once():
  """A clock's seconds are the wall time some compile event covered: nested
  or overlapping events (a compile in another thread, or an inner event
  inside an outer one) count once, time before the clock started not at
  all. Summing the durations would give 10.5 here, not 5.5."""
  clock = best_of.CompileClock(started=10.0)
  clock.add(11.0, 12.0)            # 1
  clock.add(11.5, 13.0)            # overlaps: +1
  clock.add(10.5, 13.5)            # holds both: +1
  clock.add(15.0, 15.5)            # apart: +0.5
  clock.add(8.0, 11.0)             # before the start: only 10-10.5 is new
  assert clock.seconds == pytest.approx(4.0)
  clock.add(13.5, 15.0)            # fills the gap between the two spans
  assert clock.seconds == pytest.approx(5.5)
  assert clock.programs == 0


def test_compile_clock_never_exceeds_its_block_with_threads():
  """Programs compiled by several threads at once: the clock counts each
  of them and no more seconds than the block took."""
  def compile_one(k):
    f = jax.jit(lambda v: jnp.tanh(v @ v.T) * k + jnp.sum(v) ** 2)
    return f(jnp.ones((64, 64))).block_until_ready()

  start = time.perf_counter()
  with best_of.compile_clock() as clock:
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
      list(pool.map(compile_one, range(8)))
  assert clock.programs >= 8
  assert 0 < clock.seconds <= time.perf_counter() - start


def test_best_time_keeps_the_fastest_repeat():
  calls = []
  out, seconds = best_of.best_time(lambda: calls.append(1) or len(calls), 4)
  assert out == 4 and len(calls) == 4 and seconds >= 0
  with pytest.raises(ValueError, match="repeats"):
    best_of.best_time(lambda: None, 0)


def test_best_times_interleave_rounds_and_keep_each_fastest(monkeypatch):
  """Each round calls every function once, in order (so a slow stretch of
  the machine touches all of them alike), and each function keeps its own
  fastest round: here b is slow in round 0 and a in round 1."""
  calls = []
  fns = [lambda: calls.append("a"), lambda: calls.append("b")]
  # (start, end) clock readings of a0, b0, a1, b1, a2, b2.
  reads = iter([0.0, 1.0, 0.0, 9.0, 0.0, 8.0, 0.0, 2.0, 0.0, 3.0, 0.0, 4.0])
  monkeypatch.setattr(best_of.time, "perf_counter", lambda: next(reads))
  assert best_of.best_times(fns, repeats=3) == [1.0, 2.0]
  assert calls == ["a", "b"] * 3
  with pytest.raises(ValueError, match="repeats"):
    best_of.best_times(fns, 0)


def test_best_runs_keep_each_functions_result_and_fastest_round(monkeypatch):
  """best_runs interleaves rounds as best_times does and also returns each
  function's own result (the last round's), not another function's."""
  counts = {"a": 0, "b": 0}

  def make(name):
    def fn():
      counts[name] += 1
      return f"{name}{counts[name]}"
    return fn

  reads = iter([0.0, 5.0, 0.0, 1.0, 0.0, 2.0, 0.0, 7.0])  # a0 b0 a1 b1
  monkeypatch.setattr(best_of.time, "perf_counter", lambda: next(reads))
  assert best_of.best_runs([make("a"), make("b")], repeats=2) == [
      ("a2", 2.0), ("b2", 1.0)]


def test_best_runs_call_between_once_after_each_round():
  """`between` (other measurements sharing the rounds) runs after every
  round, never inside one, and is not timed."""
  calls = []
  best_of.best_runs([lambda: calls.append("a"), lambda: calls.append("b")],
                   repeats=2, between=lambda: calls.append("|"))
  assert calls == ["a", "b", "|", "a", "b", "|"]
