"""Tests for specdec_jax.training.train and specdec_jax.data.vocabularies.

Everything runs on a generated toy corpus (a word-for-word English->German
"translation" over a 16-word lexicon) and a tiny vocabulary trained on it,
so nothing here needs /work/shared or the network.
"""

import dataclasses
import gc
import inspect
import json
import os
import random
import shutil
import subprocess
import sys

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
import sentencepiece as spm

from specdec_jax import checkpoints
from specdec_jax import generate
from specdec_jax.infra import paths
from specdec_jax.data import batching
from specdec_jax.data import tasks
from specdec_jax.decoding.protocol import Model
from specdec_jax.training import steps
from specdec_jax.training import train
from specdec_jax.training import batches
from specdec_jax.training import mirror
from specdec_jax.data import vocabularies
from specdec_jax.data import readers
from specdec_jax.models import registry
from tests import helpers
from tests.gcs_emulator import gcs_emulator  # noqa: F401  (fixture)

_LEXICON = {
    "red": "rot", "dog": "Hund", "cat": "Katze", "runs": "rennt",
    "sleeps": "schläft", "big": "groß", "small": "klein", "the": "der",
    "a": "ein", "house": "Haus", "tree": "Baum", "man": "Mann",
    "woman": "Frau", "sees": "sieht", "green": "grün", "blue": "blau"}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  """(vocab path); the Multi30k task reads the toy files meanwhile."""
  root = tmp_path_factory.mktemp("corpus")
  rng = random.Random(0)
  for split, size in (("train", 256), ("val", 16)):
    with open(root / f"{split}.en", "w") as en, open(root / f"{split}.de",
                                                     "w") as de:
      for _ in range(size):
        words = [rng.choice(list(_LEXICON)) for _ in range(rng.randint(3, 7))]
        en.write(" ".join(words) + "\n")
        de.write(" ".join(_LEXICON[w] for w in words) + "\n")
  vocab = vocabularies.train_vocab(
      [str(root / "train.en"), str(root / "train.de")], str(root / "vocab"),
      vocab_size=64,
      line_prefixes={str(root / "train.en"): tasks.TRANSLATE_PREFIX})
  files = {"train": str(root / "train"), "validation": str(root / "val")}
  with tasks.override_config(multi30k_files=files):
    yield vocab


_TINY = {"vocab_size": 192, "num_encoder_layers": 1, "num_decoder_layers": 1}


def _config(workdir, vocab, **overrides):
  """10 steps of a 1+1-layer T5 (one batch shape), dropout on, no eval."""
  settings = dict(
      model="t5_tiny", model_overrides=_TINY, vocab_path=vocab,
      length_buckets=(64,), batch_tokens=0, batch_size=32, num_steps=10,
      learning_rate=1e-2, warmup_steps=3, dropout_rate=0.1, log_every=1,
      eval_examples=0, bleu_examples=0, checkpoint_every=0,
      workdir=str(workdir))
  settings.update(overrides)
  return train.TrainConfig(**settings)


@pytest.fixture(scope="module")
def trained(corpus, tmp_path_factory):
  """(workdir, result, names of the programs it compiled) of one run with
  evaluation and two checkpoints."""
  workdir = tmp_path_factory.mktemp("trained")
  with helpers.CompileCounter() as compiles:
    result = train.train(_config(workdir, corpus, eval_examples=None,
                                 bleu_examples=4, max_decode_len=8,
                                 checkpoint_every=5))
  return workdir, result, compiles.names


def _rows(workdir, kind="train"):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [r for r in map(json.loads, f) if r["kind"] == kind]


