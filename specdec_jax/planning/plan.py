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

Homes: `compiled.py` compiles the programs and reads the compiler,
`roofline.py` holds the roofline arithmetic, `projection.py` writes the
plan's JSON; this module puts them together (`plan`,
`verification_costs`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from specdec_jax.infra import chips
from specdec_jax.experiments import fit
from specdec_jax.experiments.experiment_config import ExperimentConfig
# The plan's parts, and their names as `plan.X` (scripts, benchmarks, tests).
from specdec_jax.planning.compiled import _abstract_cache  # noqa: F401  (public)
from specdec_jax.planning.compiled import _compile  # noqa: F401  (public)
from specdec_jax.planning.compiled import _inputs  # noqa: F401  (public)
from specdec_jax.planning.compiled import _step
from specdec_jax.planning.compiled import abstract_params
from specdec_jax.planning.compiled import compile_programs
from specdec_jax.planning.compiled import DoesNotFit  # noqa: F401  (public)
from specdec_jax.planning.compiled import decoder_step_bytes  # noqa: F401  (public)
from specdec_jax.planning.compiled import memory_summary  # noqa: F401  (public)
from specdec_jax.planning.compiled import mesh_for  # noqa: F401  (public)
from specdec_jax.planning.compiled import smallest_cache_leaf_bytes  # noqa: F401  (public)
from specdec_jax.planning.compiled import step_cost  # noqa: F401  (public)
from specdec_jax.planning.compiled import target_devices
from specdec_jax.planning.projection import paper_row  # noqa: F401  (public)
from specdec_jax.planning.projection import project
from specdec_jax.planning.projection import SWEEP_ALPHAS  # noqa: F401  (public)
from specdec_jax.planning.projection import tree_rank_rates  # noqa: F401  (public)
from specdec_jax.planning.roofline import break_even_alpha  # noqa: F401  (public)
from specdec_jax.planning.roofline import roofline_seconds
from specdec_jax import sharding
from specdec_jax.planning import topology


def plan(config: ExperimentConfig, chip: chips.Chip,
         input_len: int | None = None) -> dict[str, Any]:
  """Checks the fit from shapes (raising before any compile), then compiles
  and projects. Needs as many devices as the run's mesh."""
  fit.check_fits(config, chip)
  shape = fit.run_shape(config, input_len)
  try:
    programs = compile_programs(shape)
  except DoesNotFit as e:
    raise with_fix(e, shape, chip) from None
  return project(config, shape, programs, chip)


def with_fix(error: DoesNotFit, shape: fit.RunShape, chip: chips.Chip
             ) -> DoesNotFit:
  """The compiler's refusal, with what would make the run fit (a larger
  mesh, scaled by how far the compiler's need exceeds the shapes')."""
  fix = fit.fix_for(shape, chip, chip.hbm_bytes, error.needed_bytes)
  return DoesNotFit(f"{error}. Fix: {fix}.", error.needed_bytes)


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
