"""One experiment: target alone vs speculative decoding on a task, measured.

For each example (batch size 1, as in the paper) we decode with the target
alone and with speculative decoding for each gamma, timing each call after
its shapes are compiled. Results go to the workdir as they are produced, so a
killed run resumes where it stopped:

  examples.jsonl   one line per finished example (flushed and fsynced)
  costs.json       measured c, c_hat, verification cost and prefills per gamma
                   (their model steps timed between the decoding rounds)
  optimal_gamma.json  the probe behind gamma="optimal" (if used)
  summary.json     pooled alpha, c, speedups, predictions, quality
  table.md/.csv    rows in the paper's Table 2 layout
  *.png, trace.html  plots (see `specdec_jax.experiments.report`)

Pooled alpha is the mean of beta = sum_x min(p, q) over all verified
positions of all examples (each example weighs by its number of verified
positions), i.e. sum(alpha_sum) / sum(alpha_count).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import time
from typing import Any, Sequence

from absl import logging
import gin

from specdec_jax.infra import multihost
from specdec_jax.infra import paths
from specdec_jax.infra import summaries
from specdec_jax import sharding
from specdec_jax import theory
from specdec_jax.data import batching
from specdec_jax.data import tasks
from specdec_jax.data import readers
from specdec_jax.decoding.api import generate
from specdec_jax.decoding.protocol import Model
from specdec_jax.experiments import best_of
from specdec_jax.experiments import compile_time
from specdec_jax.experiments import costs_file
from specdec_jax.experiments import fit
from specdec_jax.experiments import gamma_probe
from specdec_jax.experiments import loading
from specdec_jax.experiments import records
from specdec_jax.experiments import report
from specdec_jax.experiments import workdir as workdir_lib
# The config lives in its own module; `experiment.ExperimentConfig` is the
# name gin files and users know.
from specdec_jax.experiments.experiment_config import ConfigError
from specdec_jax.experiments.experiment_config import ExperimentConfig
from specdec_jax.experiments.experiment_config import config_problems


# Configurable before any gin file imports this module: a script run with
# experiment files only, or a `--gin.ExperimentConfig.X=V` binding, finds it.
gin.external_configurable(ExperimentConfig, module=__name__)


def validate(config: ExperimentConfig) -> None:
  """Raises ConfigError listing every problem checkable without loading
  models or data: the config's fields and its task and vocabulary."""
  problems = config_problems(config)
  try:
    tasks.get_task(config.task)
  except ValueError as e:
    problems.append(str(e))
  vocab_path = tasks.current_config().vocab_path
  if "YOUR_" in vocab_path:
    problems.append(
        f"TaskConfig.vocab_path={vocab_path!r} is a placeholder: point it at "
        "the task's SentencePiece model (see README, 'Reproduce the paper on "
        "Cloud TPU')")
  if problems:
    # One line for one mistake; a line each for several.
    raise ConfigError(
        f"bad experiment config: {problems[0]}" if len(problems) == 1 else
        "bad experiment config:\n  - " + "\n  - ".join(problems))


# ----------------------------------------------------------------------------
# The run.


def run(config: ExperimentConfig, workdir: str) -> dict:
  """Runs (or resumes) one experiment; returns the summary dict.

  The workdir is locked for the whole run and must hold results of the same
  settings (or none): see `specdec_jax.experiments.workdir`.
  """
  return run_side_by_side([config], [workdir])[0]


# What may differ between the experiments `run_side_by_side` runs together:
# the draft, how it drafts, and what each reports after decoding (costs,
# traces). Everything else (task, target, sampling, lengths, repeats, ...)
# must be equal, since they share the baseline.
PER_DRAFT_FIELDS = ("draft", "draft_config", "gamma", "max_gamma",
                    "probe_gamma", "probe_examples",
                    "optimal_gamma_verify_cost", "rule", "draft_stop", "cascade",
                    "tree", "tree_parents", "replicate_draft", "ngram_split", "ngram_max_examples",
                    "cost_repeats", "trace_examples", "name", "overwrite")


def check_side_by_side(configs: Sequence[ExperimentConfig]) -> None:
  """Raises ConfigError unless the configs differ in PER_DRAFT_FIELDS only."""
  first = configs[0]
  for config in configs[1:]:
    shared = dataclasses.replace(
        config, **{f: getattr(first, f) for f in PER_DRAFT_FIELDS})
    if shared != first:
      differ = [f.name for f in dataclasses.fields(first)
                if getattr(shared, f.name) != getattr(first, f.name)]
      raise ConfigError(
          f"experiments {first.name or first.draft!r} and "
          f"{config.name or config.draft!r} cannot share a baseline: they "
          f"differ in {', '.join(differ)} (only {', '.join(PER_DRAFT_FIELDS)}"
          " may differ). Run them separately.")


