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
"""

from __future__ import annotations

import os
import sys

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
    # tensorflow_text (which seqio imports) too: loading its library reads
    # the threshold again, for both.
    import tensorflow  # pylint: disable=g-import-not-at-top,unused-import  # noqa: F401
    import tensorflow_text  # pylint: disable=g-import-not-at-top,unused-import  # noqa: F401
  finally:
    if previous is None:
      del os.environ[_THRESHOLD]
    else:
      os.environ[_THRESHOLD] = previous


_quiet_import()
