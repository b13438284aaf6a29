r"""Would draft_base agree more with the target reading the target's encoder?

  python benchmarks/borrowed_encoder.py --mode=borrow --steps=1200 \
      --output=/tmp/borrow.jsonl          # and --mode=own, the control

A question about draft quality, not a feature: the engine runs the draft's
own encoder. In `--mode=borrow` the shipped draft_base drops its encoder and
reads the frozen target's encoder output through a learned 384 -> 64
projection (24.6k parameters, started at the least-squares map onto
draft_base's own encoder output on 25 training batches), so its own
parameters shrink and its decoder sees the target's reading of the source.
`--mode=own` is the control: draft_base as shipped.

Both fine-tune the same way: forward KL(target || draft) at temperature 1
on the reference prefixes of `multi30k_ende_mix_local`'s train split
(batches of 4,096 padded tokens, Adam, linear warmup over 50 steps, cosine
decay). Every 100 steps the script prints, and appends to --output, the
greedy agreement on the target's own greedy outputs (the argmax match that
decides a greedy draft token) for the first 256 Multi30k validation
sentences and the first 96 validation paragraphs. No model trains on
validation text. Needs ../shared/data. docs/demo_models.md has the result.
"""

import json
import time

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np
import optax

import specdec_jax as sd
from specdec_jax.data import batching
from specdec_jax.data import tasks
from specdec_jax.data import readers
from specdec_jax.models import t5
from specdec_jax.training.batches import BucketedData
from specdec_jax.tokens import EOS_ID

_MODE = flags.DEFINE_enum("mode", "borrow", ["borrow", "own"],
                          "The target's encoder, or the draft's own.")
_STEPS = flags.DEFINE_integer("steps", 1200, "Training steps.")
_LR = flags.DEFINE_float("learning_rate", 1e-3, "Peak learning rate.")
_OUTPUT = flags.DEFINE_string("output", None, "JSONL of the evaluations.")
_TARGET = flags.DEFINE_string("target", "demo:target", "Target model spec.")
_DRAFT = flags.DEFINE_string("draft", "demo:draft_base", "Draft model spec.")


def _pad(rows) -> np.ndarray:
  out = np.zeros((len(rows), max(len(r) for r in rows)), np.int32)
  for i, row in enumerate(rows):
    out[i, :len(row)] = row
  return out


def _greedy_set(target, examples, max_len: int) -> dict[str, np.ndarray]:
  """The target's greedy outputs of `examples` as a teacher-forced batch."""
  inputs = _pad([e.inputs for e in examples])
  tokens = sd.generate(target, inputs, max_decode_len=max_len).tokens
  decoder_inputs = np.zeros_like(tokens)
  decoder_inputs[:, 1:] = tokens[:, :-1]
  ends = np.argmax(tokens == EOS_ID, axis=1) + 1
  weights = np.arange(tokens.shape[1])[None] < ends[:, None]
  return {"inputs": inputs, "decoder_inputs": decoder_inputs,
          "targets": tokens, "weights": weights.astype(np.float32)}


