"""What a fresh machine needs is stated once and checked early: the Python
and jax versions (specdec_jax/versions.py) agree with setup.py's pins, a
wrong one is named with the fix; plan_run runs on the host CPU whatever
accelerator the machine has."""

import json
import os
import re
import subprocess
import sys

from specdec_jax import versions

import pytest

from tests import helpers

pytestmark = pytest.mark.quick  # `make test-quick`

REPO = helpers.REPO


def test_setup_pins_what_versions_checks():
  """setup.py's python_requires and jax pin are the ones the check uses, so
  `pip install -e .` refuses the Pythons the import refuses."""
  with open(os.path.join(REPO, "setup.py")) as f:
    setup = f.read()
  required = re.search(r'python_requires=">=(\d+)\.(\d+)"', setup)
  assert tuple(map(int, required.groups())) == versions.PYTHON_MIN == (3, 11)
  assert re.search(r'_JAX = "([^"]+)"', setup).group(1) == versions.JAX


def test_wrong_versions_are_named_with_the_fix():
  """A Python below 3.11 (a TPU VM image's 3.10) is refused naming both
  versions and how to make an environment; this one passes. Another jax is
  named beside the pinned one."""
  problem = versions.python_problem((3, 10, 12))
  assert "3.10.12" in problem and ">= 3.11" in problem
  assert "uv venv --python 3.11" in problem
  assert versions.python_problem((3, 11, 0)) is None
  assert versions.python_problem() is None
  problem = versions.jax_problem("0.11.0")
  assert "0.11.0" in problem and versions.JAX in problem
  assert versions.jax_problem(versions.JAX) is None


def test_plan_run_uses_the_host_cpu_whatever_the_environment_says(tmp_path):
  """plan_run forces JAX's CPU platform before JAX starts: with
  JAX_PLATFORMS naming an accelerator this machine lacks (as a TPU VM's
  environment would name its chips), it still plans on 16 simulated CPU
  devices; the negative control, the same environment for a plain JAX
  program, fails to start a backend."""
  env = helpers.script_env(JAX_PLATFORMS="tpu")
  control = subprocess.run(
      [sys.executable, "-c", "import jax; jax.devices()"],
      capture_output=True, text=True, env=env, timeout=120)
  assert control.returncode != 0
  out = tmp_path / "plan.json"
  proc = subprocess.run(
      [sys.executable, os.path.join(REPO, "scripts", "plan_run.py"),
       "--gin_file=experiments/table2/ende_small_t0.gin",
       "--gin.ExperimentConfig.target_config='t5_1_1_tiny'",
       "--gin.ExperimentConfig.draft_config='t5_1_1_tiny'",
       "--gin.ExperimentConfig.max_decode_len=8",
       "--gin.ExperimentConfig.mesh_shape=(2, 4)", "--input_len=8",
       f"--output={out}", "--compilation_cache_dir="],
      capture_output=True, text=True, env=env, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  # Issue 60: gin logged `Path not found: experiments/table2/ende.gin` for
  # an include it then found.
  assert not helpers.library_errors(proc.stderr), proc.stderr[-3000:]
  assert '"devices": 8' in out.read_text()
  # Issue 48: the verdict is the last lines, the JSON in --output only; the
  # figures say which compiler made them (issue 46: XLA:CPU without libtpu).
  assert json.loads(out.read_text())["compiler"].startswith("XLA:CPU")
  lines = proc.stdout.strip().splitlines()
  assert lines[-1] == f"full plan: {out}", lines
  assert lines[-3].startswith("fits: True: peak "), lines
  assert "figures from XLA:CPU" in lines[-4] and len(lines) == 4, lines
