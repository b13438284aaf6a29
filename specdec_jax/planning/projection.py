"""The plan's projection: memory against the chip, collectives, the
roofline speedups at the paper's alpha (or over a sweep where none is
published), and a token tree's expected tokens (`project`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from specdec_jax import theory
from specdec_jax.infra import chips
from specdec_jax.experiments import fit
from specdec_jax.experiments.experiment_config import ExperimentConfig
from specdec_jax.experiments.fit import RunShape
from specdec_jax.memory import footprint
from specdec_jax.planning import paper
from specdec_jax.planning.roofline import break_even_alpha
from specdec_jax.planning.roofline import BYTES_RATIO_FLAG
from specdec_jax.planning.roofline import roofline_seconds

# Where no alpha is published for a pair (T5Gemma), the plan projects the
# speedup over this range instead: the paper's T5-XXL pairs had 0.62-0.82
# (Table 3), its LaMDA pairs 0.57-0.75.
SWEEP_ALPHAS = (0.5, 0.6, 0.7, 0.8, 0.9)


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


def _grouped(copies: list[dict]) -> list[dict]:
  """{shape, bytes, count} of each copied shape."""
  out: dict[str, dict] = {}
  for c in copies:
    entry = out.setdefault(c["shape"], {"shape": c["shape"],
                                        "bytes": c["bytes"], "count": 0})
    entry["count"] += 1
  return sorted(out.values(), key=lambda e: -e["bytes"])
