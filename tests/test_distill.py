"""Tests for on-policy distillation (specdec_jax.training.distill).

Invariants: the TV loss per token is exactly 1 - beta, the acceptance rate
`theory.acceptance_rate` computes for the same two distributions (so
minimising it maximises alpha), and the KLs are those of their definitions
(zero for equal distributions, positive otherwise: the negative control);
the divergences are taken at the decoding temperature; every objective
gives finite, non-zero gradients to the student and none to the frozen
teacher; on-policy rows really are the current draft's samples (the same
seeds decode the same tokens with the draft, other tokens with the target:
the negative control), filler rows keep zero weight and the data's rows
stay where the fraction says; a few steps of TV distillation raise the
draft's agreement with the target on its own samples; bad configs fail
with a message naming the fix.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from specdec_jax import Model
from specdec_jax import generate
from specdec_jax import theory
from specdec_jax.models import registry
from specdec_jax.training import distill
from specdec_jax.training import steps


def _t5(seed, **overrides):
  definition = registry.make_def(registry.get_config("t5_1_1_tiny",
                                                     **overrides))
  return Model(definition, definition.init_params(jax.random.key(seed)))


@pytest.fixture(scope="module")
def pair():
  teacher = _t5(0)
  student = _t5(1, num_encoder_layers=1, num_decoder_layers=1)
  return teacher, student


def _batch(rows=4, width=6, length=8, seed=0):
  rng = np.random.default_rng(seed)
  inputs = rng.integers(3, 100, (rows, width)).astype(np.int32)
  inputs[:, -1] = 1
  targets = rng.integers(3, 100, (rows, length)).astype(np.int32)
  targets[:, -1] = 1
  batch = {"inputs": inputs, **distill.rows_from_tokens(targets)}
  return batch


def test_tv_is_one_minus_the_acceptance_rate_and_kls_match_definitions():
  """Per token, tv == 1 - theory.acceptance_rate(p, q) (what alpha
  averages), at the given temperature; KL(p||q), KL(q||p) as defined;
  all three vanish for q == p and not otherwise (negative control)."""
  rng = np.random.default_rng(0)
  s_logits = rng.normal(size=(3, 5, 17)).astype(np.float32) * 2
  t_logits = rng.normal(size=(3, 5, 17)).astype(np.float32) * 2
  for temperature in (1.0, 0.5):
    d = distill.token_divergences(jnp.asarray(s_logits),
                                  jnp.asarray(t_logits), temperature)
    p = np.asarray(jax.nn.softmax(t_logits / temperature), np.float64)
    q = np.asarray(jax.nn.softmax(s_logits / temperature), np.float64)
    np.testing.assert_allclose(d["tv"], 1 - theory.acceptance_rate(p, q),
                               atol=1e-5)
    np.testing.assert_allclose(
        d["forward_kl"], np.sum(p * np.log(p / q), -1), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(
        d["reverse_kl"], np.sum(q * np.log(q / p), -1), rtol=1e-4, atol=1e-5)
    assert all(np.all(np.asarray(v) > 1e-3) for v in d.values())
  same = distill.token_divergences(jnp.asarray(t_logits),
                                   jnp.asarray(t_logits))
  for name, v in same.items():
    np.testing.assert_allclose(v, 0.0, atol=1e-5, err_msg=name)


def test_divergence_temperature_follows_the_decoding_mode():
  """Sampling at T: the divergences use T; greedy: greedy_temperature."""
  assert distill.DistillConfig(decode_temperature=0.7).temperature() == 0.7
  assert distill.DistillConfig(decode_temperature=0.0,
                               greedy_temperature=2.0).temperature() == 2.0


def test_each_divergence_has_finite_nonzero_gradients():
  """d(divergence)/d(student logits) is finite and non-zero for each
  divergence, at temperature 1 and at a low one."""
  rng = np.random.default_rng(1)
  s_logits = jnp.asarray(rng.normal(size=(2, 3, 11)) * 3, jnp.float32)
  t_logits = jnp.asarray(rng.normal(size=(2, 3, 11)) * 3, jnp.float32)
  for name in distill.DIVERGENCES:
    for temperature in (1.0, 0.3):
      grad = jax.grad(lambda s, n=name, t=temperature: jnp.sum(
          distill.token_divergences(s, t_logits, t)[n]))(s_logits)
      assert np.all(np.isfinite(grad)) and np.any(grad != 0), name


def test_the_step_moves_only_the_student(pair):
  """A step of the mix of all three divergences: finite, non-zero student
  gradients, every student leaf updated, the loss the weighted sum of the
  divergences; the teacher's parameters are not touched (the step never
  differentiates them)."""
  teacher, student = pair
  config = distill.DistillConfig(
      divergence="mix", mix={"forward_kl": 0.5, "reverse_kl": 0.2, "tv": 1.0})
  tx = optax.adam(1e-3)
  step = distill.make_distill_step(student.definition, teacher.definition,
                                   tx, config)
  params = jax.tree.map(jnp.array, student.params)
  state = steps.TrainState(jnp.int32(0), params, tx.init(params))
  before = jax.tree.map(np.asarray, student.params)
  teacher_before = jax.tree.map(np.asarray, teacher.params)
  state, sums = step(state, _batch(), teacher.params)
  assert np.isfinite(float(sums["grad_norm"])) and sums["grad_norm"] > 0
  expected = sum(w * float(sums[k]) for k, w in config.weights().items())
  np.testing.assert_allclose(float(sums["loss"]), expected, rtol=1e-5)
  moved = jax.tree.map(lambda a, b: np.any(np.asarray(a) != b), state.params,
                       before)
  assert all(jax.tree.leaves(moved))
  jax.tree.map(np.testing.assert_array_equal, teacher.params, teacher_before)


def test_onpolicy_rows_are_the_drafts_own_samples(pair):
  """onpolicy_fraction 0.5 of 4 rows: rows 0-1 are exactly what
  `generate(draft, temperature=1)` samples with the step's seeds (and not
  what the teacher samples with them: the negative control), weighted up
  to their EOS; a filler row (no input) keeps weight 0; rows 2-3 are the
  data's rows untouched."""
  teacher, student = pair
  config = distill.DistillConfig(onpolicy_fraction=0.5)
  onpolicy = distill.OnPolicyStep(student.definition, teacher.definition,
                                  optax.sgd(0.1), config, seed=3)
  batch = _batch()
  batch["inputs"][1] = 0
  batch["weights"][1] = 0
  out = onpolicy.onpolicy_batch(student.params, batch, step=5)
  seeds = np.random.default_rng(3 * 1_000_003 + 5).integers(0, 2**31 - 1, 2)
  inputs = batch["inputs"][:2].copy()
  inputs[1, 0] = 1
  drafted = generate(student, inputs, max_decode_len=8, temperature=1.0,
                     seed=seeds).tokens
  by_teacher = generate(teacher, inputs, max_decode_len=8, temperature=1.0,
                        seed=seeds).tokens
  np.testing.assert_array_equal(out["targets"][:2], drafted)
  assert np.any(np.asarray(by_teacher)[0] != out["targets"][0])
  expected = distill.rows_from_tokens(drafted)
  np.testing.assert_array_equal(out["weights"][0], expected["weights"][0])
  np.testing.assert_array_equal(out["decoder_inputs"][0, 1:],
                                out["targets"][0, :-1])
  assert out["weights"][1].sum() == 0
  for k in ("inputs", "targets", "decoder_inputs", "weights"):
    np.testing.assert_array_equal(out[k][2:], batch[k][2:], err_msg=k)


