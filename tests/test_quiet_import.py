"""A user of the Python API on a CPU sees nothing: no TensorFlow, no libtpu.

Issue 60: with the `[tpu]` extra installed (as `make test` installs it),
`import specdec_jax; load_model("demo:draft_small")` printed about 12 lines
(libtpu's `E0000 ... unexpected worker hostname` and its "Source Location
Trace", TensorFlow's oneDNN and `cudart_stub` notices twice) and took 5.4 s,
because the model's seqio vocabulary imported TensorFlow and JAX's probe
of the TPU backend let libtpu complain. Invariants, in a fresh interpreter
with JAX left to choose its platform (conftest.py's JAX_PLATFORMS=cpu
removed, so JAX does probe libtpu): that import and load print nothing at
all, import neither TensorFlow nor seqio, and run on the CPU; the
vocabulary works. The negative control: plain JAX in the same environment
makes libtpu print its errors, so the silence is ours, not the machine's.
"""

import os
import subprocess
import sys

import pytest

from specdec_jax.infra import accelerators
from tests import helpers

_LOAD = """
import sys
import specdec_jax
model = specdec_jax.load_model("demo:draft_small")
assert model.vocab.decode(model.vocab.encode("Ein Hund.")) == "Ein Hund."
import jax
assert jax.default_backend() == "cpu", jax.default_backend()
heavy = sorted(m for m in ("tensorflow", "seqio") if m in sys.modules)
assert not heavy, heavy
print("libtpu probed" if "libtpu" in sys.modules else "no libtpu")
"""


def _env() -> dict[str, str]:
  """This machine as a user's: no JAX_PLATFORMS, and none of the TPU
  variables a test of this process may have set (the deviceless TPU
  compiles set TPU_ACCELERATOR_TYPE and friends, which would quiet libtpu
  by themselves). libtpu may load beside another process's (its lock file
  would otherwise make it give up before it speaks)."""
  env = {k: v for k, v in helpers.script_env().items()
         if k != "JAX_PLATFORMS" and not k.startswith("TPU_")
         and k != "ALLOW_MULTIPLE_LIBTPU_LOAD"}
  env["ALLOW_MULTIPLE_LIBTPU_LOAD"] = "1"
  return env


@pytest.mark.skipif(accelerators.tpu_device_files() != [],
                    reason="this machine has a TPU: libtpu finds it")
def test_import_and_load_print_nothing_and_import_no_tensorflow():
  proc = subprocess.run([sys.executable, "-c", _LOAD], capture_output=True,
                        text=True, env=_env(), timeout=300, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stderr == "", proc.stderr
  if proc.stdout.strip() == "libtpu probed":
    control = subprocess.run(
        [sys.executable, "-c", "import jax; jax.devices()"],
        capture_output=True, text=True, env=_env(), timeout=120, check=False)
    assert control.returncode == 0, control.stderr[-3000:]
    # libtpu's `E0000 ... unexpected worker hostname` and its trace.
    assert helpers.library_errors(control.stderr), control.stderr


def test_the_no_tpu_defaults_only_where_there_is_no_tpu(tmp_path):
  """A TPU VM (a /dev/accel* or /dev/vfio) and a user's own description of
  a slice are left alone; a machine without either gets one host and no
  chip to lock."""
  assert accelerators.quiet_libtpu_without_tpu({}, str(tmp_path)) == (
      accelerators.NO_TPU_DEFAULTS)
  env = {"ALLOW_MULTIPLE_LIBTPU_LOAD": "0"}
  accelerators.quiet_libtpu_without_tpu(env, str(tmp_path))
  assert env["ALLOW_MULTIPLE_LIBTPU_LOAD"] == "0"  # the user's value stays
  user = {"TPU_ACCELERATOR_TYPE": "v4-8"}
  assert accelerators.quiet_libtpu_without_tpu(user, str(tmp_path)) == {}
  assert user == {"TPU_ACCELERATOR_TYPE": "v4-8"}
  for device in ("accel0", "vfio"):
    root = tmp_path / device
    (root / "dev").mkdir(parents=True)
    (root / "dev" / device).mkdir()
    env = {}
    assert accelerators.quiet_libtpu_without_tpu(env, str(root)) == {}
    assert env == {}
    assert accelerators.tpu_device_files(str(root)) == [
        str(root / "dev" / device)]
