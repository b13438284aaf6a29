"""Summaries, tables and plots of experiment results.

`summarize` pools per-example records (see `experiment.py`) into the numbers
a paper row needs; `write_outputs` writes summary.json, table.md, table.csv
and PNG plots; `write_traces` renders Figure-1-style traces of a few
examples (accepted draft tokens, rejected ones, the target's corrections) as
PNG and HTML.
"""

from __future__ import annotations

import csv
import dataclasses
import html
import io
import json
from typing import Any, Callable, Sequence

import numpy as np

from specdec_jax.infra import paths
from specdec_jax import theory
from specdec_jax.decoding import api
from specdec_jax.infra import summaries
from specdec_jax.experiments import cost_checks
from specdec_jax.experiments.records import ExampleRecord


TABLE_COLUMNS = ("task", "draft", "temperature", "gamma", "alpha",
                 "acceptance_rate", "exact", "c",
                 "speedup", "predicted_speedup", "predicted_with_verify_cost",
                 "predicted_at_lengths", "predicted_at_lengths_with_verify_cost",
                 "predicted_with_prefill",
                 "tokens_per_call", "quality_metric", "quality_baseline",
                 "quality_speculative", "identical", "examples",
                 "cost_warning")


def _row(config, records: Sequence[ExampleRecord], gamma: int, costs: dict,
         metric_fn: Callable | None) -> dict[str, Any]:
  spec = [r.speculative[gamma] for r in records]
  base_time = sum(r.baseline.time_s for r in records)
  spec_time = sum(s.time_s for s in spec)
  alpha = theory.pooled_alpha([s.alpha_sum for s in spec],
                              [s.alpha_count for s in spec])
  lengths = [len(s.tokens) for s in spec]
  histogram = np.sum([s.accepted_histogram for s in spec], axis=0)
  tokens = sum(len(s.tokens) for s in spec)
  calls = sum(s.target_calls for s in spec)
  c = costs["c"]
  row = {
      "task": config.task, "target": config.target, "draft": config.draft,
      "temperature": config.temperature, "gamma": gamma,
      "examples": len(records), "alpha": alpha, "c": c,
      "mean_output_length": float(np.mean(lengths)) if lengths else 0.0,
      "c_hat": costs.get("c_hat"), "verify_cost": costs.get("verify_cost"),
      "baseline_time_s": base_time, "speculative_time_s": spec_time,
      "speedup": base_time / spec_time if spec_time else float("nan"),
      "predicted_speedup": float(theory.walltime_improvement(alpha, gamma, c)),
      # Theorem 3.8 with the target call priced at what verifying gamma + 1
      # tokens really costs (the paper assumes it costs one step).
      "predicted_with_verify_cost": float(
          theory.expected_tokens(alpha, gamma)
          / (gamma * c + costs.get("verify_cost", 1.0))),
      # The same two predictions for outputs as long as these ones: the
      # run that reaches its stop id emits only what is left (see
      # `theory.expected_iterations`), which Theorem 3.8 leaves out.
      "predicted_at_lengths": float(theory.walltime_improvement_at_lengths(
          alpha, gamma, c, lengths)),
      "predicted_at_lengths_with_verify_cost": float(
          theory.walltime_improvement_at_lengths(
              alpha, gamma, c, lengths,
              verify_cost=costs.get("verify_cost", 1.0))),
      # ... and with what each input costs once: both models' prefill (the
      # encoders), which the baseline and the speculative decode pay and
      # Theorem 3.8 leaves out (None where the costs predate its timing).
      "predicted_with_prefill": _with_prefill(alpha, gamma, c, lengths, costs),
      "tokens_per_call": tokens / max(calls, 1),
      "expected_tokens_per_call": float(theory.expected_tokens(alpha, gamma)),
      # Accepted draft tokens + 1 per call, before outputs are cut at their
      # stop id: what Theorem 3.1 predicts; tokens_per_call is lower by what
      # the last call of each output accepted past its end.
      "accepted_plus_one_per_call": float(
          np.dot(histogram, np.arange(1, len(histogram) + 1))
          / max(histogram.sum(), 1)),
      "accepted_histogram": histogram.tolist(),
      # What the rule really accepted at the positions alpha averages
      # (alpha's expectation under an exact rule; a lenient one moves it).
      "acceptance_rate": float(
          np.dot(histogram, np.arange(len(histogram)))
          / max(sum(s.alpha_count for s in spec), 1)),
      # A lossy rule's row says so (records before the field: exact).
      "exact": all(s.exact is not False for s in spec),
      "identical": all(s.tokens == r.baseline.tokens
                       for s, r in zip(spec, records)),
  }
  row["verified"] = gamma + 1
  # Costs that contradicted themselves twice (`cost_checks`): the
  # predictions above rest on them.
  row["cost_warning"] = costs.get(cost_checks.WARNING)
  shape = config.tree_shape() if hasattr(config, "tree_shape") else None
  if shape is not None:
    row.update(_tree_columns(shape, spec, c, costs.get("verify_cost", 1.0)))
  if config.temperature != 0:
    row["identical"] = None  # sampled outputs are not expected to match
  if metric_fn is not None:
    targets = [r.target_text for r in records]
    base_q = metric_fn(targets, [r.baseline.text for r in records])
    spec_q = metric_fn(targets, [s.text for s in spec])
    key = sorted(base_q)[0] if "bleu" not in base_q else "bleu"
    if "rougeL" in base_q:
      key = "rougeL"
    row.update(quality_metric=key, quality_baseline=base_q[key],
               quality_speculative=spec_q[key], quality_all_baseline=base_q,
               quality_all_speculative=spec_q)
  return row


