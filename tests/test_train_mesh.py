"""Training where the target lives: scripts/train.py on a mesh and on two
processes (training/placement.py), on the toy corpus of
tests/toy_training.py.

Invariants: with the same seeds and batches, distillation with dropout
on the (2, 4) data x model mesh of runs/cpu_8_model_parallel.gin (the
teacher sharded over `model`, its 6 heads whole, batch rows over `data`)
logs the train losses of a one-device run, step by step, to 1e-5
relative (they agree to ~1e-6: the dropout masks are the same bits on
every layout, since a jitted random draw does not depend on its sharding;
`jax_threefry_partitionable`, on by default, lets each device draw only
its shard's bits, and changes which bits, so the runs compared must share
its setting); the log's first lines name the mesh and the bytes per
device of the teacher's parameters (a quarter and the whole heads) and of
the student's state. The same mesh over the two processes of
runs/cpu_2_processes.gin (4 simulated CPU devices each, gloo collectives,
batch rows split over the processes, each reading only its half of the
examples) into a gs:// workdir (the emulator), SIGKILLed after a
checkpoint both processes committed into the bucket and started again,
resumes from it, logs the uninterrupted run's losses, ends with a final
evaluation and export on both processes (exit 0), and only process 0
writes the metrics, the TensorBoard events and the model. The shares of a
split add up to the one-device batches; the mesh's workdir resumes on one
device from its last step; on-policy distillation (the XXL recipe's) on
the mesh equals one device's; a workdir another run holds is refused; and
a run file's mesh gives a fresh process the simulated CPU devices it
needs.
"""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from specdec_jax import checkpoints
from specdec_jax.data import readers
from specdec_jax.data import tasks
from specdec_jax.infra import locks
from specdec_jax.infra import paths
from specdec_jax.launch import gin_flags
from specdec_jax.memory import footprint
from specdec_jax.models import registry
from specdec_jax.training import batches
from specdec_jax.training import distill
from specdec_jax.training import train
from tests import helpers
from tests import toy_training as toy
from tests.gcs_emulator import gcs_emulator  # noqa: F401  (fixture)
from tests.toy_training import corpus  # noqa: F401  (fixture)

STEPS = 6
RTOL = 1e-5  # measured: 6.6e-7 on the mesh, 1.2e-7 on two processes
DROPOUT = 0.1  # moves the first loss by ~0.6%, hundreds of times RTOL
# 6 heads: 4 devices on `model` do not divide them, so the teacher's
# attention stays whole and its MLP and vocabulary are split.
TEACHER = dict(toy.TINY, num_heads=6, num_decoder_layers=2)


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
  """A random t5_tiny teacher (6 heads) saved as a model directory."""
  config = registry.get_config("t5_tiny", **TEACHER)
  definition = registry.make_def(config)
  directory = str(tmp_path_factory.mktemp("teacher") / "model")
  checkpoints.save(definition.init_params(jax.random.key(7)), directory,
                   config=config)
  return directory


def _config(workdir, corpus, teacher, **overrides):  # noqa: F811
  # Dropout on: every layout must draw the one-device run's masks.
  settings = dict(num_steps=STEPS, teacher=teacher, distill_alpha=0.5,
                  dropout_rate=DROPOUT)
  return toy.config(workdir, corpus, **dict(settings, **overrides))


def _gin_file(path, config, files):
  """A training gin file of `config` whose task reads the toy `files`."""
  fields = {k: v for k, v in vars(config).items() if k != "workdir" and (
      v != getattr(train.TrainConfig, k, None))}
  lines = ["from __gin__ import dynamic_registration",
           "from specdec_jax.data import tasks",
           "from specdec_jax.training import train",
           f"tasks.TaskConfig.multi30k_files = {files!r}"]
  lines += [f"train.TrainConfig.{k} = {v!r}" for k, v in fields.items()]
  with open(path, "w") as f:
    f.write("\n".join(lines) + "\n")
  return str(path)


def _losses(workdir):
  return [r["loss"] for r in toy.rows(workdir)]


