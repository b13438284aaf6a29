"""Multi-host runs (specdec_jax/infra/multihost.py), with two real processes and
a bucket.

Invariant: two JAX processes on localhost, joined by `jax.distributed`
(gloo collectives, one CPU device each) and running the demo's
draft_base sentence row model parallel across them
(configs/runs/cpu_2_processes.gin) with the shipped models read from
objects in an emulated bucket (gs://models/...), produce one workdir in
that bucket holding each example once, with its table, summary, config and
TensorBoard events, even when one process is killed in the middle and both
are restarted; nothing lands in a local `gs:` folder; the greedy outputs
are the target's own, and tokens and acceptance counts equal a one-process
local decode of the same examples. Only process 0 writes. Also: bad
multi-host flags fail with the fix, before any device is touched, and the
supervisor a multi-host launch starts in its first lines reports a lost
peer with the line its child left, or a generic one.

The Cloud Storage emulator is tests/gcs_emulator.py's; the run test skips,
saying so, only when it cannot start.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from specdec_jax import checkpoints
from specdec_jax.infra import multihost
from specdec_jax.infra import locks
from specdec_jax.infra import paths
from specdec_jax.data import batching
from specdec_jax.data import tasks
from specdec_jax.data import readers
from specdec_jax.decoding import api
from specdec_jax.experiments import experiment
from specdec_jax.experiments import loading
from tests import helpers
from tests.gcs_emulator import gcs_emulator  # noqa: F401  (fixture)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = 3
GAMMA = 4  # configs/experiments/demo/ende_sentences_draft_base_t0.gin
# Not gs://results/run: tests/test_buckets.py's run uses that one in the same
# emulator (one per session).
WORKDIR = "gs://results/two_processes"
LEASE_S = 4
# The killed run's. It renews every third of it, so when it is killed
# (right after its first example: on idle cores its 3 examples take
# seconds, less than a renewal period) at least two thirds, 20 s, are
# left; the restart starts at once and reaches the lock well within that
# (its imports and joining the job: 5 s on idle cores, 10-15 s on loaded
# ones), so it meets a live lease and waits out what is left of it (idle
# time of the suite: 45 s waited 37 s of it, 2026-12-07).
KILLED_LEASE_S = 30
GCS_ENV = ("STORAGE_EMULATOR_HOST", "TENSORSTORE_GCS_HTTP_URL",
           "GOOGLE_AUTH_TOKEN_FOR_TESTING")


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _launch(cwd, cache, name, extra=(), lease=LEASE_S):
  """Both processes of one job, started at once in `cwd` (logs there as
  `<name><index>.txt`), the bucket's workdir and models in their flags,
  holding the workdir's lock with a `lease` of that many seconds; their
  Popen objects."""
  port = _free_port()
  # One CPU device per process, not the 8 simulated ones of conftest.py.
  env = helpers.script_env(**{locks.LEASE_ENV: str(lease)})
  assert all(env.get(var) for var in GCS_ENV), "the emulator's environment"
  procs = []
  for index in range(2):
    log = open(os.path.join(cwd, f"{name}{index}.txt"), "a")
    procs.append(subprocess.Popen(
        [sys.executable, os.path.join(ROOT, "scripts/run_experiment.py"),
         "--gin_file=experiments/demo/ende_sentences_draft_base_t0.gin",
         "--gin_file=runs/cpu_2_processes.gin",
         "--gin.ExperimentConfig.target='gs://models/target'",
         "--gin.ExperimentConfig.draft='gs://models/draft_base'",
         f"--gin.ExperimentConfig.max_examples={EXAMPLES}",
         "--gin.ExperimentConfig.cost_repeats=1",
         "--gin.ExperimentConfig.repeats=1",
         f"--workdir={WORKDIR}", f"--compilation_cache_dir={cache}",
         f"--coordinator_address=localhost:{port}", "--process_count=2",
         f"--process_index={index}", *extra],
        cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT))
  return procs


def _lines(path):
  """The records of a JSONL object (rewritten whole, never half a line)."""
  data = paths.read_bytes(path)
  return [json.loads(line) for line in (data or b"").decode().splitlines()]


def _events():
  """The TensorBoard event objects in the bucket's workdir."""
  return [n for n in paths.list_files(WORKDIR)
          if n.startswith("tensorboard/events.out.")]