def run_side_by_side(configs: Sequence[ExperimentConfig],
                     workdirs: Sequence[str]) -> list[dict]:
  """Runs (or resumes) experiments that differ only in their drafts.

  Each example is decoded by the target alone, then by every experiment's
  draft at each of its gammas, one after the other: every speedup is a
  ratio of timings taken seconds apart on the same input, and the target
  alone is timed once for all the drafts instead of once per draft. Each
  experiment keeps its own workdir (locked, fingerprinted, resumable) and
  writes the same files as `run` would; an example one of them has already
  finished is not decoded again for it (the baseline is, for the others).

  Args:
    configs: experiments equal but for `PER_DRAFT_FIELDS`.
    workdirs: one directory each.

  Returns:
    Their summaries, in order.
  """
  if not configs or len(configs) != len(workdirs):
    raise ValueError(f"need one workdir per config, got {len(configs)} "
                     f"configs and {len(workdirs)} workdirs")
  if len(set(map(os.path.abspath, workdirs))) != len(workdirs):
    raise ValueError(f"every experiment needs its own workdir: {workdirs}")
  for config in configs:
    validate(config)
  check_side_by_side(configs)
  # plan imports this module.
  multihost.initialize(configs[0].distributed)
  for config, workdir in zip(configs, workdirs):
    workdir_lib.check_directory_path(workdir)
    # On a known accelerator, refuse a run that cannot fit before loading
    # anything (shapes only; see scripts/plan_run.py for the full plan).
    fit.check_fits_on_devices(config)
  with contextlib.ExitStack() as stack:

    def claim_workdirs():  # process 0 alone: every host stops if it fails
      for config, workdir in zip(configs, workdirs):
        paths.makedirs(workdir)
        stack.enter_context(workdir_lib.lock(workdir))
        workdir_lib.check_fingerprint(workdir, config, config.overwrite)

    multihost.on_primary(claim_workdirs)
    return _run_locked(configs, workdirs)


@dataclasses.dataclass(frozen=True)
class _Arms:
  """What the arms of one side-by-side run share, and what is each arm's.

  Every arm decodes the same `batches` with the same `target` (whose
  decodes are timed once for all); arm i has its own configs[i],
  workdirs[i], drafts[i] and gammas[i].
  """

  configs: Sequence[ExperimentConfig]
  workdirs: Sequence[str]
  target: Model
  drafts: Sequence[Model]
  gammas: Sequence[tuple[int, ...]]
  batches: Sequence[batching.Batch]
  mesh: Any
  vocab: Any
  primary: bool  # this process writes the results
  # Each arm's costs.json as process 0 read it (None: some gamma missing).
  stored_costs: Sequence[dict | None]


def _run_locked(configs: Sequence[ExperimentConfig],
                workdirs: Sequence[str]) -> list[dict]:
  arms = _prepare_arms(configs, workdirs)
  timings = {}  # step_timers.time_extends's: the model steps timed so far
  done = _decode_missing_examples(arms, timings)
  return _summarize_arms(arms, done, timings)


def _prepare_arms(configs, workdirs) -> _Arms:
  """Loads the models and the task's batches; fixes each arm's gammas."""
  first = configs[0]
  # The task's vocabulary against the architecture the row names, before
  # any checkpoint is read (again below against the loaded target).
  loading.check_vocabulary_fits(first)
  mesh = sharding.make_mesh(*first.mesh_shape) if first.mesh_shape else None
  with _logged_time(f"loading {first.target} and the drafts"):
    target, draft = loading.load_models(first, mesh)
    drafts = [draft] + [loading.load_models(c, mesh, target)[1]
                        for c in configs[1:]]
  max_len = first.max_input_len or target.max_input_len or 512
  examples = readers.load_examples(first.task, first.split,
                                    max_examples=first.max_examples)
  loading.check_vocabulary_fits(first, target)
  batches = list(batching.batches(examples, batch_size=1,
                                  buckets=first.buckets, max_length=max_len))
  gammas = []
  for config, draft, workdir in zip(configs, drafts, workdirs):
    g = config.gammas()
    gammas.append((gamma_probe.choose_gamma(config, target, draft, batches, workdir),)
                  if g == "optimal" else g)
  return _Arms(configs=configs, workdirs=workdirs, target=target,
               drafts=drafts, gammas=gammas, batches=batches, mesh=mesh,
               vocab=loading.task_vocabulary(first, target),
               primary=multihost.is_primary(),
               stored_costs=costs_file.read_stored(workdirs, gammas))


