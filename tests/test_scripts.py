"""The scripts as a user runs them: processes started from the repository's
root with the flags the docs show, in a fresh interpreter each.

An in-process run shares imports and gin's registry with the tests before
it (a training run without a run file passed in the suite and crashed for
users, issue 66), so these run nothing in-process (the docs' own commands,
the plain training command among them, run in tests/test_docs_commands.py).
Invariants:
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

import pytest

from specdec_jax.data import tasks
from tests import helpers


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
  roofline and the target's call on each width.

  plan_run forces JAX's CPU platform before JAX starts: with JAX_PLATFORMS
  naming an accelerator this machine lacks (as a TPU VM's environment
  names its chips), it still plans, on the simulated CPU devices of the
  row's (2, 4) mesh; the negative control, the same environment for a
  plain JAX program, fails to start a backend. The verdict is the last
  lines (the JSON in --output only), the figures name the compiler that
  made them (XLA:CPU without a TPU topology), and gin logs no error line
  for an include it then finds (issue 60)."""
  env = helpers.script_env(JAX_PLATFORMS="tpu")
  control = helpers.launch(["-c", "import jax; jax.devices()"], env=env)
  assert control.returncode != 0
  row = tmp_path / "row.gin"
  # An include found on gin's search path (its macros only).
  row.write_text((_TINY_ROW % {"gamma": 3}).replace(
      "experiment.ExperimentConfig:",
      "include 'experiments/table2/checkpoints.gin'\n"
      "experiment.ExperimentConfig:"))
  out = tmp_path / "plan.json"
  proc = helpers.launch(["scripts/plan_run.py", f"--gin_file={row}",
                         "--chip=h100", "--verify_widths=2,8",
                         "--gin.ExperimentConfig.mesh_shape=(2, 4)",
                         f"--output={out}", "--compilation_cache_dir="],
                        env=env)
  helpers.assert_succeeded(proc)
  plan = json.loads(out.read_text())
  assert plan["chip"] == "h100" and plan["devices"] == 8, plan
  assert plan["compiler"].startswith("XLA:CPU"), plan["compiler"]
  widths = plan["verification_widths"]
  assert [w["tokens"] for w in widths] == [1, 2, 8]
  assert widths[0]["relative_to_one_token"] == 1.0
  assert all(w["roofline_seconds"] > 0 for w in widths)
  lines = proc.stdout.strip().splitlines()
  assert "figures from XLA:CPU" in lines[0], lines
  assert lines[1].startswith("fits: True: peak "), lines
  assert lines[-1] == f"full plan: {out}", lines


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