def _tail(tmp_path):
  return "\n".join(f"{p.name}: ...{p.read_text()[-3000:]}"
                   for p in sorted(tmp_path.glob("*.txt")))


def _kill(proc):
  if proc.poll() is None:
    proc.send_signal(signal.SIGKILL)
  proc.wait()


def _wait(procs, tmp_path):
  """Both exit codes (a process still running after 900 s is killed)."""
  try:
    return [p.wait(timeout=900) for p in procs]
  except subprocess.TimeoutExpired:
    pytest.fail("a process ran for over 900 s:\n" + _tail(tmp_path))
  finally:
    for proc in procs:
      _kill(proc)


@pytest.fixture(scope="module")
def two_process_run(gcs_emulator, tmp_path_factory):  # noqa: F811
  """A run into the bucket whose process 0 is killed after the first
  example (the survivor exits with our one-line message), then resumed at
  once by the same command, which waits out the dead run's lease and takes
  its lock over; then a restart while a live run renews the lock, which is
  refused: the processes' working directory and the examples done when
  killed."""
  del gcs_emulator  # the environment it sets is inherited
  tmp_path = tmp_path_factory.mktemp("two_processes")
  cache = str(tmp_path / "xla")
  for name in ("target", "draft_base"):
    paths.copy_tree(os.path.join(checkpoints.DEMO_DIR, name),
                    f"gs://models/{name}")
  results = paths.join(WORKDIR, "examples.jsonl")
  lock = paths.join(WORKDIR, ".lock")
  # The killed run's lease outlasts the restart's start (imports, joining
  # the job), so the restart meets a live lease and must wait it out.
  procs = _launch(tmp_path, cache, "killed",
                  ["--gin.ExperimentConfig.trace_examples=0",
                   "--gin.ExperimentConfig.summary_every_examples=1"],
                  lease=KILLED_LEASE_S)
  restarted = []
  try:
    # Generous: loading and compiling take ~1 min on 2 idle cores, several
    # on a machine shared with other jobs.
    deadline = time.monotonic() + 900
    while not (_lines(results) and _events()) and (
        time.monotonic() < deadline):
      assert all(p.poll() is None for p in procs), _tail(tmp_path)
      time.sleep(0.2)
    # The running processes hold the lock object; kill them now, before
    # the run ends (its last example would release the lock).
    assert paths.read_bytes(lock) is not None
    # Process 0's host dies (preempted): the survivor is ended by JAX's
    # distributed service within seconds and says so in one line of ours,
    # with the command that resumes (issue 47).
    procs[0].send_signal(signal.SIGKILL)
    lost_at = time.monotonic()
    stale = paths.read_bytes(lock)
    # Issue 60: the same command, restarted at once on both processes (as
    # a preempted slice's startup script does), waits the dead run's lease
    # out and completes; no second restart by hand.
    restarted = _launch(tmp_path, cache, "resumed",
                        ["--gin.ExperimentConfig.trace_examples=1"])
    survivor = procs[1].wait(timeout=120)
    waited = time.monotonic() - lost_at
    killed_at = len(_lines(results))
    assert stale is not None  # SIGKILL released nothing
    assert json.loads(stale)["expires"] > time.time() + 10, (
        "the killed run's lease runs out too soon for the restart to meet "
        "it")
    scalars = helpers.tensorboard_scalars(
        lambda n: paths.read_bytes(paths.join(WORKDIR, n)), _events())
  except BaseException:
    for proc in restarted:
      _kill(proc)
    raise
  finally:
    for proc in procs:
      _kill(proc)
  codes = _wait(restarted, tmp_path)
  assert survivor == 1 and waited < 60, (survivor, waited, _tail(tmp_path))
  last = (tmp_path / "killed1.txt").read_text().strip().splitlines()[-1]
  assert last.startswith("PeerHostLost: process 1 of 2 was ended"), last
  assert "waits for a lost process 0's lock to run out" in last, last
  assert "scripts/run_experiment.py" in last and WORKDIR in last, last
  assert killed_at >= 1, "no example finished in 900 s:\n" + _tail(tmp_path)
  assert killed_at < EXAMPLES, "the kill came after the run ended"
  # Issue 48: TensorBoard showed the run while it ran, and the killed run
  # kept what it showed: the examples it flushed, each at its step, with
  # the alpha of its record (the kill may fall between a record and its
  # flush, never the other way round).
  shown = scalars[f"gamma_{GAMMA}/alpha"]
  assert 1 <= len(shown) <= killed_at and sorted(shown) == list(
      range(len(shown))), (shown, killed_at)
  done = _lines(results)
  assert [shown[i] for i in sorted(shown)] == pytest.approx(
      [done[i]["speculative"][str(GAMMA)]["alpha"] for i in sorted(shown)])
  assert codes == [0, 0], _tail(tmp_path)
  resumed0 = (tmp_path / "resumed0.txt").read_text()
  assert "waiting for it" in resumed0 and "took over the lock" in resumed0, (
      resumed0[-3000:])
  # While another run holds the lock and renews it, a restart is refused on
  # both processes: process 0 sees a renewal while it waits and names the
  # holder, process 1 stops with process 0 (multihost.on_primary), and
  # nothing is written.
  live = {"host": "other-run", "pid": 1, "started": "now", "token": "t",
          "lease_s": 3}
  renewing = threading.Event()

  def renew():  # the other run's lease thread, renewing every second
    generation = None
    while not renewing.wait(1.0 if generation else 0):
      data = json.dumps(dict(live, expires=time.time() + 3)).encode()
      if generation is None:
        paths.write_bytes(lock, data)
        generation = paths.read_generation(lock)[1]
      else:
        generation = paths.replace_if(lock, data, generation)
    if generation:
      paths.replace_if(lock, None, generation)

  other_run = threading.Thread(target=renew)
  other_run.start()
  try:
    codes = _wait(_launch(tmp_path, cache, "refused"), tmp_path)
  finally:
    renewing.set()
    other_run.join()
  assert 0 not in codes, _tail(tmp_path)
  refused0 = (tmp_path / "refused0.txt").read_text()
  assert "other-run" in refused0 and "renewed it while this run waited" in (
      refused0), refused0[-3000:]
  assert "process 0 stopped the run" in (tmp_path / "refused1.txt").read_text()
  assert len(_lines(results)) == EXAMPLES
  return tmp_path, killed_at


