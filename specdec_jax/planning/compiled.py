"""Compiling a run's programs from abstract shapes, and what the compiler
says of them (the plan's first half, `plan.py`).

No checkpoint is read and no weight allocated: abstract parameters
(`jax.ShapeDtypeStruct`s with the run's `NamedSharding`s) and caches are
lowered and compiled for devices shaped like the run's mesh (the TPU
compiler where the run names a topology and libtpu is installed,
simulated CPU devices otherwise), and the compiled programs give their
memory per device, the collectives inside the decoding loop, and the
flops and bytes of one step. See `plan.py`'s docstring for the CPU
artefacts these figures take out.
"""

from __future__ import annotations

import dataclasses
import re
import time
from typing import Any

from absl import logging
import flax.linen as nn
import jax
import jax.numpy as jnp

from specdec_jax import sampling
from specdec_jax import sharding
from specdec_jax.decoding import engine
from specdec_jax.experiments.experiment_config import ConfigError
from specdec_jax.experiments.fit import RunShape
from specdec_jax.infra import chips
from specdec_jax.memory import footprint
from specdec_jax.planning import hlo
from specdec_jax.planning import topology


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


class DoesNotFit(ConfigError):
  """The compiler's verdict that a program needs more memory than a chip
  has, where the count from shapes (`fit.check_fits`) let it through.
  `needed_bytes`: the compiler's figure for one device, when it gives one."""

  def __init__(self, message: str, needed_bytes: int | None = None):
    super().__init__(message)
    self.needed_bytes = needed_bytes


# libtpu: "... required for HLO temporaries (16.02G) exceeds available HBM
# (15.75G)." (GiB).
_OUT_OF_HBM = re.compile(r"\(([\d.]+)G\) exceeds available HBM")


def _compile(fn, *args):
  mesh = next(a.sharding.mesh for a in jax.tree.leaves(args))
  with jax.set_mesh(mesh), nn.logical_axis_rules(sharding.logical_axis_rules()):
    try:
      return fn.lower(*args).compile()
    except jax.errors.JaxRuntimeError as e:
      if "RESOURCE_EXHAUSTED" not in str(e):
        raise
      line = str(e).split("RESOURCE_EXHAUSTED: ", 1)[-1].strip().splitlines()
      found = _OUT_OF_HBM.search(line[0] if line else "")
      raise DoesNotFit(
          f"the compiler: {line[0] if line else e}",
          int(float(found.group(1)) * chips.GIB) if found else None) from None


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

  where = (f"{shape.topology or devices[0].platform} mesh "
           f"{tuple(shape.mesh_shape)}, {topology.compiler_name(devices)}")

  def announced(what, make):
    # A TPU compile of a large row takes minutes: say which, before it.
    logging.info("compiling %s for %s (%.0f s so far) ...", what, where,
                 time.perf_counter() - started)
    try:
      return make()
    except DoesNotFit as e:
      raise DoesNotFit(f"{what} does not fit the chips of {where}: {e}",
                       e.needed_bytes) from None

  def memo(key, make, what):
    if key not in _COMPILED:
      _COMPILED[key] = announced(what, make)
    return _COMPILED[key]

  out["generate"] = memo(("generate", shape.target, sampler, common),
                         lambda: _loop_summary(_compile(engine.build_generate(
                             shape.target, shape.max_decode_len, sampler),
                                                        tparams, *inputs),
                                               on_cpu, cache_bytes),
                         "the target's decoding loop")
  draft, loop_dparams = shape.draft_definition, dparams
  if shape.tree is not None:
    loop_dparams = {"draft": dparams}
  out["speculative"] = announced(
      f"the speculative loop (gamma {shape.gamma})",
      lambda: _loop_summary(_compile(engine.build_speculative(
          shape.target, draft, shape.gamma, shape.max_decode_len, sampler,
          draft_replicated=shape.replicate_draft), tparams, loop_dparams,
                                     *inputs), on_cpu, cache_bytes))
  out["target_step"] = memo(
      ("step", shape.target, False, 1, shape.positions, common),
      lambda: _step(shape.target, tparams, shape, mesh, 1),
      "the target's one-token step")
  out["verify_step"] = memo(
      ("step", shape.target, False, shape.verified, shape.positions, common),
      lambda: _step(shape.target, tparams, shape, mesh, shape.verified),
      f"the target's step on {shape.verified} tokens")
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
      draft_step, "the draft's one-token step")
  out["compile_seconds"] = time.perf_counter() - started
  out["compiler"] = topology.compiler_name(devices)
  out["device_kind"] = devices[0].device_kind
  if not_tpu:
    out["compiler"] += f"; not the TPU compiler: {not_tpu}"
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
