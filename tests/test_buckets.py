"""gs:// paths, workdirs and checkpoints against a real GCS emulator.

Invariants: everything a run writes into a `gs://` workdir lands in the
bucket and nothing in a local `gs:` folder; a run killed midway resumes
there without losing or repeating an example; the workdir lock is an object
created only if absent, so a second run stops naming the first, while a
restart waits out a dead run's lease and takes it over; a run stopped before
its first example leaves a fresh workdir empty; the shipped demo model
uploaded to a bucket loads as `gs://models/target` with the same
parameters; a refused connection to the endpoint fails at once, saying so,
and a server that stalls fails within the bounded wait with an error naming
the bucket and the likely causes; a gs:// vocabulary, data file and gin
file load as their local copies. Checkpoints written into and read from
buckets: tests/test_bucket_checkpoints.py.

The emulator (tests/gcs_emulator.py) runs in a subprocess on a free port;
these tests skip, saying so, only when it cannot start.
"""

import dataclasses
import json
import logging
import os
import re
import socket
import time

import gin
import jax
import numpy as np
import pytest

import specdec_jax
from specdec_jax import checkpoints
from specdec_jax.infra import bucket_fs
from specdec_jax.infra import locks
from specdec_jax.infra import paths
from specdec_jax.data import readers
from specdec_jax.data import tasks
from specdec_jax.experiments import experiment
from specdec_jax.launch import gin_flags
from specdec_jax.experiments import workdir as workdir_lib
from tests import helpers
from tests.gcs_emulator import gcs_emulator  # noqa: F401  (fixture)

SENTENCES = ["the cat sat on the mat", "the house is wonderful",
             "a cat is on a mat today", "das Haus ist wunderbar"]


def test_the_fsspec_view_of_a_bucket_is_its_objects(gcs_emulator):  # noqa: F811
  """`bucket_fs.BucketFileSystem` (orbax's directory calls in multi-host
  training) shows the objects `paths` wrote: files with their sizes,
  directories as key prefixes (mkdir writes nothing, a prefix exists once
  an object is under it), text and appended writes land whole on close,
  a move leaves the target and no source, and a recursive rm empties a
  prefix; a missing path is FileNotFoundError, not an empty answer."""
  fs = bucket_fs.BucketFileSystem()
  root = "gs://results/fsspec_view"
  fs.mkdir(f"{root}/step_1")
  assert not fs.exists(f"{root}/step_1")
  paths.write_bytes(f"{root}/step_1/a/x.bin", b"12345")
  with fs.open(f"{root}/step_1/commit_success.txt", "w") as f:
    f.write("done")
  with fs.open(f"{root}/step_1/commit_success.txt", "ab") as f:
    f.write(b"!")
  assert paths.read_text(f"{root}/step_1/commit_success.txt") == "done!"
  assert fs.isdir(f"{root}/step_1") and fs.isdir(f"{root}/step_1/a")
  assert fs.info(f"{root}/step_1/a/x.bin") == {
      "name": "results/fsspec_view/step_1/a/x.bin", "type": "file",
      "size": 5}
  assert fs.ls(f"{root}/step_1", detail=False) == [
      "results/fsspec_view/step_1/a",
      "results/fsspec_view/step_1/commit_success.txt"]
  assert sorted(fs.glob(f"{root}/*/commit_success.txt")) == [
      "results/fsspec_view/step_1/commit_success.txt"]
  fs.mv(f"{root}/step_1", f"{root}/step_2", recursive=True)
  assert not fs.exists(f"{root}/step_1")
  assert fs.cat_file(f"{root}/step_2/a/x.bin") == b"12345"
  with pytest.raises(IsADirectoryError):
    fs.rm(f"{root}/step_2")
  fs.rm(f"{root}/step_2", recursive=True)
  assert paths.list_files(root) == []
  with pytest.raises(FileNotFoundError):
    fs.info(f"{root}/step_2")
  with pytest.raises(FileNotFoundError):
    fs.open(f"{root}/missing.json", "rb")


def test_files_round_trip_through_the_bucket(gcs_emulator):  # noqa: F811
  root = "gs://results/roundtrip"
  assert paths.read_bytes(paths.join(root, "a.txt")) is None
  paths.write_text(paths.join(root, "a.txt"), "one")
  paths.write_bytes(paths.join(root, "sub", "b.bin"), b"\x00\x01")
  paths.write_text(paths.join(root, "a.txt"), "two")  # replaced whole
  assert paths.read_text(paths.join(root, "a.txt")) == "two"
  assert paths.list_files(root) == ["a.txt", "sub/b.bin"]
  assert paths.list_dir(root) == ["a.txt", "sub"]
  assert paths.isdir(root) and not paths.isdir("gs://results/nothing")
  paths.remove(paths.join(root, "a.txt"))
  paths.remove(paths.join(root, "a.txt"))  # missing is fine
  assert paths.list_files(root) == ["sub/b.bin"]


