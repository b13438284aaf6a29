"""Negative controls: two realistic exactness bugs the chi-square tests catch.

Each test injects one deliberate bug into the speculative loop (by
monkeypatching a seam in specdec_jax/decoding/: no hook exists for it) and
asserts that sampled whole sequences then FAIL Pearson's chi-square test
against the target's exact distribution: p-value < SIGNIFICANCE = 1e-3,
N = 20,000 rows of one input tiled as a batch with per-row keys, 5-token
sequences over the 4-token vocabulary of tests/test_adaptive.py's small
models (cells expected fewer than 5 times pooled). The same harness
without the patch (same models, gamma, seed and N) passes the same test
(`test_the_unpatched_harness_passes`), so a failure is the bug's doing: the
chi-square tests have power against it.

Each buggy loop is built with `helpers.uncached_speculative`: outside the
loop cache, so the patched loop is traced afresh and no later test reuses
it.
"""

import types

import jax.numpy as jnp
import numpy as np
import pytest

import specdec_jax as sd
from specdec_jax import sampling
from specdec_jax.drafts import cascades
from specdec_jax.decoding import engine
from specdec_jax.decoding import protocol
from specdec_jax.decoding import verify
from tests import helpers

SIGNIFICANCE = 1e-3
N_SEQ = 20_000
SEQ_LEN = 5  # gamma 3 + 2: bonus tokens and rollbacks happen
GAMMA = 3


@pytest.fixture(scope="module")
def small_models():
  return helpers.chi_square_family()


def _patched_verify(**overrides):
  """A stand-in for the `verify` module as seen by one caller: the real
  functions, except those in `overrides`."""
  return types.SimpleNamespace(
      verify_chain=overrides.get("verify_chain", verify.verify_chain),
      walk=verify.walk, counted_positions=verify.counted_positions)


def _p_value(target, draft):
  """Chi-square p-value of N_SEQ sampled sequences (temperature 1) of the
  speculative loop as currently patched."""
  ids = np.tile(np.array([[2, 3, 1]], np.int32), (N_SEQ, 1))
  exact = helpers.exact_distribution(target, ids[0], SEQ_LEN)
  fn = helpers.uncached_speculative(target.definition, draft.definition,
                                    GAMMA, SEQ_LEN,
                                    sampling.SamplingConfig(1.0))
  tokens, _ = fn(target.params, draft.params, ids,
                 np.full((N_SEQ,), 11, np.int32),
                 np.arange(N_SEQ, dtype=np.int32))
  return helpers.chisquare_vs_exact(np.asarray(tokens), exact)


@pytest.mark.parametrize("kind", ["plain", "cascade"])
def test_the_unpatched_harness_passes(small_models, kind):
  """Positive control for the two tests below: with no bug injected, the
  plain draft and the two-level cascade they use sample the target's exact
  distribution (p-value > SIGNIFICANCE at these fixed seeds)."""
  target, draft, small, _ = small_models
  drafter = draft if kind == "plain" else sd.cascade(draft, small, gamma=2)
  p_value = _p_value(target, drafter)
  assert p_value > SIGNIFICANCE, p_value


def test_cascade_passing_the_inner_q_outward_fails(small_models,
                                                   monkeypatch):
  """A two-level cascade whose middle model reports the INNER draft's q for
  the tokens it emits, instead of its own p_M (the q the outer check must
  use: the tokens leave the cascade distributed as p_M, by exactness of the
  inner verification). The target then accepts token x with probability
  min(1, p(x) / q_small(x)) although x was drawn from p_M: the accepted
  tokens follow p_M * min(1, p / q_small), which is not the p_M * min(1,
  p / p_M) Algorithm 1 needs, and the residual max(0, p - q_small) is
  built from the wrong q as well, so the output is not the target's.

  Seam: `cascades.verify.verify_chain` (the middle model's check); its
  returned probs, which the cascade stores as the q of each emitted token,
  are replaced by the inner proposal's probs at the g draft positions."""
  target, draft, small, _ = small_models

  def inner_q_outward(rule, sampler, logits, prop, key):
    verdict = verify.verify_chain(rule, sampler, logits, prop, key)
    leaked = jnp.concatenate([prop.probs, verdict.probs[:, -1:]], axis=1)
    return verdict.replace(probs=leaked)

  monkeypatch.setattr(cascades, "verify",
                      _patched_verify(verify_chain=inner_q_outward))
  p_value = _p_value(target, sd.cascade(draft, small, gamma=2))
  assert p_value < SIGNIFICANCE, p_value


def test_stop_rule_that_peeks_at_the_target_fails(small_models, monkeypatch):
  """A proposal length chosen with knowledge of the target's verdict: where
  the target would reject draft token j >= 1, the proposal stops right
  before it (length j), so all j tokens are accepted and position j is
  sampled from p itself (nothing was proposed there) instead of the
  residual norm(max(0, p - q)). Position j's token is then x_j with
  probability min(1, p/q) (whose accepted part sums with the residual to
  p) replaced on rejection by a draw from p: the distribution there is
  sum_x q min(1, p/q) [x] + (1 - beta) p, which over-weights the tokens
  the draft over-proposes, wherever q != p. A legal rule sees only the
  draft (tokens, q, its own statistics), never the target's draws.

  Seam: `engine.accept` (the target's check in the loop's step). The peek
  runs the real walk with the verification's own key (the same uniform
  draws, so it sees the real verdict), then the real walk runs on the
  shortened proposal."""
  target, draft, _, _ = small_models
  accept = engine.accept

  def peeking(loop, logits, prop, key):
    accepted = accept(loop, logits, prop, key).accepted
    rejects = accepted < prop.length
    length = jnp.where(rejects, jnp.maximum(accepted, 1), prop.length)
    return accept(loop, logits, protocol.chain_proposal(
        prop.tokens, prop.probs, prop.conf, length), key)

  monkeypatch.setattr(engine, "accept", peeking)
  p_value = _p_value(target, draft)
  assert p_value < SIGNIFICANCE, p_value
