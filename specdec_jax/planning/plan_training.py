"""Plan a draft's distillation step beside a sharded target, from shapes.

`plan_distill_step` compiles `distill.make_distill_step` from abstract
parameters (no weight is allocated, no checkpoint read) on devices shaped
like the run's mesh, exactly as `plan.py` compiles the decoding loops: the
teacher (`ExperimentConfig.target_config`) sharded over `model` by the
logical rules and frozen, the draft (`draft_config`) replicated or sharded
(`DistillConfig.replicate_student`) with an Adafactor state, batch rows
(`DistillConfig.batch_size` x input_len / target_len) over `data`, both in
the run's dtype. It reports the compiled program's memory per device
against the chip's HBM: the TPU compiler's own where the run names a TPU
topology and libtpu is installed, else XLA:CPU's with its float32 copies of
bfloat16 weights taken out (`plan.memory_summary`).

  python scripts/plan_run.py \
    --gin_file=training/distill_t5_1_1_small_from_xxl.gin \
    --gin_file=runs/tpu_v4_8_model_parallel.gin --output=plan.json
"""

from __future__ import annotations

import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from specdec_jax import sharding
from specdec_jax.experiments import fit
from specdec_jax.infra import chips
from specdec_jax.planning import plan
from specdec_jax.planning import topology
from specdec_jax.experiments.experiment import ExperimentConfig
from specdec_jax.training import distill
from specdec_jax.training import steps


def _replicated(tree, mesh):
  rep = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  return jax.tree.map(
      lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=rep), tree)


def abstract_step_args(config: ExperimentConfig,
                       distill_config: distill.DistillConfig, tx):
  """(step function, (state, batch, teacher_params) as ShapeDtypeStructs)."""
  distill_config.check()
  shape = fit.run_shape(config, distill_config.input_len)
  mesh = plan.mesh_for(shape)
  teacher = plan.abstract_params(shape.target, mesh)
  student = plan.abstract_params(shape.draft, mesh,
                                 replicate=distill_config.replicate_student)
  opt_state = _replicated(jax.eval_shape(tx.init, student), mesh)
  state = steps.TrainState(
      _replicated(jax.ShapeDtypeStruct((), jnp.int32), mesh), student,
      opt_state)
  b = distill_config.batch_size
  rows = sharding.batch_sharding(mesh, b)
  width = {"inputs": distill_config.input_len}
  batch = {k: jax.ShapeDtypeStruct(
      (b, width.get(k, distill_config.target_len)),
      jnp.float32 if k == "weights" else jnp.int32, sharding=rows)
           for k in ("inputs", "decoder_inputs", "targets", "weights")}
  step = distill.make_distill_step(shape.draft, shape.target, tx,
                                   distill_config)
  return shape, step, (state, batch, teacher)


def plan_distill_step(config: ExperimentConfig,
                      distill_config: distill.DistillConfig,
                      chip: chips.Chip) -> dict[str, Any]:
  """Memory per device of one distillation step, compiled from shapes.

  Returns:
    JSON-ready: chip, mesh, models, dtype, batch shapes, parameter bytes
    per device, the compiled memory (`memory`), peak_bytes_per_device,
    hbm_bytes, fits, compile_seconds.
  """
  tx = optax.adafactor(1e-3)
  shape, step, args = abstract_step_args(config, distill_config, tx)
  start = time.perf_counter()
  compiled = plan._compile(step, *args)  # pylint: disable=protected-access
  seconds = time.perf_counter() - start
  devices, not_tpu = plan.target_devices(shape)
  memory = plan.memory_summary(compiled, devices[0].platform == "cpu")
  peak = memory["peak_bytes"]
  compiler = topology.compiler_name(devices)
  if not_tpu:
    compiler += f"; not the TPU compiler: {not_tpu}"
  state, _, teacher = args

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
      "teacher": repr(config.target_config),
      "student": repr(config.draft_config),
      "dtype": shape.target.config.param_dtype,
      "divergence": distill_config.divergence,
      "batch": distill_config.batch_size,
      "input_len": distill_config.input_len,
      "target_len": distill_config.target_len,
      "replicate_student": distill_config.replicate_student,
      "param_bytes_per_device": {"teacher": per_device(teacher),
                                 "student": per_device(state.params),
                                 "optimizer": per_device(state.opt_state)},
      "memory": memory, "peak_bytes_per_device": int(peak),
      "hbm_bytes": int(chip.hbm_bytes), "fits": bool(peak <= chip.hbm_bytes),
      "compile_seconds": seconds}
