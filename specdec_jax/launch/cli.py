"""The scripts' entry point without gin: absl's `app.run`, one line for a
user's mistake.

A `UsageError` (a missing file, a bad value, data not prepared: see
`specdec_jax.errors`) ends the script with its message on one line and
status 1; its traceback would only bury the message. A bug still shows its
traceback. Ctrl-C ends it with one line and status 130. Scripts that parse
gin files go through `gin_flags.run`, which adds their settings to this.
"""

from __future__ import annotations

import functools
import signal
import sys
from typing import Callable, Sequence

from absl import app

from specdec_jax import errors

# A script stopped by Ctrl-C exits as a shell reports a SIGINT death
# (128 + 2), so callers (make, a startup script) see it was interrupted.
INTERRUPTED_STATUS = 128 + signal.SIGINT


def one_line_errors(main: Callable[[Sequence[str]], None]
                    ) -> Callable[[Sequence[str]], None]:
  """`main`, ending with `TypeName: message` (status 1) on a UsageError."""

  @functools.wraps(main)
  def wrapped(argv):
    try:
      return main(argv)
    except errors.UsageError as e:
      raise SystemExit(f"{type(e).__name__}: {e}") from None

  return wrapped


def run(main: Callable[[Sequence[str]], None],
        stopped_line: Callable[[], str] | None = None,
        argv: Sequence[str] | None = None) -> None:
  """`app.run(main)` with one-line usage errors; Ctrl-C prints
  `stopped_line()` (default: that the user stopped it) and exits 130."""
  try:
    app.run(one_line_errors(main), argv=argv)
  except KeyboardInterrupt:
    sys.stdout.flush()
    line = stopped_line() if stopped_line else "Stopped by the user (Ctrl-C)."
    print(line, file=sys.stderr, flush=True)
    raise SystemExit(INTERRUPTED_STATUS) from None
