"""On-policy distillation of a draft: its own samples, scored by the target.

Speculative decoding accepts a drafted token with probability min(1, p/q);
per position the acceptance rate is beta = 1 - TV(p, q) (Definition 3.2,
`theory.acceptance_rate`), and alpha is its mean over the positions the
draft actually visits. Two consequences shape this module (DistillSpec,
Zhou et al. 2024, reached the same conclusions):

  on-policy data   the positions that matter are the draft's own prefixes
                   (and, greedy, the target's), not the references': each
                   row of a batch is either a sequence sampled from the
                   current draft (`onpolicy_fraction` of the rows) or the
                   row the data gives (the target's greedy translations with
                   `TrainConfig.train_translations`, else the references).
  the divergence   total variation is the quantity that sets alpha
                   (alpha = 1 - TV); forward KL(p || q) and reverse
                   KL(q || p) are smoother stand-ins; `divergence` picks one
                   or a weighted mix. They are computed on both models'
                   distributions at the temperature the draft will decode
                   at (`decode_temperature`); greedy decoding (0) has no
                   distribution to match, so the divergences use
                   `greedy_temperature` there (argmax does not move with it).

The teacher is frozen (its logits pass through `stop_gradient`, and only the
student's parameters are differentiated). `make_distill_step` is the jitted
step; it runs on one device or, traced inside `mesh_context(mesh)`, under the
same mesh and logical axis rules as decoding (`specdec_jax.sharding`,
`placement.Placement`): the
teacher's parameters sharded over `model`, the batch over `data`, the draft
replicated or sharded by the same rules (tests/test_distill_sharded.py).
`OnPolicyStep` wraps it for `train.train`: it samples the draft's rows with
the current parameters, then takes the step. Where the arrays go is
`placement.py`'s (what train.py and the planner both use).

Dimension letters: B batch rows, L input width, T target width, V vocabulary.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from specdec_jax import sharding
from specdec_jax.decoding.api import generate
from specdec_jax.decoding.protocol import Model
from specdec_jax.tokens import EOS_ID

DIVERGENCES = ("forward_kl", "reverse_kl", "tv")


@dataclasses.dataclass(frozen=True)
class DistillConfig:
  """What on-policy distillation matches, on which rows. Bind with gin.

  Attributes:
    divergence: "forward_kl" (KL(target || draft)), "reverse_kl"
      (KL(draft || target)), "tv" (total variation: 1 - beta) or "mix".
    mix: with divergence="mix", {divergence: weight}.
    decode_temperature: the temperature the draft will decode at; the
      divergences compare both models' distributions at it.
    greedy_temperature: the divergences' temperature when
      decode_temperature is 0.
    onpolicy_fraction: share of each batch's rows replaced by sequences
      sampled from the current draft (rounded; 1: all of them); the other
      rows keep the data's targets.
    sample_temperature: the draft's sampling temperature for those rows.
    batch_size, input_len, target_len: the step's shapes when it is planned
      from abstract shapes (`planning/plan_training.py`); training takes
      its shapes from the data.
    replicate_student: under a mesh, keep the draft's parameters on every
      device instead of sharding them by the logical rules (a plan from a
      DistillConfig alone; training reads `TrainConfig.replicate_student`).
  """

  divergence: str = "tv"
  mix: Mapping[str, float] = dataclasses.field(default_factory=dict)
  decode_temperature: float = 0.0
  greedy_temperature: float = 1.0
  onpolicy_fraction: float = 1.0
  sample_temperature: float = 1.0
  batch_size: int = 64
  input_len: int = 128
  target_len: int = 128
  replicate_student: bool = True

  def weights(self) -> dict[str, float]:
    """{divergence: weight} of the objective."""
    if self.divergence == "mix":
      return {k: float(v) for k, v in self.mix.items()}
    return {self.divergence: 1.0}

  def temperature(self) -> float:
    """The divergences' temperature."""
    return (self.decode_temperature if self.decode_temperature > 0
            else self.greedy_temperature)

  def check(self) -> None:
    """Raises ValueError naming the fix for a config that cannot train."""
    problems = []
    if self.divergence not in DIVERGENCES + ("mix",):
      problems.append(f"divergence {self.divergence!r} is not one of "
                      f"{DIVERGENCES + ('mix',)}")
    elif self.divergence == "mix":
      unknown = sorted(set(self.mix) - set(DIVERGENCES))
      if not self.mix or unknown or min(self.mix.values()) < 0:
        problems.append(f"divergence='mix' needs mix={{name: weight >= 0}} "
                        f"over {DIVERGENCES}, got {dict(self.mix)}")
    elif self.mix:
      problems.append(f"mix is set but divergence is {self.divergence!r}: "
                      "set divergence='mix'")
    if self.decode_temperature < 0 or self.greedy_temperature <= 0:
      problems.append("decode_temperature must be >= 0 and "
                      "greedy_temperature > 0")
    if self.sample_temperature <= 0:
      problems.append("sample_temperature must be > 0")
    if not 0 <= self.onpolicy_fraction <= 1:
      problems.append("onpolicy_fraction must be in [0, 1]")
    if min(self.batch_size, self.input_len, self.target_len) < 1:
      problems.append("batch_size, input_len and target_len must be >= 1")
    if problems:
      raise ValueError("Bad DistillConfig: " + "; ".join(problems) + ".")


