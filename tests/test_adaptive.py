"""Exactness of adaptive draft lengths (draft_stop) and cascaded drafts.

Invariants: greedy output equals the target's greedy output token for token
for every stop rule and every cascade; sampled whole sequences follow the
target's exact distribution.

Statistics: Pearson's chi-square goodness of fit over all 5-token sequences
(vocabulary 4: at most 1,024 cells, those expected fewer than 5 times pooled
into one) at significance SIGNIFICANCE = 1e-3 per test, N = 20,000 rows decoded as ONE batch (so rows of different proposal
lengths share every iteration) with independent per-row keys and fixed
seeds (deterministic; a correct sampler fails a given test with probability
1e-3 over seeds). Negative controls that must fail: a cascade whose
smallest drafter proposes its argmax while reporting its softmax q (here);
the residual built from the q of the first unproposed slot, the bug an
adaptive length invites (tests/test_sampling.py, at the unit level: since
acceptance needs q(x) > 0, the engine's zero-q padding can no longer show
it, which is what the old engine-level control here relied on). Their deviations give statistics in the hundreds or more, so their
power at this level is essentially 1.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specdec_jax as sd
from specdec_jax import sampling
from specdec_jax.decoding import drafters
from specdec_jax.decoding import engine
from specdec_jax.models import ngram
from specdec_jax.decoding import stopping
from specdec_jax.tokens import EOS_ID
from tests import helpers

SIGNIFICANCE = 1e-3
N_SEQ = 20_000
# gamma 3 + 2: the bonus token after a fully accepted proposal, and the
# rollback after it, happen within a sequence.
SEQ_LEN = 5
VOCAB = 12

RULES = {
    "confidence": sd.ConfidenceStop(0.4),
    "expected_gain": sd.ExpectedGainStop(cost=0.3),
}


def _greedy_models(decoder_only):
  target = helpers.table_model(VOCAB, seed=0, eos_bias=2.0,
                                  decoder_only=decoder_only)
  draft = helpers.table_model(VOCAB, seed=1, base=target, noise=1.0)
  small = helpers.table_model(VOCAB, seed=2, base=draft, noise=1.0)
  bigram = ngram.fit_ngram([[3, 4, 3, 1], [3, 5, 1], [4, 4, 1]], VOCAB,
                           decoder_only=decoder_only)
  return target, draft, small, bigram


def _drafts(draft, small, bigram):
  return {
      "plain": draft,
      "cascade2": sd.cascade(draft, small, gamma=2),
      "cascade3": sd.cascade(draft, sd.cascade(small, bigram, gamma=3),
                             gamma=2),
      "horizontal": sd.horizontal(sd.cascade(draft, small, gamma=2), bigram,
                                  split=2),
  }


@pytest.mark.parametrize("rule,decoder_only", [
    (None, False), (None, True), ("confidence", False),
    ("expected_gain", True)])
def test_greedy_equals_target_for_every_rule_and_cascade(decoder_only, rule):
  """Greedy speculative output == greedy target output for batch 4 (ragged
  inputs, different EOS positions) and batch 1, for plain drafts, two- and
  three-level cascades (ending in a bigram) and a horizontal drafter, with
  and without a rule, for encoder-decoder and decoder-only models."""
  target, draft, small, bigram = _greedy_models(decoder_only)
  ids = helpers.example_inputs()
  base = sd.generate(target, ids, max_decode_len=12)
  stop = RULES.get(rule)
  for name, d in _drafts(draft, small, bigram).items():
    res = sd.speculative_generate(target, d, ids, gamma=5, max_decode_len=12,
                                  draft_stop=stop)
    np.testing.assert_array_equal(res.tokens, base.tokens, err_msg=name)
  for gamma, rows in ((1, ids), (4, ids[2:3])):
    res = sd.speculative_generate(target, draft, rows, gamma=gamma,
                                  max_decode_len=12, draft_stop=stop)
    np.testing.assert_array_equal(res.tokens, base.tokens[:len(rows)] if
                                  len(rows) == 4 else base.tokens[2:3])


def test_stats_report_proposal_lengths_and_levels():
  """proposal_histogram counts one proposal length per target call; rows pay
  only the draft runs they used (draft_calls == sum of k); a rule shortens
  proposals; level stats line up with the flat ones, and a cascade reports a
  call count and an alpha per level."""
  target, draft, small, _ = _greedy_models(False)
  ids = helpers.example_inputs()
  fixed = sd.speculative_generate(target, draft, ids, gamma=5,
                                  max_decode_len=12, temperature=1.0, seed=1)
  hist = fixed.stats.proposal_histogram
  np.testing.assert_array_equal(hist[:, 5], fixed.stats.target_calls)
  for rule in RULES.values():
    res = sd.speculative_generate(target, draft, ids, gamma=5,
                                  max_decode_len=12, temperature=1.0, seed=1,
                                  draft_stop=rule)
    st = res.stats
    hist = st.proposal_histogram
    np.testing.assert_array_equal(hist.sum(1), st.target_calls)
    assert hist[:, 0].sum() == 0, "every iteration proposes at least 1"
    np.testing.assert_array_equal(hist @ np.arange(6), st.draft_calls)
    assert st.draft_calls.sum() < 5 * st.target_calls.sum()
    np.testing.assert_array_equal(st.level_calls[:, 0], st.target_calls)
    # draft_calls IS level_calls[:, 1] and alpha level_alpha[:, 0] (the
    # same counters): they are checked against the proposal histogram
    # above and against theory in test_decoding, not against each other.
  casc = sd.speculative_generate(target, sd.cascade(draft, small, gamma=2),
                                 ids, gamma=4, max_decode_len=12,
                                 temperature=1.0, seed=1)
  st = casc.stats
  assert st.level_calls.shape == (4, 3)
  assert st.level_alpha.shape == (4, 2)
  # Each middle-model call verifies one inner proposal of 2 tokens.
  np.testing.assert_array_equal(st.level_calls[:, 2],
                                2 * st.level_calls[:, 1])
  assert np.all((st.level_alpha > 0) & (st.level_alpha < 1))


def test_verified_level_stacks_the_verifier_on_its_drafter():
  """One verification's counters: the verifier's own level comes first
  (one call; beta summed over the counted positions only), the proposing
  drafter's levels follow unchanged, and a row already done adds nothing."""
  active = jnp.array([True, False])
  beta = jnp.array([[0.5, 0.25, 0.125], [0.9, 0.9, 0.9]])
  counted = jnp.array([[True, True, False], [True, True, True]])
  inner = drafters.level_stats(jnp.array([[3], [3]]), jnp.array([[0.7], [0.7]]),
                               jnp.array([[2], [2]]))
  got = drafters.verified_level(active, beta, counted, inner)
  np.testing.assert_array_equal(got.calls, [[1, 3], [0, 0]])
  np.testing.assert_allclose(got.alpha_sum, [[0.75, 0.7], [0.0, 0.0]])
  np.testing.assert_array_equal(got.alpha_count, [[2, 2], [0, 0]])