def _params(workdir):
  return checkpoints.load_model(os.path.join(workdir, "model")).params


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
  rows = _rows(workdir)
  assert [r["step"] for r in rows] == list(range(1, 11))
  assert rows[-1]["loss"] < rows[0]["loss"] - 1.0
  assert result["step"] == 10 and np.isfinite(result["eval_loss"])
  assert 0 <= result["bleu"] <= 100 and _rows(workdir, "eval")
  assert sorted(os.listdir(workdir / "checkpoints")) == ["10", "5"]
  # TensorBoard: the losses and learning rate, as in metrics.jsonl.
  events = list((workdir / "tensorboard").glob("events.out.tfevents.*"))
  assert events
  data = b"".join(e.read_bytes() for e in events)
  for tag in (b"train/loss", b"train/lr", b"eval/eval_loss"):
    assert tag in data, tag
  model = checkpoints.load_model(str(workdir / "model"))
  assert model.config == registry.get_config("t5_tiny", **_TINY)
  saved = ocp.PyTreeCheckpointer().restore(
      str(workdir / "checkpoints" / "10" / "state"))
  jax.tree.map(np.testing.assert_array_equal, saved["params"], model.params)
  ids = tasks.get_vocabulary(corpus).encode(
      tasks.TRANSLATE_PREFIX + "the red dog") + [1]
  tokens = generate(model, np.asarray([ids]), max_decode_len=8).tokens
  assert tokens.shape == (1, 8)


def test_resume_after_kill_matches_an_uninterrupted_run(corpus, trained,
                                                        tmp_path):
  """Stopping after 4 steps and restarting to 10 (across an epoch boundary,
  with dropout on) continues from the saved step and data position and ends
  with exactly the parameters of the run straight to 10. Neither run
  compiles the train step: the `trained` run of the same settings in this
  process did, once (a resumed run's restored, committed state once made
  two more programs than a fresh run's, and each run compiled its own)."""
  with helpers.CompileCounter() as compiles:
    train.train(_config(tmp_path, corpus, num_steps=4))
    train.train(_config(tmp_path, corpus))
  assert "jit(step)" not in compiles.names, compiles.names
  assert [r["step"] for r in _rows(tmp_path)] == list(range(1, 11))
  jax.tree.map(np.testing.assert_array_equal, _params(trained[0]),
               _params(tmp_path))