def _decode_missing_examples(arms: _Arms, timings: dict
                             ) -> list[list[records.ExampleRecord]]:
  """Each arm's finished examples: those its examples.jsonl holds, then the
  missing ones decoded (the target alone once, every arm that lacks the
  example at each of its gammas) and appended as they finish.

  The model steps the arms' costs need are timed between the decoding
  rounds, one per round (`step_timers.RoundRobinTimer`), into `timings`."""
  first, target, mesh = arms.configs[0], arms.target, arms.mesh
  files = [paths.join(w, "examples.jsonl") for w in arms.workdirs]
  # Read on process 0 and broadcast: every host decodes the same examples,
  # in the same order.
  done = multihost.on_primary(
      lambda: [workdir_lib.read_done(path) for path in files])
  done = [[records.ExampleRecord.from_json(r) for r in lines]
          for lines in done]
  done_ids = [{r.id for r in d} for d in done]
  kwargs = first.decode_kwargs()

  def decode_target(ids):
    return generate(target, ids, seed=first.seed, mesh=mesh, **kwargs)

  decoders = {}

  def decode_spec(arm, ids, gamma):
    if (arm, gamma) not in decoders:
      decoders[arm, gamma] = arms.configs[arm].decoder(
          target, arms.drafts[arm], gamma, mesh)
    return decoders[arm, gamma](ids, seed=first.seed)

  warmed: set = set()
  timers = None
  started, new = time.perf_counter(), 0
  # TensorBoard's per-example scalars, uploaded as the run goes.
  live = [summaries.ExampleSummaries(
      workdir, arms.gammas[a], done[a], config.summary_every_examples,
      config.summary_every_seconds)
          for a, (workdir, config) in enumerate(zip(arms.workdirs,
                                                     arms.configs))]
  with compile_time.compile_clock() as decode_clock, contextlib.ExitStack() as up:
    for writer in live:
      up.callback(writer.close)
    todo = [b for b in arms.batches
            if any(b.ids[0] not in d for d in done_ids)]
    total = len(arms.batches)
    for workdir, finished in zip(arms.workdirs, done_ids):
      kept = sum(b.ids[0] in finished for b in arms.batches)
      if kept:  # a rerun: what an earlier run finished is kept
        logging.info("resuming: %d of %d examples already in %s", kept,
                     total, workdir)
    for batch in todo:
      ids = batch.input_ids
      needed = [a for a in range(len(arms.configs))
                if batch.ids[0] not in done_ids[a]]
      for arm in [None] + needed:  # compile outside the timed calls
        if (ids.shape, arm) not in warmed:
          logging.info("compiling the %s loop for inputs of width %d",
                       "target's" if arm is None else
                       arms.configs[arm].name or arms.configs[arm].draft,
                       ids.shape[1])
          if arm is None:
            decode_target(ids)
          for g in () if arm is None else arms.gammas[arm]:
            decode_spec(arm, ids, g)
          warmed.add((ids.shape, arm))
      # The target alone and every arm's decodes in interleaved rounds
      # (`best_of.best_runs`): a slow stretch of the machine touches the
      # baseline and the speculative decodes alike, not only one side of
      # the speedup.
      if timers is None:  # after the first decodes' compiles
        with _logged_time("cost loops to time between the decodes"):
          timers = costs_file.round_robin_timers(
              _missing_cost_requests(arms), arms.batches, timings,
              first.compiler_options)
      runs = [(None, None)] + [(a, g) for a in needed for g in arms.gammas[a]]
      timed = best_of.best_runs(
          [functools.partial(decode_target, ids) if arm is None
           else functools.partial(decode_spec, arm, ids, g)
           for arm, g in runs], first.repeats,
          between=lambda: [t.tick() for t in timers])
      by_run = {run: records.DecodeRecord.of(out, seconds, arms.vocab,
                                             first.stop_ids)
                for run, (out, seconds) in zip(runs, timed)}
      baseline = by_run[(None, None)]
      for arm in needed:
        speculative = {g: by_run[(arm, g)] for g in arms.gammas[arm]}
        record = records.ExampleRecord(
            id=batch.ids[0], input_length=int(batch.input_lengths[0]),
            target_text=batch.targets_text[0], baseline=baseline,
            speculative=speculative)
        if arms.primary:
          workdir_lib.append_line(files[arm], record.to_json())
        done[arm].append(record)
        live[arm].add(record)
      new += 1
      _log_progress(arms.configs, done, arms.gammas, new, len(todo), started)
  if todo:
    logging.info("decoding %d examples: %.1f s, %.1f s of it compiling %d "
                 "programs", len(todo), time.perf_counter() - started,
                 decode_clock.seconds, decode_clock.programs)
  for timer in timers or ():
    timer.fill(timings)
  return done


