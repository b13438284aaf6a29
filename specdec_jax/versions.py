"""The Python and jax versions this release is built and tested with.

`setup.py` pins the same jax (tests/test_versions.py keeps them equal). A
Python older than `PYTHON_MIN` is refused when the package is imported (the
pinned jax, flax and orbax need it); another jax only draws a warning from
the scripts, since results on it are untested rather than wrong.
"""

from __future__ import annotations

import sys

PYTHON_MIN = (3, 11)
JAX = "0.10.2"


def python_problem(version=None) -> str | None:
  """Why this Python cannot run the package, or None."""
  version = tuple(version or sys.version_info)[:3]
  if version[:2] >= PYTHON_MIN:
    return None
  found = ".".join(map(str, version))
  need = ".".join(map(str, PYTHON_MIN))
  return (f"specdec_jax needs Python >= {need} (jax {JAX}, flax and orbax "
          f"require it); this is Python {found} ({sys.executable}). Create "
          f"a {need} environment, e.g. `uv venv --python {need} && "
          "uv pip install -e .` (on a TPU VM see docs/tpu.md).")


def jax_problem(version: str | None = None) -> str | None:
  """Why this jax is not the tested one, or None."""
  if version is None:
    import jax  # pylint: disable=g-import-not-at-top
    version = jax.__version__
  if version == JAX:
    return None
  return (f"specdec_jax is pinned to jax {JAX} but jax {version} is "
          "installed: results are untested on it. `pip install -e .` in a "
          "fresh environment installs the pinned versions.")


def check() -> None:
  """Raises on a Python too old, warns on another jax (scripts call it)."""
  problem = python_problem()
  if problem:
    raise SystemExit(problem)
  problem = jax_problem()
  if problem:
    from absl import logging  # pylint: disable=g-import-not-at-top
    logging.warning("%s", problem)
