"""The losses, the jitted train and eval steps, and evaluation.

`train.train` runs these; they are separate so that a reader of the loop
sees its bookkeeping (data position, checkpoints, signals, logs) apart from
the mathematics, and so a notebook can build a step without a workdir.

T5: the loss is the token-level cross-entropy of teacher-forced decoding on
the real target tokens (EOS included); GPT-like: on the target tokens of
inputs + targets only. Distillation mixes in KL(teacher || student) at a
temperature. Dropout (`dropout_rate`) is applied around the models, which
have none of their own, by a flax method interceptor: to the token
embeddings and to the output of every attention and MLP block.

Dimension letters: B batch rows, T target width, V vocabulary.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
from typing import Any, Mapping

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from specdec_jax.data import batching
from specdec_jax.data import metrics
from specdec_jax.data import vocabularies
from specdec_jax.decoding.api import generate
from specdec_jax.decoding.protocol import Model
from specdec_jax.models import gpt
from specdec_jax.models import layers
from specdec_jax.training import distill
from specdec_jax.training.batches import BucketedData
from specdec_jax.training.config import TrainConfig


def cross_entropy(logits: jax.Array, targets: jax.Array, weights: jax.Array,
                  label_smoothing: float = 0.0) -> tuple[jax.Array, ...]:
  """Token cross-entropy, summed over weighted tokens.

  Args:
    logits: float32 [B, T, V].
    targets: int [B, T].
    weights: float32 [B, T], 0 on padding.
    label_smoothing: mass spread uniformly over V.

  Returns:
    Scalars (smoothed loss sum, plain NLL sum, correct-argmax count).
  """
  log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  nll = -jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
  loss = ((1 - label_smoothing) * nll
          - label_smoothing * jnp.mean(log_probs, axis=-1))
  correct = (jnp.argmax(logits, axis=-1) == targets).astype(jnp.float32)
  return (jnp.sum(loss * weights), jnp.sum(nll * weights),
          jnp.sum(correct * weights))


def distillation_kl(student_logits: jax.Array, teacher_logits: jax.Array,
                    weights: jax.Array, temperature: float = 1.0) -> jax.Array:
  """KL(teacher || student) at a temperature, summed over weighted tokens.

  Args:
    student_logits, teacher_logits: float32 [B, T, V].
    weights: float32 [B, T].
    temperature: both logits are divided by it.

  Returns:
    Scalar sum_{b,t} w * sum_x p_t(x) (log p_t(x) - log p_s(x)).
  """
  log_p = jax.nn.log_softmax(teacher_logits.astype(jnp.float32) / temperature)
  log_q = jax.nn.log_softmax(student_logits.astype(jnp.float32) / temperature)
  return jnp.sum(jnp.sum(jnp.exp(log_p) * (log_p - log_q), axis=-1) * weights)


def _dropout_interceptor(rate: float, key: jax.Array):
  """A flax interceptor: dropout on embeddings and residual branches."""
  counter = itertools.count()
  sites = (layers.Embed, layers.MultiHeadAttention, layers.MlpBlock)

  def interceptor(next_fun, args, kwargs, context):
    out = next_fun(*args, **kwargs)
    if (context.method_name != "__call__"
        or not isinstance(context.module, sites)):
      return out
    # Tracing visits the sites in a fixed order: each gets its own key.
    keep = jax.random.bernoulli(jax.random.fold_in(key, next(counter)),
                                1.0 - rate, out.shape)
    return jnp.where(keep, out / (1.0 - rate), 0).astype(out.dtype)

  return interceptor


def model_logits(definition, params, batch: Mapping[str, jax.Array],
                 dropout_rate: float = 0.0, key: jax.Array | None = None):
  """Teacher-forced float32 logits [B, T, V] of a batch (`BucketedData`)."""
  def run():
    if isinstance(definition, gpt.DecoderOnlyDef):
      return definition.forward(params, batch["decoder_inputs"])
    return definition.forward(params, batch["inputs"], batch["decoder_inputs"])
  if not dropout_rate:
    return run()
  with nn.intercept_methods(_dropout_interceptor(dropout_rate, key)):
    return run()


@flax.struct.dataclass
class TrainState:
  """What a checkpoint holds besides its data position.

  Attributes:
    step: int32 [], optimizer steps taken.
    params: the model's parameter pytree.
    opt_state: the optax state.
  """

  step: jax.Array
  params: Any
  opt_state: Any


def make_schedule(config: TrainConfig, total_steps: int):
  """The learning rate as a function of the step."""
  peak, warmup = config.learning_rate, max(config.warmup_steps, 1)
  if config.schedule == "cosine":
    return optax.warmup_cosine_decay_schedule(
        0.0, peak, warmup, max(total_steps, warmup + 1), end_value=0.1 * peak)

  def schedule(step):
    step = jnp.asarray(step, jnp.float32) + 1
    ramp = peak * jnp.minimum(1.0, step / warmup)
    if config.schedule == "constant":
      return ramp
    return ramp * jnp.sqrt(warmup / jnp.maximum(step, warmup))

  return schedule


def make_optimizer(config: TrainConfig,
                   schedule) -> optax.GradientTransformation:
  """AdamW (decay on matrices only) or Adafactor, after global-norm clipping."""
  if config.optimizer == "adafactor":
    tx = optax.adafactor(learning_rate=schedule)
  else:
    tx = optax.adamw(schedule, b1=0.9, b2=config.adam_b2, eps=1e-9,
                     weight_decay=config.weight_decay,
                     mask=lambda p: jax.tree.map(lambda x: x.ndim > 1, p))
  if config.grad_clip:
    tx = optax.chain(optax.clip_by_global_norm(config.grad_clip), tx)
  return tx


def make_train_step(definition, tx, config: TrainConfig, teacher_def=None):
  """The jitted step: (state, batch, teacher_params, bad) -> (state, sums, bad).

  The state is donated. `sums` are device scalars: loss (the objective),
  nll, kl (0 without a teacher), correct and tokens summed over the batch's
  weighted tokens, and grad_norm.

  `bad` is an int32 device scalar: 0 while every step so far had a finite
  loss, gradient norm and updated parameters, else the number of the first
  step that did not (1-based, as `state.step` after it). From that step on
  the state is returned unchanged, so it never holds a non-finite value;
  the loop reads `bad` when it syncs anyway (logging, checkpoints) and
  stops there (`train.NonFiniteTrainingError`), without a host sync per step.
  """
  alpha, temp = config.distill_alpha, config.distill_temperature

  def loss_fn(params, batch, teacher_params, key):
    logits = model_logits(definition, params, batch, config.dropout_rate, key)
    loss, nll, correct = cross_entropy(logits, batch["targets"],
                                       batch["weights"], config.label_smoothing)
    kl = jnp.zeros(())
    if teacher_def is not None:
      teacher = jax.lax.stop_gradient(
          model_logits(teacher_def, teacher_params, batch))
      kl = distillation_kl(logits, teacher, batch["weights"], temp)
      loss = (1 - alpha) * loss + alpha * temp**2 * kl
    tokens = jnp.sum(batch["weights"])
    sums = dict(loss=loss, nll=nll, kl=kl, correct=correct, tokens=tokens)
    return loss / jnp.maximum(tokens, 1.0), sums

  def step(state: TrainState, batch, teacher_params, bad):
    key = jax.random.fold_in(jax.random.key(config.seed), state.step)
    grads, sums = jax.grad(loss_fn, has_aux=True)(state.params, batch,
                                                  teacher_params, key)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    sums["grad_norm"] = optax.tree.norm(grads)
    finite = (jnp.isfinite(sums["loss"]) & jnp.isfinite(sums["grad_norm"])
              & jnp.all(jnp.asarray([jnp.isfinite(x).all()
                                     for x in jax.tree.leaves(params)])))
    bad = jnp.where((bad == 0) & ~finite, state.step + 1, bad)
    new = TrainState(state.step + 1, params, opt_state)
    # After a non-finite step nothing moves: no checkpoint can hold it.
    state = jax.tree.map(lambda n, o: jnp.where(bad == 0, n, o), new, state)
    return state, sums, bad

  return jax.jit(step, donate_argnums=0)


# TrainConfig fields a train step does not read: data, evaluation, files
# and the model's own settings (its definition carries those). Runs whose
# other fields are equal share one compiled step (`step_for`); a field
# added later is part of the key unless named here.
_NOT_STEP_FIELDS = frozenset({
    "task", "model", "model_overrides", "vocab_path", "train_split",
    "eval_split", "max_train_examples", "max_input_len", "max_target_len",
    "length_buckets", "batch_tokens", "batch_size", "num_steps", "num_epochs",
    "log_every", "eval_every", "eval_examples", "bleu_examples",
    "eval_batch_size", "max_decode_len", "checkpoint_every",
    "keep_checkpoints", "workdir", "init_from", "teacher_config", "teacher",
    "train_translations", "onpolicy", "distributed", "teacher_dtype"})
_STEPS: dict[Any, Any] = {}
_STEPS_KEPT = 8


def step_for(config: TrainConfig, definition, total_steps: int,
             teacher_def=None):
  """(schedule, optimizer, jitted step) of a run of `config`.

  With `config.onpolicy`, the step is `distill.make_distill_step`'s (the
  one `planning/plan_training.py` compiles for a slice). Built once per
  process for equal settings, model and length: a second
  run in the same process (resuming after an error in a notebook, a sweep
  over data or workdirs) reuses the compiled step instead of compiling it
  again.
  """
  if config.onpolicy is not None:
    # On-policy distillation's step (`distill.OnPolicyStep` samples the
    # rows, then runs it): `plan_run` compiles this very function.
    schedule = make_schedule(config, total_steps)
    tx = make_optimizer(config, schedule)
    return schedule, tx, distill.make_distill_step(definition, teacher_def,
                                                   tx, config.onpolicy)
  # Only the cosine schedule depends on the run's length.
  length = total_steps if config.schedule == "cosine" else None
  key = (tuple((f.name, getattr(config, f.name))
               for f in dataclasses.fields(config)
               if f.name not in _NOT_STEP_FIELDS),
         definition, length, teacher_def)
  if key not in _STEPS:
    schedule = make_schedule(config, total_steps)
    tx = make_optimizer(config, schedule)
    _STEPS[key] = (schedule, tx,
                   make_train_step(definition, tx, config, teacher_def))
    while len(_STEPS) > _STEPS_KEPT:
      del _STEPS[next(iter(_STEPS))]
  return _STEPS[key]


@jax.jit(static_argnums=0)
def _eval_step(definition, params, batch):
  logits = model_logits(definition, params, batch)
  _, nll, correct = cross_entropy(logits, batch["targets"], batch["weights"])
  return dict(nll=nll, correct=correct, tokens=jnp.sum(batch["weights"]))


def evaluate(model: Model, eval_data: BucketedData | None, examples,
             config: TrainConfig) -> dict[str, Any]:
  """Validation loss and accuracy, and BLEU of greedy decoding.

  Args:
    model: the model (with its seqio vocabulary) to evaluate.
    eval_data: the examples for the loss (None: no loss).
    examples: `batching.Example`s of the split; the first `bleu_examples` are
      decoded, their EOS and padding stripped, and scored against the raw
      references.
    config: the training config.

  Returns:
    eval_loss, eval_accuracy (token level) and bleu, with a decoded sample.
  """
  result = {}
  if eval_data is not None:
    sums = collections.Counter()
    for key, indices in eval_data.epoch(None):
      out = _eval_step(model.definition, model.params,
                       eval_data.batch(key, indices))
      sums.update({k: float(v) for k, v in out.items()})
    result = {"eval_loss": sums["nll"] / max(sums["tokens"], 1.0),
              "eval_accuracy": sums["correct"] / max(sums["tokens"], 1.0)}
  if config.bleu_examples:
    chosen = examples[:config.bleu_examples]
    vocab, predictions = model.vocab, []
    for batch in batching.batches(chosen, batch_size=config.eval_batch_size,
                                  max_length=config.max_lengths()[0]):
      try:
        tokens = generate(model, batch.input_ids,
                          max_decode_len=config.max_decode_len).tokens
      except FloatingPointError as e:
        raise FloatingPointError(
            "the model being trained gives non-finite logits (NaN or inf) "
            "when decoding the validation examples for BLEU: its parameters "
            "or activations overflow. Look at loss and grad_norm in the "
            "workdir's metrics.jsonl; lower learning_rate, set grad_clip, "
            "or train in float32.") from e
      predictions += [vocabularies.detokenize(vocab, row) for row in tokens]
    result["bleu"] = metrics.bleu([e.targets_text for e in chosen],
                                  predictions)["bleu"]
    result["sample"] = predictions[0]
  return result
