"""Whether a run fits its chips, from shapes alone (nothing compiled or allocated).

`run_shape` is what `experiment.run` would load (dtypes, replicated draft,
cache lengths); `estimate` counts its bytes per device (parameters, caches,
activations) with `memory.footprint`, the memory model the decoder's input
checks and the planner count with too; `check_fits` refuses a run that
cannot fit, with the numbers and the fix, before anything is loaded.
`specdec_jax.planning` compiles the same shapes for the full memory and
cost picture, and records the compiler's figure beside this one.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax
import jax.numpy as jnp

from specdec_jax import sampling
from specdec_jax import sharding
from specdec_jax.checkpoints import configs
from specdec_jax.decoding import acceptance
from specdec_jax.decoding import drafters
from specdec_jax.drafts import trees
from specdec_jax.infra import chips
from specdec_jax.experiments.experiment_config import ConfigError
from specdec_jax.experiments.experiment_config import ExperimentConfig
from specdec_jax.memory import footprint
from specdec_jax.models import registry

GB = 1e9
NGRAM_DRAFTS = ("unigram", "bigram")


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
  shapes = draft_def.param_shapes()
  sizes = dict(zip(sharding.MESH_AXES, mesh_shape))
  specs = jax.tree.leaves(draft_def.param_logical_axes(),
                          is_leaf=lambda x: isinstance(
                              x, jax.sharding.PartitionSpec))
  for leaf, spec in zip(jax.tree.leaves(shapes), specs):
    for size, axis in zip(leaf.shape, tuple(sharding.logical_to_mesh(spec))):
      if axis is not None and size % sizes[axis]:
        return True
  return False



@dataclasses.dataclass(frozen=True)
class RunShape:
  """The shapes a run decodes with (batch 1, as `experiment.run`)."""

  target: Any  # ModelDef
  draft: Any  # ModelDef
  gamma: int
  max_decode_len: int
  input_len: int
  batch: int
  mesh_shape: tuple[int, int]
  temperature: float
  top_k: int
  top_p: float
  replicate_draft: bool
  # The TPU slice to compile for (`chips.TOPOLOGIES`), None: not a TPU.
  topology: str | None = None
  # The draft's token tree (`trees.shape.TreeShape`), None: a chain of gamma.
  tree: Any = None

  @property
  def draft_definition(self) -> Any:
    """The draft the loop is built for: the model, or its token tree."""
    return (self.draft if self.tree is None
            else trees.TreeDef(self.draft, self.tree))

  @property
  def drafter(self) -> Any:
    """The loop's drafter, for what it declares (`protocol.Drafter`): its
    shape, scratch positions and the models it calls."""
    return drafters.make_drafter(
        self.draft_definition, self.gamma, sampling.SamplingConfig(
            self.temperature, self.top_k, self.top_p), 1,
        acceptance.rule_for(sampling.SamplingConfig(self.temperature)))

  @property
  def verified(self) -> int:
    """Tokens one target call scores: gamma + 1, or a tree's nodes + 1."""
    return self.drafter.shape.verified

  @property
  def positions(self) -> int:
    """Decoder positions of the caches (the engine's width): max_decode_len
    + gamma + 1 + the drafter's scratch positions."""
    return (self.max_decode_len + self.gamma + 1
            + self.drafter.extra_width)


def run_shape(config: ExperimentConfig, input_len: int | None = None
              ) -> RunShape:
  """The models and shapes `experiment.run` would decode with."""
  if config.target_config is None or config.draft_config is None:
    raise ConfigError(
        "planning needs the architectures: set ExperimentConfig.target_config"
        " and draft_config (n-gram drafts are not planned)")
  if config.draft in NGRAM_DRAFTS:
    raise ConfigError(f"draft={config.draft!r}: n-gram drafts are not planned")
  overrides = dtype_overrides(config)
  target = registry.make_def(dataclasses.replace(
      configs.resolve_config(config.target_config), **overrides))
  draft = registry.make_def(dataclasses.replace(
      configs.resolve_config(config.draft_config), **overrides))
  gammas = config.gammas()
  gamma = config.max_gamma if isinstance(gammas, str) else max(gammas)
  mesh_shape = tuple(config.mesh_shape) if config.mesh_shape else (1, 1)
  length = (input_len or config.max_input_len or target.max_input_len or 512)
  return RunShape(
      target=target, draft=draft, gamma=int(gamma),
      max_decode_len=config.max_decode_len, input_len=int(length), batch=1,
      mesh_shape=mesh_shape, temperature=config.temperature,
      top_k=config.top_k, top_p=config.top_p,
      replicate_draft=replicate_draft(config, draft, mesh_shape),
      topology=config.topology, tree=config.tree_shape())


