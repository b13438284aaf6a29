"""One run per workdir: an exclusive lock on `<workdir>/.lock`.

Locally an OS lock (`fcntl.flock`), which the OS drops when its holder dies
(`kill -9` included), so a crashed run never leaves a stale lock behind.

On gs:// an object `.lock` with a lease. It is created only if absent
(GCS's `ifGenerationMatch=0`) and names its holder (host, pid, start time)
and when its lease ends. While the run lives, a thread renews the lease
every third of it, each time only if the object is still the generation it
wrote (`paths.replace_if`), so two runs never hold it at once. Nothing
releases the lock of a run that dies (a preempted host), but its lease
runs out: a restart takes over a lock whose lease ended, saying so in one
line, and refuses one whose lease is live. The lease is
$SPECDEC_LOCK_LEASE_S seconds (default 120); hosts' clocks must agree to
well within it. Experiments (`experiments/workdir.py`) and gs:// training
workdirs (`training/mirror.py`) take it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import socket
import threading
import time
from typing import Iterator

from specdec_jax import errors
from specdec_jax.infra import paths


class WorkdirError(ValueError, errors.UsageError):
  """The workdir is busy, or holds results of other settings."""


LEASE_ENV = "SPECDEC_LOCK_LEASE_S"
_LOG = logging.getLogger(__name__)


def lease_seconds() -> float:
  return float(os.environ.get(LEASE_ENV, "120"))


def _holder(lease: float, started: str) -> bytes:
  now = time.time()
  return json.dumps({
      "host": socket.gethostname(), "pid": os.getpid(), "started": started,
      "renewed": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
      "lease_s": lease, "expires": now + lease}).encode()


def _expires(data: bytes | None) -> float | None:
  """When a lock object's lease ends (None: unreadable, or from before
  leases: never)."""
  try:
    return float(json.loads(data)["expires"])
  except (TypeError, ValueError, KeyError):
    return None


class _Lease:
  """Renews a held lock object's lease from a daemon thread."""

  def __init__(self, path: str, generation: bytes, lease: float,
               started: str):
    self.path, self.generation = path, generation
    self._lease, self._started = lease, started
    self._stop = threading.Event()
    self.lost = False
    self._thread = threading.Thread(target=self._run, daemon=True,
                                    name="specdec-lock-lease")
    self._thread.start()

  def _run(self) -> None:
    while not self._stop.wait(self._lease / 3):
      try:
        generation = paths.replace_if(
            self.path, _holder(self._lease, self._started), self.generation)
      except OSError as e:  # a passing storage error: try again next time
        _LOG.warning("renewing the lease of %s failed (%s); retrying",
                     self.path, e)
        continue
      if generation is None:
        self.lost = True
        _LOG.error("the lock %s was taken over by another run (this run's "
                   "lease had run out): its results may mix with that run's",
                   self.path)
        return
      self.generation = generation

  def stop(self) -> None:
    self._stop.set()
    self._thread.join()


@contextlib.contextmanager
def _remote_lock(workdir: str) -> Iterator[None]:
  path = paths.join(workdir, ".lock")
  lease = lease_seconds()
  started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
  data = _holder(lease, started)
  generation = None
  if paths.create_exclusive(path, data):
    _, generation = paths.read_generation(path)
  else:
    found, current = paths.read_generation(path)
    expires = _expires(found)
    text = (found or b"?").decode(errors="replace").strip()
    if found is not None and expires is not None and time.time() > expires:
      generation = paths.replace_if(path, data, current)
      if generation is not None:
        _LOG.warning(
            "took over the lock %s: its holder %s stopped renewing it %.0f s "
            "ago (its lease ran out), so that run is dead", path, text,
            time.time() - expires)
    elif found is None:  # released between the two calls: try once more
      if paths.create_exclusive(path, data):
        _, generation = paths.read_generation(path)
    if generation is None:
      wait = "" if expires is None else (
          f" Its lease runs out in {max(expires - time.time(), 0):.0f} s: if "
          "that run is dead (a preempted host), a restart after that takes "
          "the lock over by itself.")
      raise WorkdirError(
          f"workdir {workdir} is in use by another run ({path} holds {text}):"
          " two runs in one workdir would mix their results. Wait for it to "
          f"finish, or give this run another --workdir.{wait} To remove a "
          f"lock by hand: gcloud storage rm {path}")
  renew = _Lease(path, generation, lease, started)
  try:
    yield
  finally:
    renew.stop()
    if not renew.lost:
      # Only our own generation: never another run's lock.
      paths.replace_if(path, None, renew.generation)


@contextlib.contextmanager
def lock(workdir: str) -> Iterator[None]:
  """Holds an exclusive lock on `<workdir>/.lock` while the block runs: an
  OS lock locally, a lock object on gs://."""
  if paths.is_remote(workdir):
    with _remote_lock(workdir):
      yield
    return
  path = os.path.join(workdir, ".lock")
  fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
  try:
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
      if e.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
        raise
      holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
      raise WorkdirError(
          f"workdir {workdir} is in use by another run (pid {holder}): two "
          "runs in one workdir would mix their results. Wait for it to "
          "finish, or give this run another --workdir.") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    yield
  finally:
    os.close(fd)  # releases the lock
