"""Runs a list of experiment configs and assembles the paper's tables.

Each gin file runs into `workdir/<name>` (resumable, see `experiment.py`);
then Table 2 (task, M_q, temperature, gamma, alpha, speedup) and Table 3
(alpha for each M_p / M_q pair at temperatures 0 and 1) are written as
Markdown and CSV with the paper's numbers in adjacent columns.

A run is placed by its task and draft: the task names the paper's target
(`_TARGET_KEYS`: EnDe rows are T5-XXL's, lm1b rows the GPT-like 97M's) and
the draft's config name or path its M_q (`_draft_key`).
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import re
from typing import Any, Sequence

from absl import logging
import gin

from specdec_jax import errors
from specdec_jax.infra import chips
from specdec_jax.infra import multihost
from specdec_jax.infra import paths
from specdec_jax.data import tasks
from specdec_jax.experiments import experiment
from specdec_jax.launch import gin_flags
from specdec_jax.planning import paper
from specdec_jax.experiments import report
from specdec_jax.planning import table_cost


_TASK_KEYS = {"wmt14_ende": "ende", "wmt_t2t_ende": "ende",
              "wmt14_ende_local": "ende", "multi30k_ende_local": "ende",
              "cnn_dailymail": "cnndm", "cnn_dailymail_local": "cnndm",
              "lm1b": "lm1b", "lm1b_local": "lm1b"}

# The paper's target on each task, as paper.TABLE3 keys it.
_TARGET_KEYS = {"ende": "t5_xxl_ende", "cnndm": "t5_xxl_cnndm",
                "lm1b": "gpt_97m"}


# Models we ship and train (`demo:NAME`) are not the paper's, whatever their
# size: their rows carry their own names and no paper columns.
_OURS = "demo:"


def _ours(summary_config: dict) -> bool:
  return any(str(summary_config.get(k, "")).startswith(_OURS)
             for k in ("target", "draft"))


def _draft_key(summary_config: dict) -> str:
  """The paper's name of a run's draft: its config name, else its path's
  (a shipped model's own name: `draft_base` for demo:draft_base)."""
  draft = summary_config["draft"]
  if _ours(summary_config):
    return str(draft).removeprefix(_OURS)
  if draft in ("unigram", "bigram"):
    return draft
  name = str(summary_config.get("draft_config") or draft)
  # Our checkpoints record their architecture and take no draft_config, so
  # the GPT-like draft is known by its path (configs/experiments/table3/
  # checkpoints_lm1b.gin keeps 'gpt_6m' in it).
  if re.search(r"gpt[_-]?6m", name, re.IGNORECASE):
    return "gpt_6m"
  for size in ("small", "base", "large"):
    if size in name:
      return f"t5_{size}"
  return os.path.basename(str(draft).rstrip("/"))


# Files under configs/experiments that other configs include rather than run:
# the checkpoint macros and each task's shared settings.
_SHARED_CONFIGS = ("ende.gin", "cnndm.gin", "lm1b.gin", "instruct.gin")


def is_shared_config(path: str) -> bool:
  """Whether an experiment gin file is included by rows, not run itself."""
  name = os.path.basename(path)
  return name.startswith("checkpoints") or name in _SHARED_CONFIGS


def experiment_files(patterns: Sequence[str],
                     search_dirs: str | Sequence[str]) -> list[str]:
  """The row configs matching `patterns` (globs, as given or under the first
  of `search_dirs` where they match), shared files left out, in sorted order
  per pattern."""
  dirs = [search_dirs] if isinstance(search_dirs, str) else list(search_dirs)
  files = []
  for pattern in patterns:
    matches = sorted(glob.glob(pattern))
    for d in dirs:
      matches = matches or sorted(glob.glob(os.path.join(d, pattern)))
    if not matches:
      raise FileNotFoundError(
          f"no experiment config matches {pattern!r} (looked in "
          f"{', '.join(dirs)})")
    files += [m for m in matches if not is_shared_config(m)]
  return files


@dataclasses.dataclass(frozen=True)
class Row:
  """One experiment config as parsed: its settings, the task files gin gave
  it, and where it runs."""

  config: experiment.ExperimentConfig
  task_config: Any  # tasks.TaskConfig
  workdir: str
  gin_config: str = ""  # what gin was told, written to workdir/config.gin


def parse_rows(gin_files: Sequence[str], workdir: str,
               extra_files: Sequence[str] = (),
               bindings: Sequence[str] = (),
               max_examples: int | None = None) -> list[Row]:
  """Parses each experiment gin file (plus shared run files and bindings).

  `max_examples` (when given) replaces every row's. Each row runs into
  `workdir/<name>` (its config's name, else its file's)."""
  rows = []
  for gin_file in gin_files:
    gin.clear_config()
    gin_flags.parse([gin_file, *extra_files], bindings)
    config = gin.get_configurable(experiment.ExperimentConfig)()
    if max_examples is not None:
      config = dataclasses.replace(config, max_examples=max_examples)
    name = config.name or os.path.splitext(os.path.basename(gin_file))[0]
    rows.append(Row(config, tasks.current_config(),
                    paths.join(workdir, name), gin.config_str()))
  names = [r.workdir for r in rows]
  if len(set(names)) != len(names):
    raise ValueError(f"two experiments would share a workdir: {names}")
  return rows


def share_groups(rows: Sequence[Row]) -> list[list[Row]]:
  """Rows grouped so that each group can share one baseline decode per
  example: same task files and every setting but the draft's
  (`experiment.PER_DRAFT_FIELDS`). Groups keep the rows' order."""
  groups: list[list[Row]] = []
  for row in rows:
    for group in groups:
      if group[0].task_config == row.task_config:
        try:
          experiment.check_side_by_side([group[0].config, row.config])
        except experiment.ConfigError:
          continue
        group.append(row)
        break
    else:
      groups.append([row])
  return groups


def run_rows(rows: Sequence[Row]) -> list[dict]:
  """Runs the rows, those that can share a baseline side by side
  (`experiment.run_side_by_side`: each example is decoded by the target
  alone once, then by every draft of the group, and every row's record
  holds that one baseline). Returns the summaries in the rows' order. On a
  multi-host job every process runs them all; process 0 writes."""
  by_workdir = {}
  groups = share_groups(rows)
  for i, group in enumerate(groups):
    logging.info("experiments %d/%d, side by side: %s", i + 1, len(groups),
                 ", ".join(os.path.basename(r.workdir) for r in group))
    previous = tasks.set_config(group[0].task_config)
    try:
      summaries = experiment.run_side_by_side(
          [r.config for r in group], [r.workdir for r in group])
    finally:
      tasks.set_config(previous)
    # After the run: a rerun refused for other settings leaves the
    # workdir's config as it was. Process 0 of a multi-host job writes.
    for row in group if multihost.is_primary() else ():
      paths.write_text(paths.join(row.workdir, "config.gin"), row.gin_config)
    by_workdir.update(zip((r.workdir for r in group), summaries))
  return [by_workdir[r.workdir] for r in rows]


def run_configs(gin_files: Sequence[str], workdir: str,
                extra_files: Sequence[str] = (),
                bindings: Sequence[str] = (),
                max_examples: int | None = None,
                chip: chips.Chip | None = None) -> list[dict]:
  """Parses the experiment gin files (`parse_rows`), logs the projected
  time of the whole table on `chip` (`table_cost`; None: not projected),
  then runs them (`run_rows`)."""
  rows = parse_rows(gin_files, workdir, extra_files, bindings, max_examples)
  if chip is not None:
    _, lines = table_cost.project(
        [[r.config for r in g] for g in share_groups(rows)], chip)
    for line in lines:
      logging.info("%s", line)
  return run_rows(rows)


def load_summaries(workdir: str) -> list[dict]:
  out = []
  for name in sorted(paths.list_dir(workdir)):
    data = paths.read_bytes(paths.join(workdir, name, "summary.json"))
    if data is not None:
      out.append(json.loads(data))
  return out


class NothingToAssembleError(FileNotFoundError, errors.UsageError):
  """--assemble_only on a workdir that holds no finished row."""


def assemble(workdir: str, summaries: Sequence[dict] | None = None,
             require: bool = False) -> dict:
  """Writes table2.{md,csv} and table3.{md,csv}; returns their rows.

  `require`: refuse (NothingToAssembleError, naming the path) a workdir
  that does not exist or holds no row's summary.json, instead of writing
  empty tables (`--assemble_only` on a mistyped path)."""
  if summaries is None and require:
    if not paths.isdir(workdir):
      raise NothingToAssembleError(
          f"--workdir={workdir} does not exist: nothing to assemble. Pass "
          "the workdir the rows ran into (each row's folder holds its "
          "summary.json).")
    if not load_summaries(workdir):
      raise NothingToAssembleError(
          f"--workdir={workdir} holds no finished row (no */summary.json): "
          "nothing to assemble. Run the rows first, or pass the workdir "
          "they ran into.")
  summaries = list(summaries or load_summaries(workdir))
  table2, table3 = [], {}
  for s in summaries:
    cfg = s["config"]
    task = _TASK_KEYS.get(cfg["task"], cfg["task"])
    draft = _draft_key(cfg)
    temp = int(round(float(cfg["temperature"])))
    ours = _ours(cfg)
    for row in s["rows"]:
      ref = None if ours else paper.TABLE2.get((task, draft, temp))
      table2.append({
          "task": task, "draft": draft, "temperature": temp,
          "gamma": row["gamma"], "alpha": row["alpha"], "c": row["c"],
          "speedup": row["speedup"], "predicted": row["predicted_speedup"],
          "paper_gamma": ref[0] if ref else None,
          "paper_alpha": ref[1] if ref else None,
          "paper_speedup": ref[2] if ref else None,
          "examples": row["examples"]})
      target = (str(cfg["target"]).removeprefix(_OURS) if ours
                else f"target ({task})")
      entry = table3.setdefault((task, target, draft), {"target": target,
                                                        "draft": draft})
      entry[f"alpha_t{temp}"] = row["alpha"]
      ref3 = None if ours else paper.TABLE3.get(
          (_TARGET_KEYS.get(task, task), draft))
      if ref3:
        entry["paper_alpha_t0"], entry["paper_alpha_t1"] = ref3
  cols2 = ("task", "draft", "temperature", "gamma", "alpha", "paper_alpha",
           "c", "speedup", "predicted", "paper_speedup", "paper_gamma",
           "examples")
  cols3 = ("target", "draft", "alpha_t0", "paper_alpha_t0", "alpha_t1",
           "paper_alpha_t1")
  paths.makedirs(workdir)
  report.write_table(paths.join(workdir, "table2"), table2, cols2)
  report.write_table(paths.join(workdir, "table3"), list(table3.values()),
                     cols3)
  return {"table2": table2, "table3": list(table3.values())}