def estimate(shape: RunShape) -> dict[str, Any]:
  """Bytes per device from shapes alone (`memory.footprint`, the one
  memory model): parameters, caches, activations, and their total."""
  mesh = shape.mesh_shape
  out, counted = {}, []
  # The target scores the proposal; the draft's models, what its drafter
  # declares it calls (`protocol.ModelCall`), each its tokens a call.
  calls = [("target", shape.target, shape.verified)] + [
      ("draft", call.definition, call.tokens)
      for call in shape.drafter.calls]
  for role, definition, tokens in calls:
    replicate = role == "draft" and shape.replicate_draft
    counted.append(footprint.model_bytes(
        definition, shape.batch, shape.input_len, shape.positions, tokens,
        mesh, replicate))
    out[f"{role}_param_bytes"] = counted[-1].params
    out[f"{role}_param_bytes_total"] = footprint.param_bytes(definition)
    out[f"{role}_cache_bytes"] = counted[-1].cache
  need = footprint.loop_bytes(counted, [t for _, _, t in calls], shape.batch,
                              shape.target.vocab_size, shape.positions,
                              shape.gamma)
  out["activation_bytes"] = need["activations"]
  out["total_bytes"] = need["total"]
  return out


# The run config that splits a model over one host's chips, per chip.
MODEL_PARALLEL_RUNS = {"tpu_v4": "runs/tpu_v4_8_model_parallel.gin",
                       "tpu_v5e": "runs/tpu_v5e_4_model_parallel.gin"}


def fix_for(shape: RunShape, chip: chips.Chip, hbm: int,
            needed: int | None = None) -> str:
  """What makes `shape` fit `hbm` bytes per device: bfloat16, or the
  smallest model-parallel mesh whose share fits. `needed`: the bytes one
  device needs now where a compiler measured more than the shapes count;
  the larger meshes are scaled by the same factor."""
  fixes = []
  if jnp.dtype(shape.target.config.param_dtype) != jnp.bfloat16:
    fixes.append("dtype bfloat16")
  scale = max(1.0, (needed or 0) / estimate(shape)["total_bytes"])
  for model in (2, 4, 8, 16):
    if model <= shape.mesh_shape[1]:
      continue
    bigger = dataclasses.replace(shape, mesh_shape=(1, model))
    if scale * estimate(bigger)["total_bytes"] <= hbm:
      run = MODEL_PARALLEL_RUNS.get(chip.name)
      fixes.append(run if run and model <= 4
                   else f"mesh_shape=(1, {model}) (model parallel)")
      break
  return ("use " + " or ".join(fixes)) if fixes else (
      "use a larger chip or a smaller draft/target")


def check_fits(config: ExperimentConfig, chip: chips.Chip,
               hbm_bytes: int | None = None) -> dict[str, Any]:
  """Raises ConfigError (numbers and fix) if the run cannot fit `chip`.

  Shapes only: nothing is compiled or allocated. `hbm_bytes` overrides the
  chip's capacity (e.g. a device's reported `bytes_limit`).
  """
  shape = run_shape(config)
  est = estimate(shape)
  hbm = int(hbm_bytes or chip.hbm_bytes)
  if est["total_bytes"] <= hbm:
    return est
  fix = fix_for(shape, chip, hbm)
  raise ConfigError(
      f"this run needs about {est['total_bytes'] / GB:.1f} GB per device but "
      f"{chip.name} has {hbm / GB:.1f} GB ({hbm / chips.GIB:.0f} GiB): "
      f"target parameters "
      f"{est['target_param_bytes'] / GB:.1f} GB "
      f"({shape.target.config.param_dtype}), draft "
      f"{est['draft_param_bytes'] / GB:.2f} GB, caches "
      f"{(est['target_cache_bytes'] + est['draft_cache_bytes']) / GB:.2f} GB, "
      f"activations ~{est['activation_bytes'] / GB:.2f} GB on a "
      f"{shape.mesh_shape[0]}x{shape.mesh_shape[1]} (data x model) mesh. "
      f"Fix: {fix}.")


def check_fits_on_devices(config: ExperimentConfig) -> dict | None:
  """`check_fits` for the devices this process sees; None where the chip is
  not known (CPUs): there is nothing to protect a launch from. Asks a
  device of this process (`memory_stats` of another host's is not
  available): every host of a slice holds the same chips."""
  device = jax.local_devices()[0]
  chip = chips.chip_of_device_kind(getattr(device, "device_kind", ""))
  if chip is None or config.target_config is None or (
      config.draft_config is None or config.draft in NGRAM_DRAFTS):
    return None
  stats = device.memory_stats() or {}
  return check_fits(config, chip, stats.get("bytes_limit"))