def _summarize_arms(arms: _Arms,
                    done: Sequence[Sequence[records.ExampleRecord]],
                    timings: dict) -> list[dict]:
  """Measures (or reloads) the costs, then writes each arm's summary,
  tables, plots and traces; returns the summaries.

  `timings` holds the model steps timed between the decoding rounds; when
  there were none (a resumed run with nothing left to decode), the steps
  are timed now, all in the same rounds (`step_timers.time_extends`)."""
  results = []
  with _logged_time("costs of all arms"):
    costs_file.time_missing(_missing_cost_requests(arms), arms.batches,
                            timings, arms.configs[0].compiler_options)
  for arm, (config, workdir) in enumerate(zip(arms.configs, arms.workdirs)):
    # The examples of this run only: a rerun with fewer max_examples
    # reports fewer, and lines of ids outside this run stay in the file
    # unreported.
    by_id = {r.id: r for r in done[arm]}
    records_ = [by_id[b.ids[0]] for b in arms.batches if b.ids[0] in by_id]
    with _logged_time(f"{config.name or config.draft}: costs"):
      costs_by_gamma = costs_file.load_or_measure(
          config, arms.target, arms.drafts[arm], arms.batches,
          arms.gammas[arm], paths.join(workdir, "costs.json"),
          arms.stored_costs[arm], timings)
    summary = report.summarize(config, records_, costs_by_gamma,
                               arms.gammas[arm], task_metric(config))
    if arms.primary:
      report.write_outputs(workdir, config, summary, records_)
    if config.trace_examples:  # decoded on every host, written by one
      with _logged_time(f"{config.name or config.draft}: traces"):
        report.write_traces(
            workdir, config.decoder(arms.target, arms.drafts[arm],
                                    arms.gammas[arm][0], arms.mesh),
            arms.batches[:config.trace_examples], arms.vocab, config.seed,
            write=arms.primary)
    results.append(summary)
  return results


@contextlib.contextmanager
def _logged_time(what: str):
  """Logs the block's wall time and the part of it spent compiling."""
  start = time.perf_counter()
  with compile_time.compile_clock() as clock:
    yield
  logging.info("%s: %.1f s, %.1f s of it compiling %d programs", what,
               time.perf_counter() - start, clock.seconds, clock.programs)


def _missing_cost_requests(arms: _Arms) -> dict[int, list]:
  return costs_file.missing_requests(arms.configs, arms.stored_costs,
                                     arms.target, arms.drafts, arms.gammas)


def task_metric(config: ExperimentConfig):
  # TensorFlow: deferred, so that plan_run and benchmarks/gpu.py import
  # this module without it.
  fns = tasks.get_task(config.task).metric_fns
  return fns[0] if fns else None


def _log_progress(configs, done, gammas, new, total, started):
  """One line per example: each experiment's alpha and speedup so far (at
  its first gamma)."""
  elapsed = time.perf_counter() - started
  eta = elapsed / new * (total - new)
  parts = []
  for config, records_, gs in zip(configs, done, gammas):
    g = gs[0]
    base = sum(r.baseline.time_s for r in records_)
    spec = sum(r.speculative[g].time_s for r in records_)
    alpha = theory.pooled_alpha([r.speculative[g].alpha_sum for r in records_],
                                [r.speculative[g].alpha_count
                                 for r in records_])
    label = f"{config.name} " if len(configs) > 1 and config.name else ""
    parts.append(f"{label}alpha={alpha:.3f} speedup(gamma={g})="
                 f"{base / max(spec, 1e-9):.2f}x")
  logging.info("[%d/%d] %s  ETA %.0fs", new, total, " | ".join(parts), eta)
