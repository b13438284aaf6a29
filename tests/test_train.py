"""Tests for specdec_jax.training.train and specdec_jax.data.vocabularies:
training, distillation, evaluation and their errors. Resuming (kills,
damaged checkpoints, another topology, a bucket) is in
tests/test_train_resume.py. Everything runs on the toy corpus of
tests/toy_training.py, so nothing here needs /work/shared or the network.
"""

import os
import shutil

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
import sentencepiece as spm

from specdec_jax import checkpoints
from specdec_jax import generate
from specdec_jax.data import batching
from specdec_jax.data import tasks
from specdec_jax.decoding.protocol import Model
from specdec_jax.training import steps
from specdec_jax.training import train
from specdec_jax.training import batches
from specdec_jax.data import vocabularies
from specdec_jax.data import readers
from specdec_jax.models import registry
from tests import helpers
from tests import toy_training as toy
from tests.toy_training import corpus, trained  # noqa: F401  (fixtures)


def test_vocab_has_t5_special_ids(corpus):
  """The trained vocabulary uses T5's ids: pad 0, EOS 1, UNK 2, no BOS, so
  it drops into the tasks (which add 100 extra ids) and the models."""
  sp = spm.SentencePieceProcessor(model_file=corpus)
  assert (sp.pad_id(), sp.eos_id(), sp.unk_id(), sp.bos_id()) == (0, 1, 2, -1)
  assert [sp.id_to_piece(i) for i in range(3)] == ["<pad>", "</s>", "<unk>"]
  vocab = tasks.get_vocabulary(corpus)
  assert vocab.vocab_size == sp.get_piece_size() + tasks.NUM_EXTRA_IDS
  ids = vocab.encode("the red dog")
  assert 0 not in ids and vocab.decode(ids) == "the red dog"


def test_buckets_cover_every_example_once_per_epoch_in_few_shapes():
  """Each epoch visits every example exactly once, in a seeded order that
  changes per epoch; rare lengths fold into existing shapes; padding rows
  carry zero loss weight and decoder inputs are targets shifted right."""
  rng = np.random.default_rng(0)
  lengths = [(rng.integers(2, 17), rng.integers(2, 17)) for _ in range(200)]
  lengths += [(60, 3), (61, 10)]  # Two rare long inputs share one shape.
  row = lambda n: np.append(rng.integers(3, 50, n - 1), 1).astype(np.int32)
  inputs = [row(a) for a, _ in lengths]
  targets = [row(b) for _, b in lengths]
  bucketed = batches.BucketedData(inputs, targets, (8, 16, 64),
                                  decoder_only=False, batch_tokens=256,
                                  batch_size=0, seed=3)
  assert bucketed.shapes() == [(3, 64, 16), (8, 16, 16), (10, 8, 16),
                               (10, 16, 8), (16, 8, 8)]
  epochs = [bucketed.epoch(e) for e in (0, 1)]
  for order in epochs:
    seen = np.concatenate([i for _, i in order])
    np.testing.assert_array_equal(np.sort(seen), np.arange(len(inputs)))
    assert len(order) == bucketed.batches_per_epoch
  assert [list(i) for _, i in epochs[0]] != [list(i) for _, i in epochs[1]]
  assert [list(i) for _, i in bucketed.epoch(0)] == [list(i) for _, i in
                                                     epochs[0]]
  key, indices = epochs[0][-1]
  batch = bucketed.batch(key, indices)
  first = indices[0]
  n = len(targets[first])
  np.testing.assert_array_equal(batch["targets"][0, :n], targets[first])
  np.testing.assert_array_equal(batch["decoder_inputs"][0, :n],
                                np.append(0, targets[first][:-1]))
  assert batch["weights"].sum() == sum(len(targets[i]) for i in indices)
  # Decoder-only rows hold inputs + targets; only target tokens are weighed.
  gpt = batches.BucketedData(inputs[:4], targets[:4], (64,), decoder_only=True,
                             batch_tokens=0, batch_size=4, seed=0)
  batch = gpt.batch(*gpt.epoch(None)[0])
  a, b = inputs[0], targets[0]
  np.testing.assert_array_equal(batch["decoder_inputs"][0, :len(a) + len(b)],
                                np.concatenate([a, b]))
  weighted = batch["targets"][0][batch["weights"][0] > 0]
  np.testing.assert_array_equal(weighted, b)


