"""What libtpu is told on a machine without a TPU, before JAX starts it.

With libtpu installed (the `[tpu]` extra, which `make test` installs), JAX
tries the TPU backend first on every machine. Without a TPU, libtpu asks the
environment for the slice's hosts, finds none and prints five lines
(`Failed to find host bounds ...`, `E0000 ... INVALID_ARGUMENT: unexpected
worker hostname ...` and a "Source Location Trace") before JAX falls back
to the CPU; it also holds `/tmp/libtpu_lockfile` for the life of the
process, guarding no chip (and while one process holds it, the next one's
probe gives up early and prints nothing, so whether a run printed the
errors depended on its neighbours).

`quiet_libtpu_without_tpu` describes the machine truthfully before that
probe: one host (`TPU_WORKER_HOSTNAMES=localhost`, `TPU_HOST_BOUNDS=1,1,1`)
with no chip to own (`ALLOW_MULTIPLE_LIBTPU_LOAD=1`). libtpu then looks for
a chip, finds none and fails quietly ("No jellyfish device found", which
JAX logs at INFO), and JAX uses the CPU. `JAX_PLATFORMS` stays unset, so a
GPU plugin is still found, and the deviceless TPU compile of `planning`
still describes any slice (its own variables say which).

Only where no TPU device file exists: a TPU VM has `/dev/accel*` (v2 to
v5p) or `/dev/vfio` (v5e, v6e), and there nothing is changed, so libtpu
finds its chips as before. Nothing is changed either where the user named
the slice's hosts or type, or after JAX's backends started (libtpu reads
these variables once, when the first backend starts).
"""

from __future__ import annotations

import glob
import os
from typing import MutableMapping

# Variables that describe a TPU slice: if the user set any, they chose.
_USER_TOPOLOGY = ("TPU_WORKER_HOSTNAMES", "TPU_HOST_BOUNDS",
                  "TPU_ACCELERATOR_TYPE", "TPU_CHIPS_PER_HOST_BOUNDS",
                  "TPU_PROCESS_BOUNDS", "TPU_PROCESS_ADDRESSES")

NO_TPU_DEFAULTS = {
    "TPU_WORKER_HOSTNAMES": "localhost",
    "TPU_HOST_BOUNDS": "1,1,1",
    "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
}


def tpu_device_files(root: str = "/") -> list[str]:
  """The TPU device files under `root` (`/dev/accel*`, `/dev/vfio`)."""
  dev = os.path.join(root, "dev")
  found = sorted(glob.glob(os.path.join(dev, "accel*")))
  if os.path.exists(os.path.join(dev, "vfio")):
    found.append(os.path.join(dev, "vfio"))
  return found


def quiet_libtpu_without_tpu(
    environ: MutableMapping[str, str] | None = None,
    root: str = "/") -> dict[str, str]:
  """Sets `NO_TPU_DEFAULTS` in `environ` where this machine has no TPU.

  Args:
    environ: the environment to change (default `os.environ`).
    root: where `dev/` is looked for (tests point it at a fake one).

  Returns:
    The variables set ({} on a TPU VM, or where the user set any of the
    slice's variables).
  """
  environ = os.environ if environ is None else environ
  if tpu_device_files(root) or any(v in environ for v in _USER_TOPOLOGY):
    return {}
  added = {k: v for k, v in NO_TPU_DEFAULTS.items() if k not in environ}
  environ.update(added)
  return added
