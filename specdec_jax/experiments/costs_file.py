"""The costs an experiment's arms report: c, c_hat and verification costs.

`step_timers` times model steps; this module decides which steps an experiment
needs (those its arms' costs.json files lack), hands them to the timers that
run between the decoding rounds, and turns the timings into each arm's
costs.json. The steps are timed on the run's median-length input
(`shape_batch`), the draft's cost on `cost_model(draft)`.

On a multi-host run what is stored is read on process 0 and broadcast
(`read_stored`), every host times the same missing steps (their programs'
collectives need all of them), and process 0's measured costs are everyone's
and the ones written.
"""

from __future__ import annotations

import collections
import json
from typing import Sequence

from absl import logging
import jax
import numpy as np

from specdec_jax.infra import multihost
from specdec_jax.infra import paths
from specdec_jax.decoding import drafters
from specdec_jax.decoding.protocol import Model
from specdec_jax.experiments import cost_checks
from specdec_jax.experiments import step_timers
from specdec_jax.experiments import workdir as workdir_lib


def cost_model(draft: Model, gamma: int = 1) -> Model:
  """The model whose per-step cost is the run's c: the first model the
  draft's drafter declares (the draft itself; a cascade's top model: the
  cascade's own cost per token depends on its acceptance;
  docs/log/benchmarks_history.md reports cascades by measured walltime)."""
  return drafters.top_model(draft, gamma)


def verified_gamma(draft: Model, gamma: int) -> int:
  """The gamma whose verification (gamma + 1 tokens) a target call of this
  draft costs: its drafter's proposed nodes (gamma for a chain, a token
  tree's nodes)."""
  return drafters.declared(draft, gamma).shape.num_nodes


def stored_costs(path: str, gammas) -> dict | None:
  """costs.json's costs by gamma if it holds every one of `gammas`."""
  data = paths.read_bytes(path)
  if data is not None:
    stored = json.loads(data)
    if all(str(g) in stored for g in gammas):
      return {int(g): v for g, v in stored.items()}
  return None


def read_stored(workdirs: Sequence[str], gammas) -> list[dict | None]:
  """Each arm's `stored_costs` (of its gammas), read on process 0 alone."""
  def read():
    stored = [stored_costs(paths.join(w, "costs.json"), gs)
              for w, gs in zip(workdirs, gammas)]
    return [None if s is None else {str(g): v for g, v in s.items()}
            for s in stored]
  return [None if s is None else {int(g): v for g, v in s.items()}
          for s in multihost.on_primary(read)]


def shape_batch(batches):
  """The batch of median input length: representative of the run."""
  lengths = [b.input_ids.shape[1] for b in batches]
  return batches[int(np.argsort(lengths)[len(lengths) // 2])]


def missing_requests(configs: Sequence, stored: Sequence[dict | None],
                     target: Model, drafts: Sequence[Model],
                     gammas: Sequence[Sequence[int]]) -> dict[int, list]:
  """The model steps whose timings the arms' costs.json files lack
  (`stored`: `read_stored`'s), keyed by the arms' cost_repeats
  (`step_timers.cost_requests`)."""
  requests = collections.defaultdict(list)
  for config, costs_, draft, gs in zip(configs, stored, drafts, gammas):
    if costs_ is None:
      for g in gs:
        v = verified_gamma(draft, g)
        requests[config.cost_repeats] += step_timers.cost_requests(
            target, cost_model(draft), v, config.max_decode_len + v + 1)
  return requests


def round_robin_timers(requests: dict[int, list], batches, timings: dict,
                       compiler_options=None) -> list:
  """One `step_timers.RoundRobinTimer` per cost_repeats of `requests`, skipping
  the steps `timings` already holds."""
  ids = shape_batch(batches).input_ids
  return [step_timers.RoundRobinTimer(reqs, ids, repeats=repeats,
                                compiler_options=compiler_options,
                                skip=timings)
          for repeats, reqs in requests.items()]


def time_missing(requests: dict[int, list], batches, timings: dict,
                 compiler_options=None) -> None:
  """Times into `timings` the steps of `requests` it lacks, all now, in
  interleaved rounds (`step_timers.time_extends`)."""
  ids = shape_batch(batches).input_ids
  for repeats, reqs in requests.items():
    step_timers.time_extends(reqs, ids, repeats=repeats, timings=timings,
                       compiler_options=compiler_options)


def load_or_measure(config, target: Model, draft: Model, batches, gammas,
                    path: str, stored: dict | None, timings=None) -> dict:
  """The arm's costs by gamma: `stored` (costs.json's, `read_stored`) if it
  holds them all, else measured (from `timings` where it has the steps),
  process 0's written to `path` and returned on every host.

  A gamma whose costs contradict themselves (`cost_checks`) has its steps
  timed again once, in rounds of their own; costs that still contradict
  are kept with a `cost_warning`.
  """
  if stored is not None:
    return stored
  verified = {g: verified_gamma(draft, g) for g in gammas}

  def measure(g, timings_):
    return step_timers.measure_costs(target, cost_model(draft),
                               shape_batch(batches).input_ids,
                               gamma=verified[g],
                               cache_positions=(config.max_decode_len
                                                + verified[g] + 1),
                               repeats=config.cost_repeats, timings=timings_,
                               compiler_options=config.compiler_options)

  measured = multihost.broadcast(
      {str(g): measure(g, timings) for g in gammas})
  # Judged on process 0's numbers, which every host now holds: all hosts
  # time the same steps again (their programs' collectives need them all).
  platform = jax.default_backend()
  for g in gammas:
    found = cost_checks.contradictions(measured[str(g)], platform)
    if found:
      logging.warning("%s: the costs at gamma %d contradict themselves (%s); "
                      "timing its steps again", config.name or config.draft,
                      g, "; ".join(found))
      measured[str(g)] = cost_checks.flagged(
          multihost.broadcast(measure(g, {})), platform)
      if cost_checks.WARNING in measured[str(g)]:
        logging.warning("%s: gamma %d: %s", config.name or config.draft, g,
                        measured[str(g)][cost_checks.WARNING])
  if multihost.is_primary():
    workdir_lib.write_json(path, measured)
  return {int(g): v for g, v in measured.items()}
