"""Planning a distillation step from abstract shapes
(specdec_jax/planning/plan_training.py).

Invariants: the step compiles from shapes alone on a 1x4 mesh and on one
device; the teacher's parameters per device are a quarter of the
one-device figure (plus the whole layer-norm scales) (it is sharded over `model`), the replicated student's
are the same on both; the peak per device is positive, at least the
arguments it holds, and fits a v4 chip for tiny models; the shipped
T5-small-from-XXL config parses into that planner's inputs and into the
TrainConfig scripts/train.py runs on the same mesh.
"""

import os

import gin
import jax
import pytest

from specdec_jax.infra import chips
from specdec_jax.experiments import experiment
from specdec_jax.launch import gin_flags
from specdec_jax.planning import plan_training
from specdec_jax.training import distill
from specdec_jax.training import train

V4 = chips.get_chip("tpu_v4")


def _config(mesh_shape):
  return experiment.ExperimentConfig(
      task="wmt14_ende_local", target="t5_1_1_tiny", draft="t5_1_1_tiny",
      target_config="t5_1_1_tiny", draft_config="t5_1_1_tiny",
      dtype="bfloat16", mesh_shape=mesh_shape)


def test_distill_step_plan_shards_the_teacher():
  if len(jax.devices()) < 4:
    pytest.skip("needs XLA_FLAGS=--xla_force_host_platform_device_count=8")
  config = distill.DistillConfig(batch_size=4, input_len=16, target_len=8)
  one, four = (plan_training.plan_distill_step(_config(m), config, V4)
               for m in ((1, 1), (1, 4)))
  params_1, params_4 = (p["param_bytes_per_device"] for p in (one, four))
  # A quarter, but for the layer norms' scales, which stay whole.
  assert params_1["teacher"] / 4 <= params_4["teacher"] < 0.27 * params_1[
      "teacher"]
  assert params_4["student"] == params_1["student"] > 0
  for p in (one, four):
    m = p["memory"]
    assert p["peak_bytes_per_device"] >= m["argument_bytes"] > 0
    assert p["fits"] and p["kind"] == "distill_step"


def test_the_xxl_plan_config_parses_into_what_train_runs():
  """The files plan_run plans are the files train.py trains with: its
  TrainConfig distils the plan's draft from the plan's target with the
  plan's DistillConfig, on the run file's (1, 4) mesh, teacher in
  bfloat16."""
  gin.clear_config()
  try:
    gin_flags.parse([os.path.join("training",
                                  "distill_t5_1_1_small_from_xxl.gin"),
                     os.path.join("runs", "tpu_v4_8_model_parallel.gin")], [])
    config = gin.get_configurable(experiment.ExperimentConfig)()
    distill_config = gin.get_configurable(distill.DistillConfig)()
    training = gin.get_configurable(train.TrainConfig)().on_run(
        **gin_flags.run_settings())
  finally:
    gin.clear_config()
  assert (config.target_config, config.draft_config) == ("t5_1_1_xxl",
                                                         "t5_1_1_small")
  assert tuple(config.mesh_shape) == (1, 4) and config.dtype == "bfloat16"
  distill_config.check()
  assert training.onpolicy == distill_config
  assert (training.teacher_config, training.model) == (
      config.target_config, config.draft_config)
  assert training.mesh_shape == (1, 4)
  assert training.teacher_dtype == "bfloat16"
  assert training.batch_size == distill_config.batch_size
  assert training.length_buckets == (distill_config.input_len,)
