"""Tests for experiments/best_of.py: the timing rule (the fastest of N
repeats, interleaved in rounds when numbers are divided by one another)."""

import pytest

from specdec_jax.experiments import best_of

pytestmark = pytest.mark.quick  # `make test-quick`


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