def test_create_exclusive_is_a_precondition_not_a_check(gcs_emulator,  # noqa: F811
                                                        tmp_path):
  """The second create of one object fails on the bucket, and the same
  conditional write (tensorstore's if_equal on a missing key) fails on the
  local file driver too: it is the write itself that is conditional."""
  path = "gs://results/exclusive/.lock"
  assert paths.create_exclusive(path, b"first")
  assert not paths.create_exclusive(path, b"second")
  assert paths.read_bytes(path) == b"first"
  local = str(tmp_path / "lock")
  assert paths._create_if_missing(local, b"first")  # pylint: disable=protected-access
  assert not paths._create_if_missing(local, b"second")  # pylint: disable=protected-access
  assert paths.read_bytes(local) == b"first"


def test_a_locked_bucket_workdir_names_its_holder_and_the_fix(
    gcs_emulator, monkeypatch):  # noqa: F811
  # A short lease: the second run waits until it sees the first renew.
  monkeypatch.setenv(locks.LEASE_ENV, "1.5")
  workdir = "gs://results/locked"
  with workdir_lib.lock(workdir):
    with pytest.raises(workdir_lib.WorkdirError) as error:
      with workdir_lib.lock(workdir):
        pass
    message = str(error.value)
    assert f'"pid": {os.getpid()}' in message and socket.gethostname() in message
    assert f"gcloud storage rm {workdir}/.lock" in message
    assert "renewed it while this run waited" in message
  with workdir_lib.lock(workdir):  # released at the end of the block
    pass


def test_replace_if_writes_and_deletes_only_the_generation_it_names(
    gcs_emulator):  # noqa: F811
  """GCS's ifGenerationMatch on a replace and on a delete: a stale
  generation changes nothing (what keeps two lease holders apart)."""
  path = "gs://results/generations/.lock"
  assert paths.create_exclusive(path, b"a")
  data, first = paths.read_generation(path)
  assert data == b"a"
  second = paths.replace_if(path, b"b", first)
  assert second and second != first and paths.read_bytes(path) == b"b"
  assert paths.replace_if(path, b"c", first) is None  # stale
  assert paths.replace_if(path, None, first) is None  # stale delete
  assert paths.read_bytes(path) == b"b"
  assert paths.replace_if(path, None, second) is not None
  assert paths.read_bytes(path) is None


def test_a_live_lease_is_renewed_and_a_dead_one_taken_over(
    gcs_emulator, monkeypatch, caplog):  # noqa: F811
  """Issue 48: a live run renews its lease, so a second run is refused
  even after several lease lengths; a lock whose holder died (its lease ran
  out) is taken over with one line, and released at the end; a lock object
  from before leases (no expiry) is never taken over (the control)."""
  monkeypatch.setenv(locks.LEASE_ENV, "1.5")
  workdir = "gs://results/leased"
  with workdir_lib.lock(workdir):
    time.sleep(4.5)  # three lease lengths: only renewals keep it live
    with pytest.raises(workdir_lib.WorkdirError, match="lease runs out in"):
      with workdir_lib.lock(workdir):
        pass
  assert paths.read_bytes(paths.join(workdir, ".lock")) is None
  dead = {"host": "preempted-host", "pid": 1, "started": "then",
          "lease_s": 1.5, "expires": time.time() - 30}
  paths.write_bytes(paths.join(workdir, ".lock"), json.dumps(dead).encode())
  with caplog.at_level(logging.WARNING):
    with workdir_lib.lock(workdir):
      holder = json.loads(paths.read_bytes(paths.join(workdir, ".lock")))
      assert holder["pid"] == os.getpid()
  assert [r.message for r in caplog.records
          if "took over the lock" in r.message and "preempted-host" in
          r.message], caplog.text
  assert paths.read_bytes(paths.join(workdir, ".lock")) is None
  # A run whose lock another run took over (its renewals had stalled past
  # the lease) stops writing results and leaves the other's lock alone.
  other = {"host": "other-run", "pid": 3, "started": "now",
           "lease_s": 60, "expires": time.time() + 60}
  with workdir_lib.lock(workdir):
    paths.write_bytes(paths.join(workdir, ".lock"), json.dumps(other).encode())
    time.sleep(1.5)  # past one renewal (every lease / 3)
    with pytest.raises(workdir_lib.WorkdirError, match="taken over"):
      workdir_lib.append_line(paths.join(workdir, "examples.jsonl"), {"id": 0})
  assert json.loads(paths.read_bytes(paths.join(workdir, ".lock"))) == other
  assert paths.read_bytes(paths.join(workdir, "examples.jsonl")) is None
  old = {"host": "old-run", "pid": 2, "started": "then"}
  paths.write_bytes(paths.join(workdir, ".lock"), json.dumps(old).encode())
  with pytest.raises(workdir_lib.WorkdirError, match="old-run"):
    with workdir_lib.lock(workdir):
      pass
  paths.remove(paths.join(workdir, ".lock"))


