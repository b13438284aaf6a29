"""Tests for experiments/compile_time.py: the compile clock that tells a
run's compilation apart from its decoding."""

import concurrent.futures
import time

import jax
import jax.numpy as jnp
import pytest

from specdec_jax.experiments import compile_time

pytestmark = pytest.mark.quick  # `make test-quick`


def test_compile_clocks_count_their_own_block_and_nest():
  """A clock counts the programs compiled inside its block and no others;
  nested clocks both count the inner block, including two clocks that read
  the same (they are distinct objects); a cached program costs nothing."""
  x = jnp.arange(3.0)
  with compile_time.compile_clock() as outer:
    with compile_time.compile_clock() as inner:
      pass
    with compile_time.compile_clock() as inner2:
      jax.jit(lambda v: v * 3.0 + 1.0)(x).block_until_ready()
    assert inner.programs == 0 and inner.seconds == 0.0
    assert inner2.programs == 1 and inner2.seconds > 0
  assert outer.programs == 1
  assert outer.seconds == pytest.approx(inner2.seconds)
  with compile_time.compile_clock() as after:
    jax.jit(lambda v: v * 3.0 + 1.0)(x).block_until_ready()
  # A new lambda is a new program; the clocks closed above saw none of it.
  assert after.programs == 1 and outer.programs == 1


def test_compile_clock_counts_overlapping_events_once():
  """A clock's seconds are the wall time some compile event covered: nested
  or overlapping events (a compile in another thread, or an inner event
  inside an outer one) count once, time before the clock started not at
  all. Summing the durations would give 10.5 here, not 5.5."""
  clock = compile_time.CompileClock(started=10.0)
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
  with compile_time.compile_clock() as clock:
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
      list(pool.map(compile_one, range(8)))
  assert clock.programs >= 8
  assert 0 < clock.seconds <= time.perf_counter() - start
