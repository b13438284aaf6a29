"""What a fresh machine needs is stated once and checked early: the Python
and jax versions (specdec_jax/versions.py) agree with setup.py's pins, a
wrong one is named with the fix. (plan_run on the host CPU whatever
accelerator the environment names: tests/test_scripts.py.)"""

import os
import re

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