def test_a_restart_waits_out_a_dead_runs_lease_and_takes_over(
    gcs_emulator, monkeypatch, caplog):  # noqa: F811
  """Issue 60: a restart right after a kill -9 finds the dead run's lease
  still live. It waits the lease out (one line: the holder, when the lease
  ends), then takes the lock over, reporting when the holder last renewed
  it (the lease's start, not its end). A lock renewed during the wait (a
  live run) is refused instead (the control, in the test above)."""
  monkeypatch.setenv(locks.LEASE_ENV, "1.5")
  workdir = "gs://results/restarted"
  lock = paths.join(workdir, ".lock")
  killed = {"host": "killed-host", "pid": 7, "started": "then", "token": "k",
            "lease_s": 2.0, "expires": time.time() + 2.0}
  paths.write_bytes(lock, json.dumps(killed).encode())
  start = time.monotonic()
  with caplog.at_level(logging.WARNING):
    with workdir_lib.lock(workdir):
      waited = time.monotonic() - start
      assert json.loads(paths.read_bytes(lock))["pid"] == os.getpid()
  assert 1.5 < waited < 10, waited
  waiting = [r.getMessage() for r in caplog.records
             if "waiting for it" in r.getMessage()]
  assert len(waiting) == 1, caplog.text
  assert "killed-host" in waiting[0] and "lease runs out in 2 s" in waiting[0]
  assert paths.read_bytes(lock) is None
  # Taken over long after: the age is that of its last renewal (40 s), not
  # of its lease's end (30 s).
  dead = dict(killed, lease_s=10.0, expires=time.time() - 30)
  paths.write_bytes(lock, json.dumps(dead).encode())
  caplog.clear()
  with caplog.at_level(logging.WARNING):
    with workdir_lib.lock(workdir):
      pass
  assert re.search(r"last renewed it 4[01] s ago and its lease ran out "
                   r"(30|31) s ago", caplog.text), caplog.text
  assert "waiting for it" not in caplog.text


def test_a_run_stopped_before_its_first_example_leaves_the_bucket_as_found(
    gcs_emulator):  # noqa: F811
  """Issue 60: a run refused after writing config.gin, the fingerprint and
  the lock object into a fresh gs:// workdir left them there, and the fixed
  command was refused. Stopped before its first example, it now leaves the
  workdir empty; a workdir with results, or one another run holds, is left
  as it is (the controls)."""
  fresh = "gs://results/refused_fresh"

  def stopped_run(workdir, results=False):
    with pytest.raises(FileNotFoundError, match="no such checkpoint"):
      with workdir_lib.left_as_found(workdir):
        paths.write_text(paths.join(workdir, "config.gin"), "gamma = 2")
        with workdir_lib.lock(workdir):
          paths.write_text(paths.join(workdir, "fingerprint.json"), "{}")
          if results:
            workdir_lib.append_line(paths.join(workdir, "examples.jsonl"),
                                    {"id": "0"})
          raise FileNotFoundError("no such checkpoint")

  stopped_run(fresh)
  assert paths.list_files(fresh) == []
  stopped_run(fresh, results=True)  # the first example was written: kept
  assert paths.list_files(fresh) == ["config.gin", "examples.jsonl",
                                     "fingerprint.json"]
  used = "gs://results/refused_used"
  paths.write_text(paths.join(used, "notes.txt"), "mine")
  stopped_run(used)
  assert paths.list_files(used) == ["config.gin", "fingerprint.json",
                                    "notes.txt"]
  # Refused because another run holds the lock: that run's files stay.
  held = "gs://results/refused_held"
  other = {"host": "other-run", "pid": 1, "started": "now", "token": "t",
           "lease_s": 60, "expires": time.time() + 60}
  with pytest.raises(workdir_lib.WorkdirError):
    with workdir_lib.left_as_found(held):
      paths.write_bytes(paths.join(held, ".lock"), json.dumps(other).encode())
      paths.write_text(paths.join(held, "config.gin"), "the other run's")
      with workdir_lib.lock(held, wait=False):
        pass
  assert paths.list_files(held) == [".lock", "config.gin"]


