"""The scripts as a user runs them: processes started from the repository's
root with the flags the docs show, in a fresh interpreter each.

An in-process run shares imports and gin's registry with the tests before
it (a training run without a run file passed in the suite and crashed for
users, issue 66), so these run nothing in-process. Invariants:
- `scripts/train.py` with a shipped demo config and no run file trains,
  evaluates and exports a model that loads, reading the vocabulary shipped
  in the package, and prints no error-level line and no start-up notice;
- each mistake a user can make at the command line ends with one line
  (`TypeName: message`, naming what was wrong and the fix), status 1 and
  no traceback: a missing gin file, a run of length given twice, no
  examples, a vocabulary that is not there, TFDS data not prepared;
- `plan_run.py` plans tiny rows as a table on a TPU host with libtpu (or
  simulated CPU devices), names each program before compiling it, draws
  the speedup figure, and plans one row on another chip with the target's
  verification widths.

Each launch pays Python's, JAX's and TensorFlow's start (8-10 s on 2
cores): tiny settings keep the rest short.
"""

import json
import os

import numpy as np
import pytest
import sentencepiece as spm

import specdec_jax as sd
from specdec_jax.data import tasks
from tests import helpers

# Short of the plain command only in the evaluation's size (the whole
# validation split, 1014 sentences, is decoded for BLEU at the end), the
# examples read (the first 512 of 29,000 are tokenized, not all) and their
# batches' widths (one, so one step program compiles, not one a width).
TINY_TRAIN = ("--gin.train.TrainConfig.max_train_examples=512",
              "--gin.train.TrainConfig.eval_examples=16",
              "--gin.train.TrainConfig.bleu_examples=8",
              # One batch shape: one compiled step.
              "--gin.train.TrainConfig.length_buckets=(128,)")
SHIPPED_VOCAB = tasks.resolve_package_path(
    "package:demo_models/target/vocab.model")

needs_shared_data = pytest.mark.skipif(
    not (tasks.default_local_data_dir() / "multi30k.train.en").exists(),
    reason="the Multi30k training text (../shared/data) is not here")


@needs_shared_data
def test_the_plain_training_command_trains_exports_and_is_quiet(tmp_path):
  """docs/demo_models.md's command, with no run file: one device, the
  package's vocabulary (no scripts/train_vocab.py first), the gin file's
  num_epochs replaced by the command line's num_steps."""
  workdir = tmp_path / "distill"
  proc = helpers.launch(["scripts/train.py",
                         "--gin_file=training/demo_draft_small_distill.gin",
                         "--gin.train.TrainConfig.num_steps=2", *TINY_TRAIN,
                         f"--workdir={workdir}"])
  helpers.assert_succeeded(proc)
  assert "step 2/2" in proc.stderr
  rows = [json.loads(line) for line in open(workdir / "metrics.jsonl")]
  assert [r["kind"] for r in rows] == ["train", "eval"]
  assert rows[-1]["step"] == 2 and np.isfinite(rows[-1]["eval_loss"])
  model = sd.load_model(str(workdir / "model"))
  shipped = spm.SentencePieceProcessor(model_file=SHIPPED_VOCAB)
  assert model.vocab.encode("Zwei Hunde.") == shipped.encode("Zwei Hunde.")
  with open(workdir / "train_config.json") as f:
    recorded = json.load(f)
  assert (recorded["num_steps"], recorded["num_epochs"]) == (2, None)


def _mistakes(tmp_path):
  experiment = "--gin_file=experiments/demo/ende_sentences_draft_base_t0.gin"
  demo = "--gin_file=training/demo_draft_small.gin"
  return {
      "a gin file that is not there": (
          ["scripts/train.py", "--gin_file=training/no_such_recipe.gin",
           f"--workdir={tmp_path}/a"],
          ("GinFileError", "no_such_recipe.gin", "--gin_search_paths")),
      "a run's length given twice": (
          ["scripts/train.py", demo, "--gin.train.TrainConfig.num_steps=2",
           "--gin.train.TrainConfig.num_epochs=3", f"--workdir={tmp_path}/b"],
          ("TrainConfigError", "exactly one of num_steps and num_epochs")),
      "no examples": (
          ["scripts/run_experiment.py", experiment,
           "--gin.ExperimentConfig.max_examples=0", f"--workdir={tmp_path}/c"],
          ("ConfigError", "max_examples=0")),
      "a vocabulary that is not there": (
          ["scripts/train.py", demo, "--gin.train.TrainConfig.num_steps=1",
           "--gin.train.TrainConfig.vocab_path="
           "'workdir/demo/vocab/multi30k_ende_4k.model'",
           f"--workdir={tmp_path}/d"],
          ("VocabularyError", "multi30k_ende_4k.model",
           "package:demo_models/target/vocab.model")),
      "TFDS data not prepared": (
          ["scripts/export_text.py", "--tfds_name=lm1b",
           f"--tfds_data_dir={tmp_path}/tfds", f"--output={tmp_path}/t.txt"],
          ("TfdsNotPreparedError", "tfds build lm1b")),
      # A clone without the data folder beside it.
      "training text that is not there": (
          ["scripts/train.py", demo, "--gin.train.TrainConfig.num_steps=1",
           f"--workdir={tmp_path}/e"],
          ("LocalDataNotFoundError", "multi30k.train.en",
           "github.com/multi30k/dataset")),
  }