def test_a_run_saved_on_one_topology_resumes_on_another(corpus, trained,
                                                       tmp_path, caplog):
  """Training (here distillation from a saved teacher) runs on JAX's
  default device, the teacher beside the student, and a resumed run
  restores its state onto the device it runs on now (the state's shapes
  placed there), not onto the devices its checkpoint recorded: orbax
  refuses those in a process of another topology ("Topology mismatch"), so
  every checkpoint was skipped as unrestorable and the run could not
  resume. 2 steps on device 3 of this process's 8 (before, the student
  went to device 0 and the teacher's params too), then resumed to 3 in a
  new process with one device (helpers.script_env drops the simulated
  8)."""
  settings = dict(teacher=str(trained[0] / "model"), distill_alpha=0.5)
  with jax.default_device(jax.devices()[3]), caplog.at_level("INFO"):
    train.train(_config(tmp_path, corpus, num_steps=2, **settings))
  assert f"training on {jax.devices()[3]}" in caplog.text
  config = json.dumps(dataclasses.asdict(_config(tmp_path, corpus,
                                                 num_steps=3, **settings)))
  files = json.dumps(tasks.current_config().multi30k_files)  # the toy data
  resumed = subprocess.run(
      [sys.executable, "-c",
       "import json, sys\n"
       "from specdec_jax.data import tasks\n"
       "from specdec_jax.training import train\n"
       "with tasks.override_config(multi30k_files=json.loads(sys.argv[2])):\n"
       "  train.train(train.TrainConfig(**json.loads(sys.argv[1])))",
       config, files],
      env=helpers.script_env(), capture_output=True, text=True, timeout=600)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert "the data changed" not in resumed.stderr, resumed.stderr[-3000:]
  assert [r["step"] for r in _rows(tmp_path)] == [1, 2, 3]


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
  config = _config(tmp_path, corpus, teacher="t5_tiny", distill_alpha=0.3,
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
  result = train.train(_config(
      tmp_path, corpus, seed=1, teacher=str(trained[0] / "model"),
      distill_alpha=0.5, distill_temperature=2.0))
  rows = _rows(tmp_path)
  assert rows[0]["kl"] > rows[-1]["kl"] > 0
  assert result["step"] == 10


def test_init_from_starts_at_the_saved_parameters(corpus, trained,
                                                  tmp_path):
  """init_from (fine-tuning) starts from a saved model's parameters: the
  first step's loss is the trained model's, far below a fresh init's (the
  control: the same run without init_from); a model of another shape is
  refused naming model_overrides."""
  fresh = train.train(_config(tmp_path / "fresh", corpus, num_steps=1))
  tuned = train.train(_config(tmp_path / "tuned", corpus, num_steps=1,
                              init_from=str(trained[0] / "model")))
  assert tuned["nll"] < fresh["nll"] - 1.0
  assert tuned["nll"] < _rows(trained[0])[-1]["nll"] + 0.5
  with pytest.raises(ValueError, match="model_overrides"):
    train.train(_config(tmp_path / "bad", corpus, num_steps=1,
                        init_from=str(trained[0] / "model"),
                        model_overrides=dict(_TINY, emb_dim=16)))


def test_init_from_a_t5x_checkpoint_uses_the_models_architecture(
    corpus, trained, tmp_path):
  """init_from takes a T5X checkpoint ('t5x:PATH', which records no
  architecture) and reads it with the model's own config: the first step's
  loss is the trained model's, as from our own format."""
  saved = checkpoints.load_model(str(trained[0] / "model"))
  path = checkpoints.write_t5x(saved.params, str(tmp_path / "t5x"), 10)
  tuned = train.train(_config(tmp_path / "tuned", corpus, num_steps=1,
                              init_from="t5x:" + path))
  ours = train.train(_config(tmp_path / "ours", corpus, num_steps=1,
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
  config = _config(tmp_path / "w", corpus, train_translations=str(prefix),
                   bleu_examples=2)
  definition = registry.make_def(config.model_config())
  _, vocab, _, train_data, _, examples = train._prepare(config, definition)
  assert sorted(vocab.decode([int(t) for t in row if t > 1])
                for row in train_data.targets) == sorted(d for _, d in pairs)
  assert len(examples) == 2  # bleu_examples of the toy validation pairs
  for e in examples:
    words = e.inputs_text[len(tasks.TRANSLATE_PREFIX):].split()
    assert e.targets_text == " ".join(_LEXICON[w] for w in words)
  with pytest.raises(FileNotFoundError, match="teacher_outputs.py"):
    train._prepare(_config(tmp_path / "w", corpus,
                           train_translations=str(tmp_path / "none")),
                   definition)
  with pytest.raises(ValueError, match="train_translations replaces"):
    train.train(_config(tmp_path / "w", corpus, train_translations=str(prefix),
                        task=tasks.MULTI30K_ENDE_MIX_LOCAL))


def test_config_errors_name_the_fix(corpus, tmp_path):
  """Configs that cannot train fail before anything compiles, naming the
  field to change."""
  with pytest.raises(ValueError, match="workdir"):
    train.train(_config("", corpus))
  with pytest.raises(ValueError, match="exactly one of num_steps"):
    train.train(_config(tmp_path, corpus, num_epochs=1.0))
  with pytest.raises(ValueError, match="needs a teacher"):
    train.train(_config(tmp_path, corpus, distill_alpha=0.5))
  with pytest.raises(ValueError, match="raise model_overrides"):
    train.train(_config(tmp_path, corpus, model_overrides={}))


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


def test_a_damaged_checkpoint_falls_back_to_the_newest_intact_one(
    corpus, trained, tmp_path, caplog):
  """Issue 18, finding 8: a damaged newest checkpoint gave hundreds of
  lines of orbax errors and the intact previous one went unused. Now the
  run warns naming the skipped step, moves it aside, resumes from step 5
  and ends with exactly the parameters of the uninterrupted run."""
  shutil.copytree(trained[0] / "checkpoints", tmp_path / "checkpoints")
  state = tmp_path / "checkpoints" / "10" / "state"
  data = max((p for p in state.rglob("*") if p.is_file()),
             key=lambda p: p.stat().st_size)
  data.write_bytes(data.read_bytes()[:data.stat().st_size // 3])
  # Orbax's reads abandoned by the failed restore are closed, not left to
  # print a traceback each ("Exception ignored in <coroutine ...>") when
  # collected: none was reported, none is left suspended.
  reports, hook = [], sys.unraisablehook
  sys.unraisablehook = reports.append
  try:
    with caplog.at_level("WARNING"):
      train.train(_config(tmp_path, corpus))
    gc.collect()
    abandoned = [repr(r.object) for r in reports
                 if inspect.iscoroutine(r.object)] + [
                     repr(o) for o in gc.get_objects()
                     if inspect.iscoroutine(o) and o.cr_frame is not None
                     and "orbax" in o.cr_code.co_filename]
  finally:
    sys.unraisablehook = hook
  assert not abandoned, abandoned[:3]
  assert "skipped damaged checkpoint(s) step 10" in caplog.text
  # Issue 38, finding 7: orbax's own tracebacks stay out of the log.
  assert not [r for r in caplog.records if "orbax" in r.pathname], [
      r.getMessage()[:80] for r in caplog.records if "orbax" in r.pathname]
  assert "resumed from step 5" in caplog.text
  assert os.listdir(tmp_path / "damaged_checkpoints")[0].startswith("10.")
  jax.tree.map(np.testing.assert_array_equal, _params(trained[0]),
               _params(tmp_path))


def test_teacher_outputs_script_translates_and_refuses_other_settings(
    corpus, trained, tmp_path):
  """scripts/teacher_outputs.py (the data of sequence-level distillation)
  writes aligned .en (the sources, in the split's order) and .de (the
  teacher's greedy translation, or the reference where it does not end
  within max_decode_len); a rerun with other settings is refused, naming
  them. Shards and resuming are tested in-process (tests/test_teacher.py);
  this checks the script's flags reach them."""
  data = tmp_path / "data"
  data.mkdir()
  files = tasks.current_config().multi30k_files
  for split, name in (("train", "multi30k.train"), ("validation",
                                                    "multi30k.val")):
    for side in ("en", "de"):
      shutil.copy(f"{files[split]}.{side}", data / f"{name}.{side}")
  model = str(trained[0] / "model")
  output = tmp_path / "out" / "mix"
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

  def run(*flags):
    return subprocess.run(
        [sys.executable, os.path.join(repo, "scripts", "teacher_outputs.py"),
         f"--model={model}", f"--output={output}", "--max_examples=6",
         "--batch_size=4", *flags],
        env=dict(os.environ, SPECDEC_SHARED_DATA=str(data)), cwd=repo,
        capture_output=True, text=True, timeout=300)

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
  # The refused rerun in this process (the script's real launch is above).
  with pytest.MonkeyPatch.context() as patch:
    patch.setenv("SPECDEC_SHARED_DATA", str(data))
    other = helpers.run_script(
        "teacher_outputs", f"--model={model}", f"--output={output}",
        "--max_examples=6", "--batch_size=4", "--max_decode_len=9")
  assert other.returncode != 0 and "'max_decode_len': 8" in other.stderr


def test_a_diverging_run_stops_at_the_first_nonfinite_step(corpus, tmp_path):
  """Issue 38, finding 1: with a learning rate that diverges (adamw, no
  clipping) every later step ran, checkpoints with NaN weights were saved
  and the only error came at the final evaluation, blaming "the target
  model". Now the run stops naming the step, the last finite checkpoint and
  the likely causes; no checkpoint holds a non-finite value, and a rerun
  resumes from the last finite one."""
  diverging = _config(tmp_path, corpus, learning_rate=1e30, grad_clip=0.0,
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
    assert all(r["step"] < bad for r in _rows(tmp_path))
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
  config = _config("unused", corpus, bleu_examples=1, max_decode_len=4)
  with pytest.raises(FloatingPointError, match="the model being trained"):
    steps.evaluate(Model(model.definition, nan, model.vocab), None,
                   [example], config)


def test_resume_skips_a_checkpoint_with_nonfinite_parameters(
    corpus, trained, tmp_path, caplog):
  """Issue 38, finding 1: a checkpoint with NaN weights (as runs saved
  before training checked every step) was resumed from. Now it is set aside
  like a damaged one and the run resumes from the last finite one."""
  shutil.copytree(trained[0] / "checkpoints", tmp_path / "checkpoints")
  manager = ocp.CheckpointManager(str(tmp_path / "checkpoints"),
                                  item_names=("state", "meta"))
  old = manager.restore(10, args=ocp.args.Composite(
      state=ocp.args.StandardRestore(), meta=ocp.args.JsonRestore()))
  state = dict(old.state)
  state["params"] = jax.tree.map(lambda x: np.full_like(x, np.nan),
                                 state["params"])
  manager.save(11, args=ocp.args.Composite(
      state=ocp.args.StandardSave(state),
      meta=ocp.args.JsonSave({**old.meta, "step": 11})))
  manager.wait_until_finished()
  manager.close()
  with caplog.at_level("WARNING"):
    train.train(_config(tmp_path, corpus))
  assert "step 11 (non-finite parameters)" in caplog.text
  assert "resumed from step 10" in caplog.text
  jax.tree.map(np.testing.assert_array_equal, _params(trained[0]),
               _params(tmp_path))


def test_metrics_do_not_repeat_steps_after_a_kill(corpus, trained, tmp_path):
  """Issue 38, finding 7: after a kill and resume, metrics.jsonl repeated
  the steps between the last checkpoint and the kill. Here a kill after
  step 8 (checkpoint at 5, rows 6-8 logged, a torn row after) is resumed:
  every step has one row."""
  shutil.copytree(trained[0] / "checkpoints", tmp_path / "checkpoints")
  shutil.rmtree(tmp_path / "checkpoints" / "10")
  rows = [json.dumps(r) for r in _rows(trained[0]) if r["step"] <= 8]
  (tmp_path / "metrics.jsonl").write_text("\n".join(rows) + '\n{"kind": "tr')
  train.train(_config(tmp_path, corpus))
  assert [r["step"] for r in _rows(tmp_path)] == list(range(1, 11))


def test_a_bucket_workdir_trains_uploads_and_resumes_from_the_bucket(
    gcs_emulator, corpus, trained, tmp_path, monkeypatch):  # noqa: F811
  """A gs:// workdir (trained in a local mirror, uploaded at each
  checkpoint): run to step 4, then with the mirror deleted (a fresh machine)
  on to 10, it resumes from the bucket alone and ends with exactly the
  parameters of the uninterrupted local run. The bucket then holds one
  metrics row a step, the model, the last `keep_checkpoints` (2) checkpoints
  only (older ones deleted there too), train_config.json naming the gs://
  workdir, and no lock; nothing lands in a local `gs:` folder."""
  monkeypatch.chdir(tmp_path)
  remote = "gs://results/train_tiny"
  settings = dict(checkpoint_every=2, keep_checkpoints=2)
  train.train(_config(remote, corpus, num_steps=4, **settings))
  assert "checkpoints/4/meta/metadata" in paths.list_files(remote)
  shutil.rmtree(mirror.BucketMirror(remote).local)
  train.train(_config(remote, corpus, **settings))
  rows = [json.loads(line) for line in
          paths.read_text(remote + "/metrics.jsonl").splitlines()]
  assert [r["step"] for r in rows if r["kind"] == "train"] == list(
      range(1, 11))
  files = paths.list_files(remote)
  assert sorted({f.split("/")[1] for f in files
                 if f.startswith("checkpoints/")}) == ["10", "8"], files
  assert ".lock" not in files and "model/config.json" in files
  assert json.loads(paths.read_text(remote + "/train_config.json"))[
      "workdir"] == remote
  jax.tree.map(np.testing.assert_array_equal, _params(trained[0]),
               checkpoints.load_model(remote + "/model").params)
  assert not os.path.exists(tmp_path / "gs:"), os.listdir(tmp_path)
