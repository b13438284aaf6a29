"""Tests for specdec_jax.experiments.experiment / report / reproduce and the scripts.

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
import time

import numpy as np
import pytest

import specdec_jax as sd

from specdec_jax import checkpoints
from specdec_jax.experiments import step_timers
from specdec_jax.experiments import experiment
from specdec_jax.tables import reproduce
from specdec_jax.experiments import best_of
from specdec_jax.experiments import workdir as workdir_lib
from specdec_jax.data import tasks
from specdec_jax import theory
from tests import helpers

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SENTENCES = ["the cat sat on the mat", "the house is wonderful",
             "a cat is on a mat today", "das Haus ist wunderbar",
             "the news today"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_vocab):
  """Local EnDe files, the tiny vocabulary, and two tiny T5s saved to disk."""
  root = tmp_path_factory.mktemp("exp")
  models = helpers.tiny_ende(root, SENTENCES)
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


def test_complete_run_outputs_are_consistent(setup, tmp_path, monkeypatch):
  """Every output exists; speedup = ratio of recorded times; alpha = pooled
  alpha_sum / alpha_count (weighted by verified positions); the prediction
  is Theorem 3.8 of the recorded alpha and c; greedy outputs identical.
  The cost loops are timed between the decoding rounds, one per round;
  those the rounds did not reach are topped up after them."""
  _, models, task_config = setup
  workdir = str(tmp_path / "run")
  ticks, timed_after = [], []
  tick = step_timers.RoundRobinTimer.tick
  monkeypatch.setattr(step_timers.RoundRobinTimer, "tick",
                      lambda self: ticks.append(1) or tick(self))
  best_times = best_of.best_times
  monkeypatch.setattr(best_of, "best_times", lambda fns, repeats: (
      timed_after.append(len(fns)) or best_times(fns, repeats)))
  with tasks.override_config(**task_config):
    summary = experiment.run(_config(models), workdir)
  # 5 examples, 1 round each: 5 of the 6 loops (target and draft steps,
  # verifications of 2 and 4 tokens, both prefills) are timed between the
  # rounds, the sixth by the timer after them, none anew.
  assert len(ticks) == len(SENTENCES) and sum(timed_after) == 0
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
    # The finite-length prediction uses the speculative outputs' lengths and
    # can only be lower: the last run of each output is cut short.
    assert row["predicted_at_lengths"] == pytest.approx(
        theory.walltime_improvement_at_lengths(
            alpha, row["gamma"], row["c"], [len(s["tokens"]) for s in spec]))
    assert row["predicted_at_lengths"] <= row["predicted_speedup"] + 1e-9
    # The prediction with prefills uses the costs.json the run wrote, and
    # paying a cost once per input on both sides pulls it towards 1.
    with open(os.path.join(workdir, "costs.json")) as f:
      cost = json.load(f)[g]
    assert cost["target_prefill_cost"] > 0 and cost["draft_prefill_cost"] > 0
    assert row["predicted_with_prefill"] == pytest.approx(
        theory.walltime_improvement_at_lengths(
            alpha, row["gamma"], row["c"], [len(s["tokens"]) for s in spec],
            verify_cost=row["verify_cost"],
            target_prefill=cost["target_prefill_cost"],
            draft_prefill=cost["draft_prefill_cost"]))
    # Cutting outputs at EOS can only drop tokens a call accepted.
    assert row["tokens_per_call"] <= row["accepted_plus_one_per_call"] + 1e-9
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
  real_append = workdir_lib.append_line
  calls = []

  def dying_append(path, record):
    if len(calls) == 2:
      with open(path, "a") as f:
        f.write('{"id": "2", "baseline": {')  # torn write
      raise KeyboardInterrupt("killed")
    calls.append(record["id"])
    real_append(path, record)

  with tasks.override_config(**task_config):
    monkeypatch.setattr(workdir_lib, "append_line", dying_append)
    with pytest.raises(KeyboardInterrupt):
      experiment.run(config, workdir)
    monkeypatch.setattr(workdir_lib, "append_line", real_append)
    first = _lines_lenient(workdir)
    assert [r["id"] for r in first] == ["0", "1"]
    experiment.run(config, workdir)
  lines = _lines(workdir)
  assert [r["id"] for r in lines] == [str(i) for i in range(len(SENTENCES))]
  assert lines[:2] == first


def test_side_by_side_runs_share_one_baseline_and_resume_per_draft(
    setup, tmp_path, monkeypatch):
  """Experiments that differ only in their drafts run side by side: each
  example's target-alone decode is timed once and recorded, identically, in
  every experiment's examples.jsonl; each experiment's own numbers are what
  `run` computes from its file (speedup = baseline / speculative time), and
  greedy outputs match the target's. An experiment that already finished
  an example (here: run alone first) is not decoded again for it: its lines
  stay as they were, while the other experiment gets every example."""
  _, models, task_config = setup
  first = _config(models, gamma=2, trace_examples=1, max_examples=3,
                  name="a")
  second = _config(models, gamma=(1, 3), trace_examples=0, max_examples=3,
                   name="b", draft=models["target"])
  dirs = [str(tmp_path / "a"), str(tmp_path / "b")]
  with tasks.override_config(**task_config):
    experiment.run(dataclasses.replace(first, max_examples=2), dirs[0])
    before = _lines(dirs[0])
    calls = []
    real = experiment.generate
    monkeypatch.setattr(experiment, "generate",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    summaries = experiment.run_side_by_side([first, second], dirs)
  a, b = _lines(dirs[0]), _lines(dirs[1])
  assert a[:2] == before and [r["id"] for r in a] == ["0", "1", "2"]
  assert [r["id"] for r in b] == ["0", "1", "2"]
  # Three examples: one compile call and `repeats` timed calls each, no more.
  assert len(calls) == 1 + 3 * first.repeats
  assert a[2]["baseline"] == b[2]["baseline"]
  assert a[0]["baseline"] != b[0]["baseline"]  # timed again, in this run
  for summary, lines in zip(summaries, (a, b)):
    for row in summary["rows"]:
      spec = [r["speculative"][str(row["gamma"])] for r in lines]
      assert row["speedup"] == pytest.approx(
          sum(r["baseline"]["time_s"] for r in lines)
          / sum(s["time_s"] for s in spec))
      assert all(s["tokens"] == r["baseline"]["tokens"]
                 for s, r in zip(spec, lines))
  assert sorted(r["gamma"] for r in summaries[1]["rows"]) == [1, 3]
  assert os.path.exists(os.path.join(dirs[0], "trace.html"))
  assert not os.path.exists(os.path.join(dirs[1], "trace.html"))


def test_side_by_side_refuses_experiments_that_cannot_share_a_baseline(
    setup, tmp_path, monkeypatch):
  """A shared baseline needs the same task, target and sampling: configs
  that differ elsewhere than the draft are refused, naming the field,
  before any model loads; so are two experiments on one workdir."""
  _, models, _ = setup
  monkeypatch.setattr(checkpoints, "load_model",
                      lambda *a, **k: pytest.fail("a model was loaded"))
  config = _config(models, name="a")
  with pytest.raises(experiment.ConfigError, match="differ in temperature"):
    experiment.run_side_by_side(
        [config, _config(models, name="b", temperature=1.0)],
        [str(tmp_path / "a"), str(tmp_path / "b")])
  with pytest.raises(ValueError, match="its own workdir"):
    experiment.run_side_by_side([config, config],
                                [str(tmp_path / "a"), str(tmp_path / "a")])


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
  """gamma < 1, missing models, placeholders, unknown tasks, bad stop ids:
  one ConfigError listing the problems, raised before load_model is ever
  called."""
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
      (dict(tree=(2, 1), gamma=3), r"set gamma = 2"),
      (dict(tree=(2, 1), tree_parents=(0, 0), gamma=2), "both set"),
      (dict(tree_parents=(0, 1, 0), gamma=2), "breadth first"),
      (dict(tree=(2, 2, 2, 2), gamma=4, max_decode_len=3), "deeper"),
      (dict(stop_ids=()), "stop_ids is empty"),
      (dict(stop_ids=(1, 0)), "0 is the pad id"),
      (dict(stop_ids="1"), "a tuple of token ids"),
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
  assert probe["verify_costs"] is None


def test_optimal_gamma_can_price_in_the_verification_cost(setup, tmp_path):
  """With optimal_gamma_verify_cost the probe also times the target on
  gamma + 1 tokens for every gamma and picks the argmax of
  theory.walltime_improvement_measured for the recorded numbers."""
  _, models, task_config = setup
  workdir = str(tmp_path / "opt_v")
  config = _config(models, gamma="optimal", probe_examples=1, max_gamma=3,
                   optimal_gamma_verify_cost=True, trace_examples=0,
                   max_examples=1)
  with tasks.override_config(**task_config):
    summary = experiment.run(config, workdir)
  with open(os.path.join(workdir, "optimal_gamma.json")) as f:
    probe = json.load(f)
  assert len(probe["verify_costs"]) == 3
  assert all(v > 0 for v in probe["verify_costs"])
  assert probe["gamma"] == int(theory.optimal_gamma(
      probe["alpha"], probe["c"], 3, verify_costs=probe["verify_costs"]))
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


def test_adaptive_draft_length_and_cascade_rows(setup, tmp_path):
  """ExperimentConfig.draft_stop, .cascade and .rule reach the decoder: a
  cascaded draft under ConfidenceStop and a lossy rule (typical acceptance,
  which leaves greedy unchanged) keeps greedy outputs identical, records its
  proposal lengths (one per target call, at most gamma), a call count and
  alpha per level and the measured acceptance, marks records and row lossy,
  and its costs are measured on the cascade's top model."""
  from specdec_jax.decoding import stopping  # pylint: disable=g-import-not-at-top
  _, models, task_config = setup
  workdir = str(tmp_path / "run")
  config = _config(models, gamma=3, draft_stop=stopping.ConfidenceStop(0.3),
                   cascade=((models["draft"], 2),), trace_examples=1,
                   rule=sd.TypicalAcceptance())
  with tasks.override_config(**task_config):
    summary = experiment.run(config, workdir)
  row = summary["rows"][0]
  assert row["identical"] is True
  assert row["exact"] is False and 0 <= row["acceptance_rate"] <= 1
  assert "acceptance_rate | exact" in open(
      os.path.join(workdir, "table.md")).read()
  for record in _lines(workdir):
    spec = record["speculative"]["3"]
    assert spec["exact"] is False and "exact" not in record["baseline"]
    assert sum(spec["proposal_histogram"]) == spec["target_calls"]
    assert len(spec["proposal_histogram"]) == 4
    assert spec["level_calls"][0] == spec["target_calls"]
    assert len(spec["level_alpha"]) == 2
  assert row["c"] > 0


