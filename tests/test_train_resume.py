"""Resuming training (specdec_jax.training.resume, train.py): after a kill,
past damaged or non-finite checkpoints, on another device topology and
from a gs:// workdir, each ending where an uninterrupted run ends. On the
toy corpus of tests/toy_training.py.
"""

import dataclasses
import gc
import inspect
import json
import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import orbax.checkpoint as ocp

from specdec_jax import checkpoints
from specdec_jax.infra import paths
from specdec_jax.data import tasks
from specdec_jax.training import train
from specdec_jax.training import mirror
from tests import helpers
from tests.gcs_emulator import gcs_emulator  # noqa: F401  (fixture)
from tests import toy_training as toy
from tests.toy_training import corpus, trained  # noqa: F401  (fixtures)


def test_resume_after_kill_matches_an_uninterrupted_run(corpus, trained,
                                                        tmp_path):
  """Stopping after 4 steps and restarting to 10 (across an epoch boundary,
  with dropout on) continues from the saved step and data position and ends
  with exactly the parameters of the run straight to 10. Neither run
  compiles the train step: the `trained` run of the same settings in this
  process did, once (a resumed run's restored, committed state once made
  two more programs than a fresh run's, and each run compiled its own)."""
  with helpers.CompileCounter() as compiles:
    train.train(toy.config(tmp_path, corpus, num_steps=4))
    train.train(toy.config(tmp_path, corpus))
  assert "jit(step)" not in compiles.names, compiles.names
  assert [r["step"] for r in toy.rows(tmp_path)] == list(range(1, 11))
  jax.tree.map(np.testing.assert_array_equal, toy.params(trained[0]),
               toy.params(tmp_path))


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
    train.train(toy.config(tmp_path, corpus, num_steps=2, **settings))
  assert f"training on {jax.devices()[3]}" in caplog.text
  config = json.dumps(dataclasses.asdict(toy.config(tmp_path, corpus,
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
  assert [r["step"] for r in toy.rows(tmp_path)] == [1, 2, 3]


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
      train.train(toy.config(tmp_path, corpus))
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
  jax.tree.map(np.testing.assert_array_equal, toy.params(trained[0]),
               toy.params(tmp_path))


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
    train.train(toy.config(tmp_path, corpus))
  assert "step 11 (non-finite parameters)" in caplog.text
  assert "resumed from step 10" in caplog.text
  jax.tree.map(np.testing.assert_array_equal, toy.params(trained[0]),
               toy.params(tmp_path))


def test_metrics_do_not_repeat_steps_after_a_kill(corpus, trained, tmp_path):
  """Issue 38, finding 7: after a kill and resume, metrics.jsonl repeated
  the steps between the last checkpoint and the kill. Here a kill after
  step 8 (checkpoint at 5, rows 6-8 logged, a torn row after) is resumed:
  every step has one row."""
  shutil.copytree(trained[0] / "checkpoints", tmp_path / "checkpoints")
  shutil.rmtree(tmp_path / "checkpoints" / "10")
  rows = [json.dumps(r) for r in toy.rows(trained[0]) if r["step"] <= 8]
  (tmp_path / "metrics.jsonl").write_text("\n".join(rows) + '\n{"kind": "tr')
  train.train(toy.config(tmp_path, corpus))
  assert [r["step"] for r in toy.rows(tmp_path)] == list(range(1, 11))


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
  train.train(toy.config(remote, corpus, num_steps=4, **settings))
  assert "checkpoints/4/meta/metadata" in paths.list_files(remote)
  shutil.rmtree(mirror.BucketMirror(remote).local)
  train.train(toy.config(remote, corpus, **settings))
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
  jax.tree.map(np.testing.assert_array_equal, toy.params(trained[0]),
               checkpoints.load_model(remote + "/model").params)
  assert not os.path.exists(tmp_path / "gs:"), os.listdir(tmp_path)