@pytest.fixture(scope="module")
def runs(corpus, teacher, tmp_path_factory):  # noqa: F811
  """(gin file, one-device workdir, 8-device workdir, the fixture's folder,
  8-device log)."""
  root = tmp_path_factory.mktemp("mesh")
  files = tasks.current_config().multi30k_files  # the toy data
  gin_file = _gin_file(root / "distill.gin",
                       _config(root, corpus, teacher), files)
  one = root / "one"
  train.train(_config(one, corpus, teacher))
  eight = root / "eight"
  proc = helpers.launch(["scripts/train.py", f"--gin_file={gin_file}",
                         "--gin_file=runs/cpu_8_model_parallel.gin",
                         f"--workdir={eight}"])
  helpers.assert_succeeded(proc)
  return gin_file, one, eight, root, proc.stderr


def test_a_mesh_run_logs_the_losses_of_one_device(runs, corpus, teacher,  # noqa: F811
                                                  tmp_path):
  """Dropout included: a mask drawn differently on the mesh (another key,
  another bit stream) moves the losses past RTOL, as dropping it does."""
  _, one, eight, _, log = runs
  assert len(_losses(one)) == STEPS
  np.testing.assert_allclose(_losses(eight), _losses(one), rtol=RTOL)
  train.train(_config(tmp_path, corpus, teacher, num_steps=1,
                      dropout_rate=0.0))
  assert abs(_losses(tmp_path)[0] / _losses(one)[0] - 1) > RTOL
  lines = [line for line in log.splitlines() if "train.py" in line or
           "placement.py" in line]
  assert "training on a mesh (2, 4) (data, model) of 8 cpu devices" in (
      lines[0]), lines[:3]
  definition = checkpoints.load_model(teacher).definition
  per_device = footprint.param_bytes(definition, (2, 4))
  assert per_device < footprint.param_bytes(definition) / 3
  assert (f"bytes per device: teacher parameters {per_device / 1e6:.1f} MB"
          in "\n".join(lines[:3])), lines[:3]


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _two_processes(gin_file, workdir, *flags, port=None, **env):
  """Starts `scripts/train.py` as the two processes of one job (the same
  command, but --process_index), each in a process group of its own
  (its supervisor and the supervised child: `_kill` ends both), `env`
  added to their environment."""
  port = port or _free_port()
  return [subprocess.Popen(
      [sys.executable, os.path.join(helpers.REPO, "scripts", "train.py"),
       f"--gin_file={gin_file}", "--gin_file=runs/cpu_2_processes.gin",
       f"--workdir={workdir}", f"--coordinator_address=localhost:{port}",
       "--process_count=2", f"--process_index={index}", *flags],
      cwd=helpers.REPO, env=helpers.script_env(**env), stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT, text=True, start_new_session=True)
          for index in (0, 1)]


def _finish(procs) -> list[str]:
  """The processes' logs, once both ended with status 0."""
  logs = [p.communicate(timeout=600)[0] for p in procs]
  assert [p.returncode for p in procs] == [0, 0], logs[0][-3000:] + logs[1][
      -3000:]
  return logs


def _committed(workdir) -> list[int]:
  """The steps of a workdir's committed checkpoints, local or in a bucket
  (orbax writes a step's commit marker once every process wrote)."""
  names = paths.list_files(paths.join(str(workdir), "checkpoints"))
  # A step's own marker, not an item's (`1/meta/commit_success.txt`).
  return sorted(int(n.split("/")[0]) for n in names
                if re.fullmatch(r"\d+/commit_success\.txt", n))


def _kill(procs) -> None:
  """SIGKILL to the two process groups `_two_processes` started."""
  for p in procs:
    os.killpg(p.pid, signal.SIGKILL)
  for p in procs:
    p.communicate(timeout=60)
  deadline = time.time() + 10  # the supervised children too
  for p in procs:
    while time.time() < deadline:
      try:
        os.killpg(p.pid, 0)
      except ProcessLookupError:
        break
      time.sleep(0.05)


