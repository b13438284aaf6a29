"""One run per workdir, and only runs with the same settings in it.

An experiment's workdir accumulates results across resumed runs
(`examples.jsonl`), so two things must hold or results get mixed silently:

1. One process at a time: `lock` (`specdec_jax/infra/locks.py`) takes an OS lock
   (`fcntl.flock`) on `<workdir>/.lock` for the whole run; a second run stops
   at once, naming the pid that holds it. The OS drops the lock when its
   holder dies (`kill -9` included), so a crashed run never leaves a stale
   lock behind.
2. Same settings: `fingerprint.json` records everything that determines the
   results (models and their files, task and its data, decoding settings, γ,
   lengths, seed, code version). `check_fingerprint` refuses a rerun whose
   fingerprint differs, listing the differences and the fix. Settings that
   only extend or display a run (`EXTENDING_FIELDS`) are left out: a rerun
   with more examples extends the workdir, one with fewer reports fewer.

Results are written so that a kill loses at most the example in flight:
`append_line` fsyncs each JSONL record before the next starts, `read_done`
cuts a torn last line (and refuses a damaged one elsewhere), and
`write_json` replaces a file whole.

A workdir may be gs://bucket/run: every file goes through `specdec_jax.infra.paths`.
Cloud Storage has no append, so there `append_line` rewrites the JSONL
object whole (an atomic replace: a kill loses at most the record being
added), and the lock is an object `.lock` created only if absent (GCS's
`ifGenerationMatch=0`), naming its holder, with a lease: a restart waits
out a dead holder's lease and takes the lock over (`infra/locks.py`).

A run that stops before its first example (refused, or Ctrl-C while
loading) leaves a workdir it found absent or empty as it found it
(`left_as_found`), so the corrected command is not refused for results that
do not exist.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
from typing import Any, Iterator

from absl import logging

import specdec_jax
from specdec_jax.infra import paths
from specdec_jax.checkpoints import native
from specdec_jax.data import tasks
from specdec_jax.experiments.experiment_config import ConfigError
from specdec_jax.infra import locks


FINGERPRINT = "fingerprint.json"
# Files a run writes from results, tables and plots included; `--overwrite`
# removes them (the fingerprint last) before anything new is written.
RESULT_FILES = ("examples.jsonl", "costs.json", "optimal_gamma.json",
                "summary.json", "table.md", "table.csv", "acceptance.png",
                "speedup_vs_gamma.png", "trace.html", "trace.png",
                "operative_config.gin", FINGERPRINT)
# The lock is shared with gs:// training workdirs (`training/mirror.py`), so
# it lives in infra/; its error and the directory checks are this module's
# too (scripts/convert_checkpoint.py uses them from there, without this
# module's TensorFlow).
lock = locks.lock
WorkdirError = locks.WorkdirError
check_directory_path = locks.check_directory_path
make_directory = locks.make_directory
# ExperimentConfig fields that do not change any recorded number (`topology`
# only says what scripts/plan_run.py compiles for).
EXTENDING_FIELDS = ("max_examples", "trace_examples", "name", "distributed",
                    "overwrite", "summary_every_examples",
                    "summary_every_seconds", "topology")
# Files up to this size are hashed; larger ones (weights) by size and mtime.
_HASH_LIMIT = 1 << 20


# The file whose presence (anywhere under a workdir: demo and table rows
# have a workdir each) means results a user would not want lost.
RESULTS = "examples.jsonl"


def _entries(workdir: str) -> list[str] | None:
  """The files under `workdir` (None: no such local directory; on gs:// an
  absent and an empty folder are the same), lock objects left out."""
  if paths.is_remote(workdir):
    names = paths.list_files(workdir)
  elif os.path.isdir(workdir):
    names = os.listdir(workdir)
  else:
    return None
  return [n for n in names if n != ".lock"]


def _clear(workdir: str, absent: bool) -> None:
  """Empties a workdir this process made and stopped in before any result
  (removes it if it was `absent`), unless another run holds it now."""
  if not paths.is_remote(workdir) and not os.path.isdir(workdir):
    return  # nothing was made
  if any(name.rsplit("/", 1)[-1] == RESULTS
         for name in paths.list_files(workdir)):
    return
  try:
    with lock(workdir, wait=False):
      if paths.is_remote(workdir):
        for name in paths.list_files(workdir):
          if name != ".lock":  # released (deleted) by `lock` itself
            paths.remove(paths.join(workdir, name))
      else:
        for name in os.listdir(workdir):
          full = os.path.join(workdir, name)
          if name == ".lock":
            continue  # still held here; removed below
          if os.path.isdir(full) and not os.path.islink(full):
            shutil.rmtree(full)
          else:
            os.remove(full)
  except WorkdirError:  # another run's now: its files are not ours
    return
  if not paths.is_remote(workdir):
    if absent:
      shutil.rmtree(workdir, ignore_errors=True)
    else:
      with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(workdir, ".lock"))


@contextlib.contextmanager
def left_as_found(workdir: str, primary: bool = True) -> Iterator[None]:
  """A run that stops before its first result leaves a workdir it found
  absent or empty as it found it.

  Otherwise a run refused after writing `config.gin` and the fingerprint
  (a missing checkpoint, gamma=0, Ctrl-C while loading) poisons a fresh
  workdir: the corrected command is then refused for "results of other
  settings" that do not exist. A workdir that held anything when the block
  began is never touched, nor one another run holds when the block ends.

  Args:
    workdir: the run's directory (local or gs://).
    primary: whether this process writes (only process 0 of a multi-host
      job looks and cleans).

  Yields:
    Nothing; on an exception (KeyboardInterrupt included) leaving the block
    with no `examples.jsonl` under the workdir, the files written into it
    are removed, and the exception goes on.
  """
  found = _entries(workdir) if primary else ["not ours to clean"]
  try:
    yield
  except BaseException:
    if not found:
      try:
        _clear(workdir, absent=found is None)
      # The run's own error matters more than this one.
      except Exception as e:  # pylint: disable=broad-except
        logging.warning("could not empty %s after the run stopped (%s): "
                        "delete it before running again", workdir, e)
    raise


def _code_version() -> dict:
  root = os.path.dirname(os.path.dirname(os.path.abspath(specdec_jax.__file__)))
  try:
    commit = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"],
                            capture_output=True, text=True, timeout=10,
                            check=True).stdout.strip() or None
  except (OSError, subprocess.SubprocessError):
    commit = None
  return {"version": specdec_jax.__version__, "git_commit": commit}


def _file_digest(path: str) -> str:
  st = os.stat(path)
  if st.st_size > _HASH_LIMIT:
    return f"size={st.st_size} mtime={int(st.st_mtime)}"
  with open(path, "rb") as f:
    return hashlib.sha256(f.read()).hexdigest()[:16]


def path_fingerprint(spec: Any) -> Any:
  """What a model spec or data path points at: the file digests under it.

  A spec that is not a local path (a config name, 'bigram', gs://) is its
  own fingerprint.
  """
  if not isinstance(spec, str):
    return spec
  path = spec.split(":", 1)[1] if spec.startswith(("hf:", "t5x:")) else spec
  if spec.startswith("demo:"):
    path = os.path.join(native.DEMO_DIR, spec[len("demo:"):])
  if os.path.isfile(path):
    return _file_digest(path)
  if not os.path.isdir(path):
    return spec
  digests = []
  for root, _, files in sorted(os.walk(path)):
    for name in sorted(files):
      full = os.path.join(root, name)
      digests.append(f"{os.path.relpath(full, path)}:{_file_digest(full)}")
  return hashlib.sha256("\n".join(digests).encode()).hexdigest()[:16]


def _jsonable(value: Any) -> Any:
  return json.loads(json.dumps(value, default=repr, sort_keys=True))


def fingerprint(config: Any) -> dict:
  """Everything that determines an ExperimentConfig's results, as JSON."""
  fields = {f.name: getattr(config, f.name)
            for f in dataclasses.fields(config)
            if f.name not in EXTENDING_FIELDS}
  task_config = dataclasses.asdict(tasks.current_config())
  out = dict(fields)
  out["target_files"] = path_fingerprint(config.target)
  out["draft_files"] = path_fingerprint(config.draft)
  out["task_config"] = task_config
  out["vocab_file"] = path_fingerprint(task_config.get("vocab_path"))
  out["code"] = _code_version()
  return _jsonable(out)


def _differences(path: str, now: dict) -> list[str]:
  stored = json.loads(paths.read_bytes(path) or b"{}")
  return [f"{k}: {stored.get(k)!r} in the workdir, {now.get(k)!r} now"
          for k in sorted(set(stored) | set(now))
          if stored.get(k) != now.get(k)]


def _refusal(workdir: str, differ: list[str]) -> WorkdirError:
  return WorkdirError(
      f"workdir {workdir} holds results of other settings; resuming "
      "would mix them into one table:\n  - " + "\n  - ".join(differ)
      + "\nUse a new --workdir, or rerun with --overwrite "
      "(ExperimentConfig.overwrite=True) to delete these results and "
      "start over.")


def refuse_other_settings(workdir: str, config: Any) -> None:
  """`check_fingerprint`'s refusal, writing nothing: a script calls it
  before it writes config.gin, so a refused rerun leaves the workdir as it
  was. (`check_fingerprint`, under the lock, still decides.)"""
  path = paths.join(workdir, FINGERPRINT)
  if not config.overwrite and paths.read_bytes(path) is not None:
    differ = _differences(path, fingerprint(config))
    if differ:
      raise _refusal(workdir, differ)


def check_fingerprint(workdir: str, config: Any, overwrite: bool) -> None:
  """Records the fingerprint, or refuses results made with other settings.

  Args:
    workdir: the run's directory (locked by the caller).
    config: the ExperimentConfig about to run.
    overwrite: when the workdir holds results of OTHER settings, remove them
      (`RESULT_FILES`) and start over instead of refusing. Results of the
      same settings are kept and the run resumes, so a killed run that is
      restarted with overwrite loses nothing.

  Raises:
    WorkdirError: the workdir holds results of a different fingerprint.
  """
  path = paths.join(workdir, FINGERPRINT)
  now = fingerprint(config)
  if paths.read_bytes(path) is not None:
    differ = _differences(path, now)
    if differ and overwrite:
      logging.warning("workdir %s: deleting results of other settings:\n  - "
                      "%s", workdir, "\n  - ".join(differ))
      for name in RESULT_FILES:
        paths.remove(paths.join(workdir, name))
        _JSONL_CACHE.pop(paths.join(workdir, name), None)
    elif differ:
      raise _refusal(workdir, differ)
    else:
      return
  if paths.read_bytes(paths.join(workdir, "examples.jsonl")) is not None:
    logging.warning("workdir %s has results but no %s (made before "
                    "fingerprints): adopting the current settings.", workdir,
                    FINGERPRINT)
  write_json(path, now)


# ----------------------------------------------------------------------------
# Results that survive a kill.


def read_done(path: str, truncate: bool = True) -> list[dict]:
  """Complete lines of `path`; a torn last line (killed mid-write) is cut.

  Every process reads (all must run the same decode calls); only the
  primary one, which writes, truncates. A damaged line before the last one
  cannot come from a kill (each line is fsynced before the next starts): it
  is refused, naming the file and line, rather than skipped.
  """
  raw = paths.read_bytes(path)
  if raw is None:
    return []
  keep = raw[:raw.rfind(b"\n") + 1]
  if truncate and len(keep) != len(raw):
    if paths.is_remote(path):
      paths.write_bytes(path, keep)
    else:
      with open(path, "wb") as f:
        f.write(keep)
  if paths.is_remote(path):
    _JSONL_CACHE[path] = keep
  records = []
  for number, line in enumerate(keep.decode(errors="replace").splitlines(),
                                start=1):
    if not line:
      continue
    try:
      records.append(json.loads(line))
    except json.JSONDecodeError as e:
      raise ConfigError(
          f"{path} line {number} is not a JSON record ({e.msg}): the file was "
          "edited or damaged. Delete that line to keep the other results "
          "(its example is decoded again), or delete the workdir to start "
          "over.") from None
  return records


# gs:// JSONL objects as last written by this process, so that adding a
# record does not read the object back first (the lock makes this process
# its only writer).
_JSONL_CACHE: dict[str, bytes] = {}


def append_line(path: str, record: dict) -> None:
  """Adds one JSON line; a kill loses at most this record."""
  line = (json.dumps(record) + "\n").encode()
  if paths.is_remote(path):
    # A run whose bucket lock another run took over writes nothing more.
    locks.check(paths.split(path)[0])
    if path not in _JSONL_CACHE:
      _JSONL_CACHE[path] = paths.read_bytes(path) or b""
    # No append on GCS: the object is replaced whole, atomically.
    paths.write_bytes(path, _JSONL_CACHE[path] + line)
    _JSONL_CACHE[path] += line
    return
  with open(path, "a") as f:
    f.write(json.dumps(record) + "\n")
    f.flush()
    os.fsync(f.fileno())


def write_json(path: str, obj: Any) -> None:
  """Replaces `path` whole (local or gs://)."""
  paths.write_text(path, json.dumps(obj, indent=2, sort_keys=True))