def test_two_processes_resume_into_the_bucket_without_duplicates(
    two_process_run):
  cwd, _ = two_process_run
  ids = [r["id"] for r in _lines(paths.join(WORKDIR, "examples.jsonl"))]
  assert sorted(ids, key=int) == [str(i) for i in range(EXAMPLES)], ids
  stored = paths.list_files(WORKDIR)
  for name in ("table.md", "summary.json", "config.gin", "costs.json",
               "trace.html"):
    assert name in stored, (name, stored)
  assert any(n.startswith("tensorboard/events.out.") for n in stored), stored
  assert ".lock" not in stored  # the resumed run released it
  summary = json.loads(paths.read_text(paths.join(WORKDIR, "summary.json")))
  assert summary["rows"][0]["examples"] == EXAMPLES
  assert summary["rows"][0]["identical"] is True
  # Nothing went to a local `gs:` folder (the processes ran in `cwd`).
  assert not os.path.exists(cwd / "gs:"), sorted(os.listdir(cwd))
  assert not os.path.exists(os.path.join(ROOT, "gs:"))


def test_two_processes_decode_as_one_process(two_process_run):
  """The records equal a one-process decode: greedy tokens (the target's
  own) and the draft's acceptance counts, example by example."""
  by_id = {r["id"]: r for r in _lines(paths.join(WORKDIR, "examples.jsonl"))}
  config = experiment.ExperimentConfig(
      task="wmt14_ende_local", split="test", target="demo:target",
      draft="demo:draft_base", max_examples=EXAMPLES, max_decode_len=64,
      buckets=(16, 24, 32, 48, 64, 128))
  target, draft = loading.load_models(config)
  with tasks.override_config(
      vocab_path=os.path.join(ROOT, "specdec_jax/demo_models/target/"
                              "vocab.model"),
      local_data_dir=os.path.join(ROOT, "specdec_jax/demo_data"),
      wmt_ende_files={"test": "sentences"}):
    examples = readers.load_examples(config.task, "test",
                                      max_examples=EXAMPLES)
  for batch in batching.batches(examples, batch_size=1, buckets=config.buckets,
                                max_length=target.max_input_len or 512):
    record = by_id[batch.ids[0]]
    base = api.generate(target, batch.input_ids, max_decode_len=64)
    spec = api.speculative_generate(target, draft, batch.input_ids,
                                    gamma=GAMMA, max_decode_len=64)
    tokens = base.tokens[0, :int(base.stats.length[0])].tolist()
    assert record["baseline"]["tokens"] == tokens
    ours = record["speculative"][str(GAMMA)]
    assert ours["tokens"] == tokens
    assert ours["alpha_count"] == int(spec.stats.alpha_count[0])
    assert np.isclose(ours["alpha_sum"], float(spec.stats.alpha_sum[0]))
    assert ours["target_calls"] == int(spec.stats.target_calls[0])


