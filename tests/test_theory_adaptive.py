"""theory's adaptive-length and cascade formulas, checked two ways: against
the paper's theorems they extend (exact reductions), and against decoding
measurements on context-free (unigram) models, where Theorem 3.1's i.i.d.
assumption holds exactly, so prediction and measurement may differ only by
sampling noise.

Tolerances: each measurement pools about 5,000 or more iterations; the
relative standard error of a mean tokens-per-call of ~2 with per-iteration
variance below 2 is under 1%, so 3% (more than 3 standard errors) is a
loose but real bound; a formula off by one token in the per-call count, or
using the wrong alpha, misses it by far.
"""

import numpy as np
import pytest

import specdec_jax as sd
from specdec_jax import Model
from specdec_jax import theory
from specdec_jax.models import ngram
from specdec_jax.decoding import stopping

pytestmark = pytest.mark.quick  # `make test-quick`

V = 8


def test_adaptive_formulas_reduce_to_theorems_3_1_and_3_8():
  """A point mass at K = gamma gives Theorems 3.1 and 3.8; a one-level
  cascade gives Theorem 3.8; a mixture of lengths is the mixture."""
  for alpha, gamma, c in [(0.6, 3, 0.1), (0.9, 7, 0.02), (0.3, 1, 0.5)]:
    point = np.eye(gamma + 1)[gamma]
    assert theory.expected_tokens_adaptive(alpha, point) == pytest.approx(
        float(theory.expected_tokens(alpha, gamma)))
    assert theory.walltime_improvement_adaptive(alpha, point, c) == (
        pytest.approx(float(theory.walltime_improvement(alpha, gamma, c))))
    assert theory.cascade_walltime_improvement([alpha], [gamma], [c]) == (
        pytest.approx(float(theory.walltime_improvement(alpha, gamma, c))))
  mix = np.array([0, 0.25, 0, 0.75])
  assert theory.expected_tokens_adaptive(0.5, mix) == pytest.approx(
      0.25 * theory.expected_tokens(0.5, 1)
      + 0.75 * theory.expected_tokens(0.5, 3))
  np.testing.assert_allclose(theory.cascade_calls([0.8, 1.0], [6, 2]),
                             [1, 2, 4])  # alpha 1: 3 tokens per middle run


def _unigram(probs):
  logp = np.log(np.maximum(np.asarray(probs, np.float64), 1e-30))
  return Model(ngram.NgramDef(vocab=V, order=1),
               {"log_probs": logp.astype(np.float32)})


def _dist(weights):
  p = np.zeros(V)
  for tok, w in weights.items():
    p[tok] = w
  return p / p.sum()


# q on {2, 3, 4, 5}; p = r q there and the rest on {6, 7}: every draft token
# is accepted with probability min(1, p/q) = r, whatever its confidence, so
# the acceptance does not depend on how long the proposal is (no EOS: p and
# q give it probability 0).
R = 0.6
Q = _dist({2: 0.5, 3: 0.25, 4: 0.15, 5: 0.1})
P = R * Q + (1 - R) * _dist({6: 1, 7: 1})
IDS = np.tile(np.array([[3, 1]], np.int32), (128, 1))


def test_stop_rule_tokens_per_call_match_measurement():
  """ConfidenceStop(0.2) stops after the draft's less likely tokens, so the
  proposal length varies; the measured tokens per target call (accepted + 1,
  before truncation) equal expected_tokens_adaptive(r, measured lengths)."""
  res = sd.speculative_generate(_unigram(P), _unigram(Q), IDS, gamma=6,
                                max_decode_len=64, temperature=1.0, seed=3,
                                draft_stop=sd.ConfidenceStop(0.2))
  st = res.stats
  lengths = st.proposal_histogram.sum(0)
  assert np.count_nonzero(lengths) >= 4
  measured = (st.accepted_histogram.sum(0) @ np.arange(7)
              / st.target_calls.sum()) + 1
  assert float(np.minimum(P, Q).sum()) == pytest.approx(R)
  assert st.alpha.mean() == pytest.approx(R, rel=1e-4)
  assert measured == pytest.approx(
      theory.expected_tokens_adaptive(R, lengths), rel=0.03)
  # The fixed-gamma prediction at the mean length is not the same number:
  # the test can tell a length mixture from its mean.
  mean_k = lengths @ np.arange(7) / lengths.sum()
  fixed = float(theory.expected_tokens(R, mean_k))
  assert abs(fixed - measured) > 0.03 * measured


@pytest.mark.parametrize("levels", [2, 3])
def test_cascade_calls_match_measurement(levels):
  """Two- and three-level unigram cascades: the measured alpha of each level
  is sum_x min(.,.) of its pair, tokens per target call follow Theorem 3.1
  with the outer alpha, and the measured calls of every level per target
  call match theory.cascade_calls."""
  dists = [P, _dist({2: 4, 3: 2, 4: 1, 5: 1, 6: 1, 7: 1}),
           _dist({2: 2, 3: 2, 4: 2, 5: 1, 6: 2, 7: 1}),
           _dist({2: 1, 3: 1, 4: 1, 5: 1, 6: 1, 7: 1})][:levels + 1]
  gammas = [5, 2, 3][:levels]
  alphas = [float(np.minimum(a, b).sum()) for a, b in zip(dists, dists[1:])]
  models = [_unigram(d) for d in dists]
  draft = models[-1]
  for m, g in zip(models[-2:0:-1], gammas[:0:-1]):
    draft = sd.cascade(m, draft, gamma=g)
  res = sd.speculative_generate(models[0], draft, IDS, gamma=gammas[0],
                                max_decode_len=64, temperature=1.0, seed=4)
  st = res.stats
  np.testing.assert_allclose(st.level_alpha.mean(0), alphas, rtol=1e-4)
  calls = st.level_calls.sum(0)
  np.testing.assert_allclose(calls / calls[0],
                             theory.cascade_calls(alphas, gammas), rtol=0.03)
  measured = (st.accepted_histogram.sum(0) @ np.arange(gammas[0] + 1)
              / calls[0]) + 1
  assert measured == pytest.approx(
      float(theory.expected_tokens(alphas[0], gammas[0])), rel=0.03)


def test_expected_gain_calibration_recovers_the_acceptance_per_bin():
  """Every draft token here is accepted with probability R whatever its
  confidence, so each confidence bin that saw tokens calibrates to R
  (exactly: min(1, p/q) is measured, not a coin flip); empty bins keep the
  prior."""
  rule = sd.ExpectedGainStop(cost=0.05, bins=(0.2, 0.4))
  res = sd.speculative_generate(_unigram(P), _unigram(Q), IDS[:16], gamma=4,
                                max_decode_len=32, temperature=1.0, seed=5,
                                draft_stop=rule)
  cal = stopping.calibration(rule, res.stats)
  # q(x) is 0.1, 0.15 or 0.25 (bins 0, 1) or 0.5 (bin 2).
  np.testing.assert_allclose(cal, [R, R, R], rtol=1e-4)
  calibrated = sd.ExpectedGainStop(cost=0.05, bins=(0.2, 0.4), prior=cal)
  res = sd.speculative_generate(_unigram(P), _unigram(Q), IDS[:16], gamma=4,
                                max_decode_len=32, temperature=1.0, seed=5,
                                draft_stop=calibrated)
  np.testing.assert_allclose(stopping.calibration(calibrated, res.stats), cal,
                             rtol=1e-4)
