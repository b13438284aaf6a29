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
roofline take them out (`*_tpu` / `bytes_accessed`), and the plan records
the compiler's peak beside the memory model's count from shapes
(`memory.footprint`: parameters, caches, activations per device).

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
from specdec_jax.infra import chips
from specdec_jax.experiments import fit
from specdec_jax.experiments.experiment_config import ExperimentConfig
from specdec_jax.experiments.fit import RunShape
from specdec_jax.memory import footprint
from specdec_jax.planning import hlo
from specdec_jax.planning import paper
from specdec_jax.planning import topology


# A step that accesses more than this many times its weights' bytes is
# flagged (e.g. a cache copied instead of updated in place).
BYTES_RATIO_FLAG = 2.0
# Where no alpha is published for a pair (T5Gemma), the plan projects the
# speedup over this range instead: the paper's T5-XXL pairs had 0.62-0.82
# (Table 3), its LaMDA pairs 0.57-0.75.
SWEEP_ALPHAS = (0.5, 0.6, 0.7, 0.8, 0.9)


# ----------------------------------------------------------------------------
# Compiling from abstract shapes.


def target_devices(shape: RunShape) -> tuple[tuple, str | None]:
  """(devices, why not a TPU) the programs of `shape` compile for: the TPU
  slice it names where libtpu is installed, else this process's devices
  (simulated CPU devices when planning), with the reason."""
  if shape.topology is None:
    return tuple(jax.devices()), None
  missing = topology.libtpu_missing()
  if missing:
    return tuple(jax.devices()), missing
  return topology.devices(shape.topology), None


def mesh_for(shape: RunShape):
  data, model = shape.mesh_shape
  return sharding.make_mesh(data, model, devices=target_devices(shape)[0])


def abstract_params(definition, mesh, replicate: bool = False) -> Any:
  shapes = definition.param_shapes()
  shards = sharding.param_shardings(definition, shapes, mesh,
                                    replicate=replicate)
  return jax.tree.map(
      lambda s, h: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=h),
      shapes, shards)


def _abstract_cache(definition, params, shape: RunShape, mesh) -> Any:
  del params  # the definition's own shapes
  cache = footprint.cache_shapes(definition, shape.batch, shape.input_len,
                                 shape.positions)
  specs = definition.cache_logical_axes(cache)
  mesh_shape = (mesh.shape["data"], mesh.shape["model"])

  def place(leaf, spec):
    # Dimensions that do not divide stay whole (a batch of 1 on `data`), as
    # `sharding.batch_sharding` does for the inputs.
    return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=(
        jax.sharding.NamedSharding(mesh, footprint.mesh_axes(
            leaf.shape, spec, mesh_shape))))

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


def _on_cpu(tree) -> bool:
  leaf = jax.tree.leaves(tree)[0]
  device = next(iter(leaf.sharding.device_set)) if hasattr(
      leaf, "sharding") and leaf.sharding is not None else jax.devices()[0]
  return device.platform == "cpu"


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

  `bytes_accessed` is the compiler's own figure, less XLA:CPU's float32
  weight copies on a CPU. A TPU's figure also counts the compiler's
  HBM-to-VMEM prefetches (several times the weights): a plan's roofline
  takes its bytes from shapes instead (`step_bytes_from_shapes`).
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
  out["cpu_convert_bytes"] = (hlo.cpu_convert_bytes(text)
                              if _on_cpu(params) else 0)
  # A converted weight of n elements costs the CPU 2n (read bf16) + 4n
  # (write f32) + 4n (the dot reads f32) bytes where an accelerator reads
  # 2n: 8n = 2 x the copies' bytes more.
  extra = 2 * out["cpu_convert_bytes"]
  out["bytes_accessed"] = max(out["bytes_accessed_cpu"] - extra, 0.0)
  out["collectives"] = hlo.program_collectives(text)
  out["memory"] = memory_summary(compiled, _on_cpu(params), text)
  return out


def _step(definition, params, shape: RunShape, mesh, num_tokens: int,
          replicated: bool = False) -> dict[str, Any]:
  cache = _abstract_cache(definition, params, shape, mesh)
  out = step_cost(definition, params, cache, num_tokens)
  out["bytes_from_shapes"] = step_bytes_from_shapes(
      definition, shape, replicated)
  return out