def test_incomplete_flags_fail_with_the_fix():
  with pytest.raises(multihost.MultihostError, match="--process_index"):
    multihost.initialize(coordinator_address="localhost:1", process_count=2)
  with pytest.raises(multihost.MultihostError, match="outside 0..1"):
    multihost.initialize(coordinator_address="localhost:1", process_count=2,
                         process_index=2)
  assert not multihost.initialize()  # nothing asked: one process


def test_one_process_broadcasts_its_own_values():
  value = {"gamma": 4, "done": [{"id": "0"}]}
  assert multihost.broadcast(value) == value
  assert multihost.on_primary(lambda: value) == value
  with pytest.raises(ValueError, match="lock"):
    multihost.on_primary(_raise_lock_error)


def _raise_lock_error():
  raise ValueError("lock held")


_SUPERVISED = """
import sys
from specdec_jax.launch import supervise
supervise.supervise_flagged_launch(sys.argv)
# The child from here on (the parent never returns from the line above).
if sys.argv[1] == "note":
  supervise.leave_note(lambda: "PeerHostLost: the child's own line")
sys.stderr.write("Terminating process because the JAX distributed "
                 "service detected fatal errors.\\n")
sys.exit(3)
"""


@pytest.mark.parametrize("kind", ["note", "no_note"])
def test_the_supervisor_prints_the_childs_line_or_a_fallback(tmp_path, kind):
  """A launch with --coordinator_address runs under the supervisor from the
  script's first lines: when JAX's service ends the child (its marker and
  a failing status), the parent's last line is the note the child left
  (`leave_note`), or a generic line with the command when the child died
  before leaving one. (The runs above check that a child's own status
  passes through.)"""
  script = tmp_path / "job.py"
  script.write_text(_SUPERVISED)
  proc = subprocess.run(
      [sys.executable, str(script), kind, "--coordinator_address=x:1"],
      capture_output=True, text=True, timeout=120,
      env=helpers.script_env(TMPDIR=str(tmp_path)))  # where the note goes
  assert not list(tmp_path.glob("specdec_supervisor_*"))  # removed
  last = proc.stderr.strip().splitlines()[-1]
  assert proc.returncode == 1, proc.stderr[-2000:]
  if kind == "note":
    assert last == "PeerHostLost: the child's own line", last
  else:
    assert last.startswith("PeerHostLost: this process was ended"), last
    assert last.endswith(f"{script} no_note --coordinator_address=x:1"), last
