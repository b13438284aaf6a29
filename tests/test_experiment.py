"""Tests for specdec_jax.experiment / report / reproduce and the scripts.

A complete run on tiny random T5s over a few local examples must produce
every output with numbers that agree with each other; a run killed midway
must resume without losing or duplicating an example; bad configs must fail
before any model loads.
"""

import dataclasses
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from specdec_jax import Model
from specdec_jax import checkpoints
from specdec_jax import experiment
from specdec_jax import reproduce
from specdec_jax import tasks
from specdec_jax import theory
from specdec_jax.models import registry

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SENTENCES = ["the cat sat on the mat", "the house is wonderful",
             "a cat is on a mat today", "das Haus ist wunderbar",
             "the news today"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_vocab):
  """Local EnDe files, the tiny vocabulary, and two tiny T5s saved to disk."""
  root = tmp_path_factory.mktemp("exp")
  (root / "mini.en").write_text("".join(s + "\n" for s in SENTENCES))
  (root / "mini.de").write_text("".join(s + "\n" for s in SENTENCES))
  models = {}
  for name, layers, seed in [("target", 2, 0), ("draft", 1, 1)]:
    cfg = registry.get_config("t5_1_1_tiny", vocab_size=320,
                              num_encoder_layers=layers,
                              num_decoder_layers=layers)
    definition = registry.make_def(cfg)
    params = definition.init_params(jax.random.PRNGKey(seed))
    models[name] = checkpoints.save(Model(definition, params),
                                    str(root / name), config=cfg)
  task_config = dict(vocab_path=tiny_vocab, local_data_dir=str(root),
                     wmt_ende_files={"test": "mini"})
  return root, models, task_config


def _config(models, **overrides):
  base = dict(task="wmt14_ende_local", split="test", target=models["target"],
              draft=models["draft"], gamma=(1, 3), max_decode_len=8,
              cost_repeats=1, trace_examples=2, buckets=(16, 32, 64))
  base.update(overrides)
  return experiment.ExperimentConfig(**base)


def _lines(workdir):
  with open(os.path.join(workdir, "examples.jsonl")) as f:
    return [json.loads(line) for line in f]


def test_complete_run_outputs_are_consistent(setup, tmp_path):
  """Every output exists; speedup = ratio of recorded times; alpha = pooled
  alpha_sum / alpha_count (weighted by verified positions); the prediction
  is Theorem 3.8 of the recorded alpha and c; greedy outputs identical."""
  _, models, task_config = setup
  workdir = str(tmp_path / "run")
  with tasks.override_config(**task_config):
    summary = experiment.run(_config(models), workdir)
  for name in ["examples.jsonl", "summary.json", "table.md", "table.csv",
               "costs.json", "acceptance.png", "speedup_vs_gamma.png",
               "trace.html", "trace.png"]:
    assert os.path.getsize(os.path.join(workdir, name)) > 0, name
  lines = _lines(workdir)
  assert [r["id"] for r in lines] == [str(i) for i in range(len(SENTENCES))]
  for row in summary["rows"]:
    g = str(row["gamma"])
    spec = [r["speculative"][g] for r in lines]
    base_t = sum(r["baseline"]["time_s"] for r in lines)
    assert row["speedup"] == pytest.approx(
        base_t / sum(s["time_s"] for s in spec))
    alpha = (sum(s["alpha_sum"] for s in spec)
             / sum(s["alpha_count"] for s in spec))
    assert row["alpha"] == pytest.approx(alpha)
    assert row["predicted_speedup"] == pytest.approx(
        float(theory.walltime_improvement(alpha, row["gamma"], row["c"])))
    assert row["identical"] is True
    assert all(s["tokens"] == r["baseline"]["tokens"]
               for s, r in zip(spec, lines))
    assert sum(row["accepted_histogram"]) == sum(s["target_calls"]
                                                 for s in spec)
    assert "bleu" in row["quality_all_baseline"]
  with open(os.path.join(workdir, "table.csv")) as f:
    assert len(f.read().strip().splitlines()) == 1 + len(summary["rows"])
  html = open(os.path.join(workdir, "trace.html")).read()
  assert "class=t" in html


def test_killed_run_resumes_without_loss_or_duplicates(setup, tmp_path,
                                                        monkeypatch):
  """Kill after two examples (and leave a torn half line): the rerun keeps
  the two finished lines as they were and adds each other example once."""
  _, models, task_config = setup
  workdir = str(tmp_path / "run")
  config = _config(models, gamma=2, trace_examples=0)
  real_append = experiment.append_line
  calls = []

  def dying_append(path, record):
    if len(calls) == 2:
      with open(path, "a") as f:
        f.write('{"id": "2", "baseline": {')  # torn write
      raise KeyboardInterrupt("killed")
    calls.append(record["id"])
    real_append(path, record)

  with tasks.override_config(**task_config):
    monkeypatch.setattr(experiment, "append_line", dying_append)
    with pytest.raises(KeyboardInterrupt):
      experiment.run(config, workdir)
    monkeypatch.setattr(experiment, "append_line", real_append)
    first = _lines_lenient(workdir)
    assert [r["id"] for r in first] == ["0", "1"]
    experiment.run(config, workdir)
  lines = _lines(workdir)
  assert [r["id"] for r in lines] == [str(i) for i in range(len(SENTENCES))]
  assert lines[:2] == first