def token_divergences(student_logits: jax.Array, teacher_logits: jax.Array,
                      temperature: float = 1.0) -> dict[str, jax.Array]:
  """Per-token divergences between the teacher p and the student q.

  Args:
    student_logits, teacher_logits: [B, T, V] (any float dtype).
    temperature: both logits are divided by it.

  Returns:
    {"forward_kl": KL(p || q), "reverse_kl": KL(q || p),
     "tv": sum_x |p(x) - q(x)| / 2 = 1 - sum_x min(p, q)}, float32 [B, T].
  """
  log_p = jax.nn.log_softmax(teacher_logits.astype(jnp.float32) / temperature)
  log_q = jax.nn.log_softmax(student_logits.astype(jnp.float32) / temperature)
  p, q = jnp.exp(log_p), jnp.exp(log_q)
  return {"forward_kl": jnp.sum(p * (log_p - log_q), axis=-1),
          "reverse_kl": jnp.sum(q * (log_q - log_p), axis=-1),
          "tv": 0.5 * jnp.sum(jnp.abs(p - q), axis=-1)}


def distill_sums(student_logits: jax.Array, teacher_logits: jax.Array,
                 targets: jax.Array, weights: jax.Array,
                 config: DistillConfig) -> dict[str, jax.Array]:
  """The objective and what the training log shows, summed over tokens.

  Args:
    student_logits, teacher_logits: [B, T, V].
    targets: int [B, T], the rows' tokens.
    weights: float32 [B, T], 0 on padding.
    config: the objective.

  Returns:
    Scalars: loss (the weighted divergences), each divergence, nll (the
    student's on `targets`), kl (= forward_kl, for the log), correct (the
    student's argmax equals the teacher's: greedy agreement) and tokens.
  """
  per_token = token_divergences(student_logits, teacher_logits,
                                config.temperature())
  sums = {k: jnp.sum(v * weights) for k, v in per_token.items()}
  loss = sum(w * sums[k] for k, w in config.weights().items())
  log_q = jax.nn.log_softmax(student_logits.astype(jnp.float32))
  nll = -jnp.take_along_axis(log_q, targets[..., None], axis=-1)[..., 0]
  agree = (jnp.argmax(student_logits, -1) == jnp.argmax(teacher_logits, -1))
  return dict(sums, loss=loss, kl=sums["forward_kl"],
              nll=jnp.sum(nll * weights),
              correct=jnp.sum(agree.astype(jnp.float32) * weights),
              tokens=jnp.sum(weights))


def _logits(definition, params, batch):
  return definition.forward(params, batch["inputs"], batch["decoder_inputs"])


def make_distill_step(student_def, teacher_def, tx: optax.GradientTransformation,
                      config: DistillConfig):
  """The jitted step: (state, batch, teacher_params) -> (state, sums).

  `state` is a `steps.TrainState`-like pytree (step, params, opt_state) and
  is donated; `batch` holds inputs [B, L], decoder_inputs, targets and
  weights [B, T]. Only the student's parameters get gradients; the loss is
  the objective per weighted token. `sums` are `distill_sums` plus
  grad_norm. Traced inside `mesh_context`, the step follows the inputs'
  shardings and the models' logical activation constraints.
  """
  config.check()

  def loss_fn(params, batch, teacher_params):
    teacher = jax.lax.stop_gradient(_logits(teacher_def, teacher_params, batch))
    sums = distill_sums(_logits(student_def, params, batch), teacher,
                        batch["targets"], batch["weights"], config)
    return sums["loss"] / jnp.maximum(sums["tokens"], 1.0), sums

  def step(state, batch, teacher_params, bad=None):
    grads, sums = jax.grad(loss_fn, has_aux=True)(state.params, batch,
                                                  teacher_params)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    sums["grad_norm"] = optax.tree.norm(grads)
    new = state.replace(step=state.step + 1, params=params,
                        opt_state=opt_state)
    if bad is None:
      return new, sums
    # train.train's guard (steps.make_train_step): the first non-finite
    # step's number, after which nothing moves.
    finite = (jnp.isfinite(sums["loss"]) & jnp.isfinite(sums["grad_norm"])
              & jnp.all(jnp.asarray([jnp.isfinite(x).all()
                                     for x in jax.tree.leaves(params)])))
    bad = jnp.where((bad == 0) & ~finite, state.step + 1, bad)
    new = jax.tree.map(lambda n, o: jnp.where(bad == 0, n, o), new, state)
    return new, sums, bad

  return jax.jit(step, donate_argnums=0)


