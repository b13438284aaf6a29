"""Tests for specdec_jax.theory against the numbers printed in the paper."""

import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax import theory

pytestmark = pytest.mark.quick  # `make test-quick`


def test_table1_speed_and_operations():
  """Table 1 (c = c_hat = 0): alpha=.8, gamma=5 -> 3.69x speed, 1.63x ops;
  alpha=.9, gamma=10 -> 6.86x, 1.60x."""
  for alpha, gamma, speed, ops in [(0.8, 5, 3.69, 1.63), (0.9, 10, 6.86, 1.60)]:
    assert theory.walltime_improvement(alpha, gamma, 0.0) == pytest.approx(
        speed, abs=0.005)
    assert theory.operations_factor(alpha, gamma, 0.0) == pytest.approx(
        ops, abs=0.005)


def test_theorem_3_8_on_table2_first_row():
  """EnDe / T5-small, alpha=0.75, gamma=7, c=0.02 predicts 3.16x."""
  assert theory.walltime_improvement(0.75, 7, 0.02) == pytest.approx(
      3.16, abs=0.005)


def test_optimal_gamma():
  """Figure 3's optimum: (alpha, c) = (0.75, 0.02) -> 9, (0.53, 0.02) -> 5;
  and it really is the argmax of Theorem 3.8 over integer gamma."""
  assert int(theory.optimal_gamma(0.75, 0.02)) == 9
  assert int(theory.optimal_gamma(0.53, 0.02)) == 5
  got = theory.optimal_gamma(np.array([0.75, 0.53]), 0.02)
  np.testing.assert_array_equal(got, [9, 5])
  gammas = np.arange(1, 65)
  best = theory.walltime_improvement(0.75, gammas, 0.02)
  assert best.argmax() + 1 == 9


def test_corollary_3_9_bound_holds_on_a_grid():
  """For alpha > c, the best gamma's improvement >= (1+alpha)/(1+c) > 1."""
  alphas, cs = np.meshgrid(np.linspace(0.01, 0.99, 50), np.linspace(0, 0.9, 40))
  mask = alphas > cs
  g = theory.optimal_gamma(alphas, cs)
  best = theory.walltime_improvement(alphas, g, cs)
  bound = theory.min_improvement(alphas, cs)
  assert np.all(best[mask] >= bound[mask] - 1e-12)
  assert np.all(bound[mask] > 1.0)
  assert np.all(np.isnan(bound[~mask]))


def test_limits_at_alpha_zero_and_one():
  """alpha=1: gamma+1 tokens per run; alpha=0: exactly 1; continuous near 1."""
  for gamma in [1, 3, 7]:
    assert theory.expected_tokens(1.0, gamma) == gamma + 1
    assert theory.expected_tokens(0.0, gamma) == 1.0
    near = theory.expected_tokens(1 - 1e-9, gamma)
    assert near == pytest.approx(gamma + 1, rel=1e-7)
    assert theory.walltime_improvement(1.0, gamma, 0.0) == gamma + 1
    assert theory.operations_factor(1.0, gamma, 0.0) == pytest.approx(1.0)
  # Matches the geometric series sum_{i<=gamma} alpha^i away from the limits.
  alpha = np.linspace(0, 0.999, 101)
  series = sum(alpha**i for i in range(6))
  np.testing.assert_allclose(theory.expected_tokens(alpha, 5), series,
                             rtol=1e-12)


def test_acceptance_rate_and_lk_divergence():
  """beta = sum min(p, q) = 1 - D_LK(p, q), on numpy and jax arrays alike."""
  rng = np.random.default_rng(0)
  p = rng.dirichlet(np.ones(7), size=4)
  q = rng.dirichlet(np.ones(7), size=4)
  beta = theory.acceptance_rate(p, q)
  np.testing.assert_allclose(beta, 1 - theory.lk_divergence(p, q), atol=1e-12)
  np.testing.assert_allclose(theory.acceptance_rate(p, p), 1.0)
  disjoint = theory.acceptance_rate(np.eye(3)[0], np.eye(3)[1])
  assert disjoint == 0.0
  jbeta = theory.acceptance_rate(jnp.asarray(p, jnp.float32),
                                 jnp.asarray(q, jnp.float32))
  assert isinstance(jbeta, jnp.ndarray)
  np.testing.assert_allclose(np.asarray(jbeta), beta, atol=1e-6)
  jtokens = theory.expected_tokens(jnp.float32(0.8), 5)
  assert float(jtokens) == pytest.approx(3.68928, abs=1e-4)


