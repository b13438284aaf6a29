"""Tests for specdec_jax.experiments.timing: the timing rule and the compile
clock that tells a run's compilation apart from its decoding."""

import jax
import jax.numpy as jnp
import pytest

from specdec_jax.experiments import timing


def test_compile_clocks_count_their_own_block_and_nest():
  """A clock counts the programs compiled inside its block and no others;
  nested clocks both count the inner block, including two clocks that read
  the same (they are distinct objects); a cached program costs nothing."""
  x = jnp.arange(3.0)
  with timing.compile_clock() as outer:
    with timing.compile_clock() as inner:
      pass
    with timing.compile_clock() as inner2:  # equal to `inner` by value
      jax.jit(lambda v: v * 3.0 + 1.0)(x).block_until_ready()
    assert inner.programs == 0 and inner.seconds == 0.0
    assert inner2.programs == 1 and inner2.seconds > 0
  assert outer.programs == 1
  assert outer.seconds == pytest.approx(inner2.seconds)
  with timing.compile_clock() as after:
    jax.jit(lambda v: v * 3.0 + 1.0)(x).block_until_ready()
  # A new lambda is a new program; the clocks closed above saw none of it.
  assert after.programs == 1 and outer.programs == 1


def test_best_time_keeps_the_fastest_repeat():
  calls = []
  out, seconds = timing.best_time(lambda: calls.append(1) or len(calls), 4)
  assert out == 4 and len(calls) == 4 and seconds >= 0
  with pytest.raises(ValueError, match="repeats"):
    timing.best_time(lambda: None, 0)