_ENVIRONMENTS = {"training text that is not there": {
    tasks.SHARED_DATA_ENV: "/nonexistent/shared/data"}}


@pytest.mark.parametrize("mistake", ["a gin file that is not there",
                                     "a run's length given twice",
                                     "no examples",
                                     "a vocabulary that is not there",
                                     "TFDS data not prepared",
                                     "training text that is not there"])
def test_a_users_mistake_is_one_line(mistake, tmp_path):
  command, expected = _mistakes(tmp_path)[mistake]
  proc = helpers.launch(command, **_ENVIRONMENTS.get(mistake, {}))
  line = helpers.assert_one_line_error(proc, *expected)
  # The search path once, not twice (the repository's root is the
  # current directory).
  assert line.count(helpers.REPO + ",") <= 1, line
  assert not os.path.exists(tmp_path / "c" / "examples.jsonl")


_TINY_ROW = """\
from __gin__ import dynamic_registration
from specdec_jax.experiments import experiment
experiment.ExperimentConfig:
  task = 'wmt14_ende_local'
  target = 't5_tiny'
  target_config = 't5_tiny'
  draft = 't5_tiny'
  draft_config = 't5_tiny'
  gamma = %(gamma)d
  temperature = 0.0
  max_decode_len = 16
  max_input_len = 16
"""


def test_plan_run_plans_a_table_naming_each_program_first(tmp_path):
  """--experiments (a glob outside configs/ too) with --setups and
  --figure: every row of the table planned on a v4-8 host, the compiler
  named; a line says which program compiles before its result."""
  for gamma in (3, 5):
    (tmp_path / f"ende_tiny_g{gamma}_t0.gin").write_text(
        _TINY_ROW % {"gamma": gamma})
  out, figure = tmp_path / "tables.md", tmp_path / "alpha.png"
  proc = helpers.launch([
      "scripts/plan_run.py", f"--experiments={tmp_path}/ende_*_t0.gin",
      "--setups=tpu_v4_8", f"--output={out}", f"--figure={figure}"])
  helpers.assert_succeeded(proc)
  text = out.read_text()
  assert "ende_tiny_g3_t0" in text and "ende_tiny_g5_t0" in text
  log = proc.stderr
  assert (log.index("ende_tiny_g3_t0 on ") < log.index(
      "compiling the speculative loop (gamma 3) for ") < log.index(
          "ende_tiny_g3_t0 on (") < log.index("compiled in"))
  assert os.path.getsize(figure) > 0


def test_plan_run_projects_one_row_on_another_chip(tmp_path):
  """One row, --chip and --verify_widths: the plan's JSON has the chip's
  roofline and the target's call on each width."""
  row = tmp_path / "row.gin"
  row.write_text(_TINY_ROW % {"gamma": 3})
  out = tmp_path / "plan.json"
  proc = helpers.launch(["scripts/plan_run.py", f"--gin_file={row}",
                         "--chip=h100", "--verify_widths=2,8",
                         f"--output={out}"])
  helpers.assert_succeeded(proc)
  plan = json.loads(out.read_text())
  assert plan["chip"] == "h100"
  widths = plan["verification_widths"]
  assert [w["tokens"] for w in widths] == [1, 2, 8]
  assert widths[0]["relative_to_one_token"] == 1.0
  assert all(w["roofline_seconds"] > 0 for w in widths)


@pytest.mark.skipif(
    not (tasks.default_local_data_dir() / "multi30k.val.en").exists(),
    reason="the Multi30k validation text (../shared/data) is not here")
def test_build_paragraphs_writes_the_shipped_demo_data(tmp_path):
  """scripts/build_paragraphs.py remakes the demo's inputs from Multi30k
  validation: the files it writes are the package's, byte for byte."""
  proc = helpers.launch(["scripts/build_paragraphs.py",
                         f"--data_dir={tmp_path}"])
  helpers.assert_succeeded(proc)
  shipped = tasks.resolve_package_path("package:demo_data")
  for name in ("sentences.en", "sentences.de", "paragraphs.en",
               "paragraphs.de"):
    with open(os.path.join(shipped, name), "rb") as f:
      assert (tmp_path / name).read_bytes() == f.read(), name