def main(argv):
  del argv
  target, draft = sd.load_model(_TARGET.value), sd.load_model(_DRAFT.value)
  tdef, ddef = target.definition, draft.definition
  tparams = jax.tree.map(jnp.asarray, target.params)
  with tasks.override_config(
      vocab_path=target.vocab.sentencepiece_model_file):
    train = readers.load_examples("multi30k_ende_mix_local", "train")
    sentences = readers.load_examples("multi30k_ende_local", "validation",
                                       max_examples=256)
    paragraphs = readers.load_examples("multi30k_ende_paragraphs_local",
                                        "validation", max_examples=96)
  data = BucketedData([e.inputs[:128] for e in train],
                      [e.targets[:128] for e in train],
                      (16, 32, 48, 64, 96, 128), decoder_only=False,
                      batch_tokens=4096, batch_size=0, seed=0)
  evals = {"sentences": _greedy_set(target, sentences, 64),
           "paragraphs": _greedy_set(target, paragraphs, 96)}
  borrow = _MODE.value == "borrow"

  def logits_fn(params, inputs, decoder_inputs):
    if borrow:
      encoded = tdef.encode(tparams, inputs) @ params["projection"]
    else:
      encoded = ddef.encode(params["draft"], inputs)
    cross = ddef._apply(params["draft"], encoded,  # pylint: disable=protected-access
                        method=t5.T5Transformer.cross_kv)
    positions = jnp.broadcast_to(jnp.arange(decoder_inputs.shape[1]),
                                 decoder_inputs.shape)
    logits, _ = ddef._apply(  # pylint: disable=protected-access
        params["draft"], decoder_inputs, positions, cross, inputs > 0, None,
        method=t5.T5Transformer.decode)
    return logits

  params = {"draft": jax.tree.map(jnp.asarray, draft.params)}
  if borrow:
    xs, ys = [], []
    for key, indices in data.epoch(None)[::40][:25]:
      batch = data.batch(key, indices)
      real = batch["inputs"] > 0
      xs.append(np.asarray(tdef.encode(tparams, batch["inputs"]))[real])
      ys.append(np.asarray(ddef.encode(params["draft"], batch["inputs"]))[real])
    x, y = np.concatenate(xs), np.concatenate(ys)
    projection = np.linalg.lstsq(x, y, rcond=None)[0]
    r2 = 1 - ((x @ projection - y)**2).sum() / ((y - y.mean(0))**2).sum()
    print(f"least squares on {len(x)} tokens: R^2 {r2:.3f}", flush=True)
    params["projection"] = jnp.asarray(projection, jnp.float32)
    del params["draft"]["encoder"]
  own = sum(v.size for v in jax.tree.leaves(params))
  print(f"{_MODE.value}: {own / 1e6:.3f}M own parameters", flush=True)

  @jax.jit
  def agreement(params, batch):
    logits = logits_fn(params, batch["inputs"], batch["decoder_inputs"])
    hits = (jnp.argmax(logits, -1) == batch["targets"]) * batch["weights"]
    return hits.sum() / batch["weights"].sum()

  schedule = optax.join_schedules(
      [optax.linear_schedule(0.0, _LR.value, 50),
       optax.cosine_decay_schedule(_LR.value, _STEPS.value)], [50])
  tx = optax.adam(schedule)
  opt_state = tx.init(params)

  @jax.jit
  def step(params, opt_state, batch):
    log_p = jax.nn.log_softmax(
        tdef.forward(tparams, batch["inputs"], batch["decoder_inputs"]))

    def loss_fn(params):
      log_q = jax.nn.log_softmax(
          logits_fn(params, batch["inputs"], batch["decoder_inputs"]))
      kl = jnp.sum(jnp.exp(log_p) * (log_p - log_q), axis=-1)
      return jnp.sum(kl * batch["weights"]) / batch["weights"].sum()
    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  def report(step_number, loss, seconds):
    row = {"mode": _MODE.value, "step": step_number, "loss": loss,
           "s_per_step": seconds,
           **{k: float(agreement(params, v)) for k, v in evals.items()}}
    print(json.dumps(row), flush=True)
    if _OUTPUT.value:
      with open(_OUTPUT.value, "a") as f:
        f.write(json.dumps(row) + "\n")

  report(0, None, None)
  order = [b for epoch in range(-(-_STEPS.value // data.batches_per_epoch))
           for b in data.epoch(epoch)]
  start = time.time()
  for i in range(1, _STEPS.value + 1):
    key, indices = order[i - 1]
    params, opt_state, loss = step(params, opt_state, data.batch(key, indices))
    if i % 100 == 0 or i == _STEPS.value:
      report(i, float(loss), (time.time() - start) / i)


if __name__ == "__main__":
  app.run(main)
