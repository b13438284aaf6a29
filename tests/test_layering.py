"""The layout is the architecture: each layer imports only from layers below.

  core         sampling, theory, sharding, tokens, decoding/, models/
  checkpoints  checkpoints/          (core)
  data         data/                 (core)
  training     training/             (core, checkpoints, data)
  experiments  experiments/          (everything)

Two invariants: (1) no module imports from a layer above its own (checked
on the source, function-local imports included); (2) the core and the
checkpoint formats import with TensorFlow, seqio and gin unimportable, so a
user who only decodes needs jax, flax and numpy.
"""

import ast
import os
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir,
                    "specdec_jax")
LAYERS = ("core", "checkpoints", "data", "training", "experiments")
ALLOWED = {
    "core": {"core"},
    "checkpoints": {"core", "checkpoints"},
    "data": {"core", "data"},
    "training": {"core", "checkpoints", "data", "training"},
    "experiments": set(LAYERS),
}


def _layer(module: str) -> str:
  """specdec_jax.a.b -> its layer name."""
  parts = module.split(".")
  top = parts[1] if len(parts) > 1 else ""
  return top if top in LAYERS else "core"


def _imports(path: str) -> list[str]:
  with open(path) as f:
    tree = ast.parse(f.read(), path)
  found = []
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and node.module and (
        node.module.startswith("specdec_jax")):
      if node.module == "specdec_jax":
        found += [f"specdec_jax.{a.name}" for a in node.names]
      else:
        found.append(node.module)
    elif isinstance(node, ast.Import):
      found += [a.name for a in node.names if a.name.startswith("specdec_jax")]
  return found


def _modules():
  for directory, _, files in os.walk(ROOT):
    for name in files:
      if name.endswith(".py"):
        path = os.path.join(directory, name)
        rel = os.path.relpath(path, os.path.dirname(ROOT))[:-3]
        yield path, rel.replace(os.sep, ".").removesuffix(".__init__")


def test_no_module_imports_from_a_layer_above_its_own():
  violations = []
  for path, module in _modules():
    if module == "specdec_jax":  # the package re-exports the public API
      continue
    layer = _layer(module)
    for imported in _imports(path):
      if _layer(imported) not in ALLOWED[layer]:
        violations.append(f"{module} ({layer}) imports {imported}")
  assert not violations, "\n".join(violations)


def test_the_layer_check_catches_an_upward_import(tmp_path):
  """Negative control: the checker sees a core module importing data."""
  bad = tmp_path / "bad.py"
  bad.write_text("def f():\n  from specdec_jax.data import tasks\n")
  imported = _imports(str(bad))
  assert imported == ["specdec_jax.data"]
  assert _layer(imported[0]) not in ALLOWED["core"]


_BLOCKED = ("tensorflow", "tensorflow_text", "tensorflow_datasets", "seqio",
            "gin")

_IMPORT_CORE = f"""
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
  def find_spec(self, name, path=None, target=None):
    if name.split(".")[0] in {_BLOCKED!r}:
      raise ImportError("blocked for this test: " + name)
    return None
sys.meta_path.insert(0, Block())
import specdec_jax
from specdec_jax import sampling, theory, sharding, tokens
from specdec_jax import decoding, models, checkpoints
from specdec_jax.decoding import api, engine, ngram, protocol
from specdec_jax.models import gpt, registry, t5
from specdec_jax.checkpoints import configs, hf, native, storage, t5x
model = specdec_jax.load_model("t5_tiny", seed=0)
import numpy as np
out = specdec_jax.generate(model, np.array([[5, 6, 1]]), max_decode_len=3)
assert out.tokens.shape == (1, 3)
loaded = sorted(m for m in sys.modules if m.split(".")[0] in {_BLOCKED!r})
assert not loaded, loaded
print("ok")
"""


def test_core_imports_and_decodes_without_tensorflow_seqio_gin():
  result = subprocess.run([sys.executable, "-c", _IMPORT_CORE],
                          capture_output=True, text=True, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.strip().endswith("ok")


def test_gpu_benchmark_modules_import_without_tensorflow_seqio_gin():
  """benchmarks/gpu.py runs on an accelerator box with jax, flax and optax
  only: the run plan and its helpers must import there."""
  code = _IMPORT_CORE.split("import specdec_jax\n")[0] + (
      "from specdec_jax.experiments import chips, costs, plan, timing\n"
      "print('ok')\n")
  result = subprocess.run([sys.executable, "-c", code], capture_output=True,
                          text=True, check=False)
  assert result.returncode == 0, result.stderr[-3000:]


def test_the_blocker_blocks():
  """Negative control: importing the data layer fails under the blocker."""
  code = _IMPORT_CORE.split("import specdec_jax\n")[0] + (
      "from specdec_jax.data import tasks\n")
  result = subprocess.run([sys.executable, "-c", code], capture_output=True,
                          text=True, check=False)
  assert result.returncode != 0
  assert "blocked for this test" in result.stderr


if __name__ == "__main__":
  sys.exit(pytest.main([__file__]))