@pytest.fixture(scope="module")
def small_models():
  return helpers.chi_square_family()


def _sample(target, draft, top_k, **kwargs):
  ids = np.tile(np.array([[2, 3, 1]], np.int32), (N_SEQ, 1))
  exact = helpers.exact_distribution(target, ids[0], SEQ_LEN, top_k=top_k)
  res = sd.speculative_generate(target, draft, ids, max_decode_len=SEQ_LEN,
                                temperature=1.0, top_k=top_k, seed=11,
                                record_trace=True, **kwargs)
  return res, exact


def _rule_stops(res, gamma, max_decode_len=SEQ_LEN):
  """Iterations in which the stop rule itself ended the proposal: fewer than
  gamma tokens proposed (`trace_proposed`) although the row's length limit
  allowed more (the engine caps a proposal at max_decode_len - n - 1 for a
  row of length n) and the last proposed token is not EOS (where every rule
  stops). A rule that never stops has none, whatever max_decode_len does to
  the proposal lengths."""
  st = res.stats
  accepted = np.asarray(st.trace_accepted)
  active = accepted >= 0
  grown = np.where(active, accepted + 1, 0)
  length_before = np.cumsum(grown, axis=1) - grown
  room = np.clip(max_decode_len - length_before - 1, 1, gamma)
  proposed = np.asarray(st.trace_proposed)
  last = np.take_along_axis(np.asarray(st.trace_draft),
                            np.maximum(proposed - 1, 0)[..., None], axis=2)
  return int(np.sum(active & (proposed < room) & (last[..., 0] != EOS_ID)))


