"""One run per workdir: an exclusive lock on `<workdir>/.lock`.

Locally an OS lock (`fcntl.flock`), which the OS drops when its holder dies
(`kill -9` included), so a crashed run never leaves a stale lock behind. On
gs:// an object `.lock` created only if absent (GCS's `ifGenerationMatch=0`,
`paths.create_exclusive`) naming its holder (host, pid, start time); nothing
releases it when its holder dies, so the error says how to remove a stale
one. Experiments (`experiments/workdir.py`) and gs:// training workdirs
(`training/mirror.py`) take it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import time
from typing import Iterator

from specdec_jax import errors
from specdec_jax.infra import paths


class WorkdirError(ValueError, errors.UsageError):
  """The workdir is busy, or holds results of other settings."""


@contextlib.contextmanager
def _remote_lock(workdir: str) -> Iterator[None]:
  path = paths.join(workdir, ".lock")
  holder = {"host": socket.gethostname(), "pid": os.getpid(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
  if not paths.create_exclusive(path, json.dumps(holder).encode()):
    found = (paths.read_bytes(path) or b"?").decode(errors="replace").strip()
    raise WorkdirError(
        f"workdir {workdir} is in use by another run ({path} holds {found}):"
        " two runs in one workdir would mix their results. Wait for it to "
        "finish, or give this run another --workdir. If that run is "
        "dead (a bucket lock outlives a crashed run), remove the stale lock:"
        f" gcloud storage rm {path}")
  try:
    yield
  finally:
    paths.remove(path)


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
