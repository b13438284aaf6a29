"""Tests for specdec_jax.experiments.costs: the timed loops behind c and v.

Every gamma of a run must time its model steps with the same compiled loop
(cache lengths rounded by `padded_positions`), so a sweep of gammas compiles
one step loop per model, not one per gamma; and the numbers it returns must
be the ratios they claim to be.
"""

import jax
import numpy as np
import pytest

from specdec_jax import Model
from specdec_jax.experiments import costs
from specdec_jax.models import registry


def _tiny(layers, seed):
  cfg = registry.get_config("t5_1_1_tiny", vocab_size=128,
                            num_encoder_layers=layers,
                            num_decoder_layers=layers)
  definition = registry.make_def(cfg)
  return Model(definition, definition.init_params(jax.random.PRNGKey(seed)))


def test_padded_positions_rounds_up_to_the_quantum():
  q = costs.POSITION_QUANTUM
  assert [costs.padded_positions(n) for n in (1, q, q + 1, 2 * q)] == [
      q, q, 2 * q, 2 * q]


def test_gammas_of_one_run_share_the_step_loops():
  """Decoding 8 tokens at gamma 1 and 3 uses 10 and 12 cache positions: both
  time their target and draft steps with one compiled loop each, so the
  second gamma adds only its own verification loop (without the rounding it
  would add three)."""
  target, draft = _tiny(2, 0), _tiny(1, 1)
  ids = np.array([[5, 6, 7, 1]], np.int32)
  before = costs._build_timed_loop.cache_info().misses  # pylint: disable=protected-access
  first = costs.measure_costs(target, draft, ids, gamma=1,
                              cache_positions=8 + 1 + 1, repeats=1)
  middle = costs._build_timed_loop.cache_info().misses  # pylint: disable=protected-access
  second = costs.measure_costs(target, draft, ids, gamma=3,
                               cache_positions=8 + 3 + 1, repeats=1)
  after = costs._build_timed_loop.cache_info().misses  # pylint: disable=protected-access
  assert middle - before == 3  # target step, draft step, verify 2 tokens
  assert after - middle == 1   # verify 4 tokens only
  for m in (first, second):
    assert m["c"] == pytest.approx(m["draft_step_s"] / m["target_step_s"])
    assert m["verify_cost"] == pytest.approx(
        m["verify_step_s"] / m["target_step_s"])
    assert all(m[k] > 0 for k in ("target_step_s", "draft_step_s",
                                  "verify_step_s"))