def _tree_columns(shape, spec, c: float, verify_cost: float) -> dict:
  """A token-tree row's own columns (beyond the paper: `drafts/trees.py`).

  The chain's predictions (Theorem 3.8 from alpha) do not apply to a tree;
  its expected tokens per call come from the measured acceptance of each
  child rank at each depth (`theory.tree_expected_tokens`), and its
  predicted speedups price an iteration at depth x c (one draft call per
  level; a level of w nodes is one call of w tokens, counted as one step)
  plus one target call on every node (`verify_cost` at nodes + 1 tokens,
  or 1 in `predicted_speedup`). The chain's at-lengths predictions are
  left blank.
  """
  histogram = np.sum([s.rank_histogram for s in spec], axis=0)
  children = [int(shape.num_children[level].max())
              for level in shape.levels[:-1]]
  uniform = shape.describe() == "x".join(map(str, children))
  rates = theory.rank_acceptance(histogram, children if uniform else None)
  expected = theory.tree_expected_tokens(shape.parents, rates)
  draft_cost = shape.depth * c
  return {
      "tree": shape.describe(), "verified": shape.verified,
      "tree_parents": list(shape.parents),
      "rank_histogram": histogram.tolist(),
      "rank_acceptance": [[None if np.isnan(a) else float(a) for a in row]
                          for row in rates],
      "expected_tokens_per_call": expected,
      "predicted_speedup": expected / (draft_cost + 1.0),
      "predicted_with_verify_cost": expected / (draft_cost + verify_cost),
      "predicted_at_lengths": None,
      "predicted_at_lengths_with_verify_cost": None,
      "predicted_with_prefill": None,
  }


def _with_prefill(alpha, gamma, c, lengths, costs) -> float | None:
  """Theorem 3.8 at these output lengths with the measured verification
  cost and prefills (`theory.walltime_improvement_at_lengths`)."""
  if costs.get("target_prefill_cost") is None:
    return None
  return float(theory.walltime_improvement_at_lengths(
      alpha, gamma, c, lengths, verify_cost=costs.get("verify_cost", 1.0),
      target_prefill=costs["target_prefill_cost"],
      draft_prefill=costs["draft_prefill_cost"]))


