"""The demo's variants (e.g. the matmul library XLA:CPU verifies with):
applying one, and "fastest": the variant whose probe row Theorem 3.8
predicts fastest from c and v timed on this machine, recorded in the
workdir so that a rerun resumes under the same choice."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Callable, Mapping

from absl import logging
import numpy as np

from specdec_jax import checkpoints
from specdec_jax import theory
from specdec_jax.experiments import step_timers


def gamma_for(gammas: Any, temperature: float, draft: str) -> int:
  if not isinstance(gammas, Mapping):
    return int(gammas)
  for t, gamma in gammas.items():
    if float(t) == float(temperature):
      return int(gamma)
  raise ValueError(f"DemoConfig.drafts gives {draft} gammas for temperatures "
                   f"{sorted(gammas)} but not for {temperature}: add it, or "
                   "give one int for all temperatures.")


def variant(config: Any, name: str) -> Any:
  """`config` with the variant `name` applied ("default": none)."""
  if name == "default":
    return dataclasses.replace(config, variant=None)
  if name not in config.variants:
    raise ValueError(f"DemoConfig.variant={name!r}: not one of "
                     f"{sorted(config.variants)}, 'default' or 'fastest'")
  fields = {f.name for f in dataclasses.fields(config)}
  unknown = sorted(set(config.variants[name]) - fields)
  if unknown:
    raise ValueError(f"DemoConfig.variants[{name!r}] sets {unknown}, which "
                     "are not DemoConfig fields")
  return dataclasses.replace(config, variant=None, **config.variants[name])


def choose_variant(config: Any, input_ids: np.ndarray,
                   rounds: int = 2) -> tuple[str, dict]:
  """The variant (or "default") with the best predicted probe row.

  For each candidate: the probe draft's gamma at temperature 0 on the
  sentences, and c, v of that gamma timed with the candidate's compiler
  options on `input_ids` (`step_timers.measure_costs`; `rounds` rounds over all
  candidates, each number keeping its fastest, so a slow stretch of the
  machine touches every candidate). Returns (name, {name: {gamma, c,
  verify_cost, predicted}}).
  """
  draft_spec, alpha = config.variant_probe
  target = checkpoints.load_model(config.target)
  draft = checkpoints.load_model(draft_spec)
  candidates = {}
  for name in ["default", *config.variants]:
    candidate = variant(config, name)
    gammas = dict(candidate.drafts).get(draft_spec)
    if gammas is None:
      raise ValueError(f"DemoConfig.variant_probe drafts with {draft_spec}, "
                       f"which variant {name!r} has no row for")
    candidates[name] = (candidate.compiler_options,
                        gamma_for(gammas, 0.0, draft_spec))
  best: dict[str, dict] = {}
  for _ in range(rounds):
    for name, (options, gamma) in candidates.items():
      m = step_timers.measure_costs(target, draft, input_ids, gamma=gamma,
                              cache_positions=config.max_decode_len + gamma + 1,
                              repeats=2, compiler_options=options)
      seen = best.setdefault(name, m)
      for key in ("target_step_s", "draft_step_s", "verify_step_s"):
        seen[key] = min(seen[key], m[key])
  report_ = {}
  for name, (_, gamma) in candidates.items():
    m = best[name]
    c = m["draft_step_s"] / m["target_step_s"]
    v = m["verify_step_s"] / m["target_step_s"]
    report_[name] = {"gamma": gamma, "c": c, "verify_cost": v,
                     "predicted": float(theory.walltime_improvement_measured(
                         alpha, gamma, c, v))}
  chosen = max(report_, key=lambda n: report_[n]["predicted"])
  return chosen, report_


def resolve_variant(config: Any, workdir: str, *,
                    validate: Callable[[Any], None],
                    probe_input_ids: Callable[[], np.ndarray]) -> Any:
  """The config to run: `variant` applied, "fastest" measured and recorded
  in <workdir>/variant.json.

  Every variant's rows are validated first (`validate`, given each
  variant's config); `probe_input_ids()` gives the probe's input. A rerun
  in the same workdir
  keeps the recorded choice (so its finished rows resume rather than
  being started over under the other variant) unless the probe or the
  variants' names changed.
  """
  if config.variant is None:
    return config
  if config.variant != "fastest":
    return variant(config, config.variant)
  for name in ["default", *config.variants]:
    validate(variant(config, name))
  path = os.path.join(workdir, "variant.json")
  if os.path.exists(path):
    with open(path) as f:
      recorded = json.load(f)
    if (recorded.get("probe") == list(config.variant_probe)
        and sorted(recorded.get("candidates", {})) == sorted(
            ["default", *config.variants])):
      logging.info("running variant %s, chosen by an earlier run (%s)",
                   recorded["chosen"], path)
      return variant(config, recorded["chosen"])
  ids = probe_input_ids()
  name, numbers = choose_variant(config, ids)
  for n, m in numbers.items():
    logging.info("variant %s: gamma %d, c %.4f, v %.2f, predicted %.2fx", n,
                 m["gamma"], m["c"], m["verify_cost"], m["predicted"])
  logging.info("running variant %s", name)
  os.makedirs(workdir, exist_ok=True)
  with open(path, "w") as f:
    json.dump({"chosen": name, "probe": list(config.variant_probe),
               "candidates": numbers}, f, indent=1)
  return variant(config, name)
