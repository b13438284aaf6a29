"""Every command the docs show is run here, or listed with why it is not.

The commands are read from the pages as they are (tests/doc_commands.py:
every fenced shell block of README.md and docs/*.md, split into the
commands a shell runs), so a page and its test cannot drift apart:
`test_every_documented_command_is_run_or_excused` fails on a command that
is in neither list below, or on a list entry no page has any more.

A command runs as a user types it, from the repository's root, in bash:
the venv's Python for `python`, its workdirs (`workdir/`, `/tmp/`,
`$HOME/results`) under the test's folder, and, where a page's command
trains for hours, tiny settings added at its end (named in `TINY`). What
cannot run here says why: a TPU, a bucket of one's own, a download, a
cloud account, or the same script with another config, parsed by
tests/test_configs.py. The pages' Python blocks run the same way, a page a
process, and print what the page says they print.
"""

import json
import os
import re
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest
import sentencepiece as spm

import specdec_jax as sd
from specdec_jax.data import tasks
from tests import doc_commands
from tests import helpers

RUN = "run"  # run by a test of this module
# Why a command is not run here.
TRAINING_CONFIG = ("scripts/train.py (or export_demo_model.py) as this "
                   "page's run commands, with another training config: "
                   "tests/test_configs.py parses and checks every one")
TPU = "needs a TPU"
CLOUD = "needs a cloud account, a bucket of one's own or a download"
INSTALL = "installing: the Makefile's set-up does it"
TPU_PLAN = ("plan_run with libtpu for a full-size model: minutes of the TPU "
            "compiler per row (tests/test_tpu_compile.py runs plan_run for a "
            "TPU topology, tests/test_scripts.py its table, figure and "
            "chip options, on tiny rows)")

# Every documented block: one entry per command (doc_commands.commands).
PLAN = {
    "README.md#1": [
        "scripts/demo.py on its defaults, 5 minutes: tests/test_demo.py runs "
        "scripts/demo.py on one sentence and one paragraph",
        "this suite"],
    "docs/demo_models.md#1": [RUN, TRAINING_CONFIG, RUN, *[TRAINING_CONFIG] * 8,
                              RUN],
    "docs/demo_models.md#2": [TRAINING_CONFIG] * 3,
    "docs/demo_models.md#3": [TRAINING_CONFIG] * 3,
    "docs/demo_models.md#4": [TRAINING_CONFIG],
    "docs/demo_models.md#5": [RUN, *[TRAINING_CONFIG] * 4],
    "docs/demo_models.md#6": [TRAINING_CONFIG] * 5,
    "docs/gemma3.md#1": [INSTALL, CLOUD, CLOUD, CLOUD, CLOUD],
    "docs/gemma3.md#2": [CLOUD],
    "docs/gemma3.md#3": [TPU_PLAN],
    "docs/gemma3.md#4": [TPU_PLAN],
    "docs/gemma3.md#5": [CLOUD + " (the real checkpoints), and a TPU"],
    "docs/gemma3.md#6": [RUN, TRAINING_CONFIG, RUN,
                         "run_experiment's rows of the models the lines "
                         "above train (tests/test_experiment_lm.py and the "
                         "Gemma 3 row test run decoder-only rows)"],
    "docs/gemma3.md#7": [TPU_PLAN],
    "docs/llama_qwen.md#1": [
        "needs transformers and a downloaded checkpoint (the `hf` extra): "
        "it prints the checkpoint's own chat template to compare with"],
    "docs/llama_qwen.md#2": [INSTALL, *[CLOUD] * 7],
    "docs/llama_qwen.md#3": [CLOUD],
    "docs/llama_qwen.md#4": [TPU_PLAN],
    "docs/llama_qwen.md#5": [TPU_PLAN] * 3,
    "docs/llama_qwen.md#6": [CLOUD + " (the real checkpoints), and a TPU"],
    "docs/storage.md#1": [INSTALL, RUN, RUN, RUN, RUN, RUN],
    "docs/storage.md#2": [
        "tests/test_multihost.py runs this: two processes into the "
        "emulator's bucket, SIGKILLed after an example, restarted at once, "
        "waiting out the lease"] * 7,
    "docs/t5gemma.md#1": [RUN, RUN],
    "docs/t5gemma.md#2": [CLOUD] * 4,
    "docs/t5gemma.md#3": [CLOUD],
    "docs/t5gemma.md#4": [TPU_PLAN],
    "docs/t5gemma.md#5": [TPU_PLAN],
    "docs/t5gemma.md#6": [CLOUD + " (the real checkpoints), and a TPU"],
    "docs/t5gemma.md#7": ["two flags of docs/t5gemma.md#6, not a command: "
                          "tests/test_t5gemma_rows.py applies them"],
    "docs/t5gemma_projection.md#1": [TPU_PLAN],
    "docs/tpu.md#1": [CLOUD],
    "docs/tpu.md#2": [CLOUD],
    "docs/tpu.md#3": [CLOUD],
    "docs/tpu.md#4": [CLOUD] * 2,
    "docs/tpu.md#5": [CLOUD + " (T5X's own install on a TPU VM)"] * 6,
    "docs/tpu.md#6": [TPU_PLAN],
    "docs/tpu.md#7": [TPU + " and TFDS data in a bucket"],
    "docs/tpu.md#8": [TPU + " and TFDS data in a bucket"],
    "docs/tpu.md#9": [TPU + " (one process a chip)"] * 4,
    "docs/tpu.md#10": [CLOUD],
    "docs/tpu.md#11": [CLOUD + " (lm1b from TFDS)"] * 2,
    "docs/tpu.md#12": [TPU + " and lm1b from TFDS"],
    "docs/tpu.md#13": [TPU + " and lm1b from TFDS"],
    "docs/tpu.md#14": [CLOUD],
    "docs/tpu.md#15": ["tests/test_multihost.py runs these two processes "
                       "(into the emulator's bucket instead of /tmp)"],
    "docs/tpu.md#16": [TPU_PLAN],
    "docs/tpu.md#17": [INSTALL + " (the tensorboard extra)", CLOUD, CLOUD],
    "docs/tpu.md#18": [TPU_PLAN, TPU + " and TFDS data in a bucket"],
    "docs/tpu.md#19": [RUN],
    "docs/tpu_projection.md#1": [TPU_PLAN] * 4,
}

