"""The layout is the architecture: each layer imports only from layers below.

  core         sampling, theory, sharding, tokens, errors, versions,
               decoding/, drafts/, models/, memory/ (the memory model)
  infra        infra/                (core): paths, locks, multihost, summaries,
                                     chips
  checkpoints  checkpoints/          (core, infra)
  data         data/                 (core, infra)
  training     training/             (core, infra, checkpoints, data)
  experiments  experiments/          (everything above but training)
  planning     planning/             (experiments and below, training)
  launch       launch/               (experiments and below)
  tables       tables/               (everything)

Inside the core, models/ and drafts/ sit above decoding/: a model satisfies
the decoder's protocol (`decoding.protocol`), a draft the drafter protocol
(`decoding.protocol.Drafter`), and decoding/ imports neither (it tells
families apart by the `family` a definition declares, and token trees by
the `tree_shape` a draft declares).

Invariants: (1) no module imports from a layer above its own; (2) no import
inside a function, where it would hide an arrow; (3) no import circle
between modules; (4) the core and the checkpoint formats import with
TensorFlow, seqio and gin unimportable, so a user who only decodes needs
jax, flax and numpy; (5) so do the scripts that use no data pipeline
(build_paragraphs, train_vocab, convert_checkpoint), which start seconds
sooner for it.
"""

import ast
import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.quick  # `make test-quick`

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir,
                    "specdec_jax")
REPO = os.path.dirname(os.path.abspath(ROOT))
LAYERS = ("core", "infra", "checkpoints", "data", "training", "experiments",
          "planning", "launch", "tables")
_BELOW_TRAINING = {"core", "infra", "checkpoints", "data"}
ALLOWED = {
    "core": {"core"},
    "infra": {"core", "infra"},
    "checkpoints": {"core", "infra", "checkpoints"},
    "data": {"core", "infra", "data"},
    "training": _BELOW_TRAINING | {"training"},
    "experiments": _BELOW_TRAINING | {"experiments"},
    "planning": _BELOW_TRAINING | {"training", "experiments", "planning"},
    "launch": _BELOW_TRAINING | {"experiments", "launch"},
    "tables": set(LAYERS),
}


def _layer(module: str) -> str:
  """specdec_jax.a.b -> its layer name."""
  parts = module.split(".")
  top = parts[1] if len(parts) > 1 else ""
  return top if top in LAYERS else "core"


def _is_module(dotted: str) -> bool:
  path = os.path.join(os.path.dirname(ROOT), *dotted.split("."))
  return os.path.isfile(path + ".py") or os.path.isdir(path)


def _imports(path: str, local_only: bool = False) -> list[str]:
  """The specdec_jax modules a file imports (`from p import m` names p.m
  where m is a module); `local_only`: only those inside a function."""
  with open(path) as f:
    tree = ast.parse(f.read(), path)
  nodes = list(ast.walk(tree))
  if local_only:
    nodes = [n for f in nodes
             if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
             for n in ast.walk(f)]
  found = []
  for node in nodes:
    if isinstance(node, ast.ImportFrom) and node.module and (
        node.module.startswith("specdec_jax")):
      for alias in node.names:
        full = f"{node.module}.{alias.name}"
        found.append(full if _is_module(full) else node.module)
    elif isinstance(node, ast.Import):
      found += [a.name for a in node.names if a.name.startswith("specdec_jax")]
  return sorted(set(found))


def _modules():
  for directory, _, files in os.walk(ROOT):
    for name in files:
      if name.endswith(".py"):
        path = os.path.join(directory, name)
        rel = os.path.relpath(path, os.path.dirname(ROOT))[:-3]
        yield path, rel.replace(os.sep, ".").removesuffix(".__init__")


def _violations(module: str, imported: list[str]) -> list[str]:
  layer = _layer(module)
  out = [f"{module} ({layer}) imports {m} ({_layer(m)})"
         for m in imported if _layer(m) not in ALLOWED[layer]]
  if module.startswith("specdec_jax.decoding"):
    out += [f"{module} (decoding) imports the model module {m}"
            for m in imported if m.startswith("specdec_jax.models")]
    out += [f"{module} (decoding) imports the draft module {m}"
            for m in imported if m.startswith("specdec_jax.drafts")]
  return out


def test_no_module_imports_from_a_layer_above_its_own():
  violations = []
  for path, module in _modules():
    if module == "specdec_jax":  # the package re-exports the public API
      continue
    violations += _violations(module, _imports(path))
  assert not violations, "\n".join(violations)


def test_no_import_hides_inside_a_function():
  hidden = [f"{module} imports {m} inside a function"
            for path, module in _modules()
            for m in _imports(path, local_only=True)]
  assert not hidden, "\n".join(hidden)


def _cycle(graph: dict[str, list[str]]) -> list[str] | None:
  """One import circle of `graph` (module -> imported modules), or None."""
  state, stack = {}, []

  def visit(node):
    state[node] = "open"
    stack.append(node)
    for nxt in graph.get(node, ()):
      if state.get(nxt) == "open":
        return stack[stack.index(nxt):] + [nxt]
      if nxt not in state:
        found = visit(nxt)
        if found:
          return found
    stack.pop()
    state[node] = "done"
    return None

  for node in sorted(graph):
    if node not in state:
      found = visit(node)
      if found:
        return found
  return None


