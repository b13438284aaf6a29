"""Composite drafters take any drafter (issue 67).

Invariants:
- cascades and horizontal drafters built from any protocol drafter (prompt
  lookup, a draft model, a user's drafter written from the protocol alone,
  each other) decode greedy tokens equal to the target's, for every row of
  a ragged batch (one row whose lookup finds nothing);
- the draft model's NaN check survives a part that checks nothing (prompt
  lookup): NaN logits of the model are reported, wherever it sits;
- a sampled composite containing prompt lookup keeps the target's
  distribution: whole 5-token sequences pass Pearson's chi-square test
  against the exact distribution (N_SEQ = 20,000 rows of one input tiled
  with per-row keys, 4-token vocabulary, cells expected fewer than 5 times
  pooled, SIGNIFICANCE = 1e-3); the same harness with the residual skipped
  (`helpers.SkipResidual`) must fail it;
- a combination that cannot work says so: a tree or prompt lookup as a
  cascade's middle model, a tree inside a composite.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specdec_jax as sd
from specdec_jax import sampling
from specdec_jax.decoding import drafters
from specdec_jax.decoding import engine
from specdec_jax.decoding import protocol
from tests import helpers

VOCAB = 12
SIGNIFICANCE = 1e-3
N_SEQ = 20_000
SEQ_LEN = 5
GAMMA = 3


class RepeatLastDef:
  """A user's drafter definition written from the protocol alone: it
  proposes its row's last token again, with q a point mass on it."""

  def __init__(self, vocab_size):
    self.vocab_size = vocab_size
    self.max_input_len = None

  def __hash__(self):
    return hash(("RepeatLastDef", self.vocab_size))

  def __eq__(self, other):
    return (isinstance(other, RepeatLastDef)
            and other.vocab_size == self.vocab_size)

  def make_drafter(self, gamma, sampler, refeed, rule):
    del sampler, refeed
    return RepeatLast(self.vocab_size, gamma, rule)


class RepeatLast:
  """Exactly the members of `protocol.Drafter`, no base class."""

  depth = 1
  extra_width = 0
  calls = ()
  checks_finite = False

  def __init__(self, vocab_size, gamma, rule):
    self.vocab_size, self.gamma, self.rule = vocab_size, gamma, rule
    self.shape = sd.TreeShape.chain(gamma)

  def init(self, params, input_ids, num_positions, check_finite=True):
    del params, input_ids, num_positions, check_finite
    return ()

  def nonfinite(self, state):
    return None

  def commit(self, state, length, path):
    return state

  def propose(self, params, state, stream, keys, keep, limit):
    batch = stream.length.shape[0]
    last = jnp.take_along_axis(
        stream.tokens, jnp.maximum(stream.length - 1, 0)[:, None], axis=1)
    tokens = jnp.broadcast_to(last, (batch, self.gamma)).astype(jnp.int32)
    probs = (jax.nn.one_hot(tokens, self.vocab_size, dtype=jnp.float32)
             if self.rule.uses_q else None)
    levels = protocol.Levels(calls=jnp.zeros((batch, 1), jnp.int32),
                             alpha_sum=jnp.zeros((batch, 0), jnp.float32),
                             alpha_count=jnp.zeros((batch, 0), jnp.int32))
    prop = protocol.chain_proposal(
        tokens, probs, jnp.ones((batch, self.gamma), jnp.float32), limit)
    return prop, state, levels


@pytest.fixture(scope="module")
def family():
  target = helpers.table_model(VOCAB, seed=3, eos_bias=0.5)
  draft = helpers.table_model(VOCAB, seed=4, base=target, noise=1.5)
  small = helpers.table_model(VOCAB, seed=5, base=draft, noise=1.5)
  user = sd.Model(RepeatLastDef(VOCAB), {})
  return target, draft, small, sd.prompt_lookup(target), user


IDS = np.array([[2, 3, 4, 5, 2, 3, 1], [6, 7, 1, 0, 0, 0, 0],
                [9, 9, 9, 9, 9, 9, 1]], np.int32)

