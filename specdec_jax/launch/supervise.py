"""A multi-host process that loses a peer host ends with one line of ours.

When a host of a multi-host job dies (preempted, killed), JAX's distributed
service ends every other process from C++: "Terminating process because the
JAX distributed service detected fatal errors", a C++ stack, SIGABRT. No
Python code runs on that path, so the process cannot say what it means for
the run. `supervise` therefore forks before the job is joined: the child
runs the job with its stderr piped through the parent, which copies it to
its own stderr as it comes; when the child was ended that way, the parent
adds one line (`describe()`): a peer was lost, what the workdir keeps, and
the command that resumes. Otherwise the parent exits with the child's
status. The child dies with the parent (Linux `PR_SET_PDEATHSIG`), so
killing the process a user started still ends the job's process, and
SIGTERM/SIGINT are passed on to it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
from typing import Callable

# What JAX's distributed runtime prints when it ends a process over a
# failed peer or coordinator (jaxlib's "Terminating process because the JAX
# distributed service detected fatal errors. This most likely indicates
# that another task died ...").
FATAL_MARKERS = (b"JAX distributed service detected fatal errors",)
# Set to 1 to run without the supervising parent (e.g. under a debugger).
DISABLE_ENV = "SPECDEC_NO_SUPERVISOR"
_PR_SET_PDEATHSIG = 1


def _die_with(parent: int) -> None:
  """This (child) process gets SIGKILL when `parent` exits."""
  try:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6",
                       use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
  except (OSError, AttributeError):  # not Linux: no such call
    return
  if os.getppid() != parent:  # the parent died before prctl took effect
    os._exit(1)  # pylint: disable=protected-access


def lost_peer(stderr_tail: bytes, status: int) -> bool:
  """Whether a child that printed `stderr_tail` and ended with wait
  `status` was ended by JAX's distributed service."""
  if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
    return False
  return any(marker in stderr_tail for marker in FATAL_MARKERS)


def _exit_code(status: int) -> int:
  if os.WIFEXITED(status):
    return os.WEXITSTATUS(status)
  return 128 + os.WTERMSIG(status)


def supervise(describe: Callable[[], str]) -> None:
  """Forks. Returns in the child, which runs the job; the parent never
  returns: it relays the child's stderr, then exits with the child's
  status, or with status 1 after `describe()`'s line when JAX's
  distributed service ended the child. Does nothing (returns) when
  $SPECDEC_NO_SUPERVISOR is 1."""
  if os.environ.get(DISABLE_ENV) == "1":
    return
  sys.stdout.flush()
  sys.stderr.flush()
  parent = os.getpid()
  read_fd, write_fd = os.pipe()
  child = os.fork()
  if child == 0:
    os.close(read_fd)
    os.dup2(write_fd, sys.stderr.fileno())
    os.close(write_fd)
    _die_with(parent)
    return
  os.close(write_fd)
  for sig in (signal.SIGTERM, signal.SIGINT):
    signal.signal(sig, lambda s, _: os.kill(child, s))
  tail = b""
  while True:
    chunk = os.read(read_fd, 1 << 16)
    if not chunk:
      break
    os.write(sys.stderr.fileno(), chunk)
    tail = (tail + chunk)[-(1 << 14):]
  os.close(read_fd)
  _, status = os.waitpid(child, 0)
  if lost_peer(tail, status):
    os.write(sys.stderr.fileno(), (describe() + "\n").encode())
    os._exit(1)  # pylint: disable=protected-access
  os._exit(_exit_code(status))  # pylint: disable=protected-access
