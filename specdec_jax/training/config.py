"""`TrainConfig`: what `train.train` trains and how, and its checks.

Gin files bind it as `train.TrainConfig` (`train.py` imports it), e.g.
`--gin.train.TrainConfig.num_epochs=2`.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping, Sequence

from specdec_jax import errors
from specdec_jax.data import tasks
from specdec_jax.models import registry


class TrainConfigError(ValueError, errors.UsageError):
  """A `TrainConfig` that cannot train; the message names the fix."""


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """What to train and how. Bind it with gin (configs/training/*.gin).

  Attributes:
    task: a task of `specdec_jax.data.tasks`.
    model: a `registry` config name, or a T5Config/GPTConfig.
    model_overrides: config fields replaced on top of `model`.
    vocab_path: SentencePiece model for the task (None: `TaskConfig`'s);
      relative to the cwd.
    train_split, eval_split: split names.
    max_train_examples: train on the first this many only (None: all).
    max_input_len, max_target_len: longer rows are cut keeping EOS last
      (None: the task's feature lengths).
    length_buckets: allowed row widths (the longest row is always allowed).
    batch_tokens: padded input + target tokens per batch (0: batch_size).
    batch_size: rows per batch when batch_tokens is 0.
    num_steps, num_epochs: how long to train; give exactly one.
    optimizer: "adamw" or "adafactor".
    learning_rate: peak learning rate.
    schedule: after a linear warmup, "rsqrt" (1/sqrt(step)), "cosine" (to
      10% of the peak at the end) or "constant".
    warmup_steps: warmup length.
    weight_decay: AdamW's decoupled weight decay, on matrices only.
    adam_b2: AdamW's second-moment decay.
    grad_clip: global-norm clipping (0: none).
    label_smoothing: probability mass spread uniformly over the vocabulary.
    dropout_rate: see `train.py`'s module docstring.
    seed: parameter init, data order and dropout.
    log_every: steps between progress lines (and metrics.jsonl rows).
    eval_every: steps between evaluations (0: at the end only).
    eval_examples: validation examples for loss/accuracy (None: all, 0: no
      loss).
    bleu_examples: the first this many validation examples are decoded
      greedily for BLEU (0: no BLEU).
    eval_batch_size: rows per decoding batch.
    max_decode_len: decoding limit for BLEU.
    checkpoint_every: steps between checkpoints (0: at the end only).
    keep_checkpoints: how many to keep.
    workdir: where everything is written; required.
    init_from: a `checkpoints.load_model` spec whose parameters start the
      run instead of a random init (fine-tuning); its shapes must match
      the model's. A T5X checkpoint ('t5x:gs://.../checkpoint_1000000') is
      read with the model's own architecture (`model_config()`). Ignored
      when the workdir already has a checkpoint.
    teacher: a `checkpoints.load_model` spec (e.g. a directory) to distil.
    teacher_config: the teacher's architecture when it is a T5X checkpoint
      (which does not record one), e.g. 't5_1_1_xxl'.
    distill_alpha: weight of the KL term; the cross-entropy gets 1 - alpha.
    distill_temperature: divides both logits in the KL, which is multiplied
      by its square so the gradients keep their scale (Hinton et al.).
    train_translations: a prefix of `.en`/`.de` files replacing the train
      split (a teacher's outputs, `teacher.py`).
    onpolicy: a `distill.DistillConfig`: on-policy distillation.
    mesh_shape: (data, model) devices to train on, or None for one device.
      The run files (configs/runs/*.gin) set it with the decoding's
      `ExperimentConfig.mesh_shape` (`launch.gin_flags.train_config`): the
      teacher is sharded by the decoding's logical axis rules, batch rows
      go over `data`.
    replicate_student: on a mesh, keep the student's parameters whole on
      every device instead of sharding them by the same rules (its
      optimizer state is replicated either way).
    distributed: join a multi-host job (`ExperimentConfig.distributed`).
    teacher_dtype: the teacher's compute and parameter dtype (None: as
      stored); the run files' `ExperimentConfig.dtype`. The student trains
      in its own config's dtypes.
  """

  task: str = "multi30k_ende_local"
  model: Any = "t5_tiny"
  model_overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  vocab_path: str | None = None
  train_split: str = "train"
  eval_split: str = "validation"
  max_train_examples: int | None = None
  max_input_len: int | None = None
  max_target_len: int | None = None
  length_buckets: Sequence[int] = (16, 24, 32, 48, 64, 96, 128)
  batch_tokens: int = 4096
  batch_size: int = 64
  num_steps: int | None = None
  num_epochs: float | None = None
  optimizer: str = "adamw"
  learning_rate: float = 1e-3
  schedule: str = "rsqrt"
  warmup_steps: int = 1000
  weight_decay: float = 0.0
  adam_b2: float = 0.98
  grad_clip: float = 1.0
  label_smoothing: float = 0.0
  dropout_rate: float = 0.0
  seed: int = 0
  log_every: int = 50
  eval_every: int = 0
  eval_examples: int | None = None
  bleu_examples: int = 256
  eval_batch_size: int = 64
  max_decode_len: int = 96
  checkpoint_every: int = 1000
  keep_checkpoints: int = 2
  workdir: str = ""
  init_from: str | None = None
  teacher_config: Any = None
  teacher: str | None = None
  distill_alpha: float = 0.0
  distill_temperature: float = 1.0
  train_translations: str | None = None
  onpolicy: Any = None
  mesh_shape: Sequence[int] | None = None
  replicate_student: bool = True
  distributed: bool = False
  teacher_dtype: str | None = None

  def model_config(self) -> Any:
    """The architecture: `model` with `model_overrides` applied."""
    if isinstance(self.model, str):
      return registry.get_config(self.model, **self.model_overrides)
    return dataclasses.replace(self.model, **self.model_overrides)

  def on_run(self, mesh_shape=None, distributed: bool = False,
             dtype: str | None = None, **unused) -> "TrainConfig":
    """This config on the machine a run file describes (configs/runs/*.gin:
    `launch.gin_flags.run_settings()`): its mesh, multi-host job and dtype
    (the teacher's) fill the fields this config leaves at their defaults."""
    del unused  # topology: for plan_run, which compiles for it
    return dataclasses.replace(
        self,
        mesh_shape=(self.mesh_shape if self.mesh_shape is not None else
                    None if mesh_shape is None else tuple(mesh_shape)),
        distributed=self.distributed or bool(distributed),
        teacher_dtype=self.teacher_dtype or dtype)

  def max_lengths(self) -> tuple[int, int]:
    lengths = tasks.feature_lengths(self.task)
    return (self.max_input_len or lengths["inputs"],
            self.max_target_len or lengths["targets"])

  def check(self) -> None:
    """Raises `TrainConfigError` naming the fix for a config that cannot
    train."""
    problems = [message for bad, message in (
        (not self.workdir, "workdir is required (--workdir)"),
        ((self.num_steps is None) == (self.num_epochs is None),
         "give exactly one of num_steps and num_epochs (a command-line "
         "--gin binding of one replaces the other set by a gin file; "
         "set the other to None where both are given)"),
        (self.optimizer not in ("adamw", "adafactor"),
         f"optimizer {self.optimizer!r} is not 'adamw' or 'adafactor'"),
        (self.schedule not in ("rsqrt", "cosine", "constant"),
         f"schedule {self.schedule!r} is not rsqrt, cosine or constant"),
        (self.batch_tokens <= 0 and self.batch_size <= 0,
         "set batch_tokens > 0 or batch_size > 0"),
        (not (0 <= self.dropout_rate < 1 and 0 <= self.label_smoothing < 1),
         "dropout_rate and label_smoothing must be in [0, 1)"),
        (not 0 <= self.distill_alpha <= 1 or self.distill_temperature <= 0,
         "distill_alpha must be in [0, 1] and distill_temperature > 0"),
        (self.distill_alpha > 0 and not self.teacher,
         "distill_alpha > 0 needs a teacher (a load_model spec)"),
        (self.train_translations is not None
         and self.task != tasks.MULTI30K_ENDE_LOCAL,
         f"train_translations replaces the train split of "
         f"{tasks.MULTI30K_ENDE_LOCAL!r} only (task is {self.task!r})"),
        (_file_in_the_way(self.workdir),
         f"workdir {self.workdir} {_file_in_the_way(self.workdir)} a regular "
         "file, not a directory: give a directory path, or move the file "
         "away"),
        (self.onpolicy is not None and not self.teacher,
         "onpolicy distillation needs a teacher (a load_model spec)"),
        (self.mesh_shape is not None and (
            len(self.mesh_shape) != 2 or min(self.mesh_shape) < 1),
         f"mesh_shape={self.mesh_shape!r}: give (data, model) sizes >= 1, "
         "e.g. with --gin_file=runs/cpu_8_model_parallel.gin"))
                if bad]
    if problems:
      raise TrainConfigError("Bad TrainConfig: " + "; ".join(problems) + ".")


def _file_in_the_way(path: str) -> str:
  """'is' or 'lies under FILE, which is' when a local `path` cannot be a
  directory because of a regular file, else ''."""
  if not path or "://" in path:
    return ""
  part = os.path.abspath(path)
  while not os.path.exists(part) and os.path.dirname(part) != part:
    part = os.path.dirname(part)
  if not os.path.exists(part) or os.path.isdir(part):
    return ""
  return "is" if part == os.path.abspath(path) else f"lies under {part}, which is"


_LENGTH_FIELDS = ("num_steps", "num_epochs")


def length_from_command_line(bindings: Sequence[str]) -> list[str]:
  """Bindings that let a command line's length replace a gin file's.

  A run is `num_steps` or `num_epochs` long, never both. The demo's gin
  files give `num_epochs`; a command that adds
  `--gin.train.TrainConfig.num_steps=2` means "2 steps instead", so the
  other field is bound to None after it. Where the command line binds both
  (or neither), nothing changes and `check` judges.

  Args:
    bindings: the command line's gin bindings (`NAME = VALUE`).

  Returns:
    Extra bindings to apply after `bindings`: `[...num_epochs = None]` when
    only num_steps was bound (under the same name prefix), and vice versa.
  """
  given = {}
  for binding in bindings:
    name = binding.split("=", 1)[0].strip()
    for field in _LENGTH_FIELDS:
      if name == f"TrainConfig.{field}" or name.endswith(
          f".TrainConfig.{field}"):
        given[field] = name
  if len(given) != 1:
    return []
  (field, name), = given.items()
  other, = (f for f in _LENGTH_FIELDS if f != field)
  return [f"{name[:-len(field)]}{other} = None"]