def test_token_tree_rows(setup, tmp_path):
  """ExperimentConfig.tree reaches the decoder: greedy outputs stay
  identical, each record carries its walks' rank histogram (one walk per
  target call at depth 0), and the row reports the tree, its verified
  tokens, the measured per-rank acceptance and the expected tokens per
  call they give (`theory.tree_expected_tokens`), with the verification
  cost timed at the tree's nodes + 1 tokens."""
  from specdec_jax import theory  # pylint: disable=g-import-not-at-top
  _, models, task_config = setup
  workdir = str(tmp_path / "run")
  config = _config(models, gamma=2, tree=(2, 1), trace_examples=0)
  with tasks.override_config(**task_config):
    summary = experiment.run(config, workdir)
  row = summary["rows"][0]
  assert row["identical"] is True
  assert (row["tree"], row["verified"]) == ("2x1", 5)
  for record in _lines(workdir):
    spec = record["speculative"]["2"]
    assert sum(spec["rank_histogram"][0]) == spec["target_calls"]
  rates = np.array(row["rank_acceptance"], dtype=float)
  np.testing.assert_allclose(
      row["expected_tokens_per_call"],
      theory.tree_expected_tokens((0, 0, 1, 2), np.nan_to_num(rates)))
  costs = json.load(open(os.path.join(workdir, "costs.json")))
  assert costs["2"]["verify_step_s"] > 0