def _lines_lenient(workdir):
  with open(os.path.join(workdir, "examples.jsonl")) as f:
    out = []
    for line in f:
      try:
        out.append(json.loads(line))
      except json.JSONDecodeError:
        pass
    return out


def test_bad_configs_fail_before_any_model_loads(setup, tmp_path,
                                                  monkeypatch):
  """gamma < 1, missing models, placeholders, unknown tasks: one ConfigError
  listing the problems, raised before load_model is ever called."""
  _, models, _ = setup
  monkeypatch.setattr(checkpoints, "load_model",
                      lambda *a, **k: pytest.fail("a model was loaded"))
  bad = [
      (dict(gamma=0), "every gamma must be >= 1"),
      (dict(gamma="best"), "use an int, a list of ints or 'optimal'"),
      (dict(target=""), "target is empty"),
      (dict(draft="t5x:gs://YOUR_BUCKET/x"), "placeholder"),
      (dict(task="no_such_task"), "Unknown task"),
      (dict(max_decode_len=0), "max_decode_len"),
  ]
  for overrides, message in bad:
    with pytest.raises(experiment.ConfigError, match=message):
      experiment.run(_config(models, **overrides), str(tmp_path / "w"))


def test_optimal_gamma_mode_probes_then_runs(setup, tmp_path):
  """gamma='optimal' measures alpha and c on probe examples, records them,
  and runs with Theorem 3.8's best gamma for those numbers."""
  _, models, task_config = setup
  workdir = str(tmp_path / "opt")
  config = _config(models, gamma="optimal", probe_examples=2, max_gamma=6,
                   trace_examples=0, max_examples=2)
  with tasks.override_config(**task_config):
    summary = experiment.run(config, workdir)
  with open(os.path.join(workdir, "optimal_gamma.json")) as f:
    probe = json.load(f)
  assert probe["gamma"] == int(theory.optimal_gamma(probe["alpha"],
                                                    probe["c"], 6))
  assert summary["gamma"] == probe["gamma"]


def test_reproduce_assembles_tables_with_paper_columns(setup, tmp_path):
  """Table 2/3 rows carry our alpha and speedup next to the paper's."""
  _, models, task_config = setup
  run_dir = tmp_path / "tables" / "ende_small_t0"
  config = _config(models, gamma=2, trace_examples=0, max_examples=2,
                   draft_config=None)
  with tasks.override_config(**task_config):
    summary = experiment.run(config, str(run_dir))
  summary["config"]["draft_config"] = "t5_1_1_small"  # as a Table 2 row
  tables = reproduce.assemble(str(tmp_path / "tables"), [summary])
  row = tables["table2"][0]
  assert (row["task"], row["draft"], row["paper_alpha"]) == ("ende",
                                                             "t5_small", 0.75)
  assert row["alpha"] == summary["alpha"]
  md = open(tmp_path / "tables" / "table2.md").read()
  assert "paper_speedup" in md and "3.4" in md


def test_run_experiment_script_with_gin(setup, tmp_path):
  """The absl script parses --gin_file and --gin.X=... overrides, writes the
  config into the workdir and the table; a bad gin value fails clearly."""
  _, models, task_config = setup
  gin_file = tmp_path / "exp.gin"
  gin_file.write_text(
      "from __gin__ import dynamic_registration\n"
      "from specdec_jax import experiment\n"
      "experiment.ExperimentConfig:\n"
      "  task = 'wmt14_ende_local'\n"
      f"  target = '{models['target']}'\n"
      f"  draft = '{models['draft']}'\n"
      "  max_decode_len = 6\n  cost_repeats = 1\n  trace_examples = 0\n")
  workdir = tmp_path / "wd"
  cmd = [sys.executable, os.path.join(REPO, "scripts", "run_experiment.py"),
         f"--gin_file={gin_file}", f"--workdir={workdir}",
         "--gin.experiment.ExperimentConfig.gamma=2",
         "--gin.experiment.ExperimentConfig.max_examples=2",
         f"--gin.TaskConfig.vocab_path='{task_config['vocab_path']}'",
         f"--gin.TaskConfig.local_data_dir='{task_config['local_data_dir']}'",
         "--gin.TaskConfig.wmt_ende_files={'test': 'mini'}"]
  env = dict(os.environ, PYTHONPATH=REPO, XLA_FLAGS="")
  proc = subprocess.run(cmd, capture_output=True, text=True, env=env,
                        timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "gamma = 2" in (workdir / "config.gin").read_text()
  assert len(_lines(str(workdir))) == 2
  assert "| wmt14_ende_local |" in (workdir / "table.md").read_text()
  bad = subprocess.run(cmd[:3] + [f"--workdir={tmp_path / 'bad'}",
                                  "--gin.experiment.ExperimentConfig.gamma=0"],
                       capture_output=True, text=True, env=env, timeout=300)
  assert bad.returncode != 0 and "every gamma must be >= 1" in bad.stderr
