"""What can go wrong when finding, reading or checking a checkpoint.

Every checkpoint error is a `CheckpointError` (a ValueError) or a
`CheckpointNotFoundError` (a FileNotFoundError), so callers can catch the
family; each message names the file and the fix.
"""

from specdec_jax.errors import UsageError


class CheckpointError(ValueError, UsageError):
  """A checkpoint that exists but cannot be loaded."""


class CheckpointNotFoundError(FileNotFoundError, UsageError):
  """The directory, its config or its weights are missing."""


class UnsupportedCheckpointError(CheckpointError):
  """Not a T5ForConditionalGeneration (or an unsupported variant of it)."""


class ParameterShapeError(CheckpointError):
  """A tensor's shape disagrees with the config."""


class MissingParameterError(CheckpointError):
  """A tensor the config needs is not in the checkpoint."""


class UnexpectedParameterError(CheckpointError):
  """The checkpoint has parameters the config does not."""


class NonFiniteParameterError(CheckpointError):
  """A parameter holds NaN or inf."""


class SpecError(ValueError):
  """A `load_model` spec or config that cannot be understood."""