# ----------------------------------------------------------------------------
# Issue 18: one run per workdir, one set of settings per workdir.


def test_a_second_run_on_a_locked_workdir_stops_at_once_naming_the_pid(
    setup, tmp_path, monkeypatch):
  """Finding 1: two runs on one workdir both decoded every example (each id
  twice in examples.jsonl). A run holding the workdir's lock (here another
  process) makes a second run stop before loading anything, naming the pid
  and the workdir; once the holder is gone the workdir is free again."""
  _, models, task_config = setup
  workdir = tmp_path / "run"
  workdir.mkdir()
  holder = subprocess.Popen(
      [sys.executable, "-c",
       "import fcntl, os, sys, time\n"
       f"fd = os.open({str(workdir / '.lock')!r}, os.O_RDWR | os.O_CREAT)\n"
       "fcntl.flock(fd, fcntl.LOCK_EX)\n"
       "os.write(fd, f'{os.getpid()}\\n'.encode())\n"
       "print('locked', flush=True)\n"
       "time.sleep(120)\n"], stdout=subprocess.PIPE, text=True)
  try:
    assert holder.stdout.readline().strip() == "locked"
    monkeypatch.setattr(checkpoints, "load_model",
                        lambda *a, **k: pytest.fail("a model was loaded"))
    with tasks.override_config(**task_config):
      with pytest.raises(workdir_lib.WorkdirError,
                         match=f"{workdir} is in use by another run "
                         rf"\(pid {holder.pid}\)"):
        experiment.run(_config(models, gamma=2), str(workdir))
  finally:
    holder.kill()
    holder.wait()
  with workdir_lib.lock(str(workdir)):  # released by the holder's death
    pass


