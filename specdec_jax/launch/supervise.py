"""A multi-host process that loses a peer host ends with one line of ours.

When a host of a multi-host job dies (preempted, killed), JAX's distributed
service ends every other process from C++: "Terminating process because the
JAX distributed service detected fatal errors", a C++ stack, SIGABRT. No
Python code runs on that path, so the process cannot say what it means for
the run. `supervise` therefore runs the job in a child: the same command in
a fresh interpreter (not a fork: tensorstore and TensorFlow refuse to run
in a forked copy of a process that used them), with its stderr piped
through this process, which copies it to its own stderr as it comes. When
JAX's service ended the child, this process adds one line (`describe()`): a
peer was lost, what the workdir keeps, and the command that resumes.
Otherwise it exits with the child's status. The child dies with its parent
(Linux `PR_SET_PDEATHSIG`), so killing the process a user started still
ends the job's process; SIGTERM is passed on (SIGINT from a terminal
reaches both already).

The line is the child's: once its flags are parsed it hands the parent its
`describe()` text through a file named in $SPECDEC_SUPERVISOR_NOTE
(`leave_note`), so the parent needs none of the script's modules. A script
launched with `--coordinator_address` starts its supervisor first thing
(`supervise_flagged_launch`), before importing TensorFlow and the rest:
the parent then costs an interpreter and this module, not a second
start-up of the whole program. A job that joins from gin alone
(`distributed = True` on a TPU slice) starts it once the config is parsed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
from typing import Callable, Sequence

# What JAX's distributed runtime prints when it ends a process over a
# failed peer or coordinator (jaxlib's "Terminating process because the JAX
# distributed service detected fatal errors. This most likely indicates
# that another task died ...").
FATAL_MARKERS = (b"JAX distributed service detected fatal errors",)
# Set to 1 to run without the supervising parent (the child has it set).
DISABLE_ENV = "SPECDEC_NO_SUPERVISOR"
# The file a supervised child writes its lost-peer line to (`leave_note`).
NOTE_ENV = "SPECDEC_SUPERVISOR_NOTE"
# The flag that makes a script launch a multi-host process.
LAUNCH_FLAG = "--coordinator_address"
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
  """In the child, before it runs: SIGKILL when the parent exits."""
  try:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6",
                       use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
  except (OSError, AttributeError):  # not Linux: no such call
    pass


class _Relay:
  """Copies a pipe to this process's stderr; remembers whether a marker
  went by (also one split across two reads)."""

  def __init__(self, pipe):
    self._pipe = pipe
    self.seen = False
    self._thread = threading.Thread(target=self._run, daemon=True)
    self._thread.start()

  def _run(self) -> None:
    keep = max(len(m) for m in FATAL_MARKERS)
    tail = b""
    while True:
      chunk = os.read(self._pipe.fileno(), 1 << 16)
      if not chunk:
        return
      try:
        os.write(sys.stderr.fileno(), chunk)
      except OSError:  # our stderr is gone: keep draining the child's
        pass
      window = tail + chunk
      self.seen = self.seen or any(m in window for m in FATAL_MARKERS)
      tail = window[-keep:]

  def join(self, timeout: float) -> None:
    self._thread.join(timeout)


def lost_peer(seen_marker: bool, returncode: int) -> bool:
  """Whether a child that exited with `returncode` (negative: a signal)
  after printing a marker (`seen_marker`) was ended by JAX's service."""
  return seen_marker and returncode != 0


def leave_note(describe: Callable[[], str]) -> None:
  """In a supervised child: hands the parent the line `describe()` gives
  (what was lost, what the workdir keeps, the command that resumes), for
  it to print should JAX's service end this process. Nothing elsewhere."""
  path = os.environ.get(NOTE_ENV)
  if path:
    with open(path, "w", encoding="utf-8") as f:
      f.write(describe())


def _fallback_line() -> str:
  """The lost-peer line of a child that died before leaving its note."""
  return ("PeerHostLost: this process was ended by JAX's distributed "
          "service: a peer host of this multi-host job was lost (killed or "
          "preempted) or stopped answering. To resume, run the same command "
          "on every host: " + " ".join(shlex.quote(a) for a in sys.argv))


def supervise_flagged_launch(argv: Sequence[str]) -> None:
  """`supervise()` when `argv` launches a multi-host process through flags
  (`--coordinator_address`); returns at once otherwise. For a script's
  first lines, before its heavy imports."""
  if any(arg == LAUNCH_FLAG or arg.startswith(LAUNCH_FLAG + "=")
         for arg in argv[1:]):
    supervise()


def supervise(describe: Callable[[], str] | None = None) -> None:
  """Runs this command again in a child and never returns: exits with the
  child's status, or with 1 after the child's note (`leave_note`; else
  `describe()`'s line, else a generic one) when JAX's distributed service
  ended the child. Returns at once in the child (and whenever
  $SPECDEC_NO_SUPERVISOR is 1)."""
  if os.environ.get(DISABLE_ENV) == "1":
    return
  code = 1
  try:
    sys.stdout.flush()
    sys.stderr.flush()
    note = tempfile.NamedTemporaryFile(prefix="specdec_supervisor_",
                                       suffix=".txt", delete=False)
    note.close()
    child = subprocess.Popen(  # pylint: disable=subprocess-popen-preexec-fn
        [sys.executable, *sys.argv],
        env=dict(os.environ, **{DISABLE_ENV: "1", NOTE_ENV: note.name}),
        stderr=subprocess.PIPE, preexec_fn=_die_with_parent)
    relay = _Relay(child.stderr)
    signal.signal(signal.SIGTERM, lambda s, _: child.send_signal(s))
    # The terminal's Ctrl-C reaches the child too (one process group):
    # here it must neither kill the parent nor be sent twice.
    signal.signal(signal.SIGINT, lambda s, _: None)
    returncode = child.wait()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    # A grandchild holding the pipe must not keep this process waiting.
    relay.join(timeout=10)
    code = 128 - returncode if returncode < 0 else returncode
    if lost_peer(relay.seen, returncode):
      with open(note.name, encoding="utf-8") as f:
        line = f.read().strip()
      line = line or (describe() if describe else _fallback_line())
      os.write(sys.stderr.fileno(), (line + "\n").encode())
      code = 1
  finally:
    try:
      os.unlink(note.name)
    except (NameError, OSError):
      pass
    # Nothing else of this process runs: the child did the work.
    os._exit(code)  # pylint: disable=protected-access