def test_training_lowers_loss_and_exports_a_model_that_decodes(corpus,
                                                               trained):
  """A short run lowers the training loss, evaluates (loss, BLEU), and
  writes orbax checkpoints and a `model/` export holding the same trained
  parameters, which `load_model` restores and `generate` decodes. Its ten
  steps ran one compiled train step."""
  workdir, result, compiled = trained
  assert compiled.count("jit(step)") == 1, compiled
  rows = toy.rows(workdir)
  assert [r["step"] for r in rows] == list(range(1, 11))
  assert rows[-1]["loss"] < rows[0]["loss"] - 1.0
  assert result["step"] == 10 and np.isfinite(result["eval_loss"])
  assert 0 <= result["bleu"] <= 100 and toy.rows(workdir, "eval")
  assert sorted(os.listdir(workdir / "checkpoints")) == ["10", "5"]
  # TensorBoard: the losses and learning rate, as in metrics.jsonl.
  events = list((workdir / "tensorboard").glob("events.out.tfevents.*"))
  assert events
  data = b"".join(e.read_bytes() for e in events)
  for tag in (b"train/loss", b"train/lr", b"eval/eval_loss"):
    assert tag in data, tag
  model = checkpoints.load_model(str(workdir / "model"))
  assert model.config == registry.get_config("t5_tiny", **toy.TINY)
  saved = ocp.PyTreeCheckpointer().restore(
      str(workdir / "checkpoints" / "10" / "state"))
  jax.tree.map(np.testing.assert_array_equal, saved["params"], model.params)
  ids = tasks.get_vocabulary(corpus).encode(
      tasks.TRANSLATE_PREFIX + "the red dog") + [1]
  tokens = generate(model, np.asarray([ids]), max_decode_len=8).tokens
  assert tokens.shape == (1, 8)


def test_distillation_kl_is_zero_when_student_is_teacher(corpus, tmp_path):
  """KL(teacher || student) vanishes when both are the same model (and not
  otherwise), so the distilled objective is then (1 - alpha) * CE."""
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(2, 5, 11)).astype(np.float32)
  other = rng.normal(size=(2, 5, 11)).astype(np.float32)
  weights = np.ones((2, 5), np.float32)
  for temperature in (1.0, 2.0):
    assert abs(float(steps.distillation_kl(logits, logits, weights,
                                           temperature))) < 1e-5
    assert float(steps.distillation_kl(logits, other, weights,
                                       temperature)) > 0.1
  config = toy.config(tmp_path, corpus, teacher="t5_tiny", distill_alpha=0.3,
                   dropout_rate=0.0)
  definition = registry.make_def(config.model_config())
  params = definition.init_params(jax.random.key(0))
  teacher_params = jax.tree.map(np.array, params)
  tx = steps.make_optimizer(config, steps.make_schedule(config, 10))
  step = steps.make_train_step(definition, tx, config, definition)
  inputs = [np.array([5, 6, 7, 1], np.int32), np.array([8, 1], np.int32)]
  targets = [np.array([9, 10, 1], np.int32), np.array([11, 1], np.int32)]
  data = batches.BucketedData(inputs, targets, (8,), decoder_only=False,
                              batch_tokens=0, batch_size=2, seed=0)
  batch = data.batch(*data.epoch(None)[0])
  for teacher, zero in ((teacher_params, True),
                        (definition.init_params(jax.random.key(1)), False)):
    state = steps.TrainState(np.int32(0), jax.tree.map(np.array, params),
                             tx.init(params))
    _, sums, bad = step(state, batch, teacher, np.int32(0))
    assert int(bad) == 0
    assert (abs(float(sums["kl"])) < 1e-4) == zero
  np.testing.assert_allclose(float(sums["loss"]), 0.7 * float(sums["nll"])
                             + 0.3 * float(sums["kl"]), rtol=1e-5)


