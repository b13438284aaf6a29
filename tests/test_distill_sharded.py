"""The distillation step on 8 simulated CPU devices (see conftest.py),
placed by training/placement.py as scripts/train.py places it.

Invariant: under the decoding's mesh and logical axis rules (a 2x4 data x
model mesh: the frozen teacher's heads, MLP and vocabulary split over
`model`, the batch over `data`, the draft sharded by the same rules, its
optimizer state replicated) the step computes what it computes on one device: the same loss and
divergences and the same updated draft parameters, to float32 round-off.
The teacher's parameters really are split (a leaf holds a quarter of its
rows per device), so the equality is not that of two unsharded runs.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from specdec_jax import sharding
from specdec_jax.models import registry
from specdec_jax.training import distill
from specdec_jax.training import placement
from specdec_jax.training import steps


def _def_and_params(seed, **overrides):
  definition = registry.make_def(registry.get_config("t5_1_1_tiny",
                                                     **overrides))
  return definition, definition.init_params(jax.random.key(seed))


def test_sharded_step_equals_one_device_step():
  if len(jax.devices()) < 8:
    pytest.skip("needs XLA_FLAGS=--xla_force_host_platform_device_count=8")
  teacher_def, teacher_params = _def_and_params(0)
  student_def, student_params = _def_and_params(1, num_encoder_layers=1,
                                                num_decoder_layers=1)
  rng = np.random.default_rng(0)
  inputs = rng.integers(3, 100, (4, 6)).astype(np.int32)
  inputs[:, -1] = 1
  targets = rng.integers(3, 100, (4, 8)).astype(np.int32)
  targets[:, 5:] = 0
  targets[:, 4] = 1
  batch = {"inputs": inputs, **distill.rows_from_tokens(targets)}
  config = distill.DistillConfig(divergence="mix",
                                 mix={"tv": 1.0, "forward_kl": 0.5})
  tx = optax.adam(1e-3)

  def fresh_state():
    params = jax.tree.map(jnp.array, student_params)
    return steps.TrainState(jnp.int32(0), params, tx.init(params))

  one = distill.make_distill_step(student_def, teacher_def, tx, config)
  state_1, sums_1 = one(fresh_state(), batch, teacher_params)

  # Placed as train.py places a run on runs/cpu_8_model_parallel.gin.
  on_mesh = placement.Placement(None, sharding.make_mesh(data=2, model=4),
                                replicate_student=False)
  placed = (on_mesh.put_state(student_def, fresh_state()),
            on_mesh.put_batch(batch),
            jax.device_put(teacher_params, on_mesh.teacher_shardings(
                teacher_def, teacher_params)))
  kernel = placed[2]["decoder"]["layers_0"]["mlp"]["wi_0"]["kernel"]
  assert kernel.addressable_shards[0].data.shape[-1] == kernel.shape[-1] // 4
  sharded = distill.make_distill_step(student_def, teacher_def, tx, config)
  with on_mesh.context():
    state_8, sums_8 = sharded(*placed)
  for key in ("loss", "tv", "forward_kl", "reverse_kl", "tokens", "correct"):
    np.testing.assert_allclose(float(sums_8[key]), float(sums_1[key]),
                               rtol=2e-5, err_msg=key)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(
      np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6),
               sharding.gather(state_8.params), state_1.params)
