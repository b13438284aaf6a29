"""Prompt lookup (`drafts/prompt_lookup.py`) keeps the target's output exact.

Statistics (as tests/test_negative_controls.py): N_SEQ = 20,000 rows of one
input tiled as a batch with per-row keys, 5-token sequences over the
4-token vocabulary of the toy table models (`helpers.chi_square_family`),
Pearson's chi-square against the exact distribution (cells expected fewer
than 5 times pooled), significance SIGNIFICANCE = 1e-3 per test, fixed
seeds. The input [2, 3, 1] holds the tokens the target generates most, so
the lookup proposes (and gets accepted) copied tokens. Negative control: the
same harness with an acceptance rule that skips the residual
(`helpers.SkipResidual`) must fail at p < 1e-3: a point-mass q makes every
rejection's correction norm(max(0, p - q)), which drawing from p gets wrong.
"""

import numpy as np
import pytest

import specdec_jax as sd
from specdec_jax import sampling
from specdec_jax.decoding import engine
from tests import helpers

SIGNIFICANCE = 1e-3
N_SEQ = 20_000
SEQ_LEN = 5
GAMMA = 3


@pytest.fixture(scope="module")
def target():
  return helpers.chi_square_family()[0]


def _tokens(target, rule=None, **setting):
  ids = np.tile(np.array([[2, 3, 1]], np.int32), (N_SEQ, 1))
  draft = sd.prompt_lookup(target, ngram=1)
  fn = engine.build_speculative(
      target.definition, draft.definition, GAMMA, SEQ_LEN,
      sampling.SamplingConfig(**setting), rule=rule)
  tokens, stats = fn(target.params, draft.params, ids,
                     np.full((N_SEQ,), 11, np.int32),
                     np.arange(N_SEQ, dtype=np.int32))
  return np.asarray(tokens), stats


@pytest.mark.parametrize("setting", [{"temperature": 1.0},
                                     {"temperature": 0.7, "top_p": 0.9}])
def test_prompt_lookup_samples_the_targets_distribution(target, setting):
  exact = helpers.exact_distribution(target, np.array([2, 3, 1]), SEQ_LEN,
                                     **setting)
  tokens, stats = _tokens(target, **setting)
  assert helpers.chisquare_vs_exact(tokens, exact) > SIGNIFICANCE
  # The lookup proposed copied tokens, and some were accepted and some not.
  accepted = np.asarray(stats.accepted_tokens).sum()
  assert 0 < accepted < np.asarray(stats.length).sum()
  assert np.asarray(stats.draft_calls).sum() == 0


def test_prompt_lookup_without_the_residual_fails(target):
  setting = {"temperature": 1.0}
  exact = helpers.exact_distribution(target, np.array([2, 3, 1]), SEQ_LEN,
                                     **setting)
  tokens, _ = _tokens(target, rule=helpers.SkipResidual(), **setting)
  assert helpers.chisquare_vs_exact(tokens, exact) < SIGNIFICANCE


@pytest.mark.parametrize("ngram", [1, 2])
def test_greedy_prompt_lookup_equals_greedy_decoding(ngram):
  """Ragged rows (one with no match at all), against `generate`."""
  target = helpers.table_model(12, seed=3, eos_bias=0.5)
  ids = np.array([[2, 3, 4, 5, 2, 3, 1], [6, 7, 1, 0, 0, 0, 0],
                  [9, 9, 9, 9, 9, 9, 1]], np.int32)
  base = sd.generate(target, ids, max_decode_len=12)
  spec = sd.speculative_generate(target, sd.prompt_lookup(target, ngram),
                                 ids, gamma=3, max_decode_len=12)
  np.testing.assert_array_equal(spec.tokens, base.tokens)


def test_a_bad_ngram_is_refused_before_compiling(target):
  with pytest.raises(ValueError, match="ngram must be an int >= 1"):
    sd.prompt_lookup(target, ngram=0)