# A training command's tiny settings: a step (or the page's few), a few
# hundred examples read, a short evaluation.
TINY_TRAIN = ["--gin.train.TrainConfig.max_train_examples=512",
              "--gin.train.TrainConfig.eval_examples=16",
              "--gin.train.TrainConfig.bleu_examples=8",
              # One batch shape: one compiled step.
              "--gin.train.TrainConfig.length_buckets=(128,)",
              # A step of 1,024 tokens (4 rows of 128 + 128), not the
              # configs' 4,096: the mesh rehearsal's 6 steps took 5 s each.
              "--gin.train.TrainConfig.batch_tokens=1024"]
TINY = {
    "scripts/train.py": TINY_TRAIN,
    "scripts/teacher_outputs.py": ["--max_examples=8", "--max_decode_len=16"],
}
# Whatever a block left running in the background (the emulator) ends with
# its shell, whose status stays the block's.
_KILL_JOBS = ("trap 'status=$?; kill $(jobs -p) 2>/dev/null || true; "
              "exit $status' EXIT\n")
SHIPPED_VOCAB = tasks.resolve_package_path(
    "package:demo_models/target/vocab.model")

needs_shared_data = pytest.mark.skipif(
    not (tasks.default_local_data_dir() / "multi30k.train.en").exists(),
    reason="the Multi30k training text (../shared/data) is not here")


def test_every_documented_command_is_run_or_excused():
  blocks = doc_commands.blocks()
  assert sorted(blocks) == sorted(PLAN), (
      "pages and PLAN differ: new blocks "
      f"{sorted(set(blocks) - set(PLAN))}, gone {sorted(set(PLAN) - set(blocks))}")
  for key, block in blocks.items():
    assert len(block.commands) == len(PLAN[key]), (key, block.commands)


def test_a_clone_under_tmp_keeps_its_interpreter(monkeypatch):
  """A page's /tmp/ workdirs move under the test's folder, the venv's
  Python does not, even in a clone under /tmp (it did: the emulator's
  interpreter became a path that was not there and the dry run waited for
  it forever)."""
  monkeypatch.setattr(sys, "executable", "/tmp/clone/.venv/bin/python")
  out = doc_commands.for_test(
      ".venv/bin/python scripts/x.py --workdir=/tmp/w\npython y.py /tmp/z",
      "/tmp/root")
  assert out == ("/tmp/clone/.venv/bin/python scripts/x.py "
                 "--workdir=/tmp/root/tmp/w\n"
                 "/tmp/clone/.venv/bin/python y.py /tmp/root/tmp/z"), out