def step_bytes_from_shapes(definition, shape: RunShape,
                           replicated: bool = False) -> int:
  """Bytes per device one cached decoder call must read from HBM: its
  decoder weights and its caches (self- and cross-attention), counted from
  shapes and the run's sharding. The roofline's numerator on every
  backend: compilers' own counts differ in what they include."""
  return (footprint.param_bytes(definition, shape.mesh_shape, replicated,
                                decoder_only=True) +
          sum(footprint.cache_bytes(definition, shape.batch, shape.input_len,
                                    shape.positions, shape.mesh_shape,
                                    replicated)))


def _collective_seconds(collectives, chip: chips.Chip, parts: int) -> float:
  """Ring-algorithm bandwidth time of `collectives` (latency ignored)."""
  if parts <= 1:
    return 0.0
  factor = {"all-reduce": 2 * (parts - 1) / parts,
            "all-gather": (parts - 1) / parts,
            "reduce-scatter": (parts - 1) / parts}
  return sum(c["count"] * c["bytes"] * factor.get(c["kind"], 1.0)
             for c in collectives) / chip.interconnect_bytes_per_s


def roofline_seconds(step: dict, chip: chips.Chip, parts: int,
                     num_bytes: float) -> float:
  """max(compute, HBM traffic of `num_bytes`) + collectives: a bound, not a
  measurement. Plans pass `step["bytes_from_shapes"]`; on a real device
  `benchmarks/gpu.py` passes its compiler's `step["bytes_accessed"]`."""
  return (max(step["flops"] / chip.bf16_flops,
              num_bytes / chip.hbm_bytes_per_s)
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


# What no published table gives for T5: how often a token tree's second,
# third and fourth child is accepted once its elder siblings were rejected.
# Measured with the shipped demo models (draft_base drafting for the demo
# target, a (4, 4, 1, ...) tree on 64 Multi30k train sentences, ranks 1-3
# pooled over depths 1-2) by `benchmarks/trees.py` on 2026-12-04
# (docs/benchmarks.md, "Token trees"), by temperature (0, and 1 for any
# sampled row). A projected tree row takes rank 0 from the paper's alpha.
TREE_SIBLING_PROFILE = {0: (0.238, 0.140, 0.102), 1: (0.251, 0.165, 0.121)}


def tree_rank_rates(alpha: float, temperature: float,
                    depth: int) -> tuple[np.ndarray, str]:
  """Per-rank acceptance [depth, 4] of a projected tree row (rank 0: the
  paper's `alpha` at every depth; ranks 1-3: `TREE_SIBLING_PROFILE`) and
  a line saying so (`theory.tree_node_probabilities`)."""
  siblings = TREE_SIBLING_PROFILE[0 if temperature == 0 else 1]
  rates = np.tile([alpha, *siblings], (depth, 1))
  return rates, (
      f"rank 0 at every depth: the paper's alpha ({alpha}); ranks 1-3: the "
      f"demo models' sibling profile {list(siblings)} (benchmarks/trees.py)")


_COMPILED: dict = {}


def smallest_cache_leaf_bytes(shape: RunShape) -> int:
  """Bytes per device of the smallest key or value cache of either model: a
  copy this large inside a loop is a cache not updated in place."""
  out = []
  for definition, replicated in ((shape.target, False),
                                 (shape.draft, shape.replicate_draft)):
    # Keys and values ([B, N, H, S] / [B, N, S, H]), not the cache's
    # per-row indices.
    out += footprint.cache_bytes(definition, shape.batch, shape.input_len,
                                 shape.positions, shape.mesh_shape,
                                 replicated, min_rank=3)
  return min(out)


def _cache_copy_filter(shape: RunShape) -> tuple[int, str]:
  """(min bytes, HLO element type) of a copy that is a whole cache."""
  dtype = jnp.dtype(shape.target.config.dtype)
  return (smallest_cache_leaf_bytes(shape),
          "bf16" if dtype == jnp.bfloat16 else f"f{dtype.itemsize * 8}")


def _loop_summary(compiled, on_cpu: bool, cache_bytes: tuple[int, str]
                  ) -> dict[str, Any]:
  """Per-device memory and loop collectives of a compiled decoding loop,
  the cache-sized copies its loops make (`hlo.loop_copies`) and its host
  callbacks: what the design promises not to do.

  `peak_bytes` is the compiler's arguments + outputs + temporaries - aliased
  on a TPU; on a CPU, without XLA:CPU's float32 weight copies (and never
  below what the arguments alone hold: the copies share buffers with other
  temporaries, so subtracting them can undershoot).
  """
  text = compiled.as_text()
  return {"memory": memory_summary(compiled, on_cpu, text),
          "collectives": hlo.loop_collectives(text),
          "cache_copies": hlo.loop_copies(text, *cache_bytes),
          "host_callbacks": hlo.host_callbacks(text)}


def memory_summary(compiled, on_cpu: bool, text: str | None = None
                   ) -> dict[str, int]:
  """The compiler's memory per device, and `peak_bytes` (see
  `_loop_summary`)."""
  memory = _memory(compiled)
  compiled_peak = (memory["argument_bytes"] + memory["output_bytes"] +
                   memory["temp_bytes"] - memory["alias_bytes"])
  if not on_cpu:
    memory["peak_bytes"] = compiled_peak
    return memory
  text = compiled.as_text() if text is None else text
  memory["cpu_convert_bytes"] = hlo.cpu_convert_bytes(text)
  memory["peak_bytes_cpu"] = compiled_peak
  memory["peak_bytes"] = max(
      compiled_peak - memory["cpu_convert_bytes"],
      memory["argument_bytes"] + memory["output_bytes"] -
      memory["alias_bytes"])
  return memory


def compile_programs(shape: RunShape) -> dict[str, Any]:
  """Compiles the loops and step programs of `shape`: chip-independent."""
  devices, not_tpu = target_devices(shape)
  on_cpu = devices[0].platform == "cpu"
  mesh = sharding.make_mesh(*shape.mesh_shape, devices=devices)
  tparams = abstract_params(shape.target, mesh)
  dparams = abstract_params(shape.draft, mesh, replicate=shape.replicate_draft)
  sampler = sampling.SamplingConfig(shape.temperature, shape.top_k,
                                    shape.top_p)
  inputs = _inputs(shape, mesh)
  cache_bytes = _cache_copy_filter(shape)
  started = time.perf_counter()
  out: dict[str, Any] = {}
  # Programs that several rows share (the target's loop and steps) are
  # compiled once per process.
  common = (shape.mesh_shape, shape.input_len, shape.batch,
            shape.max_decode_len, devices[0].platform, shape.topology)

  def memo(key, make):
    if key not in _COMPILED:
      _COMPILED[key] = make()
    return _COMPILED[key]

  out["generate"] = memo(("generate", shape.target, sampler, common),
                         lambda: _loop_summary(_compile(engine.build_generate(
                             shape.target, shape.max_decode_len, sampler),
                                                        tparams, *inputs),
                                               on_cpu, cache_bytes))
  draft, loop_dparams = shape.draft_definition, dparams
  if shape.tree is not None:
    loop_dparams = {"draft": dparams}
  out["speculative"] = _loop_summary(_compile(engine.build_speculative(
      shape.target, draft, shape.gamma, shape.max_decode_len, sampler,
      draft_replicated=shape.replicate_draft), tparams, loop_dparams,
                                              *inputs), on_cpu, cache_bytes)
  out["target_step"] = memo(
      ("step", shape.target, False, 1, shape.positions, common),
      lambda: _step(shape.target, tparams, shape, mesh, 1))
  out["verify_step"] = memo(
      ("step", shape.target, False, shape.verified, shape.positions, common),
      lambda: _step(shape.target, tparams, shape, mesh, shape.verified))
  # A replicated draft's step is compiled on one device: passing its cache
  # replicated on the mesh would add all-gathers the loop does not have (the
  # loop keeps the cache as the model's constraints lay it out); its
  # communication is taken from the loop's inner steps (see `project`).
  if shape.replicate_draft:
    one = dataclasses.replace(shape, mesh_shape=(1, 1))
    draft_mesh = mesh_for(one)
    draft_step = lambda: _step(shape.draft, abstract_params(  # noqa: E731
        shape.draft, draft_mesh, replicate=True), one, draft_mesh, 1,
                               replicated=True)
  else:
    draft_step = lambda: _step(shape.draft, dparams, shape, mesh, 1)  # noqa: E731
  out["draft_step"] = memo(
      ("step", shape.draft, shape.replicate_draft, 1, shape.positions, common),
      draft_step)
  out["compile_seconds"] = time.perf_counter() - started
  out["compiler"] = topology.compiler_name(devices)
  out["device_kind"] = devices[0].device_kind
  if not_tpu:
    out["compiler"] += f"; not the TPU compiler: {not_tpu}"
  return out


def project(config: ExperimentConfig, shape: RunShape, programs: dict,
            chip: chips.Chip) -> dict[str, Any]:
  """The plan's JSON: memory against the chip, collectives, roofline."""
  est = fit.estimate(shape)
  parts = shape.mesh_shape[1]
  spec_mem = programs["speculative"]["memory"]
  tpu = programs["compiler"].startswith("libtpu")
  compiled_peak = max(spec_mem["peak_bytes"],
                      programs["generate"]["memory"]["peak_bytes"])
  # Per device: the TPU compiler's own peak where it compiled the programs;
  # on simulated CPU devices the larger of the CPU's peak (float32 weight
  # copies taken out) and the memory model's count from shapes
  # (`memory.footprint`, recorded beside it either way).
  peak = compiled_peak if tpu else max(compiled_peak, est["total_bytes"])

  def seconds(step, collectives=None):
    if collectives is not None:
      step = dict(step, collectives=collectives)
    return roofline_seconds(step, chip, parts, step["bytes_from_shapes"])

  t_step = seconds(programs["target_step"])
  t_verify = seconds(programs["verify_step"])
  # The draft step's communication is the loop's (its cache is laid out
  # there by the model's constraints, which a standalone step's replicated
  # input cache does not reproduce for a replicated draft).
  inner = programs["speculative"]["collectives"]["per_inner_step"]
  t_draft = seconds(programs["draft_step"], inner)
  c, verify_cost = t_draft / t_step, t_verify / t_step
  row = paper_row(config)
  alpha = row[1] if row else None
  steps = {}
  for name in ("target_step", "verify_step", "draft_step"):
    step = dict(programs[name])
    definition = shape.draft if name == "draft_step" else shape.target
    step["weight_bytes"] = footprint.param_bytes(
        definition, shape.mesh_shape,
        name == "draft_step" and shape.replicate_draft, decoder_only=True)
    step["bytes_over_weights"] = step["bytes_accessed"] / step["weight_bytes"]
    # A TPU's count includes its prefetches into VMEM, several times the
    # weights by design: the flag reads a CPU's count only (the TPU's caches
    # are checked in its HLO, tests/test_tpu_compile.py).
    step["flagged"] = (not tpu and
                       step["bytes_over_weights"] > BYTES_RATIO_FLAG)
    steps[name] = step
  hbm = chip.hbm_bytes
  out = {
      "compiler": programs["compiler"], "device_kind": programs["device_kind"],
      "topology": shape.topology,
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
      "peak_bytes_source": (
          "the TPU compiler's memory_analysis (arguments + outputs + "
          "temporaries - aliased), the larger of the two loops" if tpu else
          "XLA:CPU's memory_analysis less its float32 weight copies, or the "
          "count from shapes where larger"),
      "compiled_peak_bytes_per_device": compiled_peak,
      "peak_bytes_shape_estimate": est["total_bytes"],
      "peak_bytes_shape_estimate_source": (
          "memory.footprint: parameters + caches + activations per device "
          "from shapes, the count the input and fit checks make"),
      "roofline_bytes_source": "shapes: decoder weights + caches per device",
      "memory": {"generate": programs["generate"]["memory"],
                 "speculative": spec_mem, "shape_estimate": est},
      "hbm_bytes": hbm, "fits": bool(peak <= hbm),
      "fix": None if peak <= hbm else fit.fix_for(shape, chip, hbm, peak),
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
      "promises": {
          "cache_copies_in_loops": sum(
              len(programs[k]["cache_copies"])
              for k in ("generate", "speculative")),
          "host_callbacks": sum(
              len(programs[k]["host_callbacks"])
              for k in ("generate", "speculative")),
          "collectives_per_draft_step": sum(c["count"] for c in inner)},
      "loop_cache_copies": {
          k: _grouped(programs[k]["cache_copies"])
          for k in ("generate", "speculative")},
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
      # Theorem 3.8 at each alpha of SWEEP_ALPHAS, and the alpha above
      # which the pair beats the target alone (None: it never does).
      "alpha_sweep": {f"{a:.2f}": float(theory.walltime_improvement_measured(
          a, shape.gamma, c, verify_cost)) for a in SWEEP_ALPHAS},
      "break_even_alpha": break_even_alpha(shape.gamma, c, verify_cost),
      "compile_seconds": programs["compile_seconds"],
      "verified": shape.verified,
  }
  if shape.tree is not None and alpha is not None:
    rates, source = tree_rank_rates(alpha, shape.temperature,
                                    shape.tree.depth)
    expected = theory.tree_expected_tokens(shape.tree.parents, rates)
    out.update(
        tree=shape.tree.describe(), tree_parents=list(shape.tree.parents),
        tree_rates_source=source, expected_tokens_per_call=expected,
        # One draft call per level (a level of w nodes priced as one step:
        # memory-bound), one target call on every node.
        predicted_speedup=expected / (shape.gamma * c + verify_cost),
        predicted_speedup_v1=expected / (shape.gamma * c + 1.0))
  return out


def break_even_alpha(gamma: int, c: float, verify_cost: float) -> float | None:
  """The alpha at which Theorem 3.8's speedup is 1, or None if none is.

  E[tokens] = (1 - alpha^(gamma+1)) / (1 - alpha) rises from 1 (alpha 0)
  to gamma + 1 (alpha -> 1); an iteration costs gamma c + v target steps.
  """
  cost = gamma * c + verify_cost
  if cost <= 1.0:
    return 0.0
  if cost >= gamma + 1:
    return None
  lo, hi = 0.0, 1.0
  for _ in range(60):
    mid = (lo + hi) / 2
    if theory.expected_tokens(mid, gamma) < cost:
      lo = mid
    else:
      hi = mid
  return hi


def _grouped(copies: list[dict]) -> list[dict]:
  """{shape, bytes, count} of each copied shape."""
  out: dict[str, dict] = {}
  for c in copies:
    entry = out.setdefault(c["shape"], {"shape": c["shape"],
                                        "bytes": c["bytes"], "count": 0})
    entry["count"] += 1
  return sorted(out.values(), key=lambda e: -e["bytes"])


def plan(config: ExperimentConfig, chip: chips.Chip,
         input_len: int | None = None) -> dict[str, Any]:
  """Checks the fit from shapes (raising before any compile), then compiles
  and projects. Needs as many devices as the run's mesh."""
  fit.check_fits(config, chip)
  shape = fit.run_shape(config, input_len)
  return project(config, shape, compile_programs(shape), chip)


def verification_costs(config: ExperimentConfig, chip: chips.Chip,
                       widths, input_len: int | None = None) -> list[dict]:
  """The target's call on each of `widths` tokens (a chain's gamma + 1, a
  tree's nodes + 1), each compiled on its own for the run's devices (the
  TPU compiler where the run names a topology and libtpu is installed):
  peak memory per device and the roofline time, also relative to one
  token's step. A tree's call differs from a chain's of as many tokens
  only by its attention mask (the same matmuls)."""
  shape = fit.run_shape(config, input_len)
  devices, _ = target_devices(shape)
  mesh = sharding.make_mesh(*shape.mesh_shape, devices=devices)
  tparams = abstract_params(shape.target, mesh)
  parts = shape.mesh_shape[1]
  out, one = [], None
  for width in sorted({1, *map(int, widths)}):
    wide = dataclasses.replace(shape, tree=None,
                               gamma=max(shape.gamma, width - 1))
    step = _step(shape.target, tparams, wide, mesh, width)
    seconds = roofline_seconds(step, chip, parts, step["bytes_from_shapes"])
    one = seconds if width == 1 else one
    out.append({"tokens": width, "roofline_seconds": seconds,
                "relative_to_one_token": seconds / one,
                "flops": step["flops"],
                "bytes_from_shapes": step["bytes_from_shapes"],
                "peak_bytes": step["memory"]["peak_bytes"],
                "collectives": sum(c["count"] for c in step["collectives"]),
                "compiler": topology.compiler_name(devices)})
  return out


def decoder_step_bytes(shape: RunShape) -> dict[str, int]:
  """Weight bytes per device one decoder step of each model reads (no
  compile): the roofline's numerator, for projections made before a run."""
  out = {}
  for role, definition in (("target", shape.target), ("draft", shape.draft)):
    out[role] = footprint.param_bytes(
        definition, shape.mesh_shape,
        role == "draft" and shape.replicate_draft, decoder_only=True)
  return out