def test_two_processes_killed_in_a_bucket_resume_to_the_end(runs,
                                                             gcs_emulator):  # noqa: F811
  """The same command on two processes trains one model, as a multi-host
  slice does: the (2, 4) mesh of the 8-device run, 4 CPU devices a process
  (the run file's mesh gives a fresh process its simulated devices), batch
  rows split over the processes, each reading only its half of the
  examples, into a gs:// workdir (the emulator, real processes).

  Both processes are SIGKILLed once a checkpoint is committed in the bucket
  (a preempted slice: nothing runs on; every process's shards,
  ocdbt.process_0 and _1, one commit marker for the step, no local mirror).
  The same command again takes the workdir (its lock died with its
  holder), logs "resumed from step k" for the last committed checkpoint k,
  and its steps after k log the uninterrupted run's losses, so
  metrics.jsonl reads as one run's. It ends as a run with a final
  evaluation does (BLEU decoded on each process's first device, process 0
  reporting) and exports the model: every process reaches the same
  collectives to the end, and both exit 0. Process 0 alone writes."""
  del gcs_emulator  # the environment it sets is inherited
  gin_file, one, eight = runs[0], runs[1], runs[2]
  bucket = "gs://models/two"
  # A checkpoint every step: one is committed soon, long before the end.
  command = (gin_file, bucket, "--gin.train.TrainConfig.checkpoint_every=1",
             "--gin.experiment.ExperimentConfig.mesh_shape=(2, 4)")
  # A short lease on the bucket's lock (renewed every 2 s while the run
  # lives): the restart finds it run out (tests/test_multihost.py waits
  # one out) instead of waiting 2 minutes, the default.
  procs = _two_processes(*command, **{locks.LEASE_ENV: "6"})
  deadline = time.time() + 600
  while not _committed(bucket) and time.time() < deadline:
    assert all(p.poll() is None for p in procs), "a process ended early"
    time.sleep(0.05)
  _kill(procs)
  steps = _committed(bucket)
  assert steps and steps[-1] < STEPS, steps
  stored = paths.list_files(bucket)
  assert {f"checkpoints/{steps[-1]}/state/ocdbt.process_{i}/manifest.ocdbt"
          for i in (0, 1)} <= set(stored), stored
  logs = _finish(_two_processes(
      *command, "--gin.train.TrainConfig.eval_every=0",
      "--gin.train.TrainConfig.eval_examples=None",
      "--gin.train.TrainConfig.bleu_examples=4",
      "--gin.train.TrainConfig.max_decode_len=8"))
  assert ("training on a mesh (2, 4) (data, model) of 8 cpu devices in 2 "
          "process(es), 4 of them this process's") in logs[0]
  # Each read its half of the 256 examples (seqio's shards: even and odd).
  assert ("2 processes read the 256 examples of train, each its share: "
          "128, 128 examples") in logs[0]
  assert f"resumed from step {steps[-1]}" in logs[0], logs[0][-3000:]
  workdir = runs[3] / "two"
  paths.copy_tree(bucket, str(workdir))
  assert [r["step"] for r in toy.rows(workdir)] == list(range(1, STEPS + 1))
  # 1e-7 apart (gloo adds across processes in its own order); a restart
  # from scratch or at another batch moves them by percents. The 8-device
  # run logs the one-device losses (the first test).
  np.testing.assert_allclose(_losses(workdir), _losses(eight), rtol=RTOL)
  np.testing.assert_allclose(_losses(workdir), _losses(one), rtol=RTOL)
  (final,) = toy.rows(workdir, "eval")
  assert final["step"] == STEPS and np.isfinite(final["eval_loss"])
  assert "eval at step" not in logs[1]  # process 0 alone reports
  assert os.listdir(workdir / "tensorboard")
  assert _committed(workdir)[-1] == STEPS
  params = checkpoints.load_model(str(workdir / "model")).params
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4,
                                                       atol=1e-6),
               params, toy.params(one))