def _run(key: str, indices, root, extra=TINY, env=None, timeout=900):
  """Runs commands `indices` of block `key` in one bash, as a user would
  paste them, rewritten for the test (doc_commands.for_test)."""
  assert all(PLAN[key][i] == RUN for i in indices), (key, indices)
  commands = doc_commands.blocks()[key].commands
  script = "\n".join(doc_commands.for_test(commands[i], str(root), extra)
                     for i in indices)
  proc = helpers.launch(_KILL_JOBS + script,
                        env=env, timeout=timeout)
  helpers.assert_succeeded(proc)
  return proc


@needs_shared_data
def test_the_demo_models_recipe_from_a_fresh_clone(tmp_path):
  """docs/demo_models.md's first recipe: the vocabulary (the shipped one's
  pieces, from Multi30k's training text), a distilled draft (tiny
  settings) and its export (into the test's folder: the page's writes into
  the package).

  The training command is the plain one (issue 66: it crashed for users
  while the suite passed): a shipped demo config and no run file, one
  device, the vocabulary shipped in the package; it trains, evaluates and
  exports a model that loads, and prints no error-level line and no
  start-up notice (`helpers.assert_succeeded`)."""
  extra = dict(TINY, **{
      "scripts/train.py": TINY_TRAIN + [
          "--gin.train.TrainConfig.num_steps=1",
          "--gin.train.TrainConfig.num_epochs=None"],
      "scripts/export_demo_model.py": [f"--out_dir={tmp_path}/export"],
      # Its default, workdir/demo/vocab/..., is relative to the current
      # directory (the repository's root): the same path, under the test's.
      "scripts/train_vocab.py": [
          f"--output_prefix={tmp_path}/workdir/demo/vocab/multi30k_ende_4k"]})
  proc = _run("docs/demo_models.md#1", [0, 2, 11], tmp_path, extra)
  assert "step 1/1" in proc.stderr
  made = spm.SentencePieceProcessor(model_file=str(
      tmp_path / "workdir/demo/vocab/multi30k_ende_4k.model"))
  shipped = spm.SentencePieceProcessor(model_file=SHIPPED_VOCAB)
  assert [made.id_to_piece(i) for i in range(made.get_piece_size())] == [
      shipped.id_to_piece(i) for i in range(shipped.get_piece_size())]
  workdir = tmp_path / "workdir/demo/draft_small_distill_10ep"
  rows = [json.loads(line) for line in open(workdir / "metrics.jsonl")]
  assert [r["kind"] for r in rows] == ["train", "eval"]
  assert rows[-1]["step"] == 1 and np.isfinite(rows[-1]["eval_loss"])
  with open(workdir / "train_config.json") as f:
    recorded = json.load(f)
  assert (recorded["num_steps"], recorded["num_epochs"]) == (1, None)
  exported = sd.load_model(str(tmp_path / "export" / "draft_small"))
  trained = sd.load_model(str(workdir / "model"))
  assert trained.vocab.encode("Zwei Hunde.") == shipped.encode("Zwei Hunde.")
  # bfloat16 on disk: 8 bits of mantissa.
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-2,
                                                       atol=1e-3),
               exported.params, trained.params)


def test_the_teachers_translations_in_two_shards(tmp_path):
  """docs/demo_models.md's sequence-level KD data: two processes share the
  work, the last writes aligned files (8 examples here)."""
  _run("docs/demo_models.md#5", [0], tmp_path)
  prefix = tmp_path / "workdir/demo/teacher/mix_train"
  lines = [open(f"{prefix}.{side}").read().splitlines() for side in
           ("en", "de")]
  assert len(lines[0]) == len(lines[1]) == 8 and all(lines[1])


def _table_rows(text: str) -> list[dict[str, str]]:
  """The rows of the Markdown table a script printed (table.md)."""
  lines = [line for line in text.splitlines() if line.startswith("| ")]
  cells = [[c.strip() for c in line.strip().strip("|").split("|")]
           for line in lines]
  return [dict(zip(cells[0], row)) for row in cells[1:]]


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def test_the_storage_dry_run_on_the_emulator(tmp_path):
  """docs/storage.md's dry run: the emulator started, a bucket made with
  curl, an experiment's workdir in it (at a free port instead of 9023)."""
  port = str(_free_port())
  blocks = doc_commands.blocks()
  key = "docs/storage.md#1"
  commands = [c.replace("9023", port) for c in blocks[key].commands]
  script = "\n".join(doc_commands.for_test(c, str(tmp_path))
                     for c in commands[1:])
  proc = helpers.launch(_KILL_JOBS + script)
  helpers.assert_succeeded(proc)
  (row,) = _table_rows(proc.stdout)
  assert (row["draft"], row["examples"]) == ("demo:draft_base", "2"), row
  assert "contacting gs://results at http://localhost:" + port in proc.stderr


