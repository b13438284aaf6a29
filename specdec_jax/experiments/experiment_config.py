"""What one experiment runs: `ExperimentConfig`, and its checks.

`validate` finds every problem that is visible without loading a model or
reading data, and raises one `ConfigError` listing them, so a bad config
fails in a second, not after a checkpoint has loaded. The run itself is
`specdec_jax.experiments.experiment`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from specdec_jax import errors
from specdec_jax import sampling
from specdec_jax.decoding import api
from specdec_jax.decoding import checks
from specdec_jax.decoding import contract
from specdec_jax.decoding import stopping
from specdec_jax.decoding.tree_shape import TreeShape
from specdec_jax.decoding.stopping import StopRule
from specdec_jax.infra import chips
from specdec_jax.tokens import DEFAULT_STOP_IDS


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
    stop_ids: a row ends after the first of these ids it emits, and its
      recorded text is cut before it: (1,), EOS, by default; (1, 107) for
      T5Gemma's instruction-tuned checkpoints, whose turns end with
      <end_of_turn> (configs/experiments/t5gemma/checkpoints.gin).
    max_input_len: inputs are cut to this many tokens (None: the target's
      limit, else 512).
    buckets: input widths examples are padded to (None: powers of two).
    max_examples: the first examples of the split (None: all); a rerun with
      more extends the workdir.
    seed: sampling seed (each example's rows from it).
    repeats, cost_repeats: timed repeats of each decode and of each cost
      measurement (the fastest counts; a run times the target alone and
      every arm in interleaved rounds, `best_of.best_runs`, and after each
      round one of the model steps the costs divide, in turn,
      `step_timers.RoundRobinTimer`; a step the rounds timed fewer than
      cost_repeats times gets the rest after them).
    ngram_split, ngram_max_examples: data an n-gram drafter is fitted on.
    trace_examples: examples whose per-iteration traces are plotted.
    rule: the acceptance rule: None (Algorithm 1) or any
      `acceptance.AcceptanceRule`, e.g. `@typical.TypicalAcceptance()` with
      `from specdec_jax.rules import typical` in the .gin file (lossy: the
      tables mark its rows `exact` False).
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
    tree: the draft proposes a token tree (`sd.tree`, beyond the paper):
      its branching per depth, e.g. (3, 2, 1, 1); gamma must be its depth.
    tree_parents: the same for any static tree: the parent of nodes
      1..M breadth first (`sd.TreeShape`), e.g. a Sequoia-style shape from
      `TreeShape.best`; at most one of tree and tree_parents.
    compiler_options: XLA options of every decoding loop and cost timing
      of the run (None: XLA's defaults), e.g. `api.CPU_EIGEN_MATMULS`:
      {'xla_cpu_experimental_ynn_fusion_type': ''} on CPUs where Eigen runs
      a verification's matmuls faster than YNNPACK.
    mesh_shape: (data, model) devices, or None for one device.
    replicate_draft: replicate the draft's parameters on every device
      instead of sharding them over `model`; None: only when its heads, MLP
      or vocabulary do not divide the model axis (T5-small's 6 heads on 4
      chips).
    distributed: call jax.distributed.initialize() (multi-host pods).
    topology: the TPU slice the run is for, as libtpu names it (a key of
      `chips.TOPOLOGIES`, e.g. 'v4:2x2x1' for a v4-8 host): `plan_run.py`
      compiles for its devices with the TPU compiler where libtpu is
      installed, the mesh taking its first devices; None: not a TPU.
    name: the row's name in tables.
    overwrite: delete the workdir's results of other settings instead of
      refusing to resume (same settings resume); see `workdir.py`.
    summary_every_examples, summary_every_seconds: TensorBoard's
      per-example scalars reach the workdir (a new events object each time)
      after this many new examples or seconds, whichever comes first, and
      at the end: a killed run keeps what it showed.
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
  stop_ids: Sequence[int] = DEFAULT_STOP_IDS
  compiler_options: dict | None = None
  max_input_len: int | None = None
  buckets: Sequence[int] | None = None
  max_examples: int | None = None
  seed: int = 0
  repeats: int = 1
  cost_repeats: int = 5
  ngram_split: str = "train"
  ngram_max_examples: int | None = 20000
  trace_examples: int = 3
  rule: Any = None
  draft_stop: StopRule | None = None
  cascade: Sequence[tuple[str | int, ...]] = ()
  tree: Sequence[int] | None = None
  tree_parents: Sequence[int] | None = None
  mesh_shape: Sequence[int] | None = None
  replicate_draft: bool | None = None
  distributed: bool = False
  topology: str | None = None
  name: str = ""
  overwrite: bool = False
  summary_every_examples: int = 10
  summary_every_seconds: float = 60.0

  def decode_kwargs(self) -> dict[str, Any]:
    """The decoding keywords every call of the run shares (sampling, length,
    compiler options, stop ids)."""
    return dict(max_decode_len=self.max_decode_len,
                temperature=self.temperature, top_k=self.top_k,
                top_p=self.top_p, compiler_options=self.compiler_options,
                stop_ids=self.stop_ids)

  def decoder(self, target: Any, draft: Any, gamma: int,
              mesh: Any = None) -> api.SpeculativeDecoder:
    """The `SpeculativeDecoder` this run decodes with at `gamma`."""
    return api.SpeculativeDecoder(
        target, draft, gamma=gamma, max_decode_len=self.max_decode_len,
        sampling=sampling.SamplingConfig(self.temperature, self.top_k,
                                         self.top_p),
        rule=self.rule, draft_stop=self.draft_stop, mesh=mesh,
        compiler_options=self.compiler_options, stop_ids=self.stop_ids)

  def tree_shape(self) -> TreeShape | None:
    """The draft's token-tree shape (None: a chain); raises ValueError for
    a malformed one (`config_problems` reports it)."""
    if self.tree is not None:
      return TreeShape.from_branching(tuple(self.tree))
    if self.tree_parents is not None:
      return TreeShape(tuple(self.tree_parents))
    return None

  def gammas(self) -> tuple[int, ...] | str:
    if isinstance(self.gamma, str):
      return self.gamma
    if isinstance(self.gamma, (list, tuple)):
      return tuple(int(g) for g in self.gamma)
    return (int(self.gamma),)


class ConfigError(ValueError, errors.UsageError):
  """An experiment config that cannot run; raised before any model loads."""


def config_problems(config: ExperimentConfig) -> list[str]:
  """What is wrong with the config's own fields, each with its fix.

  Checks everything checkable without loading models, data or a task
  (`experiment.validate` adds the task's checks and raises)."""
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
  try:
    api.compiler_options_key(config.compiler_options)
  except TypeError as e:
    problems.append(str(e))
  if config.max_decode_len < 1:
    problems.append(f"max_decode_len={config.max_decode_len} must be >= 1")
  try:  # the vocabulary's bound is checked when the models have loaded
    checks.check_stop_ids(config.stop_ids, None)
  except (TypeError, ValueError) as e:
    problems.append(str(e))
  try:
    sampling.SamplingConfig(config.temperature, config.top_k, config.top_p)
  except (TypeError, ValueError) as e:
    problems.append(str(e))
  if config.summary_every_examples < 1 or config.summary_every_seconds <= 0:
    problems.append(
        f"summary_every_examples={config.summary_every_examples} and "
        f"summary_every_seconds={config.summary_every_seconds} must be "
        f"positive")
  if config.max_examples is not None and config.max_examples < 1:
    problems.append(f"max_examples={config.max_examples}: give a number >= 1 "
                    "of the split's first examples, or None for all of them")
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
  try:
    contract.check_rule(config.rule)
  except (TypeError, ValueError) as e:
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
  problems += _tree_problems(config)
  if config.mesh_shape is not None and len(config.mesh_shape) != 2:
    problems.append(f"mesh_shape={config.mesh_shape!r}: use (data, model)")
  if config.topology is not None:
    if config.topology not in chips.TOPOLOGIES:
      problems.append(f"topology={config.topology!r} is not a TPU slice we "
                      f"plan for; use one of {', '.join(chips.TOPOLOGIES)}")
    elif config.mesh_shape is not None and (
        config.mesh_shape[0] * config.mesh_shape[1] >
        chips.TOPOLOGIES[config.topology].num_chips):
      problems.append(
          f"mesh_shape={tuple(config.mesh_shape)} needs more chips than "
          f"topology {config.topology!r} has "
          f"({chips.TOPOLOGIES[config.topology].num_chips}): use a larger "
          f"slice or a smaller mesh")
  return problems


def _tree_problems(config: ExperimentConfig) -> list[str]:
  """What is wrong with a tree row's settings, each with its fix."""
  if config.tree is None and config.tree_parents is None:
    return []
  if config.tree is not None and config.tree_parents is not None:
    return ["tree and tree_parents are both set: give the tree's shape one "
            "way (a branching per depth, or the parents breadth first)"]
  try:
    shape = config.tree_shape()
  except (TypeError, ValueError) as e:
    return [str(e)]
  problems = []
  if config.cascade:
    problems.append("a token tree's draft must be a plain model: drop "
                    "cascade or tree")
  if config.draft_stop is not None:
    problems.append("draft_stop shortens chains; a token tree has a static "
                    "shape: drop draft_stop or tree")
  if config.gammas() != (shape.depth,):
    problems.append(
        f"gamma={config.gamma!r} but the tree {shape.describe()} is "
        f"{shape.depth} deep: set gamma = {shape.depth} (a tree's gamma is "
        f"its depth)")
  if shape.depth > config.max_decode_len:
    problems.append(
        f"the tree {shape.describe()} is deeper ({shape.depth}) than "
        f"max_decode_len={config.max_decode_len}: use a shallower tree")
  return problems
