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
line. A restart that finds a live lease waits it out (one line says whose
lock, and when its lease ends): a run killed moments ago is then taken
over, while a live run's next renewal shows and the restart is refused.
The lease is $SPECDEC_LOCK_LEASE_S seconds (default 120); hosts' clocks
must agree to well within it. Experiments (`experiments/workdir.py`) and
gs:// training workdirs (`training/mirror.py`) take it.

Also the workdir's error (`WorkdirError`) and the check that a local
directory path does not run into a regular file (`check_directory_path`,
`make_directory`).
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
import uuid
from typing import Iterator

from specdec_jax import errors
from specdec_jax.infra import paths


class WorkdirError(ValueError, errors.UsageError):
  """The workdir is busy, or holds results of other settings."""


def check_directory_path(path: str, what: str = "workdir") -> None:
  """Refuses a local `path` that is, or lies under, a regular file (a
  directory there could not be made); remote paths (gs://) pass."""
  if "://" in path:
    return
  part = os.path.abspath(path)
  while not os.path.exists(part) and os.path.dirname(part) != part:
    part = os.path.dirname(part)
  if os.path.exists(part) and not os.path.isdir(part):
    where = ("is" if part == os.path.abspath(path) else f"lies under {part}, "
             "which is")
    raise WorkdirError(
        f"{what} {path} {where} a regular file, not a directory: give a "
        f"directory path, or move the file away.")


def make_directory(path: str, what: str = "workdir") -> None:
  """`paths.makedirs`, with `check_directory_path`'s message for a file
  there."""
  check_directory_path(path, what)
  paths.makedirs(path)


LEASE_ENV = "SPECDEC_LOCK_LEASE_S"
_LOG = logging.getLogger(__name__)


def lease_seconds() -> float:
  return float(os.environ.get(LEASE_ENV, "120"))


def _identity(started: str) -> dict:
  """Who holds a lock: host, process, and the acquisition (`started`: its
  time and a random token, so two acquisitions never look alike)."""
  when, _, token = started.partition(" ")
  return {"host": socket.gethostname(), "pid": os.getpid(),
          "started": when, "token": token}


def _holder(lease: float, started: str) -> bytes:
  now = time.time()
  return json.dumps(dict(
      _identity(started),
      renewed=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
      lease_s=lease, expires=now + lease)).encode()


def _fields(data: bytes | None) -> dict:
  try:
    return dict(json.loads(data))
  except (TypeError, ValueError):
    return {}


def _expires(data: bytes | None) -> float | None:
  """When a lock object's lease ends (None: unreadable, or from before
  leases: never)."""
  try:
    return float(_fields(data)["expires"])
  except (KeyError, TypeError, ValueError):
    return None


def _ours(data: bytes | None, started: str) -> bool:
  """Whether a lock object names this very holder (a write of ours whose
  answer was lost still counts as ours)."""
  fields = _fields(data)
  return all(fields.get(k) == v for k, v in _identity(started).items())


# Workdirs whose lease this process lost to another run: their results must
# not be written (`check`).
_LOST: set[str] = set()


def check(workdir: str) -> None:
  """Raises WorkdirError if this process held `workdir`'s lock and another
  run took it over (this run's lease had run out): writing on would mix
  the two runs' results."""
  if workdir.rstrip("/") in _LOST:
    raise WorkdirError(
        f"the lock of {workdir} was taken over by another run while this "
        "run held it (its lease ran out: renewals failed or stalled for "
        f"{lease_seconds():g} s): this run stops so that the two do not mix "
        "their results.")


class _Lease:
  """Renews a held lock object's lease from a daemon thread."""

  def __init__(self, path: str, workdir: str, generation: bytes,
               lease: float, started: str):
    self.path, self.workdir, self.generation = path, workdir, generation
    self._lease, self._started = lease, started
    self._stop = threading.Event()
    self.lost = False
    self._thread = threading.Thread(target=self._run, daemon=True,
                                    name="specdec-lock-lease")
    self._thread.start()

  def _renew(self) -> None:
    # Each call must end well within the lease, or a live run's lease
    # could run out while one renewal waits.
    timeout = self._lease / 4
    generation = paths.replace_if(
        self.path, _holder(self._lease, self._started), self.generation,
        timeout=timeout)
    if generation is None:  # changed: by another run, or by a lost answer
      data, current = paths.read_generation(self.path, timeout=timeout)
      if not _ours(data, self._started):
        self.lost = True
        _LOST.add(self.workdir.rstrip("/"))
        _LOG.error("the lock %s was taken over by another run (this run's "
                   "lease had run out): this run stops writing results",
                   self.path)
        return
      generation = current
    self.generation = generation

  def _run(self) -> None:
    while not self.lost and not self._stop.wait(self._lease / 3):
      try:
        self._renew()
      except OSError as e:  # a passing storage error: try again next time
        _LOG.warning("renewing the lease of %s failed (%s); retrying",
                     self.path, e)

  def stop(self) -> None:
    self._stop.set()
    self._thread.join(timeout=self._lease)