@needs_shared_data
def test_mesh_training_as_the_tpu_guide_shows_it_on_a_cpu(tmp_path):
  """docs/tpu.md's CPU rehearsal of training on a slice: the (2, 4) mesh of
  runs/cpu_8_model_parallel.gin on 8 simulated devices, 6 steps."""
  proc = _run("docs/tpu.md#19", [0], tmp_path)
  assert "training on a mesh (2, 4) (data, model) of 8 cpu devices" in (
      proc.stderr)
  assert "step 6/6" in proc.stderr


@needs_shared_data
def test_a_gemma3_draft_distilled_on_the_cpu_mesh(tmp_path):
  """docs/gemma3.md's distillation recipe (issue 68), tiny settings: the
  tiny Gemma 3 target trained on one device (no run file), then its draft
  distilled from it on the (2, 4) mesh of runs/cpu_8_model_parallel.gin:
  the teacher's forward runs in every step (the logged KL is finite and
  positive) and the student exports a model that loads."""
  rows = ["--gin.train.TrainConfig.length_buckets=(160,)",
          "--gin.train.TrainConfig.num_steps=2",
          "--gin.train.TrainConfig.num_epochs=None"]
  _run("docs/gemma3.md#6", [0], tmp_path,
       {"scripts/train.py": TINY_TRAIN + rows})
  target = tmp_path / "workdir/gemma3_tiny/target/model"
  proc = _run("docs/gemma3.md#6", [2], tmp_path, {
      "scripts/train.py": TINY_TRAIN + rows + [
          f"--gin.train.TrainConfig.teacher='{target}'"]})
  assert "training on a mesh (2, 4) (data, model) of 8 cpu devices" in (
      proc.stderr)
  workdir = tmp_path / "workdir/gemma3_tiny/draft_distill"
  train = [json.loads(line) for line in open(workdir / "metrics.jsonl")
           if json.loads(line)["kind"] == "train"]
  assert train and all(np.isfinite(r["kl"]) and r["kl"] > 0 for r in train)
  student = sd.load_model(str(workdir / "model"))
  assert student.config.emb_dim == 16  # the draft, not its teacher
  assert sd.load_model(str(target)).config.emb_dim == 96


def test_the_t5gemma_dry_run_offline(tmp_path):
  """docs/t5gemma.md's dry run: tiny checkpoints in the downloads' format,
  then a row; its table prints greedy outputs identical to the target's."""
  proc = _run("docs/t5gemma.md#1", [0, 1], tmp_path)
  (row,) = _table_rows(proc.stdout)
  assert (row["gamma"], row["identical"]) == ("7", "True"), row
  summary = json.loads((tmp_path / "tmp/t5gemma_tiny/ende_s_s_t0" /
                        "summary.json").read_text())
  assert summary["identical"] is True


def _python_blocks(page: str) -> list[str]:
  with open(os.path.join(helpers.REPO, page)) as f:
    text = f.read()
  return re.findall(r"^```python\n(.*?)^```", text, re.S | re.M)


def test_the_python_of_the_readme_and_the_adaptive_page_runs():
  """README's Python block prints the translation and alpha its comment
  shows; then docs/adaptive_and_cascades.md's blocks run, in order (the
  page's second uses the first's models and input). One fresh interpreter
  for both pages (one start-up instead of two, about 4 s of the suite): the
  README's block runs first, in an interpreter nothing ran in yet, and the
  adaptive page loads its own models and input."""
  (readme,) = _python_blocks("README.md")
  marker = "--- docs/adaptive_and_cascades.md ---"
  code = "\n".join([readme, f"print({marker!r})",
                    *_python_blocks("docs/adaptive_and_cascades.md")])
  proc = subprocess.run([sys.executable, "-c", code], cwd=helpers.REPO,
                        env=helpers.script_env(), capture_output=True,
                        text=True, timeout=600, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  promised = re.search(r"print\(.*\)\s*#\s*(.+)", readme).group(1).strip()
  lines = proc.stdout.strip().splitlines()
  assert lines[-1] == marker, lines[-3:]
  assert lines[-2] == promised, lines[-3:]
