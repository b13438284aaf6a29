"""Multi-host runs (specdec_jax/multihost.py), with two real processes.

Invariant: two JAX processes on localhost, joined by `jax.distributed`
(gloo collectives, one CPU device each) and running the demo's
draft_base sentence row model parallel across them
(configs/runs/cpu_2_processes.gin), produce one workdir holding each
example once, even when one process is killed in the middle and both are
restarted; its greedy outputs are the target's own, and tokens and
acceptance counts equal a one-process decode of the same examples. Only
process 0 writes. Also: bad multi-host flags fail with the fix, before any
device is touched.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from specdec_jax import multihost
from specdec_jax.data import batching
from specdec_jax.data import tasks
from specdec_jax.decoding import api
from specdec_jax.experiments import experiment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = 3
GAMMA = 4  # configs/experiments/demo/ende_sentences_draft_base_t0.gin


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _launch(workdir, cache, extra=()):
  """Both processes of one job, started at once; their Popen objects."""
  port = _free_port()
  env = dict(os.environ, PYTHONPATH=ROOT)
  # One CPU device per process, not the 8 simulated ones of conftest.py.
  env["XLA_FLAGS"] = env.get("XLA_FLAGS", "").replace(
      "--xla_force_host_platform_device_count=8", "")
  procs = []
  for index in range(2):
    log = open(os.path.join(os.path.dirname(workdir), f"log{index}.txt"), "a")
    procs.append(subprocess.Popen(
        [sys.executable, "scripts/run_experiment.py",
         "--gin_file=experiments/demo/ende_sentences_draft_base_t0.gin",
         "--gin_file=runs/cpu_2_processes.gin",
         f"--gin.ExperimentConfig.max_examples={EXAMPLES}",
         "--gin.ExperimentConfig.cost_repeats=2",
         "--gin.ExperimentConfig.repeats=1",
         f"--workdir={workdir}", f"--compilation_cache_dir={cache}",
         f"--coordinator_address=localhost:{port}", "--process_count=2",
         f"--process_index={index}", *extra],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT))
  return procs


def _lines(path):
  """The complete records of a JSONL file (a line being written is not)."""
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line) for line in f.read().split("\n")[:-1] if line]


def _tail(tmp_path):
  logs = [tmp_path / f"log{i}.txt" for i in range(2)]
  return "\n".join(p.read_text()[-3000:] for p in logs if p.exists())


def _kill(proc):
  if proc.poll() is None:
    proc.send_signal(signal.SIGKILL)
  proc.wait()


@pytest.fixture(scope="module")
def two_process_run(tmp_path_factory):
  """A run killed after its first example, then resumed: its workdir."""
  tmp_path = tmp_path_factory.mktemp("two_processes")
  workdir, cache = str(tmp_path / "run"), str(tmp_path / "xla")
  results = os.path.join(workdir, "examples.jsonl")
  procs = _launch(workdir, cache, ["--gin.ExperimentConfig.trace_examples=0"])
  try:
    # Generous: loading and compiling take ~1 min on 2 idle cores, several
    # on a machine shared with other jobs.
    deadline = time.monotonic() + 900
    while not _lines(results) and time.monotonic() < deadline:
      assert all(p.poll() is None for p in procs), _tail(tmp_path)
      time.sleep(0.2)
    _kill(procs[1])  # a host dies mid-run; process 0 is stuck, killed too
  finally:
    for proc in procs:
      _kill(proc)
  killed_at = len(_lines(results))
  assert killed_at >= 1, "no example finished in 900 s:\n" + _tail(tmp_path)
  assert killed_at < EXAMPLES, "the kill came after the run ended"
  procs = _launch(workdir, cache, ["--gin.ExperimentConfig.trace_examples=1"])
  try:
    codes = [p.wait(timeout=900) for p in procs]
  finally:
    for proc in procs:
      _kill(proc)
  assert codes == [0, 0], _tail(tmp_path)
  return workdir, killed_at


def test_two_processes_resume_without_duplicates(two_process_run):
  workdir, _ = two_process_run
  ids = [r["id"] for r in _lines(os.path.join(workdir, "examples.jsonl"))]
  assert sorted(ids, key=int) == [str(i) for i in range(EXAMPLES)], ids
  for name in ("table.md", "summary.json", "config.gin", "costs.json",
               "trace.html"):
    assert os.path.exists(os.path.join(workdir, name)), name
  with open(os.path.join(workdir, "summary.json")) as f:
    summary = json.load(f)
  assert summary["rows"][0]["examples"] == EXAMPLES
  assert summary["rows"][0]["identical"] is True


def test_two_processes_decode_as_one_process(two_process_run):
  """The records equal a one-process decode: greedy tokens (the target's
  own) and the draft's acceptance counts, example by example."""
  workdir, _ = two_process_run
  by_id = {r["id"]: r for r in _lines(os.path.join(workdir, "examples.jsonl"))}
  config = experiment.ExperimentConfig(
      task="wmt14_ende_local", split="test", target="demo:target",
      draft="demo:draft_base", max_examples=EXAMPLES, max_decode_len=64,
      buckets=(16, 24, 32, 48, 64, 128))
  target, draft = experiment.load_models(config)
  with tasks.override_config(
      vocab_path=os.path.join(ROOT, "specdec_jax/demo_models/target/"
                              "vocab.model"),
      local_data_dir=os.path.join(ROOT, "specdec_jax/demo_data"),
      wmt_ende_files={"test": "sentences"}):
    examples = batching.load_examples(config.task, "test",
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