@pytest.mark.parametrize("top_k", [0, 2])
@pytest.mark.parametrize("rule", ["confidence", "expected_gain"])
def test_stop_rules_sample_the_target_distribution(small_models, rule, top_k):
  """Sampled sequences with an adaptive draft length pass the chi-square
  test against the exact target distribution (temperature 1, and top-k 2),
  and the rule itself stopped proposals early (read from trace_proposed,
  not from the length limit or EOS) in thousands of iterations."""
  target, draft, _, _ = small_models
  res, exact = _sample(target, draft, top_k, gamma=3, draft_stop=RULES[rule])
  assert helpers.chisquare_vs_exact(res.tokens, exact) > SIGNIFICANCE
  assert _rule_stops(res, 3) > 1000, _rule_stops(res, 3)
  assert res.stats.alpha.mean() < 0.95


def test_rule_stop_check_has_power(small_models):
  """The check above fails for a rule that never stops early (ConfidenceStop
  with threshold 0 stops only after EOS), although its proposal lengths
  still vary with the length limit: the weak check it replaces passed."""
  target, draft, _, _ = small_models
  res, _ = _sample(target, draft, 0, gamma=3,
                   draft_stop=sd.ConfidenceStop(0.0))
  assert np.count_nonzero(res.stats.proposal_histogram.sum(0)) >= 2
  assert _rule_stops(res, 3) == 0


@pytest.mark.parametrize("top_k", [0, 2])
@pytest.mark.parametrize("levels", [2, 3])
def test_cascades_sample_the_target_distribution(small_models, levels, top_k):
  """Two-level (draft <- small) and three-level (draft <- small <- bigram)
  cascades: sampled sequences pass the chi-square test, with the outer and
  inner drafts genuinely different (alpha < 1 at every level)."""
  target, draft, small, bigram = small_models
  inner = small if levels == 2 else sd.cascade(small, bigram, gamma=2)
  res, exact = _sample(target, sd.cascade(draft, inner, gamma=2), top_k,
                       gamma=3)
  assert helpers.chisquare_vs_exact(res.tokens, exact) > SIGNIFICANCE
  assert res.stats.level_alpha.shape[1] == levels
  assert np.all(res.stats.level_alpha.mean(0) < 0.97)


def test_cascade_with_a_stop_rule_samples_the_target_distribution(
    small_models):
  """A cascade under ConfidenceStop (the rule reads the middle model's q)."""
  target, draft, small, _ = small_models
  res, exact = _sample(target, sd.cascade(draft, small, gamma=2), 0, gamma=3,
                       draft_stop=RULES["confidence"])
  assert helpers.chisquare_vs_exact(res.tokens, exact) > SIGNIFICANCE
  assert _rule_stops(res, 3) > 1000, _rule_stops(res, 3)


@pytest.mark.parametrize("rule", [None, "confidence"])
def test_horizontal_drafter_samples_the_target_distribution(small_models,
                                                            rule):
  """Early positions from the draft, later ones from the small model (with
  and without a stop rule): sampled sequences pass the chi-square test."""
  target, draft, small, _ = small_models
  res, exact = _sample(target, sd.horizontal(draft, small, split=1), 0,
                       gamma=3, draft_stop=RULES.get(rule))
  assert helpers.chisquare_vs_exact(res.tokens, exact) > SIGNIFICANCE
  assert res.stats.level_calls[:, 2].sum() > 0, "late drafter never used"


