"""One experiment: target alone vs speculative decoding on a task, measured.

For each example (batch size 1, as in the paper) we decode with the target
alone and with speculative decoding for each gamma, timing each call after
its shapes are compiled. Results go to the workdir as they are produced, so a
killed run resumes where it stopped:

  examples.jsonl   one line per finished example (flushed and fsynced)
  costs.json       measured c, c_hat and verification cost per gamma
  optimal_gamma.json  the probe behind gamma="optimal" (if used)
  summary.json     pooled alpha, c, speedups, predictions, quality
  table.md/.csv    rows in the paper's Table 2 layout
  *.png, trace.html  plots (see `specdec_jax.experiments.report`)

Pooled alpha is the mean of beta = sum_x min(p, q) over all verified
positions of all examples (each example weighs by its number of verified
positions), i.e. sum(alpha_sum) / sum(alpha_count).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any, Sequence

from absl import logging
import jax
import numpy as np

from specdec_jax import checkpoints
from specdec_jax import sampling
from specdec_jax import sharding
from specdec_jax import theory
from specdec_jax.data import batching
from specdec_jax.decoding import cascades
from specdec_jax.decoding import ngram
from specdec_jax.decoding import stopping
from specdec_jax.decoding.api import generate, speculative_generate
from specdec_jax.decoding.protocol import Model
from specdec_jax.decoding.stopping import StopRule
from specdec_jax.experiments import costs
from specdec_jax.experiments import records
from specdec_jax.experiments import report
from specdec_jax.experiments import timing
from specdec_jax.experiments import workdir as workdir_lib
from specdec_jax.models import gpt


@dataclasses.dataclass(frozen=True)
class ExperimentConfig:
  """What to run. Bind it with gin (configs/experiments/).

  Attributes:
    task, split: the seqio task (`specdec_jax.data.tasks`) and its split.
    target, draft: model specs (`load_model`: hf:DIR, t5x:PATH, a directory
      of ours, demo:NAME or a config name); `draft` may also be 'unigram' or
      'bigram' (an n-gram drafter fitted on `ngram_split`).
    target_config, draft_config: the architecture where the checkpoint does
      not record it (t5x:): a config name, a gin file or a dict of T5X
      fields; None otherwise.
    dtype: compute dtype of both models (None: as stored).
    param_dtype: parameter dtype; None: the same as `dtype` (T5-XXL in
      bfloat16 is 22 GB, in float32 45 GB, more than one TPU v4 chip holds).
    temperature, top_k, top_p: sampling, applied to target and draft alike.
    gamma: draft tokens per iteration: an int, a tuple of ints (a sweep, one
      speculative decode per gamma and example), or "optimal" (probe alpha
      and c, then maximise Theorem 3.8 up to `max_gamma`).
    max_gamma, probe_gamma, probe_examples: the probe behind "optimal".
    optimal_gamma_verify_cost: for "optimal" on hardware where scoring
      gamma + 1 tokens costs more than one token (CPUs, small models): also
      time the target on 2..max_gamma + 1 tokens and maximise
      `theory.walltime_improvement_measured`.
    max_decode_len: the most tokens generated per example.
    max_input_len: inputs are cut to this many tokens (None: the target's
      limit, else 512).
    buckets: input widths examples are padded to (None: powers of two).
    max_examples: the first examples of the split (None: all); a rerun with
      more extends the workdir.
    seed: sampling seed (each example's rows from it).
    repeats, cost_repeats: timed repeats of each decode and of each cost
      measurement (the fastest counts, `timing.best_time`).
    ngram_split, ngram_max_examples: data an n-gram drafter is fitted on.
    trace_examples: examples whose per-iteration traces are plotted.
    draft_stop: adaptive draft length: None (exactly gamma draft tokens per
      iteration) or a rule, e.g. `@stopping.ConfidenceStop()` with
      `from specdec_jax.decoding import stopping` in the .gin file; gamma is
      then the most draft tokens per iteration.
    cascade: drafters below `draft`, ((spec, gamma), ...) from the draft
      downwards: each spec a model spec, 'unigram' or 'bigram', gamma that
      drafter's tokens per call of the model above it, and a third entry
      naming the model config where the checkpoint needs one (t5x:).
      (('demo:draft_small', 3),) drafts with
      `sd.cascade(draft, draft_small, gamma=3)`.
    mesh_shape: (data, model) devices, or None for one device.
    replicate_draft: replicate the draft's parameters on every device
      instead of sharding them over `model`; None: only when its heads, MLP
      or vocabulary do not divide the model axis (T5-small's 6 heads on 4
      chips).
    distributed: call jax.distributed.initialize() (multi-host pods).
    name: the row's name in tables.
    overwrite: delete the workdir's results of other settings instead of
      refusing to resume (same settings resume); see `workdir.py`.
  """

  task: str = "wmt14_ende_local"
  split: str = "test"
  target: str = ""
  draft: str = ""
  target_config: str | dict | None = None
  draft_config: str | dict | None = None
  dtype: str | None = None
  param_dtype: str | None = None
  temperature: float = 0.0
  top_k: int = 0
  top_p: float = 1.0
  gamma: int | tuple[int, ...] | str = 7
  max_gamma: int = 16
  probe_gamma: int = 4
  probe_examples: int = 5
  optimal_gamma_verify_cost: bool = False
  max_decode_len: int = 128
  max_input_len: int | None = None
  buckets: Sequence[int] | None = None
  max_examples: int | None = None
  seed: int = 0
  repeats: int = 1
  cost_repeats: int = 5
  ngram_split: str = "train"
  ngram_max_examples: int | None = 20000
  trace_examples: int = 3
  draft_stop: StopRule | None = None
  cascade: Sequence[tuple[str | int, ...]] = ()
  mesh_shape: Sequence[int] | None = None
  replicate_draft: bool | None = None
  distributed: bool = False
  name: str = ""
  overwrite: bool = False

  def gammas(self) -> tuple[int, ...] | str:
    if isinstance(self.gamma, str):
      return self.gamma
    if isinstance(self.gamma, (list, tuple)):
      return tuple(int(g) for g in self.gamma)
    return (int(self.gamma),)


class ConfigError(ValueError):
  """An experiment config that cannot run; raised before any model loads."""


def validate(config: ExperimentConfig) -> None:
  """Checks everything checkable without loading models or data."""
  problems = []
  if not config.target:
    problems.append("target is empty: set ExperimentConfig.target to a "
                    "model spec (hf:DIR, t5x:PATH, a directory or a config "
                    "name)")
  if not config.draft:
    problems.append("draft is empty: set ExperimentConfig.draft to a model "
                    "spec, 'unigram' or 'bigram'")
  gammas = config.gammas()
  if isinstance(gammas, str):
    if gammas != "optimal":
      problems.append(f"gamma={gammas!r}: use an int, a list of ints or "
                      f"'optimal'")
    if config.max_gamma < 1 or config.probe_gamma < 1:
      problems.append("max_gamma and probe_gamma must be >= 1")
  elif not gammas or any(g < 1 for g in gammas):
    problems.append(f"gamma={config.gamma!r}: every gamma must be >= 1")
  if config.max_decode_len < 1:
    problems.append(f"max_decode_len={config.max_decode_len} must be >= 1")
  try:
    sampling.SamplingConfig(config.temperature, config.top_k, config.top_p)
  except (TypeError, ValueError) as e:
    problems.append(str(e))
  if config.repeats < 1:
    problems.append(f"repeats={config.repeats} must be >= 1")
  for field in ("target", "draft"):
    spec = getattr(config, field)
    if "YOUR_" in spec:
      problems.append(
          f"{field}={spec!r} is a placeholder: point the checkpoint macro at "
          f"your checkpoint (see README, 'Reproduce the paper on Cloud TPU')")
  try:
    stopping.check_rule(config.draft_stop)
  except TypeError as e:
    problems.append(str(e))
  for entry in config.cascade:
    if (not isinstance(entry, (tuple, list)) or len(entry) not in (2, 3)
        or not isinstance(entry[1], int) or entry[1] < 1 or not entry[0]):
      problems.append(f"cascade entry {entry!r}: use (model spec, gamma >= 1"
                      f"[, model config])")
    elif "YOUR_" in str(entry[0]):
      problems.append(
          f"cascade spec {entry[0]!r} is a placeholder: point the checkpoint "
          f"macro at your checkpoint (see README, 'Reproduce the paper on "
          f"Cloud TPU')")
  if config.mesh_shape is not None and len(config.mesh_shape) != 2:
    problems.append(f"mesh_shape={config.mesh_shape!r}: use (data, model)")
  # TensorFlow: deferred so plan_run and benchmarks/gpu.py import this module without it.
  from specdec_jax.data import tasks  # pylint: disable=g-import-not-at-top
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
    raise ConfigError("bad experiment config:\n  - " + "\n  - ".join(problems))


# ----------------------------------------------------------------------------
# Loading.


def dtype_overrides(config: ExperimentConfig) -> dict[str, str]:
  """The dtype/param_dtype a run loads both models with (see the fields)."""
  param_dtype = config.param_dtype or config.dtype
  return {k: v for k, v in [("dtype", config.dtype),
                            ("param_dtype", param_dtype)] if v}


def replicate_draft(config: ExperimentConfig, draft_def: Any,
                    mesh_shape: Sequence[int] | None) -> bool:
  """Whether the draft is replicated (see `replicate_draft`)."""
  if config.replicate_draft is not None:
    return bool(config.replicate_draft)
  if not mesh_shape or not hasattr(draft_def, "param_logical_axes"):
    return False
  shapes = jax.eval_shape(draft_def.init_params, jax.random.PRNGKey(0))
  sizes = dict(zip(sharding.MESH_AXES, mesh_shape))
  specs = jax.tree.leaves(draft_def.param_logical_axes(),
                          is_leaf=lambda x: isinstance(
                              x, jax.sharding.PartitionSpec))
  for leaf, spec in zip(jax.tree.leaves(shapes), specs):
    for size, axis in zip(leaf.shape, tuple(sharding.logical_to_mesh(spec))):
      if axis is not None and size % sizes[axis]:
        return True
  return False


def load_models(config: ExperimentConfig, mesh=None) -> tuple[Model, Model]:
  overrides = dtype_overrides(config)
  target = _load_model("target", config.target, config.target_config, mesh,
                       overrides)

  def load(spec, model_config):
    if spec in ("unigram", "bigram"):
      return fit_ngram_draft(config, target, spec)
    model = _load_model("draft", spec, model_config, None, overrides)
    return model if mesh is None else _place_draft(config, model, mesh)

  chain = [load(config.draft, config.draft_config)]
  chain += [load(entry[0], entry[2] if len(entry) > 2 else None)
            for entry in config.cascade]
  draft = chain[-1]
  for model, entry in zip(chain[-2::-1], config.cascade[::-1]):
    draft = cascades.cascade(model, draft, gamma=int(entry[1]))
  return target, draft


def cost_model(draft: Model) -> Model:
  """The model whose per-step cost is the run's c: the draft itself, or for
  a cascade its top model (the cascade's own cost per token depends on its
  acceptance; docs/benchmarks.md reports cascades by measured walltime)."""
  return cascades.top_model(draft)


def _place_draft(config: ExperimentConfig, draft: Model, mesh) -> Model:
  """Shards the draft over `mesh` by the logical rules, or replicates it.

  The draft is loaded on this process's first device and placed from host
  memory (every process holds the same values): small next to the target.
  """
  replicate = replicate_draft(config, draft.definition,
                              tuple(mesh.shape.values()))
  host = jax.tree.map(np.asarray, jax.device_get(draft.params))
  params = sharding.shard_params(draft.definition, host, mesh,
                                 replicate=replicate)
  return dataclasses.replace(draft, params=params)


def _load_model(role: str, spec: str, model_config: Any, mesh,
                overrides: dict[str, str] | None) -> Model:
  """`checkpoints.load_model`, with `model_config` checked where not needed.

  A t5x: checkpoint needs its architecture (`*_config`). Every other spec
  records its own, so there the config is not passed on but compared with
  what loaded: a row that names 'gpt_97m' then runs the model it names
  whether its checkpoint came from T5X or from `specdec_jax.training.train`.
  """
  overrides = overrides or {}
  if model_config is None or str(spec).startswith("t5x:"):
    return checkpoints.load_model(spec, config=model_config, mesh=mesh,
                                  **overrides)
  model = checkpoints.load_model(spec, mesh=mesh, **overrides)
  expected = checkpoints.resolve_config(model_config)
  loaded = getattr(model.definition, "config", None)
  # Compute and parameter dtypes are run settings, not the architecture.
  run_settings = ("dtype", "param_dtype")
  if loaded is None or type(loaded) is not type(expected):
    differ = ["family"]
  else:
    differ = [f.name for f in dataclasses.fields(expected)
              if f.name not in run_settings
              and getattr(expected, f.name) != getattr(loaded, f.name)]
  if differ:
    raise ConfigError(
        f"{role} {spec!r} is not the model {role}_config={model_config!r} "
        f"names (differs in {', '.join(differ)}): point the {role} at a "
        f"checkpoint of that architecture, or set {role}_config to None to "
        "run whatever the checkpoint holds.")
  return model


def fit_ngram_draft(config: ExperimentConfig, target: Model,
                    kind: str | None = None) -> Model:
  """A unigram/bigram drafter from the task's `ngram_split` examples.

  For an encoder-decoder target (T5) the drafter sees the reference targets
  alone, each after the decoder start id, as the target's decoder does. For
  a decoder-only target (GPT-like) it drafts from the last prompt token on,
  so it is fit on whole rows, prompt + targets: the bigrams that cross from
  the prompt into the continuation are the ones it is asked first.

  Args:
    config: the experiment (task, ngram_split, ngram_max_examples, draft).
    target: the model drafted for; its vocabulary size and architecture.
    kind: 'unigram' or 'bigram' (default: config.draft).

  Returns:
    An n-gram `Model` over the target's vocabulary.
  """
  examples = batching.load_examples(config.task, config.ngram_split,
                                max_examples=config.ngram_max_examples)
  decoder_only = isinstance(target.definition, gpt.GPTDef)
  sequences = ([np.concatenate([e.inputs, e.targets]) for e in examples]
               if decoder_only else [e.targets for e in examples])
  return ngram.fit_ngram(sequences, target.vocab_size,
                         order=1 if (kind or config.draft) == "unigram" else 2,
                         decoder_only=decoder_only)


def _check_vocabulary_fits(config: ExperimentConfig, target: Model) -> None:
  """Task token ids past the target's embedding would decode as garbage."""
  # TensorFlow: deferred so plan_run and benchmarks/gpu.py import this module without it.
  from specdec_jax.data import tasks  # pylint: disable=g-import-not-at-top
  size = tasks.get_task(config.task).output_features["inputs"].vocabulary
  size = size.vocab_size
  if size > target.vocab_size:
    raise ConfigError(
        f"the task {config.task!r} tokenizes with "
        f"{tasks.current_config().vocab_path!r} ({size} ids, extra ids "
        f"included) but the target has vocab_size {target.vocab_size}: set "
        "TaskConfig.vocab_path to the vocabulary the target was trained "
        "with.")


def task_vocabulary(config: ExperimentConfig, target: Model):
  if target.vocab is not None:
    return target.vocab
  # TensorFlow: deferred so plan_run and benchmarks/gpu.py import this module without it.
  from specdec_jax.data import tasks  # pylint: disable=g-import-not-at-top
  return tasks.get_task(config.task).output_features["targets"].vocabulary


# ----------------------------------------------------------------------------
# Results that survive a kill.


def read_done(path: str, truncate: bool = True) -> list[dict]:
  """Complete lines of `path`; a torn last line (killed mid-write) is cut.

  Every process reads (all must run the same decode calls); only the
  primary one, which writes, truncates. A damaged line before the last one
  cannot come from a kill (each line is fsynced before the next starts): it
  is refused, naming the file and line, rather than skipped.
  """
  if not os.path.exists(path):
    return []
  with open(path, "rb") as f:
    raw = f.read()
  keep = raw[:raw.rfind(b"\n") + 1]
  if truncate and len(keep) != len(raw):
    with open(path, "wb") as f:
      f.write(keep)
  records = []
  for number, line in enumerate(keep.decode(errors="replace").splitlines(),
                                start=1):
    if not line:
      continue
    try:
      records.append(json.loads(line))
    except json.JSONDecodeError as e:
      raise ConfigError(
          f"{path} line {number} is not a JSON record ({e.msg}): the file was "
          "edited or damaged. Delete that line to keep the other results "
          "(its example is decoded again), or delete the workdir to start "
          "over.") from None
  return records


def append_line(path: str, record: dict) -> None:
  with open(path, "a") as f:
    f.write(json.dumps(record) + "\n")
    f.flush()
    os.fsync(f.fileno())


def write_json(path: str, obj: Any) -> None:
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(obj, f, indent=2, sort_keys=True)
  os.replace(tmp, path)


# ----------------------------------------------------------------------------
# The run.


def _spec_kwargs(config: ExperimentConfig) -> dict:
  return dict(max_decode_len=config.max_decode_len,
              temperature=config.temperature, top_k=config.top_k,
              top_p=config.top_p)


def choose_gamma(config, target, draft, batches, workdir) -> int:
  """gamma="optimal": probe alpha and c (and, if configured, the verification
  cost of each gamma), then maximise Theorem 3.8."""
  path = os.path.join(workdir, "optimal_gamma.json")
  if os.path.exists(path):
    with open(path) as f:
      return int(json.load(f)["gamma"])
  probes = [speculative_generate(target, draft, batch.input_ids,
                                 gamma=config.probe_gamma, seed=config.seed,
                                 draft_stop=config.draft_stop,
                                 **_spec_kwargs(config)).stats
            for batch in batches[:config.probe_examples]]
  alpha = theory.pooled_alpha([s.alpha_sum.sum() for s in probes],
                              [s.alpha_count.sum() for s in probes])
  positions = config.max_decode_len + config.max_gamma + 1
  ids = batches[0].input_ids
  measured = costs.measure_costs(target, cost_model(draft), ids,
                                 gamma=config.probe_gamma,
                                 cache_positions=positions,
                                 repeats=config.cost_repeats)
  c = measured["c"]
  verify_costs = None
  if config.optimal_gamma_verify_cost:
    verify_costs = [
        costs.time_extend(target, ids, num_tokens=g + 1,
                          cache_positions=positions,
                          repeats=config.cost_repeats)
        / measured["target_step_s"] for g in range(1, config.max_gamma + 1)]
  gamma = int(theory.optimal_gamma(alpha, c, config.max_gamma,
                                   verify_costs=verify_costs))
  write_json(path, {"gamma": gamma, "alpha": alpha, "c": c,
                    "verify_costs": verify_costs,
                    "probe_gamma": config.probe_gamma,
                    "probe_examples": config.probe_examples})
  logging.info("optimal gamma %d from probe alpha=%.3f c=%.4f", gamma, alpha, c)
  return gamma


def run(config: ExperimentConfig, workdir: str) -> dict:
  """Runs (or resumes) one experiment; returns the summary dict.

  The workdir is locked for the whole run and must hold results of the same
  settings (or none): see `specdec_jax.experiments.workdir`.
  """
  validate(config)
  os.makedirs(workdir, exist_ok=True)
  # plan imports this module.
  from specdec_jax.experiments import plan  # pylint: disable=g-import-not-at-top
  sharding.maybe_initialize_distributed(config.distributed)
  # On a known accelerator, refuse a run that cannot fit before loading
  # anything (shapes only; see scripts/plan_run.py for the full plan).
  plan.check_fits_on_devices(config)
  if not sharding.is_primary():
    return _run_locked(config, workdir)
  with workdir_lib.lock(workdir):
    workdir_lib.check_fingerprint(workdir, config, config.overwrite)
    return _run_locked(config, workdir)


def _run_locked(config: ExperimentConfig, workdir: str) -> dict:
  mesh = sharding.make_mesh(*config.mesh_shape) if config.mesh_shape else None
  target, draft = load_models(config, mesh)
  max_len = config.max_input_len or target.max_input_len or 512
  examples = batching.load_examples(config.task, config.split,
                                max_examples=config.max_examples)
  _check_vocabulary_fits(config, target)
  batches = list(batching.batches(examples, batch_size=1, buckets=config.buckets,
                              max_length=max_len))
  gammas = config.gammas()
  if gammas == "optimal":
    gammas = (choose_gamma(config, target, draft, batches, workdir),)
  vocab = task_vocabulary(config, target)
  primary = sharding.is_primary()

  path = os.path.join(workdir, "examples.jsonl")
  done = [records.ExampleRecord.from_json(r)
          for r in read_done(path, truncate=primary)]
  done_ids = {r.id for r in done}
  kwargs = _spec_kwargs(config)
  warmed: set = set()
  started, new = time.perf_counter(), 0
  todo = [b for b in batches if b.ids[0] not in done_ids]
  for batch in todo:
    ids = batch.input_ids
    if ids.shape not in warmed:  # compile outside the timed calls
      generate(target, ids, seed=config.seed, mesh=mesh, **kwargs)
      for g in gammas:
        speculative_generate(target, draft, ids, gamma=g, seed=config.seed,
                             draft_stop=config.draft_stop, mesh=mesh,
                             **kwargs)
      warmed.add(ids.shape)
    base, base_s = timing.best_time(lambda: generate(  # pylint: disable=cell-var-from-loop
        target, ids, seed=config.seed, mesh=mesh, **kwargs), config.repeats)
    speculative = {}
    for g in gammas:
      spec, spec_s = timing.best_time(lambda: speculative_generate(  # pylint: disable=cell-var-from-loop
          target, draft, ids, gamma=g, seed=config.seed,
          draft_stop=config.draft_stop, mesh=mesh, **kwargs),
                            config.repeats)
      speculative[g] = records.DecodeRecord.of(spec, spec_s, vocab)
    record = records.ExampleRecord(
        id=batch.ids[0], input_length=int(batch.input_lengths[0]),
        target_text=batch.targets_text[0],
        baseline=records.DecodeRecord.of(base, base_s, vocab),
        speculative=speculative)
    if primary:
      append_line(path, record.to_json())
    done.append(record)
    new += 1
    _log_progress(done, new, len(todo), started, gammas)

  # The examples of this run only: a rerun with fewer max_examples reports
  # fewer, and lines of ids outside this run stay in the file unreported.
  by_id = {r.id: r for r in done}
  done = [by_id[b.ids[0]] for b in batches if b.ids[0] in by_id]
  cost_path = os.path.join(workdir, "costs.json")
  costs_by_gamma = _load_or_measure_costs(config, target, draft, batches,
                                          gammas, cost_path, primary)
  summary = report.summarize(config, done, costs_by_gamma, gammas,
                             task_metric(config))
  if primary:
    report.write_outputs(workdir, config, summary, done)
    if config.trace_examples:
      report.write_traces(workdir, config, target, draft, batches[
          :config.trace_examples], vocab, gammas[0], mesh)
  return summary


def _load_or_measure_costs(config, target, draft, batches, gammas, path,
                           primary):
  if os.path.exists(path):
    with open(path) as f:
      stored = json.load(f)
    if all(str(g) in stored for g in gammas):
      return {int(g): v for g, v in stored.items()}
  # The median input length is representative of the run.
  lengths = [b.input_ids.shape[1] for b in batches]
  shape_batch = batches[int(np.argsort(lengths)[len(lengths) // 2])]
  measured = {
      g: costs.measure_costs(target, cost_model(draft),
                             shape_batch.input_ids, gamma=g,
                             cache_positions=config.max_decode_len + g + 1,
                             repeats=config.cost_repeats)
      for g in gammas}
  if primary:
    write_json(path, {str(g): v for g, v in measured.items()})
  return measured


def task_metric(config: ExperimentConfig):
  # TensorFlow: deferred so plan_run and benchmarks/gpu.py import this module without it.
  from specdec_jax.data import tasks  # pylint: disable=g-import-not-at-top
  fns = tasks.get_task(config.task).metric_fns
  return fns[0] if fns else None


def _log_progress(done, new, total, started, gammas):
  elapsed = time.perf_counter() - started
  eta = elapsed / new * (total - new)
  g = gammas[0]
  base = sum(r.baseline.time_s for r in done)
  spec = sum(r.speculative[g].time_s for r in done)
  alpha = theory.pooled_alpha([r.speculative[g].alpha_sum for r in done],
                              [r.speculative[g].alpha_count for r in done])
  logging.info("[%d/%d] alpha=%.3f speedup(gamma=%s)=%.2fx  ETA %.0fs", new,
               total, alpha, g, base / max(spec, 1e-9), eta)
