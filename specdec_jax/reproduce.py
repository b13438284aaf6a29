"""Runs a list of experiment configs and assembles the paper's tables.

Each gin file runs into `workdir/<name>` (resumable, see `experiment.py`);
then Table 2 (task, M_q, temperature, gamma, alpha, speedup) and Table 3
(alpha for each M_p / M_q pair at temperatures 0 and 1) are written as
Markdown and CSV with the paper's numbers in adjacent columns.
"""

from __future__ import annotations

import json
import os
from typing import Sequence

from absl import logging

from specdec_jax import paper
from specdec_jax import report

_TASK_KEYS = {"wmt14_ende": "ende", "wmt_t2t_ende": "ende",
              "wmt14_ende_local": "ende", "multi30k_ende_local": "ende",
              "cnn_dailymail": "cnndm", "cnn_dailymail_local": "cnndm"}


def _draft_key(summary_config: dict) -> str:
  draft = summary_config["draft"]
  if draft in ("unigram", "bigram"):
    return draft
  name = str(summary_config.get("draft_config") or draft)
  for size in ("small", "base", "large"):
    if size in name:
      return f"t5_{size}"
  return os.path.basename(str(draft).rstrip("/"))


def run_configs(gin_files: Sequence[str], workdir: str,
                extra_files: Sequence[str] = (),
                bindings: Sequence[str] = ()) -> list[dict]:
  """Runs each experiment gin file (plus shared run files and bindings)."""
  import gin  # pylint: disable=g-import-not-at-top
  from specdec_jax import experiment, gin_utils  # pylint: disable=g-import-not-at-top
  summaries = []
  for i, gin_file in enumerate(gin_files):
    gin.clear_config()
    gin_utils.parse([gin_file, *extra_files], bindings)
    config = gin.get_configurable(experiment.ExperimentConfig)()
    name = config.name or os.path.splitext(os.path.basename(gin_file))[0]
    logging.info("experiment %d/%d: %s", i + 1, len(gin_files), name)
    run_dir = os.path.join(workdir, name)
    gin_utils.write_config(run_dir)
    summaries.append(experiment.run(config, run_dir))
  return summaries


def load_summaries(workdir: str) -> list[dict]:
  out = []
  for name in sorted(os.listdir(workdir)):
    path = os.path.join(workdir, name, "summary.json")
    if os.path.exists(path):
      with open(path) as f:
        out.append(json.load(f))
  return out


def assemble(workdir: str, summaries: Sequence[dict] | None = None) -> dict:
  """Writes table2.{md,csv} and table3.{md,csv}; returns their rows."""
  summaries = list(summaries or load_summaries(workdir))
  table2, table3 = [], {}
  for s in summaries:
    cfg = s["config"]
    task = _TASK_KEYS.get(cfg["task"], cfg["task"])
    draft = _draft_key(cfg)
    temp = int(round(float(cfg["temperature"])))
    for row in s["rows"]:
      ref = paper.TABLE2.get((task, draft, temp))
      table2.append({
          "task": task, "draft": draft, "temperature": temp,
          "gamma": row["gamma"], "alpha": row["alpha"], "c": row["c"],
          "speedup": row["speedup"], "predicted": row["predicted_speedup"],
          "paper_gamma": ref[0] if ref else None,
          "paper_alpha": ref[1] if ref else None,
          "paper_speedup": ref[2] if ref else None,
          "examples": row["examples"]})
      entry = table3.setdefault((task, draft), {"target": f"target ({task})",
                                                "draft": draft})
      entry[f"alpha_t{temp}"] = row["alpha"]
      ref3 = paper.TABLE3.get((f"t5_xxl_{task}", draft))
      if ref3:
        entry["paper_alpha_t0"], entry["paper_alpha_t1"] = ref3
  cols2 = ("task", "draft", "temperature", "gamma", "alpha", "paper_alpha",
           "c", "speedup", "predicted", "paper_speedup", "paper_gamma",
           "examples")
  cols3 = ("target", "draft", "alpha_t0", "paper_alpha_t0", "alpha_t1",
           "paper_alpha_t1")
  os.makedirs(workdir, exist_ok=True)
  report.write_table(os.path.join(workdir, "table2"), table2, cols2)
  report.write_table(os.path.join(workdir, "table3"), list(table3.values()),
                     cols3)
  return {"table2": table2, "table3": list(table3.values())}