def test_the_demo_model_loads_from_a_bucket(gcs_emulator):  # noqa: F811
  paths.copy_tree(os.path.join(checkpoints.DEMO_DIR, "target"),
                  "gs://models/target")
  remote = specdec_jax.load_model("gs://models/target")
  local = specdec_jax.load_model("demo:target")
  flat_remote = jax.tree_util.tree_leaves_with_path(remote.params)
  flat_local = dict(jax.tree_util.tree_leaves_with_path(local.params))
  assert len(flat_remote) == len(flat_local)
  for name, value in flat_remote:
    np.testing.assert_array_equal(np.asarray(value),
                                  np.asarray(flat_local[name]))
  assert remote.vocab.encode("the house") == local.vocab.encode("the house")


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, tiny_vocab):
  root = tmp_path_factory.mktemp("bucket_exp")
  models = helpers.tiny_ende(root, SENTENCES)
  config = experiment.ExperimentConfig(
      task="wmt14_ende_local", split="test", target=models["target"],
      draft=models["draft"], gamma=2, max_decode_len=6, cost_repeats=1,
      trace_examples=1, buckets=(16, 32, 64))
  task_config = dict(vocab_path=tiny_vocab, local_data_dir=str(root),
                     wmt_ende_files={"test": "mini"})
  return config, task_config


def _ids(workdir):
  text = paths.read_text(paths.join(workdir, "examples.jsonl"))
  return [json.loads(line)["id"] for line in text.splitlines()]


def test_a_run_into_a_bucket_writes_there_and_resumes(gcs_emulator,  # noqa: F811
                                                      tiny_run, tmp_path,
                                                      monkeypatch):
  """Data and target read from buckets; killed after two examples, rerun:
  every example once, in the bucket
  (results, table, summary, config.gin, TensorBoard events), and no local
  `gs:` folder."""
  config, task_config = tiny_run
  workdir = "gs://results/run"
  monkeypatch.chdir(tmp_path)
  real_append = workdir_lib.append_line
  calls = []

  def dying_append(path, record):
    if len(calls) == 2:
      raise KeyboardInterrupt("killed")
    calls.append(record["id"])
    real_append(path, record)

  # The data files and the target model are read from buckets too.
  for side in ("en", "de"):
    paths.write_bytes(f"gs://results/data/mini.{side}", paths.read_bytes(
        os.path.join(task_config["local_data_dir"], f"mini.{side}")))
  task_config = dict(task_config, local_data_dir="gs://results/data")
  paths.copy_tree(config.target, "gs://models/tiny_target")
  config = dataclasses.replace(config, target="gs://models/tiny_target")
  with tasks.override_config(**task_config):
    gin_flags.write_config(workdir)
    monkeypatch.setattr(workdir_lib, "append_line", dying_append)
    with pytest.raises(KeyboardInterrupt):
      experiment.run(config, workdir)
    monkeypatch.setattr(workdir_lib, "append_line", real_append)
    assert _ids(workdir) == ["0", "1"]
    # The killed run released its lock object on the way out.
    assert paths.read_bytes(paths.join(workdir, ".lock")) is None
    summary = experiment.run(config, workdir)
  assert _ids(workdir) == [str(i) for i in range(len(SENTENCES))]
  assert summary["examples"] == len(SENTENCES)
  stored = paths.list_files(workdir)
  for name in ("examples.jsonl", "table.md", "table.csv", "summary.json",
               "config.gin", "fingerprint.json", "costs.json",
               "acceptance.png", "trace.html"):
    assert name in stored, (name, stored)
  assert "| wmt14_ende_local |" in paths.read_text(
      paths.join(workdir, "table.md"))
  events = [n for n in stored if n.startswith("tensorboard/events.out.")]
  assert events, stored
  data = b"".join(paths.read_bytes(paths.join(workdir, n)) for n in events)
  for tag in (b"gamma_2/alpha", b"gamma_2/running_alpha", b"gamma_2/speedup",
              b"gamma_2/tokens_per_target_call", b"config"):
    assert tag in data, tag
  # Each example's scalars once, at its place in the run, across the killed
  # run's events and the resumed run's (issue 48).
  scalars = helpers.tensorboard_scalars(
      lambda n: paths.read_bytes(paths.join(workdir, n)), events)
  alphas = scalars["gamma_2/alpha"]
  assert sorted(alphas) == list(range(len(SENTENCES)))
  records = [json.loads(line) for line in paths.read_text(
      paths.join(workdir, "examples.jsonl")).splitlines()]
  assert [alphas[i] for i in range(len(SENTENCES))] == pytest.approx(
      [r["speculative"]["2"]["alpha"] for r in records])
  assert not os.path.exists(tmp_path / "gs:"), os.listdir(tmp_path)