def test_verify_cost_shrinks_the_optimal_gamma():
  """With v(gamma) = 1 the measured form is Theorem 3.8 itself; a
  verification cost growing with gamma (a CPU) makes the optimum smaller,
  and the chosen gamma is the argmax of the measured form."""
  gammas = np.arange(1, 17)
  ones = np.ones(16)
  assert int(theory.optimal_gamma(0.8, 0.05, 16, verify_costs=ones)) == int(
      theory.optimal_gamma(0.8, 0.05, 16))
  np.testing.assert_allclose(
      theory.walltime_improvement_measured(0.8, gammas, 0.05, ones),
      theory.walltime_improvement(0.8, gammas, 0.05))
  growing = 1.0 + 0.15 * gammas
  g = int(theory.optimal_gamma(0.8, 0.05, 16, verify_costs=growing))
  assert g < int(theory.optimal_gamma(0.8, 0.05, 16))
  speed = theory.walltime_improvement_measured(0.8, gammas, 0.05, growing)
  assert g == int(np.argmax(speed)) + 1
  with pytest.raises(ValueError, match="one cost per gamma"):
    theory.optimal_gamma(0.8, 0.05, 16, verify_costs=ones[:3])


def test_expected_iterations_limits():
  """f(n) runs for n tokens: alpha = 0 is one token per run, alpha = 1 is
  gamma + 1 per run (the last run cut short), and n / f(n) tends to
  Theorem 3.1's expected tokens per run for long outputs."""
  for gamma in (1, 3, 7):
    for n in (1, 5, 12, 40):
      assert theory.expected_iterations(0.0, gamma, n) == pytest.approx(n)
      assert theory.expected_iterations(1.0, gamma, n) == pytest.approx(
          -(-n // (gamma + 1)))
  n = 5000
  assert n / theory.expected_iterations(0.8, 4, n) == pytest.approx(
      float(theory.expected_tokens(0.8, 4)), rel=2e-3)
  assert theory.expected_iterations(0.8, 4, 0) == 0.0
  with pytest.raises(ValueError, match="gamma"):
    theory.expected_iterations(0.8, 0, 5)


def test_expected_iterations_matches_simulation():
  """The recursion against a direct simulation of Theorem 3.1's model (each
  draft token accepted independently with probability alpha, a run emits
  the accepted prefix plus one token, the output ends after n tokens).
  The check is a 5-sigma z-test on 20,000 simulated outputs per case (a
  false failure has probability ~6e-7). Negative control: Theorem 3.1's
  endless-output rate, n / expected_tokens, must fail the same test on
  these short outputs."""
  rng = np.random.default_rng(0)
  sims = 20000
  for alpha, gamma, n in [(0.88, 7, 12), (0.73, 4, 12), (0.66, 1, 13)]:
    runs = np.zeros(sims)
    left = np.full(sims, n)
    while np.any(left > 0):
      active = left > 0
      accepted = np.zeros(sims, np.int64)
      alive = np.ones(sims, bool)
      for _ in range(gamma):
        alive &= rng.random(sims) < alpha
        accepted += alive
      runs += active
      left = np.where(active, left - (accepted + 1), left)
    mean, sem = runs.mean(), runs.std() / np.sqrt(sims)
    expected = theory.expected_iterations(alpha, gamma, n)
    assert abs(mean - expected) < 5 * sem, (alpha, gamma, n, mean, expected)
    endless = n / float(theory.expected_tokens(alpha, gamma))
    assert abs(mean - endless) > 5 * sem, (alpha, gamma, n, mean, endless)


def test_prediction_at_lengths():
  """Finite outputs predict less than Theorem 3.8, approach it as outputs
  grow, and a verification cost v divides the prediction by
  (gamma c + v) / (gamma c + 1)."""
  alpha, gamma, c = 0.88, 7, 0.02
  endless = float(theory.walltime_improvement(alpha, gamma, c))
  short = theory.walltime_improvement_at_lengths(alpha, gamma, c, [12, 13])
  long = theory.walltime_improvement_at_lengths(alpha, gamma, c, [4000])
  assert short < 0.85 * endless
  assert long == pytest.approx(endless, rel=5e-3)
  with_v = theory.walltime_improvement_at_lengths(alpha, gamma, c, [12, 13],
                                                  verify_cost=1.5)
  assert with_v == pytest.approx(short * (gamma * c + 1) / (gamma * c + 1.5))
  with pytest.raises(ValueError, match="lengths"):
    theory.walltime_improvement_at_lengths(alpha, gamma, c, [])


def test_prediction_with_prefills():
  """Costs paid once per input are added to both sides: none changes
  nothing; a hand-computed case (alpha 0: every run emits one token, so
  f(n) = n) matches; a prefill that dwarfs the decoding pulls the
  prediction to 1, or below it by the draft's share."""
  alpha, gamma, c = 0.8, 3, 0.05
  plain = theory.walltime_improvement_at_lengths(alpha, gamma, c, [12, 40],
                                                 verify_cost=1.4)
  assert theory.walltime_improvement_at_lengths(
      alpha, gamma, c, [12, 40], verify_cost=1.4, target_prefill=0.0,
      draft_prefill=0.0) == plain
  # alpha 0: (2 + 10) / (2 + 0.5 + 10 * (3 * 0.05 + 1.4)) for one 10-token
  # output, prefills 2 (target) and 0.5 (draft) steps.
  assert theory.walltime_improvement_at_lengths(
      0.0, 3, 0.05, [10], verify_cost=1.4, target_prefill=2.0,
      draft_prefill=0.5) == pytest.approx(12 / (2.5 + 15.5))
  with_prefill = theory.walltime_improvement_at_lengths(
      alpha, gamma, c, [12, 40], verify_cost=1.4, target_prefill=2.0,
      draft_prefill=0.2)
  assert 1.0 < with_prefill < plain
  assert theory.walltime_improvement_at_lengths(
      alpha, gamma, c, [12], target_prefill=1e9) == pytest.approx(1.0)
  assert theory.walltime_improvement_at_lengths(
      alpha, gamma, c, [12], target_prefill=1e9,
      draft_prefill=1e8) == pytest.approx(1 / 1.1)
  with pytest.raises(ValueError, match="prefill"):
    theory.walltime_improvement_at_lengths(alpha, gamma, c, [12],
                                           target_prefill=-1.0)


def test_alpha_for_improvement_inverts_the_predictions():
  """alpha_for_improvement is the inverse in alpha of Theorem 3.8 (with v)
  and of its finite-length form: a closed form (gamma 1, c 0: 1 + alpha),
  round trips at lengths with prefills, the smallest such alpha, 0 when
  any draft will do, NaN when even alpha = 1 falls short."""
  assert theory.alpha_for_improvement(1.7, 1, 0.0) == pytest.approx(0.7)
  # At alpha = 1 every run emits gamma + 1 tokens: the ceiling.
  gamma, c, v = 4, 0.0235, 1.31
  ceiling = (gamma + 1) / (gamma * c + v)
  assert np.isnan(theory.alpha_for_improvement(ceiling + 0.01, gamma, c, v))
  assert theory.alpha_for_improvement(ceiling - 1e-9, gamma, c, v) > 0.999
  assert theory.alpha_for_improvement(0.5, gamma, c, v) == 0.0
  lengths = [38, 41, 40, 52, 33]
  for alpha in (0.3, 0.81, 0.93):
    goal = theory.walltime_improvement_at_lengths(
        alpha, gamma, c, lengths, verify_cost=v, target_prefill=2.1,
        draft_prefill=0.23)
    found = theory.alpha_for_improvement(
        goal, gamma, c, v, lengths=lengths, target_prefill=2.1,
        draft_prefill=0.23)
    assert found == pytest.approx(alpha, abs=1e-9)
    assert theory.walltime_improvement_at_lengths(
        found - 1e-6, gamma, c, lengths, verify_cost=v, target_prefill=2.1,
        draft_prefill=0.23) < goal
  with pytest.raises(ValueError, match="lengths"):
    theory.alpha_for_improvement(2.0, gamma, c, v, target_prefill=1.0)
  with pytest.raises(ValueError, match="gamma"):
    theory.alpha_for_improvement(2.0, 0, c, v)