def test_the_shares_of_a_split_add_up_to_its_batches(corpus):  # noqa: F811
  """Two processes' shares of the toy split (seqio's shards, read here in
  one process) are its examples dealt out one by one, the first 5 of
  them under max_examples=5; each process's share of a batch holds only
  its rows, and the shares add up to the one-process batch."""
  task = toy.config("unused", corpus).task
  with tasks.override_config(vocab_path=corpus):
    whole = readers.load_examples(task, "train")
    shards = [readers.load_examples(task, "train", shard=(p, 2))
              for p in (0, 1)]
    firsts = [readers.load_examples(task, "train", max_examples=5,
                                    shard=(p, 2)) for p in (0, 1)]
  assert [len(x) for x in shards] == [128, 128]
  assert [len(x) for x in firsts] == [3, 2]
  lengths = [np.array([(len(e.inputs), len(e.targets)) for e in x])
             for x in shards]
  data = lambda inputs, targets, lengths=None: batches.BucketedData(
      inputs, targets, (16, 32), decoder_only=False, batch_tokens=0,
      batch_size=32, seed=1, lengths=lengths)
  one = data([e.inputs for e in whole], [e.targets for e in whole])
  shared = [data(*batches.share_rows([e.inputs for e in x],
                                     [e.targets for e in x], lengths, p))
            for p, x in enumerate(shards)]
  for p, x in enumerate(shards):
    ids = [e.id for e in x]
    assert ids == [e.id for e in whole[p::2]] == [str(p + 2 * j) for j in
                                                  range(128)]
    assert all(np.array_equal(a.inputs, b.inputs) for a, b in
               zip(x, whole[p::2]))
    assert [e.id for e in firsts[p]] == [e.id for e in whole[:5][p::2]]
  assert shared[0].shared and not one.shared and len(one.shapes()) > 1
  assert one.shapes() == shared[0].shapes() == shared[1].shapes()
  for (key, indices), again in zip(one.epoch(3), shared[1].epoch(3)):
    assert key == again[0] and np.array_equal(indices, again[1])
    full = one.batch(key, indices)
    parts = [s.batch(key, indices) for s in shared]
    assert 0 < parts[0]["weights"].sum() < full["weights"].sum()
    for name, value in full.items():
      np.testing.assert_array_equal(parts[0][name] + parts[1][name], value)


def test_the_mesh_workdir_resumes_on_one_device(runs, corpus, teacher,  # noqa: F811
                                                tmp_path, caplog):
  """The (2, 4) mesh's sharded checkpoint restores onto the one device
  this run places its state on, and training goes on from step 6."""
  workdir = tmp_path / "resumed"
  shutil.copytree(runs[2], workdir)
  with caplog.at_level("INFO"):
    train.train(_config(workdir, corpus, teacher, num_steps=STEPS + 2))
  assert f"resumed from step {STEPS}" in caplog.text
  assert [r["step"] for r in toy.rows(workdir)] == list(range(1, STEPS + 3))
  with open(workdir / "train_config.json") as f:
    assert json.load(f)["mesh_shape"] is None


def test_a_busy_workdir_is_refused_before_anything_loads(corpus, teacher,  # noqa: F811
                                                          tmp_path):
  """One writer per workdir: while another run holds its lock, a run
  there stops at once, naming the fix."""
  with locks.lock(str(tmp_path)):
    with pytest.raises(locks.WorkdirError, match="another --workdir"):
      train.train(_config(tmp_path, corpus, teacher))
  assert not (tmp_path / "metrics.jsonl").exists()


def test_a_run_file_mesh_gets_its_simulated_cpu_devices(runs):
  """A user sets no XLA_FLAGS: a (2, 4) mesh gives a fresh process's CPU 8
  devices (the 8-device run above is such a process: its log names them;
  the two-process run 4 a process); a process whose JAX has started keeps
  its devices (this one, 8 from conftest.py)."""
  assert helpers.SIMULATED_DEVICES_FLAG not in helpers.script_env().get(
      "XLA_FLAGS", "")
  assert "of 8 cpu devices" in runs[4]
  before = os.environ.get("XLA_FLAGS")
  gin_flags.simulate_cpu_devices((4, 4))
  assert os.environ.get("XLA_FLAGS") == before and jax.device_count() == 8


def test_onpolicy_distillation_on_the_mesh_is_one_devices(corpus, teacher,  # noqa: F811
                                                           tmp_path):
  """The XXL recipe's objective (training/distill_t5_1_1_small_from_xxl.gin):
  half of each batch sampled from the draft, then total variation to the
  teacher; on the (2, 4) mesh the same rows and losses as on one device."""
  onpolicy = distill.DistillConfig(onpolicy_fraction=0.5, divergence="tv")
  settings = dict(num_steps=2, onpolicy=onpolicy, batch_size=8)
  train.train(_config(tmp_path / "one", corpus, teacher, **settings))
  train.train(_config(tmp_path / "mesh", corpus, teacher, mesh_shape=(2, 4),
                      **settings))
  np.testing.assert_allclose(_losses(tmp_path / "mesh"),
                             _losses(tmp_path / "one"), rtol=RTOL)