def test_a_refused_endpoint_fails_at_once_saying_so(monkeypatch):
  """Issue 60: with the endpoint's variables pointing at a port where
  nothing listens, a call waited the whole bounded wait (120 s), then
  blamed the network, credentials or bucket. A refused connection is known
  at once: the call fails within seconds (the default wait kept), naming
  the endpoint, the variable that points there, and the cause."""
  with socket.socket() as s:
    s.bind(("localhost", 0))
    port = s.getsockname()[1]  # closed once the block ends
  url = f"http://localhost:{port}"
  monkeypatch.setenv("TENSORSTORE_GCS_HTTP_URL", url)
  monkeypatch.setenv("STORAGE_EMULATOR_HOST", url)
  monkeypatch.setenv("GOOGLE_AUTH_TOKEN_FOR_TESTING", "test")
  monkeypatch.delenv(paths.TIMEOUT_ENV, raising=False)
  start = time.monotonic()
  with pytest.raises(paths.RemoteStorageError) as error:
    paths.write_bytes("gs://unreachable-bucket/run/x.json", b"{}")
  assert time.monotonic() - start < 10
  message = str(error.value)
  assert f"{url}: connection refused (is the server running? which " \
         "variable points at it?)" in message, message
  assert f"TENSORSTORE_GCS_HTTP_URL={url}" in message, message
  assert "gs://unreachable-bucket/run/x.json" in message


def test_a_stalled_server_fails_within_the_bounded_wait(monkeypatch):
  """A server that accepts the connection and never answers (a listening
  socket nobody serves) stands for a hung network: the error comes within
  the timeout (not after tensorstore's minutes of retries) and names the
  bucket, the endpoint and the likely causes."""
  with socket.socket() as server:
    server.bind(("localhost", 0))
    server.listen(8)  # the kernel accepts; nothing ever answers
    port = server.getsockname()[1]
    monkeypatch.setenv("TENSORSTORE_GCS_HTTP_URL", f"http://localhost:{port}")
    monkeypatch.setenv("GOOGLE_AUTH_TOKEN_FOR_TESTING", "test")
    monkeypatch.setenv(paths.TIMEOUT_ENV, "3")
    start = time.monotonic()
    with pytest.raises(paths.RemoteStorageError) as error:
      paths.write_bytes("gs://stalled-bucket/run/x.json", b"{}")
    elapsed = time.monotonic() - start
  assert 2 < elapsed < 30, elapsed
  message = str(error.value)
  assert "gs://stalled-bucket" in message
  assert f"localhost:{port}" in message
  assert "no network" in message and "credentials" in message


def test_a_bucket_vocabulary_data_file_and_gin_file_load(
    gcs_emulator, tiny_vocab, tmp_path):  # noqa: F811
  """Issue 48: every path a user gives goes through `paths`, so the
  emulator serves it: a gs:// vocabulary, gs:// task data files and a gs://
  gin file load, and equal their local copies (the control). A gs://
  vocabulary read through TensorFlow's own client would have tried the
  public endpoint instead."""
  with open(tiny_vocab, "rb") as f:
    paths.write_bytes("gs://models/data/tiny.model", f.read())
  sentences = ["the house is wonderful", "a cat sat on the mat"]
  for language in ("en", "de"):
    text = "".join(s + "\n" for s in sentences)
    paths.write_text(f"gs://models/data/mini.{language}", text)
    (tmp_path / f"mini.{language}").write_text(text)
  paths.write_text("gs://models/data/exp.gin",
                   "TaskConfig.wmt_ende_files = {'test': 'mini'}\n")
  try:
    gin_flags.parse(["gs://models/data/exp.gin"], [])
    remote = tasks.current_config()
    assert remote.wmt_ende_files == {"test": "mini"}
  finally:
    gin.clear_config()
  loaded = {}
  for where, vocab in (("gs://models/data", "gs://models/data/tiny.model"),
                       (str(tmp_path), tiny_vocab)):
    with tasks.override_config(vocab_path=vocab, local_data_dir=where,
                               wmt_ende_files={"test": "mini"}):
      examples = readers.load_examples(tasks.WMT14_ENDE_LOCAL, "test")
    loaded[where] = [(e.inputs.tolist(), e.targets_text) for e in examples]
  remote_examples, local_examples = loaded.values()
  assert remote_examples == local_examples
  assert [text for _, text in remote_examples] == sentences
