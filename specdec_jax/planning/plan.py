"""Plan a run before paying for it: memory, collectives and a roofline.

From an `ExperimentConfig` alone (no checkpoint is read, no weight is
allocated) this builds abstract parameters (`jax.ShapeDtypeStruct`s with the
run's `NamedSharding`s), lowers and compiles the run's jitted loops
(`engine.build_generate`, `engine.build_speculative`) on devices shaped like
the run's mesh (simulated CPU devices when planning off the accelerator),
and reads off what the compiler knows:

  memory       `memory_analysis()` per device: arguments, outputs, temporaries.
  collectives  the optimized HLO: every all-reduce/all-gather/... inside the
               decoding loop, per iteration (one target call) and per draft
               step (the inner scan).
  costs        `cost_analysis()` of one target step, one verification of
               gamma + 1 tokens and one draft step, each compiled on its own
               (a while loop's body is counted once, so the loops cannot give
               per-step costs).

CPU artefacts. XLA:CPU computes bfloat16 dots in float32 and materialises a
float32 copy of every bfloat16 weight (hoisted out of the loop, so the
copies are live the whole time): the CPU's temporaries hold about twice the
weights' bytes that a TPU or GPU never allocates, and the step programs'
bytes accessed include the copies' writes and reads. `cpu_convert_bytes`
finds those converts in the HLO; the figures used for fitting and for the
roofline take them out (`*_tpu` / `bytes_accessed`), and `estimate` checks
the remainder against a count from shapes (parameters + caches).

`check_fits` is the cheap half: shapes only, no compile. `run_experiment`
calls it on real accelerators before loading anything.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import sampling
from specdec_jax import sharding
from specdec_jax import theory
from specdec_jax.decoding import engine
from specdec_jax.experiments import chips
from specdec_jax.experiments import fit
from specdec_jax.experiments.experiment_config import ExperimentConfig
from specdec_jax.experiments.fit import RunShape
from specdec_jax.experiments.fit import cache_shapes
from specdec_jax.planning import hlo
from specdec_jax.planning import paper


# A step that accesses more than this many times its weights' bytes is
# flagged (e.g. a cache copied instead of updated in place).
BYTES_RATIO_FLAG = 2.0


# ----------------------------------------------------------------------------
# Compiling from abstract shapes.


def _mesh(shape: RunShape):
  data, model = shape.mesh_shape
  return sharding.make_mesh(data, model)


def abstract_params(definition, mesh, replicate: bool = False) -> Any:
  shapes = definition.param_shapes()
  shards = sharding.param_shardings(definition, shapes, mesh,
                                    replicate=replicate)
  return jax.tree.map(
      lambda s, h: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=h),
      shapes, shards)


def _abstract_cache(definition, params, shape: RunShape, mesh) -> Any:
  positions = shape.max_decode_len + shape.gamma + 1
  cache = cache_shapes(definition, params, shape.batch, shape.input_len,
                       positions)
  specs = definition.cache_logical_axes(cache)

  def place(leaf, spec):
    # Dimensions that do not divide stay whole (a batch of 1 on `data`), as
    # `sharding.batch_sharding` does for the inputs.
    axes = [a if a is None or d % int(np.prod(
        [mesh.shape[x] for x in (a if isinstance(a, tuple) else (a,))])) == 0
            else None
            for d, a in zip(leaf.shape, tuple(sharding.logical_to_mesh(spec)))]
    return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=(
        jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*axes))))

  return jax.tree.map(place, cache, specs, is_leaf=lambda x: isinstance(
      x, jax.sharding.PartitionSpec))


def _compile(fn, *args):
  mesh = next(a.sharding.mesh for a in jax.tree.leaves(args))
  with jax.set_mesh(mesh), nn.logical_axis_rules(sharding.logical_axis_rules()):
    return fn.lower(*args).compile()


def _cost(compiled) -> dict[str, float]:
  cost = compiled.cost_analysis()
  if isinstance(cost, (list, tuple)):
    cost = cost[0]
  return {"flops": float(cost.get("flops", 0.0)),
          "bytes_accessed_cpu": float(cost.get("bytes accessed", 0.0))}


def _memory(compiled) -> dict[str, int]:
  m = compiled.memory_analysis()
  return {"argument_bytes": int(m.argument_size_in_bytes),
          "output_bytes": int(m.output_size_in_bytes),
          "temp_bytes": int(m.temp_size_in_bytes),
          "alias_bytes": int(m.alias_size_in_bytes)}


# ----------------------------------------------------------------------------
# The plan.


def _inputs(shape: RunShape, mesh) -> list[jax.ShapeDtypeStruct]:
  rows = sharding.batch_sharding(mesh, shape.batch)
  return [jax.ShapeDtypeStruct((shape.batch, shape.input_len), jnp.int32,
                               sharding=rows),
          jax.ShapeDtypeStruct((shape.batch,), jnp.int32, sharding=rows),
          jax.ShapeDtypeStruct((shape.batch,), jnp.int32, sharding=rows)]


def step_cost(definition, params, cache, num_tokens: int) -> dict[str, Any]:
  """Compiles one cached `extend` of `num_tokens` tokens on its own (cache
  donated, as the loop updates it in place) for the backend of `params`
  (arrays or ShapeDtypeStructs with shardings): flops, bytes, collectives.

  `bytes_accessed` takes out XLA:CPU's float32 weight copies (0 elsewhere).
  """
  leaf = jax.tree.leaves(cache)[0]
  batch = leaf.shape[0]
  rows = getattr(leaf, "sharding", None)
  if isinstance(rows, jax.sharding.NamedSharding):
    rows = sharding.batch_sharding(rows.mesh, batch)
  ids = jax.ShapeDtypeStruct((batch, num_tokens), jnp.int32, sharding=rows)
  fn = jax.jit(definition.extend, donate_argnums=1)
  if isinstance(rows, jax.sharding.NamedSharding):
    compiled = _compile(fn, params, cache, ids, ids)
  else:
    compiled = fn.lower(params, cache, ids, ids).compile()
  text = compiled.as_text()
  out = _cost(compiled)
  out["cpu_convert_bytes"] = hlo.cpu_convert_bytes(text)
  # A converted weight of n elements costs the CPU 2n (read bf16) + 4n
  # (write f32) + 4n (the dot reads f32) bytes where an accelerator reads
  # 2n: 8n = 2 x the copies' bytes more.
  extra = 2 * out["cpu_convert_bytes"]
  out["bytes_accessed"] = max(out["bytes_accessed_cpu"] - extra, 0.0)
  out["collectives"] = hlo.program_collectives(text)
  return out


def _step(definition, params, shape: RunShape, mesh, num_tokens: int
          ) -> dict[str, Any]:
  cache = _abstract_cache(definition, params, shape, mesh)
  return step_cost(definition, params, cache, num_tokens)


def _collective_seconds(collectives, chip: chips.Chip, parts: int) -> float:
  """Ring-algorithm bandwidth time of `collectives` (latency ignored)."""
  if parts <= 1:
    return 0.0
  factor = {"all-reduce": 2 * (parts - 1) / parts,
            "all-gather": (parts - 1) / parts,
            "reduce-scatter": (parts - 1) / parts}
  return sum(c["count"] * c["bytes"] * factor.get(c["kind"], 1.0)
             for c in collectives) / chip.interconnect_bytes_per_s


def roofline_seconds(step: dict, chip: chips.Chip, parts: int) -> float:
  """max(compute, HBM traffic) + collectives: a bound, not a measurement."""
  return (max(step["flops"] / chip.bf16_flops,
              step["bytes_accessed"] / chip.hbm_bytes_per_s)
          + _collective_seconds(step["collectives"], chip, parts))


def paper_row(config: ExperimentConfig):
  """(gamma, alpha, speedup) of the paper's Table 2 row this config is, or
  None (matched on task, draft size and temperature)."""
  task = "cnndm" if "cnn" in config.task else "ende" if "ende" in \
      config.task else None
  draft = str(config.draft_config)
  for size in ("small", "base", "large"):
    if draft.endswith(size):
      return paper.TABLE2.get((task, f"t5_{size}", int(config.temperature)))
  return None


_COMPILED: dict = {}


def _loop_summary(compiled) -> dict[str, Any]:
  """Per-device memory and loop collectives of a compiled decoding loop."""
  text = compiled.as_text()
  memory = _memory(compiled)
  memory["cpu_convert_bytes"] = hlo.cpu_convert_bytes(text)
  memory["peak_bytes_cpu"] = (memory["argument_bytes"] +
                              memory["output_bytes"] + memory["temp_bytes"]
                              - memory["alias_bytes"])
  # Without the CPU's float32 weight copies; never below what the arguments
  # alone hold (the copies share buffers with other temporaries, so
  # subtracting them can undershoot).
  memory["peak_bytes"] = max(
      memory["peak_bytes_cpu"] - memory["cpu_convert_bytes"],
      memory["argument_bytes"] + memory["output_bytes"])
  return {"memory": memory, "collectives": hlo.loop_collectives(text)}


def compile_programs(shape: RunShape) -> dict[str, Any]:
  """Compiles the loops and step programs of `shape`: chip-independent."""
  mesh = _mesh(shape)
  tparams = abstract_params(shape.target, mesh)
  dparams = abstract_params(shape.draft, mesh, replicate=shape.replicate_draft)
  sampler = sampling.SamplingConfig(shape.temperature, shape.top_k,
                                    shape.top_p)
  inputs = _inputs(shape, mesh)
  started = time.perf_counter()
  out: dict[str, Any] = {}
  # Programs that several rows share (the target's loop and steps) are
  # compiled once per process.
  common = (shape.mesh_shape, shape.input_len, shape.batch,
            shape.max_decode_len)

  def memo(key, make):
    if key not in _COMPILED:
      _COMPILED[key] = make()
    return _COMPILED[key]

  out["generate"] = memo(("generate", shape.target, sampler, common),
                         lambda: _loop_summary(_compile(engine.build_generate(
                             shape.target, shape.max_decode_len, sampler),
                                                        tparams, *inputs)))
  out["speculative"] = _loop_summary(_compile(engine.build_speculative(
      shape.target, shape.draft, shape.gamma, shape.max_decode_len, sampler,
      draft_replicated=shape.replicate_draft), tparams, dparams, *inputs))
  out["target_step"] = memo(
      ("step", shape.target, False, 1, shape.gamma, common),
      lambda: _step(shape.target, tparams, shape, mesh, 1))
  out["verify_step"] = memo(
      ("step", shape.target, False, shape.gamma + 1, shape.gamma, common),
      lambda: _step(shape.target, tparams, shape, mesh, shape.gamma + 1))
  # A replicated draft's step is compiled on one device: passing its cache
  # replicated on the mesh would add all-gathers the loop does not have (the
  # loop keeps the cache as the model's constraints lay it out); its
  # communication is taken from the loop's inner steps (see `project`).
  if shape.replicate_draft:
    one = dataclasses.replace(shape, mesh_shape=(1, 1))
    draft_mesh = _mesh(one)
    draft_step = lambda: _step(shape.draft, abstract_params(  # noqa: E731
        shape.draft, draft_mesh, replicate=True), one, draft_mesh, 1)
  else:
    draft_step = lambda: _step(shape.draft, dparams, shape, mesh, 1)  # noqa: E731
  out["draft_step"] = memo(
      ("step", shape.draft, shape.replicate_draft, 1, shape.gamma, common),
      draft_step)
  out["compile_seconds"] = time.perf_counter() - started
  return out


def project(config: ExperimentConfig, shape: RunShape, programs: dict,
            chip: chips.Chip) -> dict[str, Any]:
  """The plan's JSON: memory against the chip, collectives, roofline."""
  est = fit.estimate(shape)
  parts = shape.mesh_shape[1]
  spec_mem = programs["speculative"]["memory"]
  # Per device: the larger of the compiled programs' peak (CPU float32
  # weight copies taken out) and the count from shapes.
  peak = max(spec_mem["peak_bytes"],
             programs["generate"]["memory"]["peak_bytes"], est["total_bytes"])
  t_step = roofline_seconds(programs["target_step"], chip, parts)
  t_verify = roofline_seconds(programs["verify_step"], chip, parts)
  # The draft step's communication is the loop's (its cache is laid out
  # there by the model's constraints, which a standalone step's replicated
  # input cache does not reproduce for a replicated draft).
  inner = programs["speculative"]["collectives"]["per_inner_step"]
  t_draft = roofline_seconds(dict(programs["draft_step"], collectives=inner),
                             chip, parts)
  c, verify_cost = t_draft / t_step, t_verify / t_step
  row = paper_row(config)
  alpha = row[1] if row else None
  steps = {}
  for name in ("target_step", "verify_step", "draft_step"):
    step = dict(programs[name])
    definition = shape.draft if name == "draft_step" else shape.target
    spec = None if (name == "draft_step" and shape.replicate_draft) else \
        definition.param_logical_axes()
    weights = fit.decoder_weights(definition.param_shapes())
    if spec is not None:
      spec = fit.decoder_weights(spec)
    step["weight_bytes"] = fit.shard_bytes(weights, spec, shape.mesh_shape)
    step["bytes_over_weights"] = step["bytes_accessed"] / step["weight_bytes"]
    step["flagged"] = step["bytes_over_weights"] > BYTES_RATIO_FLAG
    steps[name] = step
  hbm = chip.hbm_bytes
  out = {
      "chip": chip.name, "devices": int(np.prod(shape.mesh_shape)),
      "mesh_shape": list(shape.mesh_shape),
      "target": repr(config.target_config), "draft": repr(config.draft_config),
      "dtype": shape.target.config.param_dtype, "gamma": shape.gamma,
      "max_decode_len": shape.max_decode_len, "input_len": shape.input_len,
      "batch": shape.batch, "temperature": shape.temperature,
      "replicate_draft": shape.replicate_draft,
      "param_bytes_per_device": {"target": est["target_param_bytes"],
                                 "draft": est["draft_param_bytes"]},
      "param_bytes_total": {"target": est["target_param_bytes_total"],
                            "draft": est["draft_param_bytes_total"]},
      "peak_bytes_per_device": peak,
      "memory": {"generate": programs["generate"]["memory"],
                 "speculative": spec_mem, "shape_estimate": est},
      "hbm_bytes": hbm, "fits": bool(peak <= hbm),
      "loop_collectives": {
          "generate_per_target_call":
              programs["generate"]["collectives"]["per_iteration"],
          "speculative_per_iteration":
              programs["speculative"]["collectives"]["per_iteration"],
          "speculative_per_draft_step":
              programs["speculative"]["collectives"]["per_inner_step"]},
      "collectives_per_iteration": {
          "target_call": sum(c["count"] for c in programs["generate"][
              "collectives"]["per_iteration"]),
          "speculative": sum(c["count"] for c in programs["speculative"][
              "collectives"]["per_iteration"]) + (shape.gamma - 1) * sum(
                  c["count"] for c in inner)},
      "steps": steps,
      "target_step_seconds": t_step, "verify_seconds": t_verify,
      "draft_step_seconds": t_draft, "c": c, "verify_cost": verify_cost,
      "alpha_paper": alpha,
      "predicted_speedup": None if alpha is None else float(
          theory.walltime_improvement_measured(alpha, shape.gamma, c,
                                               verify_cost)),
      "predicted_speedup_v1": None if alpha is None else float(
          theory.walltime_improvement(alpha, shape.gamma, c)),
      "paper_speedup": row[2] if row else None,
      "compile_seconds": programs["compile_seconds"],
  }
  return out


def plan(config: ExperimentConfig, chip: chips.Chip,
         input_len: int | None = None) -> dict[str, Any]:
  """Checks the fit from shapes (raising before any compile), then compiles
  and projects. Needs as many devices as the run's mesh."""
  fit.check_fits(config, chip)
  shape = fit.run_shape(config, input_len)
  return project(config, shape, compile_programs(shape), chip)


def decoder_step_bytes(shape: RunShape) -> dict[str, int]:
  """Weight bytes per device one decoder step of each model reads (no
  compile): the roofline's numerator, for projections made before a run."""
  out = {}
  for role, definition in (("target", shape.target), ("draft", shape.draft)):
    replicate = role == "draft" and shape.replicate_draft
    spec = None if replicate else fit.decoder_weights(
        definition.param_logical_axes())
    out[role] = fit.shard_bytes(fit.decoder_weights(definition.param_shapes()), spec,
                             shape.mesh_shape)
  return out
