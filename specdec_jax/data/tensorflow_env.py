"""TensorFlow for the data pipelines, without its CUDA error on a CPU.

TensorFlow's Linux wheel is built with CUDA: on a machine with no NVIDIA
GPU its first op logs `E0000 ... cuda_platform.cc:52] failed call to cuInit:
... UNKNOWN ERROR (303)` (`CUDA_VISIBLE_DEVICES` does not stop it), an
error line in every run for a GPU nobody asked for. TensorFlow reads its C++
log threshold (`TF_CPP_MIN_LOG_LEVEL`) once, when it is imported, so the
modules that read data import this one first: where no NVIDIA device file
exists (jax's own test: /dev/nvidia0, /dev/nvidiactl, /dev/dxg) and the
user chose no threshold, TensorFlow (and tensorflow_text) are imported with
their C++ logging limited to fatal errors. Their failures still raise
Python exceptions; the variable gets its value back at once, so JAX's XLA,
which reads the same name, keeps its own threshold.

The threshold does not reach the notices TensorFlow's libraries print
through absl before its logging starts, twice (once for tensorflow_text's
copy): "oneDNN custom operations are on", "Could not find cuda drivers" and
the CPU-instructions note, at info level, in every script's first lines.
So the import's C++ output (file descriptor 2) goes to a temporary file,
and only what is not an info-level notice is passed on to stderr.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile

_NVIDIA_DEVICE_FILES = ("/dev/nvidia0", "/dev/nvidiactl", "/dev/dxg")
_THRESHOLD = "TF_CPP_MIN_LOG_LEVEL"


def _quiet_import() -> None:
  previous = os.environ.get(_THRESHOLD)
  # "1" is jax's own default (jax/__init__.py); any other value the user
  # chose stays.
  if ("tensorflow" in sys.modules or previous not in (None, "1") or
      any(os.path.exists(f) for f in _NVIDIA_DEVICE_FILES)):
    return
  os.environ[_THRESHOLD] = "3"
  try:
    with _info_notices_dropped():
      # tensorflow_text (which seqio imports) too: loading its library
      # reads the threshold again, for both.
      import tensorflow  # pylint: disable=g-import-not-at-top,unused-import  # noqa: F401
      import tensorflow_text  # pylint: disable=g-import-not-at-top,unused-import  # noqa: F401
  finally:
    if previous is None:
      del os.environ[_THRESHOLD]
    else:
      os.environ[_THRESHOLD] = previous


# absl's info lines (`I0000 00:00:17... port.cc:153] ...`), its note that
# it logs to stderr before it is set up, and the second line of TensorFlow's
# CPU-instructions notice.
_NOTICE = re.compile(r"^(I\d{4} |WARNING: All log messages before "
                     r"absl::InitializeLog|To enable the following "
                     r"instructions)")


class _info_notices_dropped:  # pylint: disable=invalid-name
  """Within the block, what C++ code writes to stderr is kept back; on exit
  every line but the info-level notices is written out (so warnings and
  errors still show)."""

  def __enter__(self):
    sys.stderr.flush()
    self._kept = tempfile.TemporaryFile()
    self._saved = os.dup(2)
    os.dup2(self._kept.fileno(), 2)

  def __exit__(self, *exc):
    sys.stderr.flush()
    os.dup2(self._saved, 2)
    os.close(self._saved)
    self._kept.seek(0)
    text = self._kept.read().decode("utf-8", "replace")
    self._kept.close()
    shown = [line for line in text.splitlines(keepends=True)
             if not _NOTICE.match(line)]
    if shown:
      sys.stderr.write("".join(shown))
      sys.stderr.flush()


_quiet_import()
