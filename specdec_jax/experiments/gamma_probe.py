"""gamma = "optimal": the alpha probe and the cost timing behind Theorem 3.8's
choice of gamma, decided once per workdir (`optimal_gamma.json`) on process 0
for every host. The one alpha probe of the project."""

from __future__ import annotations

import json

from absl import logging

from specdec_jax import theory
from specdec_jax.experiments import costs_file
from specdec_jax.experiments import step_timers
from specdec_jax.experiments import workdir as workdir_lib
from specdec_jax.infra import multihost
from specdec_jax.infra import paths


def choose_gamma(config, target, draft, batches, workdir) -> int:
  """gamma="optimal": probe alpha and c (and, if configured, the verification
  cost of each gamma), then maximise Theorem 3.8."""
  path = paths.join(workdir, "optimal_gamma.json")

  def stored():
    data = paths.read_bytes(path)
    return None if data is None else int(json.loads(data)["gamma"])

  # Decided once, on process 0: every host decodes with the same gamma.
  gamma = multihost.on_primary(stored)
  if gamma is not None:
    return gamma
  probe = config.decoder(target, draft, config.probe_gamma)
  probes = [probe(batch.input_ids, seed=config.seed).stats
            for batch in batches[:config.probe_examples]]
  alpha = theory.pooled_alpha([s.alpha_sum.sum() for s in probes],
                              [s.alpha_count.sum() for s in probes])
  positions = config.max_decode_len + config.max_gamma + 1
  ids = batches[0].input_ids
  gammas = (range(1, config.max_gamma + 1)
            if config.optimal_gamma_verify_cost else [config.probe_gamma])
  # Every gamma's costs from one set of interleaved rounds.
  timings = {}
  top = costs_file.cost_model(draft)
  step_timers.time_extends(
      [r for g in gammas for r in step_timers.cost_requests(
          target, top, g, positions)],
      ids, repeats=config.cost_repeats, timings=timings,
      compiler_options=config.compiler_options)
  measured = {g: step_timers.measure_costs(target, top, ids,
                                     gamma=g, cache_positions=positions,
                                     repeats=config.cost_repeats,
                                     timings=timings,
                                     compiler_options=config.compiler_options)
              for g in gammas}
  c = measured[gammas[0]]["c"]
  verify_costs = None
  if config.optimal_gamma_verify_cost:
    verify_costs = [measured[g]["verify_cost"] for g in gammas]
  gamma = int(theory.optimal_gamma(alpha, c, config.max_gamma,
                                   verify_costs=verify_costs))
  # Each host timed its own c: process 0's choice is everyone's.
  gamma = int(multihost.broadcast(gamma))
  if multihost.is_primary():
    workdir_lib.write_json(path, {"gamma": gamma, "alpha": alpha, "c": c,
                                  "verify_costs": verify_costs,
                                  "probe_gamma": config.probe_gamma,
                                  "probe_examples": config.probe_examples})
  logging.info("optimal gamma %d from probe alpha=%.3f c=%.4f", gamma, alpha, c)
  return gamma
