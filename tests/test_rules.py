"""Acceptance and stop rules plug in through the public API (issue 67).

Invariants:
- a rule written outside the package (a frozen dataclass with the members
  of `acceptance.AcceptanceRule`) runs as itself through `rule=`: it
  changes tokens per target call, its results are marked lossy, and the
  next call without it returns the tokens a call before it returned (the
  rule is part of the compiled program's key, so no program compiled for
  one rule serves another);
- the measured acceptance (`acceptance_rate`) is what alpha predicts: equal
  under greedy (both count argmax matches), and moved by a lenient rule;
- Medusa's typical acceptance (`sd.TypicalAcceptance`) accepts more than
  Algorithm 1, the chi-square harness rejects it where Algorithm 1 on the
  same models, seed and N passes (the positive control, in the same test),
  and greedy decoding is unchanged by it;
- a stop rule is any object with init, keep_going and update;
- a rule missing a member, an unhashable one and lenience beside a rule are
  refused before anything compiles, the message naming the member.

Statistics: N_SEQ = 20,000 rows of one input tiled with per-row keys,
5-token sequences over the 4-token vocabulary of `helpers.chi_square_family`,
Pearson's chi-square against the target's exact distribution (cells
expected fewer than 5 times pooled), SIGNIFICANCE = 1e-3, fixed seeds.
"""

import dataclasses

import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specdec_jax as sd
from specdec_jax import sampling
from specdec_jax.decoding import acceptance
from specdec_jax.decoding import engine
from specdec_jax.decoding import verify
from specdec_jax.errors import ContractError
from specdec_jax.experiments import experiment_config
from tests import helpers

SIGNIFICANCE = 1e-3
N_SEQ = 20_000
SEQ_LEN = 5
GAMMA = 3


@dataclasses.dataclass(frozen=True)
class HalfLenient:
  """Accepts x while r * q(x) <= 2 p(x): Algorithm 1 at lenience 1/2,
  written from the protocol alone (a user's rule: lossy, and says so)."""

  uses_q = True
  exact = False

  def target(self, sampler, logits):
    return sampler.probs(logits)

  def at(self, p, x):
    return jnp.take_along_axis(p, x[:, None], axis=-1)[:, 0]

  def accepts(self, u, p_x, q_x):
    return (q_x > 0) & ((1.0 - u) * q_x <= 2.0 * p_x)

  def residual(self, p, q):
    return sampling.residual(p, 0.5 * q)

  def draw(self, u, p):
    return sampling.inverse_cdf(p, u[:, None])

  def overlap(self, p, q, x):
    del x
    return jnp.sum(jnp.minimum(p, q), axis=-1)

  def accept_prob(self, p_x, q_x):
    return jnp.minimum(1.0, 2.0 * p_x / jnp.maximum(q_x, 1e-30))


@pytest.fixture(scope="module")
def models():
  target = helpers.table_model(12, seed=3, eos_bias=-1.0)
  return target, helpers.table_model(12, seed=4, base=target, noise=1.5)


def test_a_users_rule_runs_as_itself_and_the_default_comes_back(models):
  target, draft = models
  ids = np.tile(np.array([[2, 3, 1]], np.int32), (64, 1))
  run = lambda **kw: sd.speculative_generate(  # noqa: E731
      target, draft, ids, gamma=4, max_decode_len=12, temperature=1.0, **kw)
  before = run()
  misses = engine.build_speculative.cache_info().misses
  lenient = run(rule=HalfLenient())
  assert engine.build_speculative.cache_info().misses == misses + 1
  after = run()
  np.testing.assert_array_equal(after.tokens, before.tokens)
  assert (lenient.stats.tokens_per_target_call.mean()
          > before.stats.tokens_per_target_call.mean())
  assert lenient.stats.exact is False and before.stats.exact is True
  # beta is the models' overlap whatever the rule; the measured acceptance
  # is what the rule did.
  assert (lenient.stats.pooled_acceptance_rate()
          > before.stats.pooled_acceptance_rate() + 0.05)
  assert abs(lenient.stats.pooled_alpha() - before.stats.pooled_alpha()) < 0.1


def test_greedy_measured_acceptance_is_alpha(models):
  """Under greedy both count the argmax matches at the same positions."""
  target, draft = models
  out = sd.speculative_generate(target, draft, helpers.example_inputs(),
                                gamma=3, max_decode_len=12)
  np.testing.assert_allclose(out.stats.acceptance_rate, out.stats.alpha,
                             atol=1e-6)
  assert 0.1 < out.stats.pooled_alpha() < 0.95


def _sample(target, draft, rule):
  ids = np.tile(np.array([[2, 3, 1]], np.int32), (N_SEQ, 1))
  fn = engine.build_speculative(target.definition, draft.definition, GAMMA,
                                SEQ_LEN, sampling.SamplingConfig(1.0),
                                rule=rule)
  tokens, stats = fn(target.params, draft.params, ids,
                     np.full((N_SEQ,), 11, np.int32),
                     np.arange(N_SEQ, dtype=np.int32))
  return np.asarray(tokens), stats