def test_rerun_with_other_settings_is_refused_and_more_examples_extend(
    setup, tmp_path, monkeypatch):
  """Finding 2: a rerun with another temperature exited 0 with temperature-0
  numbers under a temperature-1 label; another gamma died with
  KeyError: '5'; max_examples=5 on a 40-example workdir still reported 40.
  Now: other settings are refused before loading, listing each difference
  and the fix; more examples extend the workdir; fewer report fewer;
  overwrite=True starts over when the settings differ and resumes when they
  do not."""
  _, models, task_config = setup
  workdir = str(tmp_path / "run")
  base = dict(gamma=2, trace_examples=0, max_examples=2)
  with tasks.override_config(**task_config):
    assert experiment.run(_config(models, **base), workdir)["examples"] == 2
    with monkeypatch.context() as m:
      m.setattr(checkpoints, "load_model",
                lambda *a, **k: pytest.fail("a model was loaded"))
      for change, listed in ((dict(temperature=1.0), r"temperature: 0\.0 in "
                              r"the workdir, 1\.0 now"),
                             (dict(gamma=5), "gamma: 2 in the workdir, 5 now"),
                             (dict(seed=1), "seed: 0 in the workdir, 1 now")):
        with pytest.raises(workdir_lib.WorkdirError,
                           match=f"(?s){listed}.*--overwrite"):
          experiment.run(_config(models, **dict(base, **change)), workdir)
    more = experiment.run(_config(models, **dict(base, max_examples=4)),
                          workdir)
    assert more["examples"] == 4 and len(_lines(workdir)) == 4
    fewer = experiment.run(_config(models, **dict(base, max_examples=1)),
                           workdir)
    assert fewer["examples"] == 1 and len(_lines(workdir)) == 4
    # overwrite keeps results of the same settings: the run resumes.
    same = experiment.run(_config(models, **dict(base, overwrite=True)),
                          workdir)
    assert same["examples"] == 2 and len(_lines(workdir)) == 4
    fresh = experiment.run(_config(models, **dict(
        base, temperature=1.0, max_examples=1, overwrite=True)), workdir)
  assert fresh["examples"] == 1 and len(_lines(workdir)) == 1
  with open(os.path.join(workdir, "fingerprint.json")) as f:
    assert json.load(f)["temperature"] == 1.0


def test_overwrite_clears_old_tables_and_a_refusal_writes_nothing(
    setup, tmp_path):
  """Issue 38, finding 3: `--overwrite` with settings that then failed left
  the new fingerprint next to the old tables and plots, and a refused rerun
  wrote into the workdir. Now the refusal (checked before config.gin is
  written) changes no file, and overwrite removes every result file, tables
  and plots included, before anything new is written."""
  _, models, task_config = setup
  workdir = tmp_path / "wd"
  workdir.mkdir()
  with tasks.override_config(**task_config):
    workdir_lib.check_fingerprint(str(workdir), _config(models, gamma=2),
                                  False)
    for name in ("table.md", "table.csv", "acceptance.png", "trace.html",
                 "summary.json", "examples.jsonl"):
      (workdir / name).write_text("old")
    before = {p.name: p.read_bytes() for p in workdir.iterdir()}
    other = _config(models, gamma=3)
    with pytest.raises(workdir_lib.WorkdirError, match="gamma: 2 in the"):
      workdir_lib.refuse_other_settings(str(workdir), other)
    assert {p.name: p.read_bytes() for p in workdir.iterdir()} == before
    workdir_lib.refuse_other_settings(str(workdir), _config(models, gamma=2))
    workdir_lib.check_fingerprint(
        str(workdir), _config(models, gamma=3, overwrite=True), True)
  assert sorted(p.name for p in workdir.iterdir()) == ["fingerprint.json"]


def test_a_damaged_line_inside_examples_jsonl_names_file_and_line(tmp_path):
  """Finding 8: a garbage line in the middle of examples.jsonl gave a bare
  JSONDecodeError. It is refused naming the file and the line; a torn LAST
  line (a kill mid-write) is still cut and the run resumes."""
  path = str(tmp_path / "examples.jsonl")
  with open(path, "w") as f:
    f.write('{"id": "0"}\n{"id": "1", "bas\n{"id": "2"}\n')
  with pytest.raises(workdir_lib.ConfigError,
                     match=f"{path} line 2 is not a JSON record.*Delete that line"):
    workdir_lib.read_done(path)
  with open(path, "w") as f:
    f.write('{"id": "0"}\n{"id": "1"}\n{"id": "2", "bas')
  assert [r["id"] for r in workdir_lib.read_done(path)] == ["0", "1"]
