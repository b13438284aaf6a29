"""Trains T5 (or GPT-like) models with optax on a seqio task, fast on a CPU.

This is what trains the shipped demo target and drafts on Multi30k. The
tokenized splits are materialised once as numpy (TensorFlow runs only then);
batches are cut in numpy from length buckets, so the jitted train step sees
a handful of static shapes and compiles once per shape (`batches`).

T5: inputs end in EOS, decoder inputs are the targets shifted right after the
start id 0, the loss is the token-level cross-entropy on the real target
tokens (EOS included). GPT-like: a row is inputs + targets and the loss is on
the target tokens only (the prompt conditions, as when decoding). Optional
distillation mixes in KL(teacher || student) at a temperature.

Dropout: the models have none of their own, so `dropout_rate` applies it
around them with a flax method interceptor, to the token embeddings and to
the output of every attention and MLP block (the residual branches, where T5
puts it). Evaluation and decoding run without it. The losses, the jitted
steps and `evaluate` are in `steps.py`, `TrainConfig` in `config.py`; this
module is the loop around them.

Where it runs (`placement.py`): one device, or the (data, model) mesh a run
file names (configs/runs/*.gin, the same files the decoding scripts take:
`TrainConfig.mesh_shape`), the teacher sharded by the decoding's logical
axis rules and batch rows over `data`; on several processes
(`TrainConfig.distributed`, or the scripts' --coordinator_address flags)
every process runs this same loop on its share of the training examples
(the batches stay the one-process run's), process 0 writes the metrics,
TensorBoard and the exported model, and every process writes its shards
of each checkpoint.

The workdir holds `checkpoints/` (orbax: params, optimizer state, step and
data position, saved sharded; a restarted run resumes from the latest, on
this topology or another), `metrics.jsonl`,
`train_config.json` and, at the end, `model/` in `specdec_jax.checkpoints`
format: `load_model(workdir + "/model")`. A gs:// workdir holds the same,
trained in a local mirror and uploaded (`mirror.py`); on several processes
the checkpoints and the model go straight into the bucket from every
process (`infra/bucket_fs.py`), the rest through process 0's mirror.

Dimension letters: B batch rows, L input width, T target width, V vocabulary.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import os
import signal
import tempfile
import time
from typing import Any, Callable, Mapping

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from specdec_jax import checkpoints
from specdec_jax.infra import bucket_fs
from specdec_jax.infra import locks
from specdec_jax.infra import multihost
from specdec_jax.infra import paths
from specdec_jax.infra import summaries
from specdec_jax.data import tasks
from specdec_jax.training import distill
from specdec_jax.training import mirror
from specdec_jax.training import resume
from specdec_jax.training import steps
from specdec_jax.training.batches import load_split
from specdec_jax.training.placement import local
from specdec_jax.training.placement import Placement
# Gin files bind TrainConfig as train.TrainConfig: imported here for them.
from specdec_jax.training.config import TrainConfig
from specdec_jax.decoding.protocol import Model
from specdec_jax.models import gpt
from specdec_jax.models import registry


# ------------------------------- training -------------------------------------


class NonFiniteTrainingError(FloatingPointError):
  """A step gave a non-finite loss, gradient norm or parameters."""


def _raise_nonfinite(bad_step: int, manager, config: TrainConfig) -> None:
  last = manager.latest_step()
  where = (f"the last checkpoint, step {last} in "
           f"{os.path.join(config.workdir, 'checkpoints')}, holds finite "
           "values and a rerun resumes from it" if last is not None else
           "no checkpoint was saved, so a rerun starts from scratch")
  raise NonFiniteTrainingError(
      f"training stopped: step {bad_step} gave a non-finite loss, gradient "
      f"norm or parameters (NaN or inf), so its update was not applied and "
      f"nothing after it was saved; {where}. Likely causes: the learning "
      f"rate is too high for this model (learning_rate="
      f"{config.learning_rate}, warmup_steps={config.warmup_steps}), no "
      f"gradient clipping (grad_clip={config.grad_clip}; try 1.0), or a "
      "low-precision dtype that overflows (float16; use bfloat16 or "
      "float32). A rerun with a lower learning_rate resumes from the last "
      "checkpoint; grad_clip, the optimizer or the dtype change what a "
      "checkpoint holds, so train with new ones in a new workdir.")


class _StopRequest:
  """SIGTERM/SIGINT ask the loop to checkpoint and stop after this step."""

  def __enter__(self):
    self.requested, self._previous = False, {}
    self.signal = None  # the one that asked
    for sig in (signal.SIGTERM, signal.SIGINT):
      try:
        self._previous[sig] = signal.signal(sig, self._handle)
      except ValueError:  # Not the main thread: leave signals alone.
        pass
    return self

  def _handle(self, signum, frame):
    del frame
    logging.warning("signal %d: saving a checkpoint, then stopping", signum)
    self.requested, self.signal = True, signum

  def __exit__(self, *exc):
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)


def _prepare(config: TrainConfig, definition,
             placement: Placement | None = None):
  """Vocabulary, teacher (on `placement`; default: the config's) and data,
  all checked before anything compiles."""
  vocab_path = (os.path.abspath(tasks.resolve_package_path(config.vocab_path))
                if config.vocab_path else tasks.current_config().vocab_path)
  vocab = tasks.get_vocabulary(vocab_path)
  if vocab.vocab_size > definition.vocab_size:
    raise ValueError(
        f"the vocabulary {vocab_path} has {vocab.vocab_size} ids ("
        f"{vocab.extra_ids} extra ids included: TaskConfig.vocab_extra_ids) "
        f"but the model's vocab_size is {definition.vocab_size}: raise "
        "model_overrides['vocab_size'].")
  teacher = None
  placement = placement or Placement.create(config.mesh_shape,
                                            config.replicate_student)
  if config.teacher:
    teacher = placement.load_teacher(config.teacher, config.teacher_config,
                                     config.teacher_dtype)
    if teacher.vocab_size != definition.vocab_size:
      raise ValueError(
          f"the teacher {config.teacher!r} has vocab_size "
          f"{teacher.vocab_size}, the student {definition.vocab_size}: "
          "distillation compares distributions token by token, so set the "
          "student's model_overrides['vocab_size'] to the teacher's.")
  decoder_only = isinstance(definition, gpt.DecoderOnlyDef)
  n = config.eval_examples
  train_files = {}
  if config.train_translations:
    prefix = os.path.abspath(config.train_translations)
    for side in ("en", "de"):
      if not os.path.exists(f"{prefix}.{side}"):
        raise FileNotFoundError(
            f"TrainConfig.train_translations: {prefix}.{side} not found; "
            "write it with scripts/teacher_outputs.py or fix the path.")
    train_files["multi30k_files"] = {
        **tasks.current_config().multi30k_files, config.train_split: prefix}
  with tasks.override_config(vocab_path=vocab_path):
    with tasks.override_config(**train_files):
      # Several processes: each reads its share (`batches.load_split`).
      _, train_data = load_split(config, config.train_split,
                                 config.max_train_examples, decoder_only,
                                 share=placement.spans_processes)
    examples, eval_data = [], None
    if n != 0 or config.bleu_examples:
      examples, eval_data = load_split(
          config, config.eval_split,
          None if n is None else max(n, config.bleu_examples), decoder_only,
          keep=n or None)
      eval_data = None if n == 0 else eval_data
  return vocab_path, vocab, teacher, train_data, eval_data, examples


def _initial_params(config: TrainConfig, definition):
  """`init_from`'s parameters as float32, checked against the model's."""
  expected = jax.eval_shape(definition.init_params, jax.random.key(0))
  architecture = (config.model_config()
                  if config.init_from.startswith("t5x:") else None)
  params = checkpoints.load_model(config.init_from, config=architecture).params
  shapes = lambda tree: jax.tree.map(lambda x: tuple(x.shape), tree)
  if shapes(params) != shapes(expected):
    raise ValueError(
        f"init_from {config.init_from!r} has other parameter shapes than the "
        "configured model: make model_overrides describe its architecture "
        "(its config.json).")
  return jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), params)


def _window_metrics(window: Mapping[str, float], seconds: float):
  tokens = max(window["tokens"], 1.0)
  return {"loss": window["loss"] / tokens, "nll": window["nll"] / tokens,
          "kl": window["kl"] / tokens, "accuracy": window["correct"] / tokens,
          "grad_norm": window["grad_norm"] / window["steps"],
          "examples_per_s": window["examples"] / seconds,
          "tokens_per_s": ((window["tokens"] + window["input_tokens"])
                           / seconds),
          "step_s": seconds / window["steps"]}


def _save(manager, state: steps.TrainState, per_epoch: int) -> None:
  step = int(state.step)
  if manager.latest_step() != step:
    meta = {"step": step, "batches_per_epoch": per_epoch,
            "epoch": step // per_epoch, "batch_in_epoch": step % per_epoch}
    manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)))


def _log_window(last: dict[str, float], total: int) -> None:
  """One progress line: where the run is, its speed, the window's metrics
  and the time left at this window's speed."""
  logging.info(
      "step %d/%d (epoch %.2f) | %.1f ex/s %.0f tok/s %.3f s/step | "
      "loss %.4f nll %.4f kl %.4f acc %.3f | lr %.2e | ETA %.0f s",
      last["step"], total, last["epoch"], last["examples_per_s"],
      last["tokens_per_s"], last["step_s"], last["loss"], last["nll"],
      last["kl"], last["accuracy"], last["lr"],
      last["step_s"] * (total - last["step"]))


def train(config: TrainConfig) -> dict[str, Any]:
  """Trains, resuming from the workdir's latest checkpoint if there is one.

  Args:
    config: what to train; see `TrainConfig`. A local workdir is locked
      for the run (`infra.locks`: a second run there stops, naming the
      holder); a gs:// workdir is trained in a local mirror under the
      bucket's lease lock, uploaded after each checkpoint and at the end
      (`mirror.py`); on several processes its checkpoints go straight
      into the bucket (`_train_into_bucket`).

  Returns:
    The last window's training metrics (loss, nll, kl, accuracy, lr, rates)
    and the final evaluation (eval_loss, eval_accuracy, bleu), with step,
    num_params and seconds. A run stopped by SIGTERM/SIGINT saves a
    checkpoint and returns what it has with stopped=True.
  """
  config.check()
  multihost.initialize(config.distributed)
  if not paths.is_remote(config.workdir):
    # One run, one writer: process 0 holds the workdir's lock for the run,
    # and every process stops if it cannot (`multihost.on_primary`).
    os.makedirs(config.workdir, exist_ok=True)
    with contextlib.ExitStack() as held:
      multihost.on_primary(
          lambda: held.enter_context(locks.lock(config.workdir)))
      return _train(config)
  if jax.process_count() > 1:
    return _train_into_bucket(config)
  with mirror.bucket_mirror(config.workdir) as copy:
    logging.info("training %s in its local mirror %s", config.workdir,
                 copy.local)
    return _train(dataclasses.replace(config, workdir=copy.local),
                  after_checkpoint=copy.upload, recorded=config)


def _train_into_bucket(config: TrainConfig) -> dict[str, Any]:
  """`train` on several processes with a gs:// workdir.

  Every process writes its shards of each checkpoint (and of the exported
  model) straight into the bucket, orbax committing each once all wrote:
  orbax's directory calls go through our I/O layer (`bucket_fs`, for the
  rest of this process). Process 0 holds the workdir's lease lock for the
  run (every process stops if it cannot) and keeps the rest (metrics.jsonl,
  TensorBoard, train_config.json) in a local mirror uploaded after each
  checkpoint and at the end, as a one-process gs:// run does.
  """
  bucket_fs.use_for_epath()
  stored = ("checkpoints", "model", "damaged_checkpoints")
  copy = mirror.BucketMirror(config.workdir, skip=stored)
  with contextlib.ExitStack() as held:

    def take():
      held.enter_context(locks.lock(config.workdir))
      copy.download()
      held.callback(copy.upload)

    # Every process joins the job's collectives before process 0 may wait
    # out a dead run's lease (up to SPECDEC_LOCK_LEASE_S): gloo gives up on
    # a first collective whose peers arrive 30 s apart.
    multihost.sync("train: before the workdir's lock")
    multihost.on_primary(take)
    # The other processes write no file of their own to the workdir.
    local = copy.local if multihost.is_primary() else held.enter_context(
        tempfile.TemporaryDirectory(prefix="specdec_jax_train."))
    logging.info("training %s: checkpoints into the bucket, the rest in %s",
                 config.workdir, local)
    # On every process, so that all wait for each checkpoint alike.
    after = copy.upload if multihost.is_primary() else lambda: None
    # The checkpoints go straight into the bucket, committed there by
    # orbax: the metrics up to a checkpoint's step are uploaded before it
    # starts, or a kill between its commit and the next upload would lose
    # them (a resumed run keeps the rows up to its checkpoint and drops
    # the later ones, `resume.forget_metrics_after`).
    before = copy.upload if multihost.is_primary() else None
    return _train(dataclasses.replace(config, workdir=local),
                  after_checkpoint=after, recorded=config,
                  store=config.workdir, before_checkpoint=before)


def _train(config: TrainConfig,
           after_checkpoint: Callable[[], None] | None = None,
           recorded: TrainConfig | None = None,
           store: str | None = None,
           before_checkpoint: Callable[[], None] | None = None
           ) -> dict[str, Any]:
  """`train` in a local workdir; `after_checkpoint` runs once each
  periodic checkpoint is written, `before_checkpoint` before it is started
  (with the metrics of its step on disk); train_config.json records `recorded`
  (default: `config`); `store` (default: the workdir) holds `checkpoints/`
  and `model/`. On several processes every one runs this; process 0
  alone writes the metrics, TensorBoard, train_config.json and the model's
  manifest, and every process writes its shards of each checkpoint
  (orbax)."""
  store = store or config.workdir
  placement = Placement.create(config.mesh_shape, config.replicate_student)
  logging.info("%s", placement.describe())
  primary = multihost.is_primary()
  model_config = config.model_config()
  definition = registry.make_def(model_config)
  vocab_path, vocab, teacher, train_data, eval_data, examples = _prepare(
      config, definition, placement)
  os.makedirs(config.workdir, exist_ok=True)
  if primary:
    with open(os.path.join(config.workdir, "train_config.json"), "w") as f:
      json.dump(dataclasses.asdict(recorded or config), f, indent=2,
                default=lambda v: (dataclasses.asdict(v) if
                                   dataclasses.is_dataclass(v) else str(v)))
  per_epoch = train_data.batches_per_epoch
  total = config.num_steps or int(np.ceil(config.num_epochs * per_epoch))
  schedule, tx, train_step = steps.step_for(
      config, definition, total, teacher.definition if teacher else None)

  def init(params=None):
    if params is None:
      params = definition.init_params(jax.random.key(config.seed))
    return steps.TrainState(jnp.int32(0), params, tx.init(params))

  def make_manager():
    return ocp.CheckpointManager(
        paths.absolute(paths.join(store, "checkpoints")),
        options=ocp.CheckpointManagerOptions(
            max_to_keep=config.keep_checkpoints, create=True),
        item_names=("state", "meta"))

  placement.log_bytes(teacher, definition, jax.eval_shape(init))
  logging.info("%d examples, %d batches an epoch, %d steps; batch shapes "
               "(rows, widths): %s", len(train_data.lengths), per_epoch, total,
               train_data.shapes())
  restored, manager = resume.restore_latest_intact(
      make_manager, init, store,
      placement.state_shardings(definition, jax.eval_shape(init)))
  if restored is None:
    state = init(_initial_params(config, definition) if config.init_from
                 else None)
  else:
    state = restored.state
    if restored.meta.get("batches_per_epoch") != per_epoch:
      logging.warning("the data changed since the checkpoint: %s batches an "
                      "epoch then, %d now", restored.meta.get(
                          "batches_per_epoch"), per_epoch)
    logging.info("resumed from step %d", int(local(state.step)))
  num_params = sum(x.size for x in jax.tree.leaves(state.params))
  logging.info("%s: %.3fM parameters", model_config, num_params / 1e6)
  if config.onpolicy is not None:
    config.onpolicy.check()
    train_step = distill.OnPolicyStep(definition, teacher.definition, tx,
                                      config.onpolicy, config.seed,
                                      place_batch=placement.put_batch,
                                      step=train_step)
  metrics_path = os.path.join(config.workdir, "metrics.jsonl")
  writer = summaries.Writer(config.workdir)

  if primary:
    resume.forget_metrics_after(metrics_path, int(local(state.step)))

  def record(row):
    if not primary:
      return
    with open(metrics_path, "a") as f:  # a line survives a kill right after
      f.write(json.dumps(row) + "\n")
    writer.scalars(row["kind"], row, row["step"])

  def run_eval(step):
    # On each host's first device, from gathered parameters: decoding and
    # BLEU need no mesh. Every process evaluates, only process 0 reports:
    # the processes then reach the next collective (a step, a save) together
    # instead of the others waiting in it past gloo's timeout, and no
    # process runs a collective its peers do not (`sharding.gather` fetches
    # one process's arrays without one).
    params = placement.host(state.params)
    result = steps.evaluate(Model(definition, params, vocab), eval_data,
                            examples, config)
    if not primary:
      return {}
    logging.info("eval at step %d: %s", step, result)
    record({"kind": "eval", "step": step, **result})
    return result

  step = int(local(state.step))
  start_time = window_start = time.time()
  window, last, order = collections.Counter(), {}, (-1, None)
  # `bad`: the first non-finite step, on device (steps.py).
  state, bad = placement.put_state(definition, state), placement.put_scalar(0)
  teacher_params = teacher.params if teacher else None

  def check_finite():  # before anything is logged or saved
    if int(local(bad)):
      manager.wait_until_finished()
      _raise_nonfinite(int(local(bad)), manager, config)

  with _StopRequest() as stop:
    while step < total and not _stopping(stop):
      epoch, position = divmod(step, per_epoch)
      if order[0] != epoch:
        order = (epoch, train_data.epoch(epoch))
      key, indices = order[1][position]
      batch = train_data.batch(key, indices)
      if train_data.shared:  # this process's rows: the processes' batch
        batch = placement.join_shares(batch)
        if config.onpolicy is not None:  # sampled from, on the host
          batch = placement.host(batch)
      elif config.onpolicy is None:
        batch = placement.put_batch(batch)
      with placement.context():
        state, sums, bad = train_step(state, batch, teacher_params, bad)
      step += 1
      # Sums stay on the device until log time, so that the host cuts the
      # next batch while this step runs.
      window.update(sums)
      window.update(steps=1, examples=len(indices), input_tokens=int(
          train_data.lengths[indices, 0].sum()))
      if step % config.log_every == 0 or step == total:
        check_finite()
        last = {"step": step, "epoch": step / per_epoch,
                "lr": float(schedule(step - 1)),
                **_window_metrics({k: float(local(v))
                                   for k, v in window.items()},
                                  time.time() - window_start)}
        _log_window(last, total)
        record({"kind": "train", **last})
        window, window_start = collections.Counter(), time.time()
      if config.checkpoint_every and step % config.checkpoint_every == 0:
        check_finite()
        if before_checkpoint:
          writer.flush()
          before_checkpoint()
        _save(manager, state, per_epoch)
        writer.flush()
        if after_checkpoint:
          manager.wait_until_finished()
          after_checkpoint()
      if config.eval_every and step % config.eval_every == 0 and step < total:
        check_finite()
        paused = time.time()
        run_eval(step)
        window_start += time.time() - paused  # Rates measure training alone.
    check_finite()
    _save(manager, state, per_epoch)
    manager.wait_until_finished()
  final = {} if stop.requested else run_eval(step)
  if not stop.requested:
    # Every process: orbax writes each shard once, from the process that
    # holds it, and process 0 the manifest.
    checkpoints.save(Model(definition, state.params, vocab),
                     paths.join(store, "model"),
                     config=model_config, vocab=vocab_path, overwrite=True)
  manager.close()
  writer.close()
  return {**last, **final, "step": step, "num_params": int(num_params),
          "seconds": time.time() - start_time, "stopped": stop.requested,
          "signal": stop.signal}


def _stopping(stop: "_StopRequest") -> bool:
  """Whether to stop before the next step. A signal reaches one process
  of a multi-host job (a preempted host's): process 0's answer is every
  process's, so all stop at the same step instead of one waiting in a
  collective the others never join."""
  if jax.process_count() == 1:
    return stop.requested
  return bool(multihost.broadcast(stop.requested))