def test_no_import_circle():
  graph = {module: [m for m in _imports(path) if m != module]
           for path, module in _modules() if module != "specdec_jax"}
  cycle = _cycle(graph)
  assert cycle is None, " -> ".join(cycle)


def test_the_checks_catch_an_upward_import_a_hidden_one_and_a_circle(
    tmp_path):
  """Negative controls: each check sees what it exists to catch."""
  bad = tmp_path / "bad.py"
  bad.write_text("def f():\n  from specdec_jax.data import tasks\n")
  assert _imports(str(bad), local_only=True) == ["specdec_jax.data.tasks"]
  assert _violations("specdec_jax.sampling", _imports(str(bad)))
  assert _violations("specdec_jax.decoding.api", ["specdec_jax.models.t5"])
  assert _violations("specdec_jax.experiments.fit",
                     ["specdec_jax.planning.plan"])
  assert not _violations("specdec_jax.planning.plan",
                         ["specdec_jax.experiments.fit"])
  assert _cycle({"a": ["b"], "b": ["c"], "c": ["a"]}) == ["a", "b", "c", "a"]
  assert _cycle({"a": ["b"], "b": ["c"], "c": []}) is None


def test_the_package_root_keeps_only_the_core():
  """At most 6 modules beside __init__; no folder holds over 20% of the
  package's lines (one home per role, none swallowing the rest)."""
  root_modules = sorted(n for n in os.listdir(ROOT)
                        if n.endswith(".py") and n != "__init__.py")
  assert len(root_modules) <= 6, root_modules
  lines = {}
  for path, module in _modules():
    with open(path) as f:
      count = sum(1 for _ in f)
    folder = module.split(".")[1] if module.count(".") >= 2 else "(root)"
    lines[folder] = lines.get(folder, 0) + count
  total = sum(lines.values())
  big = {k: f"{v / total:.0%}" for k, v in lines.items() if v > 0.2 * total}
  assert not big, big


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
from specdec_jax.decoding import api, engine, protocol
from specdec_jax.models import ngram
from specdec_jax.models import gpt, registry, t5
from specdec_jax.memory import footprint
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


def test_gpu_benchmark_runs_without_tensorflow_seqio_gin(tmp_path):
  """benchmarks/gpu.py runs on an accelerator box with jax, flax and optax
  only: it runs here end to end on two tiny sizes with TensorFlow, seqio
  and gin blocked, writes its JSON (each size's roofline from the run
  plan's step programs) and the step programs' HLO."""
  out = tmp_path / "gpu.json"
  code = _IMPORT_CORE.split("import specdec_jax\n")[0] + (
      "import runpy\n"
      f"sys.argv = ['gpu.py', '--sizes=t5_1_1_tiny,t5_tiny', '--gammas=1',"
      f" '--input_len=8', '--cache_positions=16', '--chip=h200',"
      f" '--out={out}', '--hlo_dir={tmp_path}']\n"
      "runpy.run_path('benchmarks/gpu.py', run_name='__main__')\n")
  result = subprocess.run([sys.executable, "-c", code], capture_output=True,
                          text=True, check=False, cwd=REPO,
                          env=dict(os.environ, PYTHONPATH=REPO))
  assert result.returncode == 0, result.stderr[-3000:]
  sizes = json.loads(out.read_text())["sizes"]
  assert set(sizes) == {"t5_1_1_tiny", "t5_tiny"}
  for row in sizes.values():
    assert row["step_ms"] > 0 and row["roofline_ms"] > 0
    assert row["verify_cost_g1"] > 0 and row["verify_cost_roofline_g1"] > 0
  assert sizes["t5_1_1_tiny"]["vs_largest"]["c_roofline"] > 0
  assert sorted(p.name for p in tmp_path.glob("*.hlo.txt")) == [
      f"{n}_extend_{k}.hlo.txt" for n in ("t5_1_1_tiny", "t5_tiny")
      for k in (1, 2)]


# Scripts that need no data pipeline: they start without TensorFlow's
# seconds of import (data/shared_data.py, infra/locks.py).
_LIGHT_SCRIPTS = ("build_paragraphs", "train_vocab", "convert_checkpoint")


def test_scripts_without_a_data_pipeline_load_without_tensorflow():
  """Each of _LIGHT_SCRIPTS loads (its imports and flag definitions, not
  its `__main__` block) with TensorFlow, seqio and gin blocked."""
  code = _IMPORT_CORE.split("import specdec_jax\n")[0] + "import runpy\n" + (
      "".join(f"runpy.run_path('scripts/{name}.py', run_name='loaded')\n"
              for name in _LIGHT_SCRIPTS)) + "print('ok')\n"
  result = subprocess.run([sys.executable, "-c", code], capture_output=True,
                          text=True, check=False, cwd=REPO,
                          env=dict(os.environ, PYTHONPATH=REPO))
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.strip().endswith("ok")


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