def summarize(config, records: Sequence[ExampleRecord], costs_by_gamma: dict,
              gammas: Sequence[int], metric_fn: Callable | None) -> dict:
  """Pools records into one row per gamma (and the first row at top level)."""
  if not records:
    raise ValueError("no finished examples to summarize")
  rows = [_row(config, records, g, costs_by_gamma[g], metric_fn)
          for g in gammas]
  summary = dict(rows[0])
  summary.update(rows=rows, config=_jsonable(dataclasses.asdict(config)),
                 costs={str(g): costs_by_gamma[g] for g in gammas})
  return summary


def closing_line(summary: dict) -> str:
  """The run's last log line: the measured speedup beside Theorem 3.8's
  prediction at the measured verification cost v (at these output lengths
  where known), and the ideal prediction (a verification costing one step)
  named as such."""
  predicted = summary.get("predicted_at_lengths_with_verify_cost")
  if predicted is None:
    predicted = summary.get("predicted_with_verify_cost")
  verify = summary.get("verify_cost")
  at = f"v={verify:.2f}" if verify is not None else "v unmeasured, 1"
  return (f"alpha={summary['alpha']:.3f} c={summary['c']:.4f} gamma="
          f"{summary['gamma']}: speedup {summary['speedup']:.2f}x, Theorem 3.8 "
          f"predicts {predicted:.2f}x at the measured verification cost ({at}"
          f"), {summary['predicted_speedup']:.2f}x if verifying gamma + 1 "
          "tokens cost one step")


def _jsonable(obj):
  return json.loads(json.dumps(obj, default=str))


def _fmt(value) -> str:
  if isinstance(value, float):
    return f"{value:.3f}"
  return "" if value is None else str(value)


def identical_mark(identical: bool | None) -> str:
  """A greedy row's outputs against the target's: yes, NO, or — (not
  checked: sampled rows)."""
  if identical is None:
    return "—"
  return "yes" if identical else "NO"


def write_table(path_stem: str, rows: list[dict],
                columns: Sequence[str] = TABLE_COLUMNS) -> None:
  """table.md and table.csv with `columns` (missing values left blank)."""
  f = io.StringIO(newline="")
  writer = csv.writer(f)
  writer.writerow(columns)
  for row in rows:
    writer.writerow([row.get(c, "") if row.get(c) is not None else ""
                     for c in columns])
  paths.write_text(path_stem + ".csv", f.getvalue())
  lines = ["| " + " | ".join(columns) + " |\n",
           "|" + "---|" * len(columns) + "\n"]
  for row in rows:
    lines.append("| " + " | ".join(_fmt(row.get(c)) for c in columns) + " |\n")
  paths.write_text(path_stem + ".md", "".join(lines))


def write_outputs(workdir: str, config, summary: dict, records) -> None:
  """summary.json, table.md/.csv, the plots and TensorBoard summaries."""
  # gin only when outputs are written: the run plan imports this module on
  # accelerator boxes without gin (tests/test_layering.py).
  import gin  # pylint: disable=g-import-not-at-top
  summaries.write_run(workdir, summary, gin.config_str(), len(records))
  paths.write_text(paths.join(workdir, "summary.json"), json.dumps(
      _jsonable(summary), indent=2, sort_keys=True))
  write_table(paths.join(workdir, "table"), summary["rows"])
  plot_acceptance(paths.join(workdir, "acceptance.png"), summary["rows"][0])
  if len(summary["rows"]) > 1:
    plot_speedup_vs_gamma(paths.join(workdir, "speedup_vs_gamma.png"),
                          summary["rows"], title=f"{config.task}: "
                          f"{config.draft} drafting for {config.target}")


def pyplot():
  """matplotlib.pyplot on the Agg backend (no display needed)."""
  # matplotlib: its Agg backend must be chosen before pyplot loads.
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  return plt