def test_decoder_only_model_learns_its_targets():
  """A GPT-like model trains on one row of inputs + targets with the loss on
  the target tokens only: repeated steps on one batch drive that loss down."""
  config = train.TrainConfig(model="gpt_tiny", num_steps=8, workdir="unused",
                             learning_rate=1e-2, warmup_steps=1)
  definition = registry.make_def(config.model_config())
  params = definition.init_params(jax.random.key(0))
  tx = steps.make_optimizer(config, steps.make_schedule(config, 8))
  step = steps.make_train_step(definition, tx, config)
  rows = [np.array([5, 6, 7, 1], np.int32), np.array([9, 10, 11, 12, 1])]
  data = batches.BucketedData(rows, rows[::-1], (16,), decoder_only=True,
                              batch_tokens=0, batch_size=2, seed=0)
  batch = data.batch(*data.epoch(None)[0])
  assert batch["weights"].sum() == 4 + 5  # The targets' tokens, EOS included.
  state = steps.TrainState(np.int32(0), params, tx.init(params))
  losses = []
  for _ in range(8):
    state, sums, _ = step(state, batch, None, np.int32(0))
    losses.append(float(sums["nll"]) / float(sums["tokens"]))
  assert losses[-1] < 0.5 * losses[0]


def test_distillation_from_a_saved_teacher_trains(corpus, trained,
                                                  tmp_path):
  """A teacher given as a saved model directory is loaded and distilled
  from: the KL term is reported, positive and decreasing."""
  result = train.train(toy.config(
      tmp_path, corpus, seed=1, teacher=str(trained[0] / "model"),
      distill_alpha=0.5, distill_temperature=2.0))
  rows = toy.rows(tmp_path)
  assert rows[0]["kl"] > rows[-1]["kl"] > 0
  assert result["step"] == 10


def test_init_from_starts_at_the_saved_parameters(corpus, trained,
                                                  tmp_path):
  """init_from (fine-tuning) starts from a saved model's parameters: the
  first step's loss is the trained model's, far below a fresh init's (the
  control: the same run without init_from); a model of another shape is
  refused naming model_overrides."""
  fresh = train.train(toy.config(tmp_path / "fresh", corpus, num_steps=1))
  tuned = train.train(toy.config(tmp_path / "tuned", corpus, num_steps=1,
                              init_from=str(trained[0] / "model")))
  assert tuned["nll"] < fresh["nll"] - 1.0
  assert tuned["nll"] < toy.rows(trained[0])[-1]["nll"] + 0.5
  with pytest.raises(ValueError, match="model_overrides"):
    train.train(toy.config(tmp_path / "bad", corpus, num_steps=1,
                        init_from=str(trained[0] / "model"),
                        model_overrides=dict(toy.TINY, emb_dim=16)))


def test_init_from_a_t5x_checkpoint_uses_the_models_architecture(
    corpus, trained, tmp_path):
  """init_from takes a T5X checkpoint ('t5x:PATH', which records no
  architecture) and reads it with the model's own config: the first step's
  loss is the trained model's, as from our own format."""
  saved = checkpoints.load_model(str(trained[0] / "model"))
  path = checkpoints.write_t5x(saved.params, str(tmp_path / "t5x"), 10)
  tuned = train.train(toy.config(tmp_path / "tuned", corpus, num_steps=1,
                              init_from="t5x:" + path))
  ours = train.train(toy.config(tmp_path / "ours", corpus, num_steps=1,
                             init_from=str(trained[0] / "model")))
  assert tuned["nll"] == pytest.approx(ours["nll"], rel=1e-5)