def test_typical_acceptance_accepts_more_and_is_not_exact():
  target, draft, _, _ = helpers.chi_square_family()
  exact = helpers.exact_distribution(target, np.array([2, 3, 1]), SEQ_LEN)
  exact_tokens, exact_stats = _sample(target, draft, None)
  typical_tokens, typical_stats = _sample(target, draft,
                                          sd.TypicalAcceptance())
  assert helpers.chisquare_vs_exact(exact_tokens, exact) > SIGNIFICANCE
  assert helpers.chisquare_vs_exact(typical_tokens, exact) < SIGNIFICANCE
  rate = lambda st: (np.sum(st.accepted_tokens)  # noqa: E731
                     / np.sum(st.alpha_count))
  assert rate(typical_stats) > rate(exact_stats) + 0.05, (
      rate(typical_stats), rate(exact_stats))
  calls = lambda st: np.sum(st.length) / np.sum(st.target_calls)  # noqa: E731
  assert calls(typical_stats) > calls(exact_stats)
  assert not sd.TypicalAcceptance().exact


def test_typical_acceptance_leaves_greedy_unchanged(models):
  target, draft = models
  ids = helpers.example_inputs()
  spec = sd.speculative_generate(target, draft, ids, gamma=3,
                                 max_decode_len=12,
                                 rule=sd.TypicalAcceptance())
  np.testing.assert_array_equal(
      spec.tokens, sd.generate(target, ids, max_decode_len=12).tokens)


class TwoAtATime:
  """A stop rule that is no dataclass and has no static/values/traced:
  every proposal ends after its second token."""

  def init(self, batch):
    del batch
    return {}

  def keep_going(self, tokens, conf, state):
    del conf, state
    return jnp.broadcast_to(jnp.arange(tokens.shape[1]) < 1, tokens.shape)

  def update(self, state, conf, accept_prob, verified):
    del conf, accept_prob, verified
    return state


def test_any_object_with_the_members_is_a_stop_rule(models):
  target, draft = models
  ids = helpers.example_inputs()
  spec = sd.speculative_generate(target, draft, ids, gamma=4,
                                 max_decode_len=12, draft_stop=TwoAtATime())
  np.testing.assert_array_equal(
      spec.tokens, sd.generate(target, ids, max_decode_len=12).tokens)
  hist = np.asarray(spec.stats.proposal_histogram).sum(0)
  assert hist[2] > 0 and hist[3:].sum() == 0, hist


class Unhashable(HalfLenient):
  __hash__ = None


@dataclasses.dataclass(frozen=True)
class NoResidual:
  uses_q = True
  exact = True

  def target(self, sampler, logits):
    return sampler.probs(logits)


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(rule=NoResidual()), ContractError, "no at, accepts, residual"),
    (dict(rule=Unhashable()), ContractError, "not hashable"),
    (dict(rule=HalfLenient(), lenience=0.5), ValueError,
     r"rule=acceptance.Sampled\(0.5\)"),
    (dict(draft_stop=object()), ContractError,
     "has no init, keep_going, update"),
])
def test_broken_rules_are_refused_before_compiling(models, kwargs, error,
                                                   match):
  target, draft = models
  before = engine.build_speculative.cache_info().misses
  with pytest.raises(error, match=match):
    sd.speculative_generate(target, draft, helpers.example_inputs(), gamma=2,
                            max_decode_len=4, temperature=1.0, **kwargs)
  assert engine.build_speculative.cache_info().misses == before


def test_gin_binds_a_rule_to_the_experiment_config():
  with gin.unlock_config():
    gin.parse_config("\n".join([
        "from __gin__ import dynamic_registration",
        "from specdec_jax.experiments import experiment_config",
        "from specdec_jax.rules import typical",
        "experiment_config.ExperimentConfig.rule = "
        "@typical.TypicalAcceptance()",
        "typical.TypicalAcceptance.epsilon = 0.2"]))
  try:
    config = gin.get_configurable(experiment_config.ExperimentConfig)()
  finally:
    gin.clear_config()
  assert config.rule == sd.TypicalAcceptance(epsilon=0.2)
  assert not experiment_config.config_problems(
      dataclasses.replace(config, target="t", draft="d"))
  assert acceptance.rule_for(sampling.SamplingConfig()) == acceptance.Greedy()


def test_speculative_accept_takes_a_rule():
  """The array-level Algorithm 1 runs any rule: a point-mass draft of a
  token the target gives 1/2 is accepted about half the time by Algorithm
  1 (1,000 rows: 6 sigma is +-95) and always by typical acceptance."""
  rows = 1000
  q = jnp.tile(jnp.array([[[1.0, 0.0, 0.0, 0.0]]]), (rows, 1, 1))
  p = jnp.tile(jnp.array([[[0.5, 0.5, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]]),
               (rows, 1, 1))
  tokens = jnp.zeros((rows, 1), jnp.int32)
  exact, _ = verify.speculative_accept(jax.random.key(0), tokens, q, p)
  typical, _ = verify.speculative_accept(jax.random.key(0), tokens, q, p,
                                         rule=sd.TypicalAcceptance())
  assert 405 < int(exact.sum()) < 595 and int(typical.sum()) == rows