def save_figure(fig, path: str, dpi: int) -> None:
  """A matplotlib figure as a PNG at `path` (local or gs://)."""
  buffer = io.BytesIO()
  fig.savefig(buffer, format="png", dpi=dpi)
  paths.write_bytes(path, buffer.getvalue())


def plot_speedup_vs_gamma(path: str, rows: list[dict], title: str = "") -> None:
  """Measured speedups over Theorem 3.8's curve from the pooled alpha and c."""
  plt = pyplot()
  gammas = np.array([r["gamma"] for r in rows])
  alpha = float(np.mean([r["alpha"] for r in rows]))
  c = float(np.mean([r["c"] for r in rows]))
  verify = float(np.mean([r.get("verify_cost") or 1.0 for r in rows]))
  grid = np.arange(1, max(gammas.max(), theory.optimal_gamma(alpha, c)) + 3)
  fig, ax = plt.subplots(figsize=(6, 4))
  ax.plot(grid, theory.walltime_improvement(alpha, grid, c), "-",
          label=f"Theorem 3.8 (alpha={alpha:.2f}, c={c:.3f})")
  ax.plot(grid, theory.expected_tokens(alpha, grid) / (grid * c + verify),
          "--", label=f"with measured verify cost ({verify:.2f})")
  if all("predicted_at_lengths_with_verify_cost" in r for r in rows):
    ax.plot(gammas, [r["predicted_at_lengths_with_verify_cost"] for r in rows],
            "x:", label="with each γ's verify cost, at the output lengths")
  if all(r.get("predicted_with_prefill") is not None for r in rows):
    ax.plot(gammas, [r["predicted_with_prefill"] for r in rows], "+:",
            label="... and the measured prefills")
  ax.plot(gammas, [r["speedup"] for r in rows], "o", color="black",
          label="measured")
  ax.axhline(1.0, color="gray", lw=0.5)
  ax.set_xlabel("gamma")
  ax.xaxis.get_major_locator().set_params(integer=True)
  ax.set_ylabel("walltime speedup")
  ax.set_title(title, fontsize=9)
  ax.legend(fontsize=8)
  fig.tight_layout()
  save_figure(fig, path, dpi=120)
  plt.close(fig)


def plot_acceptance(path: str, row: dict) -> None:
  """Accepted draft tokens per iteration: measured vs i.i.d. theory."""
  plt = pyplot()
  hist = np.asarray(row["accepted_histogram"], np.float64)
  gamma, alpha = len(hist) - 1, row["alpha"]
  k = np.arange(gamma + 1)
  expected = alpha**k * (1 - alpha)
  expected[-1] = alpha**gamma
  fig, ax = plt.subplots(figsize=(6, 3.5))
  ax.bar(k, hist / max(hist.sum(), 1), label="measured")
  ax.plot(k, expected, "o-", color="black",
          label=f"alpha^k (1 - alpha), alpha={alpha:.2f}")
  ax.set_xlabel("draft tokens accepted per iteration")
  ax.set_ylabel("fraction of iterations")
  ax.legend(fontsize=8)
  fig.tight_layout()
  save_figure(fig, path, dpi=120)
  plt.close(fig)


# ----------------------------------------------------------------------------
# Figure-1-style traces.


def _piece(vocab, token: int) -> str:
  tokenizer = getattr(vocab, "tokenizer", None)
  if tokenizer is not None and token < tokenizer.get_piece_size():
    return tokenizer.id_to_piece(int(token)).replace("\u2581", " ")
  try:
    return vocab.decode([int(token)]) or f"<{token}>"
  except Exception:  # pylint: disable=broad-except
    return f"<{token}>"


