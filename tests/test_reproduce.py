"""reproduce_tables: rows that share a baseline decode it once; the cost of a
table is projected before it runs; T5X's flags are accepted."""

import glob
import json
import os
import shutil
import subprocess
import sys

import gin
import pytest

from specdec_jax.infra import chips
from specdec_jax.experiments import experiment
from specdec_jax.launch import gin_flags
from specdec_jax.planning import table_cost
from specdec_jax.tables import reproduce
from tests import helpers

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_CONFIGS = os.path.join(REPO, "configs")
_DEMO_ROWS = "experiments/demo/ende_sentences_draft_*_t0.gin"


def _records(path):
  with open(path) as f:
    return {r["id"]: r for r in map(json.loads, f)}


def test_rows_differing_in_draft_share_each_baseline_decode(tmp_path):
  """The two demo rows (draft_base, draft_small) run side by side: every
  example's baseline record (tokens and time_s) is the same object in both
  rows' results, and both rows and the assembled table exist. Run through
  the script as a T5X user would: experiment files only (no run file),
  found through --gin_search_paths, T5X-style `--gin.ExperimentConfig.X=`
  bindings applied after them (issue 47), --tfds_data_dir, and
  --max_examples capping every row."""
  extra = tmp_path / "my_configs"
  (extra / "rows").mkdir(parents=True)
  for path in glob.glob(os.path.join(_CONFIGS, _DEMO_ROWS)):
    shutil.copy(path, extra / "rows")
  workdir = tmp_path / "rows"
  cmd = [sys.executable, os.path.join(REPO, "scripts", "reproduce_tables.py"),
         "--experiments=rows/ende_sentences_draft_*_t0.gin",
         "--gin.ExperimentConfig.repeats=1",
         "--gin.ExperimentConfig.cost_repeats=1",
         "--gin.ExperimentConfig.max_decode_len=24",
         f"--gin_search_paths={extra}", f"--tfds_data_dir={tmp_path / 'tfds'}",
         "--max_examples=2", f"--workdir={workdir}",
         "--compilation_cache_dir="]
  env = helpers.script_env()
  proc = subprocess.run(cmd, capture_output=True, text=True, env=env,
                        timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "projected decode time on one" in proc.stderr, proc.stderr[-2000:]
  base = _records(workdir / "ende_sentences_draft_base_t0" / "examples.jsonl")
  small = _records(workdir / "ende_sentences_draft_small_t0" /
                   "examples.jsonl")
  assert len(base) == len(small) == 2 and base.keys() == small.keys()
  for key in base:
    assert base[key]["baseline"] == small[key]["baseline"], key
    assert base[key]["baseline"]["time_s"] > 0
    # Each row keeps its own speculative decodes (gamma 4 and 3).
    assert list(base[key]["speculative"]) == ["4"]
    assert list(small[key]["speculative"]) == ["3"]
  config = (workdir / "ende_sentences_draft_base_t0" / "config.gin")
  assert "max_decode_len = 24" in config.read_text()
  table = (workdir / "table2.md").read_text()
  assert table.count("| ende |") == 2, table


def test_bindings_apply_after_every_file_with_or_without_files():
  """Issue 47: ExperimentConfig is configurable before any file imports it;
  a binding overrides the files whatever their order; a binding gin cannot
  apply (unknown name, unknown parameter, unparsable value) raises
  GinBindingError naming it."""
  try:
    gin.clear_config()
    gin_flags.parse([], ["ExperimentConfig.max_examples = 2"])
    config = gin.get_configurable(experiment.ExperimentConfig)()
    assert config.max_examples == 2
    gin.clear_config()
    row = "experiments/demo/ende_sentences_draft_base_t0.gin"
    gin_flags.parse([row], ["ExperimentConfig.max_examples = 3",
                            "experiment.ExperimentConfig.gamma = 5"])
    config = gin.get_configurable(experiment.ExperimentConfig)()
    assert (config.max_examples, config.gamma, config.draft) == (
        3, 5, "demo:draft_base")
    for bad in ("Foo.bar = 1", "ExperimentConfig.max_exampels = 2",
                "ExperimentConfig.max_examples = "):
      with pytest.raises(gin_flags.GinBindingError, match=bad.split(" =")[0]):
        gin_flags.parse([], [bad])
  finally:
    gin.clear_config()


def test_a_binding_that_matches_nothing_is_refused_in_one_line(tmp_path):
  """Issue 47: a `--gin.X=` binding gin cannot apply ends the script with
  status 1 and one line naming it, before any row runs (no workdir)."""
  workdir = tmp_path / "wd"
  # In this process (the script's real launch is the test above).
  proc = helpers.run_script(
      "reproduce_tables", f"--experiments={_DEMO_ROWS}",
      "--gin.ExperimentConfig.max_exampels=2", f"--workdir={workdir}",
      "--compilation_cache_dir=")
  assert proc.returncode == 1, proc.stderr[-3000:]
  assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
  last = proc.stderr.strip().splitlines()[-1]
  assert last.startswith("GinBindingError: "), last
  assert "ExperimentConfig.max_exampels" in last, last
  assert not workdir.exists()


def test_rows_that_cannot_share_a_baseline_run_apart():
  """Rows at different temperatures, or on different task files, are not
  grouped: their baselines differ."""
  files = reproduce.experiment_files(["experiments/table2/ende_*_t*.gin"],
                                     _CONFIGS)
  try:
    rows = reproduce.parse_rows(files, "/tmp/unused")
  finally:
    gin.clear_config()
  groups = reproduce.share_groups(rows)
  assert sorted(len(g) for g in groups) == [3, 3]
  for group in groups:
    assert len({r.config.temperature for r in group}) == 1
  other_files = rows[0].task_config.__class__(wmt_ende_files={"test": "x"})
  moved = reproduce.Row(rows[0].config, other_files, "/tmp/elsewhere")
  assert len(reproduce.share_groups([rows[0], moved])) == 2


def test_projection_counts_a_shared_baseline_once():
  """The projected time of the three T5-XXL EnDe greedy rows on a v4 chip
  (3,003 newstest2014 sentences each) counts the target's decodes once, not
  three times; the target step is the roofline of its decoder weights."""
  files = reproduce.experiment_files(["experiments/table2/ende_*_t0.gin"],
                                     _CONFIGS)
  try:
    rows = reproduce.parse_rows(files, "/tmp/unused")
  finally:
    gin.clear_config()
  configs = [r.config for r in rows]
  chip = chips.get_chip("tpu_v4")
  costs = [table_cost.row_cost(c, chip) for c in configs]
  assert all(c.examples == 3003 for c in costs)
  # Same target, same baseline: equal for all three rows.
  assert len({c.baseline_seconds for c in costs}) == 1
  together, _ = table_cost.project([configs], chip)
  apart, _ = table_cost.project([[c] for c in configs], chip)
  baseline = costs[0].baseline_seconds
  assert together == pytest.approx(apart - 2 * baseline)
  # XXL's decoder in bfloat16 is ~6.7 GB: ~5.6 ms a step at 1.2 TB/s, so
  # ~10 minutes for 3,003 x 34 tokens.
  assert 300 < baseline < 1200, baseline
  # A speculative row projects faster than its baseline (paper alphas).
  assert all(c.speculative_seconds < c.baseline_seconds for c in costs)


def test_unprojectable_rows_say_why():
  """A row without an architecture to plan (our own checkpoints) is listed
  as not projected, with the reason, instead of silently counting zero."""
  config = experiment.ExperimentConfig(task="wmt14_ende", target="x",
                                       draft="y", max_examples=5)
  total, lines = table_cost.project([[config]], chips.get_chip("tpu_v4"))
  assert total == 0
  assert any("not projected" in line and "target_config" in line
             for line in lines), lines


def _summary(target, draft, draft_config=None, alpha=0.7):
  return {"config": {"task": "wmt14_ende_local", "target": target,
                     "draft": draft, "draft_config": draft_config,
                     "temperature": 0.0},
          "rows": [{"gamma": 4, "alpha": alpha, "c": 0.05, "speedup": 2.0,
                    "predicted_speedup": 2.5, "examples": 2}]}


def test_rows_of_our_models_carry_no_paper_columns(tmp_path):
  """Issue 48: the demo's models (demo:NAME) are not the paper's T5 sizes
  even when their names say base or small: their rows keep their own names
  and no paper alpha, speedup or gamma. A paper row beside them keeps its
  paper columns (the control)."""
  tables = reproduce.assemble(str(tmp_path), [
      _summary("demo:target", "demo:draft_base"),
      _summary("hf:/ckpt/t5-v1_1-xxl-ende", "hf:/ckpt/small",
               draft_config="t5_1_1_small", alpha=0.75)])
  ours, theirs = tables["table2"]
  assert ours["draft"] == "draft_base"
  assert all(ours[k] is None for k in ("paper_alpha", "paper_speedup",
                                       "paper_gamma")), ours
  assert theirs["draft"] == "t5_small" and theirs["paper_alpha"] is not None
  rows3 = {r["draft"]: r for r in tables["table3"]}
  assert rows3["draft_base"]["target"] == "target"
  assert "paper_alpha_t0" not in rows3["draft_base"]
  assert "paper_alpha_t0" in rows3["t5_small"]


def test_assembling_a_missing_or_empty_workdir_is_refused(tmp_path):
  """Issue 48: --assemble_only (require=True) on a path that does not
  exist, or holds no finished row, names it instead of writing empty
  tables; a workdir with a row assembles (the control)."""
  missing = tmp_path / "typo"
  with pytest.raises(reproduce.NothingToAssembleError, match=str(missing)):
    reproduce.assemble(str(missing), require=True)
  assert not missing.exists()
  empty = tmp_path / "empty"
  empty.mkdir()
  with pytest.raises(reproduce.NothingToAssembleError, match="no finished"):
    reproduce.assemble(str(empty), require=True)
  row = empty / "ende_small_t0"
  row.mkdir()
  (row / "summary.json").write_text(json.dumps(
      _summary("hf:/t", "hf:/s", draft_config="t5_1_1_small")))
  assert len(reproduce.assemble(str(empty), require=True)["table2"]) == 1