def test_train_translations_replace_the_train_split_only(corpus, tmp_path):
  """Sequence-level distillation trains on a teacher's translations: with
  `train_translations`, the train split is exactly those aligned files
  (here three made-up pairs), the validation split stays the task's; a
  missing file or another task is refused naming the fix."""
  prefix = tmp_path / "teacher"
  pairs = [("red dog", "Hund Hund"), ("a cat", "Katze"), ("the tree", "Baum")]
  (tmp_path / "teacher.en").write_text("".join(e + "\n" for e, _ in pairs))
  (tmp_path / "teacher.de").write_text("".join(d + "\n" for _, d in pairs))
  config = toy.config(tmp_path / "w", corpus, train_translations=str(prefix),
                   bleu_examples=2)
  definition = registry.make_def(config.model_config())
  _, vocab, _, train_data, _, examples = train._prepare(config, definition)
  assert sorted(vocab.decode([int(t) for t in row if t > 1])
                for row in train_data.targets) == sorted(d for _, d in pairs)
  assert len(examples) == 2  # bleu_examples of the toy validation pairs
  for e in examples:
    words = e.inputs_text[len(tasks.TRANSLATE_PREFIX):].split()
    assert e.targets_text == " ".join(toy.LEXICON[w] for w in words)
  with pytest.raises(FileNotFoundError, match="teacher_outputs.py"):
    train._prepare(toy.config(tmp_path / "w", corpus,
                           train_translations=str(tmp_path / "none")),
                   definition)
  with pytest.raises(ValueError, match="train_translations replaces"):
    train.train(toy.config(tmp_path / "w", corpus, train_translations=str(prefix),
                        task=tasks.MULTI30K_ENDE_MIX_LOCAL))


def test_config_errors_name_the_fix(corpus, tmp_path):
  """Configs that cannot train fail before anything compiles, naming the
  field to change."""
  with pytest.raises(ValueError, match="workdir"):
    train.train(toy.config("", corpus))
  with pytest.raises(ValueError, match="exactly one of num_steps"):
    train.train(toy.config(tmp_path, corpus, num_epochs=1.0))
  with pytest.raises(ValueError, match="needs a teacher"):
    train.train(toy.config(tmp_path, corpus, distill_alpha=0.5))
  with pytest.raises(ValueError, match="raise model_overrides"):
    train.train(toy.config(tmp_path, corpus, model_overrides={}))