def test_negative_control_cascade_with_broken_inner_drafter_fails(
    small_models, monkeypatch):
  """A three-level cascade whose bigram proposes its argmax while reporting
  its softmax q: the middle levels are no longer exact, and the test fails."""
  target, draft, small, bigram = small_models
  casc = sd.cascade(draft, sd.cascade(small, bigram, gamma=2), gamma=2)
  ids = np.tile(np.array([[2, 3, 1]], np.int32), (N_SEQ, 1))
  exact = helpers.exact_distribution(target, ids[0], SEQ_LEN)
  monkeypatch.setattr(drafters.ModelDrafter, "draw", helpers.argmax_draw)
  fn = helpers.uncached_speculative(target.definition, casc.definition, 3,
                                    SEQ_LEN, sampling.SamplingConfig(1.0))
  tokens, _ = fn(target.params, casc.params, ids,
                 np.full((N_SEQ,), 11, np.int32),
                 np.arange(N_SEQ, dtype=np.int32))
  assert helpers.chisquare_vs_exact(np.asarray(tokens), exact) < SIGNIFICANCE


def test_expected_gain_stop_picks_theorem_3_8_gamma_at_constant_alpha():
  """With a constant acceptance probability and constant draft confidence,
  the calibrated estimate settles on alpha and the rule proposes the gamma
  maximising Theorem 3.8 (its derivation's fixed point)."""
  rule = sd.ExpectedGainStop(cost=0.2, prior_weight=1.0)
  batch, gamma, alpha = 3, 12, 0.7
  state = rule.init(batch)
  conf = jnp.full((batch, gamma), 0.6, jnp.float32)
  accept = jnp.full((batch, gamma), alpha, jnp.float32)
  state = rule.update(state, jnp.full((batch, gamma), 0.6), accept,
                      jnp.ones((batch, gamma), bool))
  for _ in range(20):
    state = rule.update(state, conf, accept, jnp.ones((batch, gamma), bool))
  tokens = jnp.full((batch, gamma), 5, jnp.int32)
  k = stopping.proposal_length(rule.keep_going(tokens, conf, state),
                               jnp.full((batch,), gamma))
  best = int(sd.theory.optimal_gamma(alpha, 0.2, max_gamma=gamma))
  assert np.all(np.asarray(k) == best), (k, best)


def test_bad_rules_and_cascades_fail_before_compiling():
  """Wrong draft_stop types, bad rule settings, bad cascade arguments and a
  cascade used as a target raise clear errors before anything is traced."""
  target, draft, small, _ = _greedy_models(False)
  ids = helpers.example_inputs()
  before = engine.build_speculative.cache_info().misses
  with pytest.raises(TypeError, match="draft_stop must be"):
    sd.speculative_generate(target, draft, ids, gamma=2, max_decode_len=4,
                            draft_stop=0.4)
  with pytest.raises(ValueError, match="threshold"):
    sd.ConfidenceStop(1.5)
  with pytest.raises(ValueError, match="cost"):
    sd.ExpectedGainStop(cost=-1.0)
  with pytest.raises(ValueError, match="gamma must be"):
    sd.cascade(draft, small, gamma=0)
  casc = sd.cascade(draft, small, gamma=2)
  with pytest.raises(TypeError, match="middle model"):
    sd.cascade(casc, small, gamma=2)
  with pytest.raises(TypeError, match="only be the draft"):
    sd.generate(casc, ids, max_decode_len=4)
  with pytest.raises(TypeError, match="only be the draft"):
    sd.speculative_generate(casc, draft, ids, gamma=2, max_decode_len=4)
  assert engine.build_speculative.cache_info().misses == before