def test_tv_distillation_raises_agreement_on_the_drafts_samples(pair):
  """30 on-policy TV steps on 4 inputs lower the mean TV (1 - beta) on a
  fresh set of the draft's samples for the same inputs."""
  teacher, student = pair
  config = distill.DistillConfig(divergence="tv", decode_temperature=1.0)
  tx = optax.adam(3e-3)
  onpolicy = distill.OnPolicyStep(student.definition, teacher.definition, tx,
                                  config)
  batch = _batch(rows=4)
  params = jax.tree.map(jnp.array, student.params)
  state = steps.TrainState(jnp.int32(0), params, tx.init(params))

  def mean_tv(params):
    rows = onpolicy.onpolicy_batch(params, batch, step=10_000)
    sums = distill.distill_sums(
        distill._logits(student.definition, params, rows),  # pylint: disable=protected-access
        distill._logits(teacher.definition, teacher.params, rows),  # pylint: disable=protected-access
        rows["targets"], rows["weights"], config)
    return float(sums["tv"] / sums["tokens"])

  before = mean_tv(state.params)
  for _ in range(30):
    state, _ = onpolicy(state, batch, teacher.params)
  after = mean_tv(state.params)
  assert after < before - 0.05, (before, after)


@pytest.mark.parametrize("kwargs, message", [
    ({"divergence": "js"}, "not one of"),
    ({"divergence": "mix"}, "needs mix"),
    ({"divergence": "mix", "mix": {"tv": 1.0, "l2": 1.0}}, "needs mix"),
    ({"mix": {"tv": 1.0}}, "set divergence='mix'"),
    ({"onpolicy_fraction": 1.5}, "onpolicy_fraction"),
    ({"greedy_temperature": 0.0}, "greedy_temperature")])
def test_bad_configs_name_the_fix(kwargs, message):
  with pytest.raises(ValueError, match=message):
    distill.DistillConfig(**kwargs).check()