def _wait_out(path: str, found: bytes, current: bytes
              ) -> tuple[bytes | None, bytes, bool]:
  """Waits for a held lock's lease to run out, reading the object again
  every few seconds.

  A restart right after a kill finds the dead run's lease still live; it
  waits the lease out rather than asking the user to run it again. A live
  run renews its lease every third of it, so a renewal shows within that
  time, and the wait ends.

  Args:
    path: the lock object.
    found: its contents as last read (names the holder and `expires`).
    current: its storage generation as last read.

  Returns:
    (contents, generation, changed): the object as last read, and whether
    it changed during the wait (renewed, replaced or deleted: the holder is
    alive or gone), rather than its lease running out unchanged.
  """
  fields = _fields(found)
  expires = float(fields["expires"])
  holder = ", ".join(f"{k} {fields[k]}" for k in ("host", "pid", "started")
                     if k in fields)
  # Two reads per renewal period (a live holder renews every third of its
  # lease), at most one every 5 s.
  poll = min(5.0, max(0.25, float(fields.get("lease_s") or 30) / 6))
  _LOG.warning(
      "the lock %s is held by another run (%s) whose lease runs out in "
      "%.0f s, at %s UTC: waiting for it. A dead run's lock (killed or "
      "preempted) is then taken over; if that run renews it, it is alive "
      "and this run stops.", path, holder or "?",
      max(expires - time.time(), 0),
      time.strftime("%H:%M:%S", time.gmtime(expires)))
  while True:
    left = expires - time.time()
    if left < 0:
      return found, current, False
    time.sleep(min(poll, left + 0.05))
    data, generation = paths.read_generation(path)
    if generation != current:
      return data, generation, True


def _took_over(path: str, found: bytes) -> None:
  """Logs a take-over: whose lock, when it was renewed last."""
  fields = _fields(found)
  expires = float(fields["expires"])
  # The holder wrote `expires` at its last renewal, one lease ahead.
  lease = float(fields.get("lease_s") or lease_seconds())
  _LOG.warning(
      "took over the lock %s: its holder %s last renewed it %.0f s ago and "
      "its lease ran out %.0f s ago, so that run is dead", path,
      found.decode(errors="replace").strip(),
      time.time() - (expires - lease), time.time() - expires)


@contextlib.contextmanager
def _remote_lock(workdir: str, wait: bool) -> Iterator[None]:
  path = paths.join(workdir, ".lock")
  lease = lease_seconds()
  started = (time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()) + " " +
             uuid.uuid4().hex[:16])
  data = _holder(lease, started)
  generation = None
  waited = False
  # Again if the object vanished between two calls, or its holder released
  # it while this run waited.
  for _ in range(3):
    if paths.create_exclusive(path, data):
      found, generation = paths.read_generation(path)
      break
    found, current = paths.read_generation(path)
    if found is None:
      continue
    if _ours(found, started):  # our create, whose answer was lost
      generation = current
      break
    expires = _expires(found)
    if expires is None:  # from before leases: never taken over
      break
    if time.time() <= expires:
      if waited or not wait:  # (another run took it while this one waited)
        break
      found, current, changed = _wait_out(path, found, current)
      waited = True
      if changed:
        if found is None:  # released: the workdir is free
          continue
        break  # renewed: its holder is alive
    generation = paths.replace_if(path, data, current)
    if generation is not None:
      _took_over(path, found)
    break
  if generation is None:
    text = (found or b"?").decode(errors="replace").strip()
    expires = _expires(found)
    live = "" if expires is None else (
        f" Its lease runs out in {max(expires - time.time(), 0):.0f} s" + (
            " and its holder renewed it while this run waited, so that run "
            "is alive." if waited else "."))
    raise WorkdirError(
        f"workdir {workdir} is in use by another run ({path} holds {text}):"
        " two runs in one workdir would mix their results. Wait for it to "
        f"finish, or give this run another --workdir.{live} To remove a "
        f"lock by hand: gcloud storage rm {path}")
  _LOST.discard(workdir.rstrip("/"))
  renew = _Lease(path, workdir, generation, lease, started)
  try:
    yield
  finally:
    renew.stop()
    if not renew.lost:
      try:
        # Only our own generation: never another run's lock.
        paths.replace_if(path, None, renew.generation)
      except OSError as e:  # not worth hiding the block's own error
        _LOG.warning("releasing %s failed (%s): its lease runs out in %g s",
                     path, e, lease)


@contextlib.contextmanager
def lock(workdir: str, wait: bool = True) -> Iterator[None]:
  """Holds an exclusive lock on `<workdir>/.lock` while the block runs: an
  OS lock locally, a lock object on gs://.

  Args:
    workdir: the directory (local or gs://).
    wait: on gs://, wait out another run's live lease before refusing (a
      restart right after a kill); False refuses at once. A local lock is
      never waited for: the OS drops a dead holder's lock at once.

  Raises:
    WorkdirError: another run holds the lock.
  """
  if paths.is_remote(workdir):
    with _remote_lock(workdir, wait):
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
