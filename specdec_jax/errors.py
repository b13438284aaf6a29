"""The errors a user fixes, as opposed to bugs.

A `UsageError` says what is wrong with the input (a config, a workdir, a
checkpoint, a bucket, a multi-host launch) and how to fix it; its message is
the whole story. The scripts' entry point (`launch.gin_flags.run`)
prints it and exits with status 1, without a traceback, which would only
bury the message (a bug still shows its traceback). Each family keeps its
builtin base (ValueError, OSError, ...), so existing `except` clauses hold.
"""


class UsageError(Exception):
  """Mixed into the user-facing error classes; see the module docstring."""


class ContractError(TypeError, UsageError):
  """An object handed to the decoder (an acceptance rule, a stop rule, a
  drafter or its definition) lacks a member of its contract or returns the
  wrong thing; the message names the member and what it must be. Raised
  before the loop compiles."""