def trace_steps(stats, row: int, gamma: int) -> list[dict]:
  """Per iteration: accepted draft tokens, the rejected one, the target's."""
  steps = []
  for it in range(int(stats.target_calls[row])):
    n = int(stats.trace_accepted[row, it])
    draft = stats.trace_draft[row, it].tolist()
    # With an adaptive draft length a row may propose fewer than gamma.
    proposed = (int(stats.trace_proposed[row, it])
                if stats.trace_proposed is not None else gamma)
    steps.append({"accepted": draft[:n],
                  "rejected": draft[n:n + 1] if n < proposed else [],
                  "target": int(stats.trace_next[row, it])})
  return steps


def write_traces(workdir, decoder: api.SpeculativeDecoder, batches, vocab,
                 seed: int, write: bool = True) -> None:
  """trace.html and trace.png of `decoder` on the first few examples.

  On a multi-host run every process decodes (the decodes' collectives need
  all of them) and only the one told to `write` writes.
  """
  traces = []
  for batch in batches:
    res = decoder(batch.input_ids, seed=seed, record_trace=True)
    traces.append((batch.inputs_text[0],
                   trace_steps(res.stats, 0, decoder.gamma)))
  if not write:
    return
  _write_trace_html(paths.join(workdir, "trace.html"), traces, vocab,
                    decoder.gamma)
  _write_trace_png(paths.join(workdir, "trace.png"), traces, vocab)


def _write_trace_html(path, traces, vocab, gamma) -> None:
  style = ("body{font-family:sans-serif} .a{background:#c8f0c8} "
           ".r{background:#f7c6c6;text-decoration:line-through} "
           ".t{background:#c6d8f7} "
           "div.step{margin:2px 0;font-family:monospace}")
  parts = [f"<html><head><meta charset='utf-8'><style>{style}</style></head>"
           f"<body><h2>Speculative decoding traces (gamma={gamma})</h2>"
           "<p><span class=a>accepted draft tokens</span> "
           "<span class=r>rejected draft token</span> "
           "<span class=t>target's token (correction or bonus)</span></p>"]
  for text, steps in traces:
    parts.append(f"<h3>{html.escape(text)}</h3>")
    for step in steps:
      spans = [f"<span class=a>{html.escape(_piece(vocab, t))}</span>"
               for t in step["accepted"]]
      spans += [f"<span class=r>{html.escape(_piece(vocab, t))}</span>"
                for t in step["rejected"]]
      spans.append(
          f"<span class=t>{html.escape(_piece(vocab, step['target']))}</span>")
      parts.append("<div class=step>" + "".join(spans) + "</div>")
  parts.append("</body></html>")
  paths.write_text(path, "\n".join(parts))


def _write_trace_png(path, traces, vocab) -> None:
  plt = pyplot()
  lines = [(text, steps) for text, steps in traces]
  height = sum(len(s) + 2 for _, s in lines) * 0.22 + 0.5
  fig = plt.figure(figsize=(10, height))
  ax = fig.add_axes([0, 0, 1, 1])
  ax.axis("off")
  renderer = fig.canvas.get_renderer()
  y = 1.0
  step_h = 0.22 / height
  colors = {"accepted": "#c8f0c8", "rejected": "#f7c6c6", "target": "#c6d8f7"}
  for text, steps in lines:
    ax.text(0.01, y - step_h, text[:120], fontsize=8, weight="bold",
            va="top", transform=ax.transAxes)
    y -= 1.5 * step_h
    for step in steps:
      x = 0.02
      items = [(t, "accepted") for t in step["accepted"]]
      items += [(t, "rejected") for t in step["rejected"]]
      items.append((step["target"], "target"))
      for tok, kind in items:
        label = _piece(vocab, tok).strip() or "_"
        t = ax.text(x, y, label, fontsize=8, family="monospace", va="top",
                    transform=ax.transAxes,
                    bbox=dict(facecolor=colors[kind], edgecolor="none",
                              pad=1))
        box = t.get_window_extent(renderer=renderer)
        x += box.width / fig.bbox.width + 0.004
      y -= step_h
    y -= 0.5 * step_h
  save_figure(fig, path, dpi=110)
  plt.close(fig)
