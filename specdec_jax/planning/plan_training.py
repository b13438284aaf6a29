"""Plan a draft's distillation step beside a sharded target, from shapes.

`plan_distill_step` compiles the step `scripts/train.py` runs for the same
gin files (`steps.step_for` of the `TrainConfig`: `distill.make_distill_step`
with its optimizer and its non-finite guard), placed as `train.py` places
it on the run's mesh (`training/placement.py`): the teacher
(`TrainConfig.teacher_config`, else `ExperimentConfig.target_config`; in
the run's dtype) sharded over `model` by the logical rules and frozen, the
student (`TrainConfig.model`) replicated or sharded
(`TrainConfig.replicate_student`) with its optimizer state, batch rows
(`DistillConfig.batch_size` x input_len / target_len) over `data`. From
abstract parameters: no weight is allocated, no checkpoint read. It reports the compiled program's memory per device against the
chip's HBM: the TPU compiler's own where the run names a TPU topology and
libtpu is installed, else XLA:CPU's with its float32 copies of bfloat16
weights taken out (`plan.memory_summary`).

  python scripts/plan_run.py \
    --gin_file=training/distill_t5_1_1_small_from_xxl.gin \
    --gin_file=runs/tpu_v4_8_model_parallel.gin --output=plan.json
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import checkpoints
from specdec_jax import sharding
from specdec_jax.experiments import fit
from specdec_jax.infra import chips
from specdec_jax.models import registry
from specdec_jax.planning import plan
from specdec_jax.planning import topology
from specdec_jax.experiments.experiment import ExperimentConfig
from specdec_jax.training import distill
from specdec_jax.training import steps
from specdec_jax.training.config import TrainConfig
from specdec_jax.training.placement import Placement


def _abstract(tree, shardings):
  return jax.tree.map(
      lambda s, h: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=h), tree,
      shardings)


def train_config_for(config: ExperimentConfig,
                     distill_config: distill.DistillConfig) -> TrainConfig:
  """The TrainConfig of a plan given a DistillConfig alone: the run's draft
  distilled from its target with Adafactor (T5's optimizer)."""
  return TrainConfig(model=config.draft_config, teacher="plan",
                     teacher_config=config.target_config,
                     optimizer="adafactor", learning_rate=1e-3,
                     schedule="constant", num_steps=1, workdir="plan",
                     onpolicy=distill_config,
                     replicate_student=distill_config.replicate_student)


def abstract_step_args(config: ExperimentConfig, train_config: TrainConfig):
  """(run shape, step, (state, batch, teacher_params, bad) as
  ShapeDtypeStructs placed as train.py places them)."""
  distill_config = train_config.onpolicy
  if distill_config is None:
    raise ValueError("planning a training step needs TrainConfig.onpolicy "
                     "(a distill.DistillConfig: the batch shapes and the "
                     "objective); bind it in the gin file.")
  distill_config.check()
  shape = fit.run_shape(config, distill_config.input_len)
  mesh = plan.mesh_for(shape)
  student = registry.make_def(train_config.model_config())
  teacher = shape.target
  if train_config.teacher_config is not None:
    # The teacher train.py loads: the TrainConfig's architecture in the
    # run's dtype (`TrainConfig.on_run`).
    teacher = registry.make_def(dataclasses.replace(
        checkpoints.resolve_config(train_config.teacher_config),
        **fit.dtype_overrides(config)))
  total = train_config.num_steps or 1
  _, tx, step = steps.step_for(train_config, student, total, teacher)
  placement = Placement(None, mesh, train_config.replicate_student)
  state = jax.eval_shape(lambda: steps.TrainState(
      jnp.int32(0), *(lambda p: (p, tx.init(p)))(
          student.init_params(jax.random.key(0)))))
  state = _abstract(state, placement.state_shardings(student, state))
  teacher_shapes = teacher.param_shapes()
  teacher_params = _abstract(
      teacher_shapes, placement.teacher_shardings(teacher, teacher_shapes))
  b = distill_config.batch_size
  rows = sharding.batch_sharding(mesh, b)
  width = {"inputs": distill_config.input_len}
  batch = {k: jax.ShapeDtypeStruct(
      (b, width.get(k, distill_config.target_len)),
      jnp.float32 if k == "weights" else jnp.int32, sharding=rows)
           for k in ("inputs", "decoder_inputs", "targets", "weights")}
  bad = jax.ShapeDtypeStruct((), jnp.int32, sharding=state.step.sharding)
  return dataclasses.replace(shape, target=teacher, draft=student), step, (
      state, batch, teacher_params, bad)


def plan_distill_step(config: ExperimentConfig,
                      train_config: TrainConfig | distill.DistillConfig,
                      chip: chips.Chip) -> dict[str, Any]:
  """Memory per device of one distillation step, compiled from shapes.

  Args:
    config: the run: its mesh, topology, dtype and target (the teacher).
    train_config: what scripts/train.py trains (its `onpolicy` gives the
      batch shapes), or a DistillConfig alone (`train_config_for`).
    chip: the chip whose HBM the peak is held against.

  Returns:
    JSON-ready: chip, mesh, models, dtype, batch shapes, parameter bytes
    per device, the compiled memory (`memory`), peak_bytes_per_device,
    hbm_bytes, fits, compile_seconds.
  """
  if isinstance(train_config, distill.DistillConfig):
    train_config = train_config_for(config, train_config)
  distill_config = train_config.onpolicy
  shape, step, args = abstract_step_args(config, train_config)
  start = time.perf_counter()
  compiled = plan._compile(step, *args)  # pylint: disable=protected-access
  seconds = time.perf_counter() - start
  devices, not_tpu = plan.target_devices(shape)
  memory = plan.memory_summary(compiled, devices[0].platform == "cpu")
  peak = memory["peak_bytes"]
  compiler = topology.compiler_name(devices)
  if not_tpu:
    compiler += f"; not the TPU compiler: {not_tpu}"
  state, _, teacher, _ = args

  def per_device(tree):
    return int(sum(
        np.prod(leaf.sharding.shard_shape(leaf.shape)) * leaf.dtype.itemsize
        for leaf in jax.tree.leaves(tree)))

  return {
      "kind": "distill_step", "compiler": compiler,
      "device_kind": devices[0].device_kind, "topology": shape.topology,
      "chip": chip.name,
      "devices": int(np.prod(shape.mesh_shape)),
      "mesh_shape": list(shape.mesh_shape),
      "teacher": repr(train_config.teacher_config or config.target_config),
      "student": repr(train_config.model),
      "optimizer": train_config.optimizer,
      "dtype": shape.target.config.param_dtype,
      "divergence": distill_config.divergence,
      "batch": distill_config.batch_size,
      "input_len": distill_config.input_len,
      "target_len": distill_config.target_len,
      "replicate_student": train_config.replicate_student,
      "param_bytes_per_device": {"teacher": per_device(teacher),
                                 "student": per_device(state.params),
                                 "optimizer": per_device(state.opt_state)},
      "memory": memory, "peak_bytes_per_device": int(peak),
      "hbm_bytes": int(chip.hbm_bytes), "fits": bool(peak <= chip.hbm_bytes),
      "compile_seconds": seconds}