COMBINATIONS = {
    "cascade(draft, lookup)": lambda t, d, s, pl, u: sd.cascade(
        d, pl, gamma=2),
    "horizontal(draft, lookup)": lambda t, d, s, pl, u: sd.horizontal(
        d, pl, split=1),
    "horizontal(lookup, draft)": lambda t, d, s, pl, u: sd.horizontal(
        pl, d, split=1),
    "cascade(draft, user)": lambda t, d, s, pl, u: sd.cascade(d, u, gamma=2),
    "horizontal(lookup, user)": lambda t, d, s, pl, u: sd.horizontal(
        pl, u, split=2),
    "cascade(draft, horizontal(lookup, small))": lambda t, d, s, pl, u:
        sd.cascade(d, sd.horizontal(pl, s, split=1), gamma=2),
    "horizontal(cascade(draft, lookup), user)": lambda t, d, s, pl, u:
        sd.horizontal(sd.cascade(d, pl, gamma=2), u, split=2),
}


@pytest.mark.parametrize("name", list(COMBINATIONS))
def test_greedy_composites_of_any_drafters_equal_the_target(family, name):
  target = family[0]
  draft = COMBINATIONS[name](*family)
  spec = sd.speculative_generate(target, draft, IDS, gamma=GAMMA,
                                 max_decode_len=12)
  base = sd.generate(target, IDS, max_decode_len=12)
  np.testing.assert_array_equal(spec.tokens, base.tokens)
  # A composite holding a model keeps that model's NaN check; one
  # without any has nothing to check.
  has_model = bool(drafters.declared(draft, GAMMA).calls)
  assert (spec.stats.draft_nonfinite is not None) == has_model, name


@pytest.mark.parametrize("where", ["late", "early", "inner"])
def test_the_draft_models_nan_check_survives_prompt_lookup(family, where):
  target, draft, _, lookup, _ = family
  params = jax.tree.map(np.array, draft.params)
  params["table"][..., 7] = np.nan
  bad = sd.Model(draft.definition, params)
  composite = {"late": lambda: sd.horizontal(lookup, bad, split=1),
               "early": lambda: sd.horizontal(bad, lookup, split=1),
               "inner": lambda: sd.cascade(draft, sd.horizontal(
                   lookup, bad, split=1), gamma=2)}[where]()
  with pytest.warns(RuntimeWarning, match="the draft model"):
    res = sd.speculative_generate(target, composite, IDS, gamma=GAMMA,
                                  max_decode_len=6, on_nonfinite="warn")
  assert res.stats.draft_nonfinite.all()


def _sample(target, draft, rule=None):
  ids = np.tile(np.array([[2, 3, 1]], np.int32), (N_SEQ, 1))
  fn = engine.build_speculative(target.definition, draft.definition, GAMMA,
                                SEQ_LEN, sampling.SamplingConfig(1.0),
                                rule=rule)
  tokens, _ = fn(target.params, draft.params, ids,
                 np.full((N_SEQ,), 11, np.int32),
                 np.arange(N_SEQ, dtype=np.int32))
  return np.asarray(tokens)


def test_a_sampled_composite_with_prompt_lookup_is_exact():
  target, draft, _, _ = helpers.chi_square_family()
  composite = sd.horizontal(sd.prompt_lookup(target, ngram=1), draft,
                            split=1)
  exact = helpers.exact_distribution(target, np.array([2, 3, 1]), SEQ_LEN)
  assert helpers.chisquare_vs_exact(_sample(target, composite),
                                    exact) > SIGNIFICANCE
  wrong = _sample(target, composite, rule=helpers.SkipResidual())
  assert helpers.chisquare_vs_exact(wrong, exact) < SIGNIFICANCE


def test_combinations_that_cannot_work_say_so(family):
  target, draft, small, lookup, user = family
  tree = sd.tree(draft, (2, 1))
  with pytest.raises(TypeError, match="middle model must be a plain model"):
    sd.cascade(lookup, small, gamma=2)
  with pytest.raises(TypeError, match="middle model must be a plain model"):
    sd.cascade(tree, small, gamma=2)
  with pytest.raises(TypeError, match="late is a token tree"):
    sd.horizontal(lookup, tree, split=1)
  with pytest.raises(TypeError, match="tree: the draft must be a plain"):
    sd.tree(user, (2, 1))
