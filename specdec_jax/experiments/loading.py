"""Loading a run's models: the target, its draft (or cascade of drafts, or a
fitted n-gram drafter), each checked against the architecture its config
names and against the task's vocabulary."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np

from specdec_jax import checkpoints
from specdec_jax import sharding
from specdec_jax.data import readers
from specdec_jax.data import tasks
from specdec_jax.drafts import cascades
from specdec_jax.drafts import trees
from specdec_jax.models import ngram
from specdec_jax.decoding import protocol
from specdec_jax.decoding import widths
from specdec_jax.decoding.protocol import Model
from specdec_jax.experiments import fit
from specdec_jax.experiments.experiment_config import ConfigError
from specdec_jax.experiments.experiment_config import ExperimentConfig


def load_models(config: ExperimentConfig, mesh=None,
                target: Model | None = None) -> tuple[Model, Model]:
  """(target, draft) of a config; `target` given: only the draft loads."""
  check_draft_vocabularies(config)
  overrides = fit.dtype_overrides(config)
  if target is None:
    # A target whose heads, MLP or vocabulary the model axis does not
    # divide (the demo target's 6 heads on runs/cpu_8_model_parallel.gin's
    # 4) is replicated, not refused.
    replicate = None if mesh is None else (
        lambda d: not sharding.divides(d, d.param_shapes(), mesh))
    target = _load_model("target", config.target, config.target_config, mesh,
                         overrides, replicate)

  def load(spec, model_config):
    if spec in ("unigram", "bigram"):
      return fit_ngram_draft(config, target, spec)
    # Sharded by the rules or replicated (see `replicate_draft`), decided
    # from the draft's shapes before anything is read.
    replicate = None if mesh is None else functools.partial(
        fit.replicate_draft, config, mesh_shape=tuple(mesh.shape.values()))
    return _load_model("draft", spec, model_config, mesh, overrides,
                       replicate)

  chain = [load(config.draft, config.draft_config)]
  chain += [load(entry[0], entry[2] if len(entry) > 2 else None)
            for entry in config.cascade]
  draft = chain[-1]
  for model, entry in zip(chain[-2::-1], config.cascade[::-1]):
    draft = cascades.cascade(model, draft, gamma=int(entry[1]))
  shape = config.tree_shape()
  if shape is not None:
    draft = trees.tree(draft, shape)
  return target, draft


def check_draft_vocabularies(config: ExperimentConfig) -> None:
  """Refuses, before any weights are read, a draft (or a cascade's level)
  wider than the target or carrying another SentencePiece model, naming
  both sizes. A narrower one with the target's tokenizer (Gemma 3 1B's
  262,144 ids beside 27B's 262,208) decodes exactly (`decoding.widths`)."""
  target_size, target_vocab = checkpoints.vocabulary_of(
      config.target, config.target_config)
  entries = [(config.draft, config.draft_config)] + [
      (e[0], e[2] if len(e) > 2 else None) for e in config.cascade]
  for spec, model_config in entries:
    if spec in fit.NGRAM_DRAFTS:  # fit over the target's ids
      continue
    size, vocab = checkpoints.vocabulary_of(spec, model_config)
    try:
      widths.check_widths(target_size, size, f"draft {spec!r}")
    except ValueError as e:
      raise ConfigError(f"{e} (target {config.target!r})") from None
    if target_vocab and vocab and vocab != target_vocab:
      raise ConfigError(
          f"draft {spec!r} ({size:,} ids) and target {config.target!r} "
          f"({target_size:,} ids) carry different vocabularies "
          f"(tokenizer fingerprints {vocab[0]} vs {target_vocab[0]}): "
          "the same id names different pieces, so drafts would almost never "
          "be accepted. Use a draft trained with the target's tokenizer.")


def _load_model(role: str, spec: str, model_config: Any, mesh,
                overrides: dict[str, str] | None,
                replicate: Any = None) -> Model:
  """`checkpoints.load_model`, with `model_config` checked where not needed.

  A t5x: checkpoint needs its architecture (`*_config`). Every other spec
  records its own, so there the config is not passed on but compared with
  what loaded: a row that names 'gpt_97m' then runs the model it names
  whether its checkpoint came from T5X or from `specdec_jax.training.train`.
  """
  overrides = dict(overrides or {})
  if replicate is not None:
    overrides["replicate"] = replicate
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
  examples = readers.load_examples(config.task, config.ngram_split,
                                    max_examples=config.ngram_max_examples)
  decoder_only = protocol.family(target.definition) == protocol.DECODER_ONLY
  sequences = ([np.concatenate([e.inputs, e.targets]) for e in examples]
               if decoder_only else [e.targets for e in examples])
  return ngram.fit_ngram(sequences, target.vocab_size,
                         order=1 if (kind or config.draft) == "unigram" else 2,
                         decoder_only=decoder_only)


def check_vocabulary_fits(config: ExperimentConfig,
                          target: Model | None = None) -> None:
  """Refuses a task vocabulary with more ids than the target's embedding.

  Task token ids past the target's embedding would decode as garbage. The
  vocabulary's size counts `TaskConfig.vocab_extra_ids` sentinels on top of
  the SentencePiece model's pieces (T5's 100; Gemma's vocabulary has none).

  Args:
    config: the experiment (its task, and `target_config`).
    target: the loaded target. None: the architecture `config.target_config`
      names, checked before anything loads (nothing is checked without one;
      the check then runs once the target has loaded).

  Raises:
    ConfigError: naming both sizes and the settings that fix it.
  """
  if target is not None:
    target_size = target.vocab_size
  elif config.target_config is not None:
    target_size = checkpoints.resolve_config(config.target_config).vocab_size
  else:
    return
  vocab = tasks.get_task(config.task).output_features["inputs"].vocabulary
  size, extra = vocab.vocab_size, vocab.extra_ids
  if size > target_size:
    settings = tasks.current_config()
    raise ConfigError(
        f"the task {config.task!r} tokenizes with {settings.vocab_path!r} "
        f"({size} ids: {size - extra} pieces + TaskConfig.vocab_extra_ids="
        f"{extra} sentinel ids) but the target has vocab_size {target_size}: "
        "set TaskConfig.vocab_path to the vocabulary the target was trained "
        "with, and TaskConfig.vocab_extra_ids to the sentinels it has (T5's "
        "100; 0 for a vocabulary without them, e.g. Gemma's).")


def task_vocabulary(config: ExperimentConfig, target: Model):
  if target.vocab is not None:
    return target.vocab
  return tasks.get_task(config.task).output_features["targets"].vocabulary