@contextlib.contextmanager
def mesh_context(mesh: jax.sharding.Mesh | None):
  """Traces and runs under `mesh` and the decoding's logical axis rules."""
  if mesh is None:
    yield
    return
  with jax.set_mesh(mesh), nn.logical_axis_rules(
      sharding.logical_axis_rules()):
    yield


def rows_from_tokens(tokens: np.ndarray) -> dict[str, np.ndarray]:
  """decoder_inputs, targets and weights of T5 rows of decoded tokens.

  Args:
    tokens: int [B, T], 0 after each row's EOS (as the decoders return).

  Returns:
    targets = tokens; decoder_inputs = tokens shifted right after the start
    id 0; weights 1 up to and including each row's first EOS (every token
    of a row that has none).
  """
  tokens = np.asarray(tokens, np.int32)
  is_eos = tokens == EOS_ID
  first = np.where(is_eos.any(1), is_eos.argmax(1), tokens.shape[1] - 1)
  weights = (np.arange(tokens.shape[1])[None] <= first[:, None])
  decoder_inputs = np.pad(tokens[:, :-1], ((0, 0), (1, 0)))
  return {"decoder_inputs": decoder_inputs, "targets": tokens,
          "weights": weights.astype(np.float32)}


def sample_rows(student: Model, inputs: np.ndarray, *, length: int,
                temperature: float, seed: int) -> np.ndarray:
  """Sequences sampled from `student` for each input row: int32 [B, length].

  Rows of `inputs` without a token (a batch's empty filler rows) are given
  a lone EOS so the decoder accepts them; their samples mean nothing and
  their weights must stay 0.
  """
  inputs = np.array(inputs, np.int32)
  empty = ~(inputs != 0).any(1)
  inputs[empty, 0] = EOS_ID
  seeds = np.random.default_rng(seed).integers(0, 2**31 - 1, len(inputs))
  return np.asarray(generate(student, inputs, max_decode_len=length,
                             temperature=temperature, seed=seeds).tokens)


class OnPolicyStep:
  """`train.train`'s step with on-policy rows: (state, batch, teacher_params).

  Before each step, the first round(onpolicy_fraction * B) rows of the
  batch are replaced by sequences the current draft samples for their
  inputs (as long as the batch's targets, so the step keeps the data's
  shapes); empty filler rows stay empty. Then `make_distill_step`'s step,
  on the batch `place_batch` puts on the devices (`train.py`'s placement:
  rows over `data` on a mesh; default: as given).
  """

  def __init__(self, student_def, teacher_def, tx, config: DistillConfig,
               seed: int = 0, place_batch=None, step=None):
    self._def, self._config, self._seed = student_def, config, seed
    self._place = place_batch or (lambda batch: batch)
    # `step`: the jitted step `steps.step_for` built (and `plan_run` plans).
    self._step = step or make_distill_step(student_def, teacher_def, tx,
                                           config)

  def onpolicy_batch(self, params, batch: Mapping[str, Any],
                     step: int) -> dict[str, np.ndarray]:
    """`batch` with its first rows sampled from the draft (`params`)."""
    batch = {k: np.asarray(v) for k, v in batch.items()}
    n = int(round(self._config.onpolicy_fraction * len(batch["inputs"])))
    if n == 0:
      return batch
    sampled = sample_rows(Model(self._def, params), batch["inputs"][:n],
                          length=batch["targets"].shape[1],
                          temperature=self._config.sample_temperature,
                          seed=self._seed * 1_000_003 + step)
    rows = rows_from_tokens(sampled)
    real = batch["weights"][:n].sum(1, keepdims=True) > 0
    rows["weights"] = rows["weights"] * real
    for k, v in rows.items():
      batch[k] = np.concatenate([v.astype(batch[k].dtype), batch[k][n:]])
    return batch

  def __call__(self, state, batch, teacher_params, bad=None):
    batch = self._place(self.onpolicy_batch(state.params, batch,
                                            int(np.asarray(
                                                state.step.addressable_data(0)))))
    if bad is None:
      return self._step(state, batch, teacher_params)
    return self._step(state, batch, teacher_params, bad)