def test_rule_and_cascade_arguments_are_normalised_or_named():
  """Issue 38: lists become tuples (the rule keys the compiled loop, so a
  list failed later with "unhashable type"); None as a threshold names the
  threshold; numpy integers work for cascade gamma and horizontal split like
  everywhere else; sizes beyond int32 are refused naming the argument, at
  every level of a cascade, before compiling."""
  target, draft, small, _ = _greedy_models(False)
  rule = sd.ExpectedGainStop(bins=[0.3, 0.6], prior=[0.2, 0.5, 0.8])
  assert rule.bins == (0.3, 0.6) and rule.prior == (0.2, 0.5, 0.8)
  assert hash(rule) == hash(sd.ExpectedGainStop(bins=(0.3, 0.6),
                                                prior=(0.2, 0.5, 0.8)))
  with pytest.raises(TypeError, match="ConfidenceStop.threshold"):
    sd.ConfidenceStop(None)
  with pytest.raises(TypeError, match="ExpectedGainStop.bins"):
    sd.ExpectedGainStop(bins=0.5)
  assert sd.cascade(draft, small, gamma=np.int64(3)).definition.gamma == 3
  assert sd.horizontal(draft, small, split=np.int32(1)).definition.split == 1
  with pytest.raises(ValueError, match="gamma=2147483648 is beyond int32"):
    sd.cascade(draft, small, gamma=2**31)
  with pytest.raises(ValueError, match="split=4294967296 is beyond int32"):
    sd.horizontal(draft, small, split=2**32)
  before = engine.build_speculative.cache_info().misses
  for kwargs, name in (({"gamma": 2**31, "max_decode_len": 4}, "gamma"),
                       ({"gamma": 2, "max_decode_len": 2**31},
                        "max_decode_len")):
    with pytest.raises(ValueError, match=f"{name} = .* is beyond int32"):
      sd.speculative_generate(target, draft, helpers.example_inputs(), **kwargs)
  # The sum of every level's sizes is checked too: a cascade's inner gamma.
  huge = sd.cascade(draft, small, gamma=2**31 - 3)
  with pytest.raises(ValueError, match="cascade's inner gammas"):
    sd.speculative_generate(target, huge, helpers.example_inputs(), gamma=2,
                            max_decode_len=4)
  assert engine.build_speculative.cache_info().misses == before


def test_memory_estimate_counts_a_cascades_inner_gamma():
  """Issue 38: a cascade with a huge inner gamma is refused by the memory
  estimate (its middle model verifies gamma + 1 tokens at once, and its
  buffers grow by as many positions) instead of compiling and failing to
  allocate terabytes; the same cascade with a small inner gamma passes."""
  target, draft, small, _ = _greedy_models(False)
  ids = helpers.example_inputs()
  before = engine.build_speculative.cache_info().misses
  with pytest.raises(ValueError, match="GiB of buffers"):
    sd.speculative_generate(target, sd.cascade(draft, small, gamma=10**5),
                            ids, gamma=2, max_decode_len=4)
  assert engine.build_speculative.cache_info().misses == before


def test_nan_anywhere_in_a_cascade_is_named_as_the_draft():
  """The non-finite check covers every model of a cascade: NaN logits in
  the innermost drafter raise the draft error (a warning on request, with
  the flag set and the greedy output still the target's); the finite
  cascade sets no flag."""
  target, draft, small, _ = _greedy_models(False)
  params = jax.tree.map(np.array, small.params)
  params["table"][..., 7] = np.nan
  bad_small = sd.Model(small.definition, params)
  ids = helpers.example_inputs()
  bad = sd.cascade(draft, bad_small, gamma=2)
  with pytest.raises(FloatingPointError, match="the draft model"):
    sd.speculative_generate(target, bad, ids, gamma=3, max_decode_len=6)
  with pytest.warns(RuntimeWarning, match="draft model"):
    res = sd.speculative_generate(target, bad, ids, gamma=3,
                                  max_decode_len=6, on_nonfinite="warn")
  assert res.stats.draft_nonfinite.all()
  np.testing.assert_array_equal(
      res.tokens, sd.generate(target, ids, max_decode_len=6).tokens)
  clean = sd.speculative_generate(target, sd.cascade(draft, small, gamma=2),
                                  ids, gamma=3, max_decode_len=6)
  assert not clean.stats.draft_nonfinite.any()