def test_export_tfds_text_writes_one_value_a_line(tmp_path, monkeypatch):
  """export_tfds_text (scripts/export_text.py, the input of an lm1b
  vocabulary) writes the chosen field one value a line, in order, up to
  max_examples; a newline inside a value cannot split it and empty values
  are skipped; an unknown field names the dataset's features."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  rows = {"text": ["the red dog", "a\nsmall  cat", " ", "big tree", "man"],
          "id": ["0", "1", "2", "3", "4"]}
  monkeypatch.setattr(tasks, "read_tfds_split", lambda name, split: (
      tf.data.Dataset.from_tensor_slices(rows)))
  output = tmp_path / "out" / "text.txt"
  lines = readers.export_tfds_text("lm1b", "train", "text",
                                        str(output), max_examples=4)
  assert lines == 3
  assert output.read_text("utf-8") == "the red dog\na small cat\nbig tree\n"
  with pytest.raises(ValueError, match=r"no feature 'txt'.*\['id', 'text'\]"):
    readers.export_tfds_text("lm1b", "train", "txt", str(output))


def test_teacher_outputs_script_translates_and_refuses_other_settings(
    corpus, trained, tmp_path):
  """scripts/teacher_outputs.py (the data of sequence-level distillation)
  writes aligned .en (the sources, in the split's order) and .de (the
  teacher's greedy translation, or the reference where it does not end
  within max_decode_len); a rerun with other settings is refused, naming
  them. Shards and resuming are tested in-process (tests/test_teacher.py),
  the script's launch as a process by tests/test_docs_commands.py (the
  docs' two shards); this checks the script's flags reach them."""
  data = tmp_path / "data"
  data.mkdir()
  files = tasks.current_config().multi30k_files
  for split, name in (("train", "multi30k.train"), ("validation",
                                                    "multi30k.val")):
    for side in ("en", "de"):
      shutil.copy(f"{files[split]}.{side}", data / f"{name}.{side}")
  model = str(trained[0] / "model")
  output = tmp_path / "out" / "mix"

  def run(*flags):
    with pytest.MonkeyPatch.context() as patch:
      patch.setenv("SPECDEC_SHARED_DATA", str(data))
      return helpers.run_script(
          "teacher_outputs", f"--model={model}", f"--output={output}",
          "--max_examples=6", "--batch_size=4", *flags)

  done = run("--max_decode_len=8")
  assert done.returncode == 0, done.stderr[-2000:]
  english = (data / "multi30k.train.en").read_text().splitlines()[:6]
  assert open(f"{output}.en").read().splitlines() == english
  teacher = checkpoints.load_model(model)
  with tasks.override_config(vocab_path=corpus):
    vocab = tasks.get_vocabulary(corpus)
    ids = [list(vocab.encode(tasks.TRANSLATE_PREFIX + e)) + [1]
           for e in english]
  german = (data / "multi30k.train.de").read_text().splitlines()[:6]
  for i, (row, line) in enumerate(zip(ids, open(f"{output}.de"))):
    tokens = np.asarray(generate(teacher, np.asarray([row]),
                                 max_decode_len=8).tokens[0])
    expected = (vocabularies.detokenize(teacher.vocab, tokens)
                if (tokens == 1).any() else german[i])
    assert line.rstrip("\n") == " ".join(expected.split()), i
  other = run("--max_decode_len=9")
  assert other.returncode == 1 and "Traceback" not in other.stderr
  assert other.stderr.strip().splitlines()[-1].startswith(
      "OtherSettingsError: ")
  assert "'max_decode_len': 8" in other.stderr


def test_a_diverging_run_stops_at_the_first_nonfinite_step(corpus, tmp_path):
  """Issue 38, finding 1: with a learning rate that diverges (adamw, no
  clipping) every later step ran, checkpoints with NaN weights were saved
  and the only error came at the final evaluation, blaming "the target
  model". Now the run stops naming the step, the last finite checkpoint and
  the likely causes; no checkpoint holds a non-finite value, and a rerun
  resumes from the last finite one."""
  diverging = toy.config(tmp_path, corpus, learning_rate=1e30, grad_clip=0.0,
                      schedule="constant", warmup_steps=1, dropout_rate=0.0,
                      checkpoint_every=1, log_every=5, bleu_examples=2,
                      max_decode_len=4)
  with pytest.raises(train.NonFiniteTrainingError) as error:
    train.train(diverging)
  message = str(error.value)
  bad = int(message.split("step ")[1].split()[0])
  assert bad >= 2 and f"step {bad - 1} in" in message, message
  assert "learning_rate=1e+30" in message and "grad_clip=0.0" in message
  assert "float16" in message and not os.path.exists(tmp_path / "model")
  saved = sorted(int(s) for s in os.listdir(tmp_path / "checkpoints"))
  assert saved[-1] == bad - 1
  for step in saved:
    state = ocp.PyTreeCheckpointer().restore(
        str(tmp_path / "checkpoints" / str(step) / "state"))
    assert all(np.isfinite(x).all() for x in jax.tree.leaves(state))
  if os.path.exists(tmp_path / "metrics.jsonl"):  # no row of a NaN window
    assert all(r["step"] < bad for r in toy.rows(tmp_path))
  # The rerun resumes from the last finite checkpoint (whose weights this
  # learning rate has already blown up: it stops at the same step again).
  with pytest.raises(train.NonFiniteTrainingError,
                     match=f"step {bad} gave .* step {bad - 1} in"):
    train.train(diverging)


def test_evaluation_errors_blame_the_model_being_trained(corpus, trained):
  """Issue 38, finding 1: a non-finite model failed the final evaluation
  with an error about "the target model"; it speaks of the trained one."""
  model = checkpoints.load_model(str(trained[0] / "model"))
  nan = jax.tree.map(lambda x: np.full_like(x, np.nan), model.params)
  example = batching.Example(
      id="0", inputs=np.asarray([5, 6, 1], np.int32),
      targets=np.asarray([7, 1], np.int32), inputs_text="x", targets_text="y",
      inputs_eos=True)
  config = toy.config("unused", corpus, bleu_examples=1, max_decode_len=4)
  with pytest.raises(FloatingPointError, match="the model being trained"):
    steps.evaluate(Model(model.definition, nan, model.vocab), None,
                   [example], config)
