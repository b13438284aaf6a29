"""`make demo`: a scaled-down Table 2 (EnDe) with the shipped tiny models.

The target and its three drafts (`demo:target`, `demo:draft_large`,
`demo:draft_base`, `demo:draft_small`, 1/13, 1/42 and 1/134 of the target's
parameters, as T5-large, -base and -small are about 1/14, 1/50 and 1/180 of
T5-XXL: `DRAFT_SIZE_RATIOS`) were trained on Multi30k EN->DE sentences and
paragraphs by `specdec_jax.training.train` (docs/demo_models.md). The demo
has two tasks, as the paper's Table 2 pairs a short-output task with a
long-output one:

  ende_sentences    the first 40 Multi30k validation pairs, shipped in
                    `specdec_jax/demo_data/sentences.{en,de}`, ~18 output
                    tokens;
  ende_paragraphs   16 paragraphs of 2-5 consecutive validation pairs
                    (`paragraphs.{en,de}`, `specdec_jax.data.paragraphs`),
                    ~63 output tokens.

No demo model trained on validation text (docs/demo_models.md).

Each is decoded at batch size 1 with the target alone and with each draft
at temperature 0 and 1; the rows of one task and temperature run side by
side (`experiment.run_side_by_side`: each example is decoded by the target
alone, then by every draft, so each row's speedup comes from timings taken
seconds apart, and the target alone is timed once per example, not once per
draft). The demo writes:

  <workdir>/table.md, table.csv   one row per (task, draft, temperature)
  <workdir>/speedup.png           measured vs Theorem 3.8 per row
  <workdir>/<row>/...             each row's experiment outputs (examples,
                                  summary, acceptance plot; traces for
                                  the drafts of `trace_drafts`);
                                  paragraph rows are `paragraphs_<row>`
  <workdir>/gamma_sweep/...       one draft on the sentences, greedy, a
                                  range of gammas, with its
                                  speedup-vs-gamma plot
  <workdir>/timing.json           each group's wall time and how much of
                                  it went to compiling
  <workdir>/variant.json          with variant='fastest': each variant's
                                  timed c, v and predicted speedup, and
                                  the one run (see DemoConfig.variants)

Nothing is downloaded: models, vocabulary and inputs ship in the package.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any, Mapping, Sequence

from absl import logging
import gin
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import checkpoints
from specdec_jax.data import batching
from specdec_jax.data import tasks
from specdec_jax.data import text
from specdec_jax.data import readers
from specdec_jax.decoding.tree_shape import TreeShape
from specdec_jax.decoding.protocol import Model
from specdec_jax.experiments import experiment
from specdec_jax.experiments import report
from specdec_jax.experiments import compile_time
from specdec_jax.tables import variants


DEMO_DATA = text.DEMO_DATA
# Target parameters / draft parameters of the shipped models.
DRAFT_SIZE_RATIOS = {"draft_large": 13, "draft_base": 42, "draft_small": 134}
SENTENCES, PARAGRAPHS = "ende_sentences", "ende_paragraphs"
TABLE_COLUMNS = ("task", "draft", "tree", "temperature", "gamma",
                 "verified", "alpha", "c",
                 "speedup", "predicted_speedup", "predicted_with_verify_cost",
                 "predicted_at_lengths", "predicted_at_lengths_with_verify_cost",
                 "predicted_with_prefill",
                 "tokens_per_call", "mean_output_length", "quality_baseline",
                 "quality_speculative", "identical", "examples",
                 "cost_warning")


@dataclasses.dataclass(frozen=True)
class DemoConfig:
  """The demo's rows: each task, each draft at each temperature.

  `drafts` pairs each draft with its gamma: one int for every temperature,
  or a mapping {temperature: gamma} (the paper's Table 2 also picks gamma per
  row). configs/demo.gin uses the gammas `benchmarks/choose_gamma.py` (removed after c4b7ae8) picks
  from alpha, c and the verification cost measured on Multi30k validation
  (docs/log/benchmarks_history.md). The paragraph rows use `paragraph_drafts` (the same
  drafts, with gammas of their own; None: `drafts`), their own decoding
  limit, input buckets and example cap; `paragraphs` None leaves them out.
  """

  target: str = "demo:target"
  drafts: Sequence[tuple[str, Any]] = (("demo:draft_large", 4),
                                       ("demo:draft_base", 4),
                                       ("demo:draft_small", 4))
  temperatures: Sequence[float] = (0.0, 1.0)
  sweep_draft: str | None = "demo:draft_small"
  sweep_gammas: Sequence[int] = (1, 2, 3, 4, 5, 6)
  max_decode_len: int = 64
  # Input widths the sentences are padded to. Finer than the powers of two
  # used elsewhere: the encoder runs once per sentence for both decoders, and
  # on these short captions padding 20 tokens to 32 made that shared fixed
  # cost a third larger.
  buckets: Sequence[int] = (16, 24, 32, 48, 64, 128)
  max_examples: int | None = None
  repeats: int = 3
  cost_repeats: int = 5
  trace_examples: int = 3
  # Rows whose draft is listed here write traces (trace_examples of them);
  # None: every row but the sweep (whose first gamma's trace would repeat a
  # row's). Each traced row compiles one more decoding loop, 4-9 s on 2
  # CPU cores.
  trace_drafts: Sequence[str] | None = None
  # ...and whose temperature is listed here (None: every temperature).
  trace_temperatures: Sequence[float] | None = None
  data_dir: str = DEMO_DATA
  sentences: str = "sentences"  # <data_dir>/<sentences>.{en,de}
  paragraphs: str | None = "paragraphs"  # <data_dir>/<paragraphs>.{en,de}
  paragraph_drafts: Sequence[tuple[str, Any]] | None = None
  # The longest reference paragraph is 103 tokens with EOS.
  paragraph_max_decode_len: int = 128
  # Paragraph inputs are 29-88 tokens: one width, so one compile of each
  # decoder (the largest bucket must hold the inputs' limit, 128). Padding
  # the short ones to 96 costs both decoders the same little encoder time;
  # a second width cost every row a compile of seconds.
  paragraph_buckets: Sequence[int] = (96, 128)
  paragraph_max_examples: int | None = None
  vocab_path: str | None = None  # default: the target's shipped vocabulary
  # Start each row's workdir over when it holds results of other settings
  # (another code version included) instead of refusing; rows with the same
  # settings resume. On by default: `make demo` must run from any state of
  # its disposable workdir. See experiments/workdir.py.
  overwrite: bool = True
  # Adaptive draft length for every row (None: exactly gamma per iteration),
  # e.g. `draft_stop = @stopping.ConfidenceStop()` in a .gin file.
  draft_stop: Any = None
  # Extra rows with cascaded drafts: (draft, ((drafter, gamma), ...), gammas)
  # as in ExperimentConfig.cascade, gammas as in `drafts`; e.g.
  # (('demo:draft_base', (('demo:draft_small', 3),), 7),).
  cascades: Sequence[tuple[str, Sequence[tuple[str, int]], Any]] = ()
  # Extra sentence rows with token trees (beyond the paper, sd.tree):
  # (draft, shape), the shape a branching per depth, e.g. (2, 2, 1, 1), or
  # {'parents': (...)} (a TreeShape's parents, breadth first). Each comes
  # with a chain row of the same draft that verifies as many tokens per
  # call (gamma = the tree's nodes), both at every temperature.
  trees: Sequence[tuple[str, Any]] = ()
  # XLA options of every decoding loop and cost timing (None: XLA's
  # defaults), e.g. {'xla_cpu_experimental_ynn_fusion_type': ''}
  # (`api.CPU_EIGEN_MATMULS`) where Eigen verifies faster than YNNPACK;
  # choose the gammas for them (benchmarks/choose_gamma.py, removed after c4b7ae8;
  # --matmuls=eigen).
  compiler_options: dict | None = None
  # Alternative settings, {name: {DemoConfig field: value}}, e.g. Eigen's
  # matmuls with the gammas chosen for them (configs/demo.gin). `variant`
  # runs the settings above (None), one variant by name, or "fastest": the
  # one (the settings above included, as "default") under which this
  # machine is predicted to run `variant_probe` fastest. The probe is a
  # sentence row (draft, validation alpha at temperature 0): Theorem 3.8
  # at that alpha, the row's gamma and the c and v timed here, before any
  # decoding (`choose_variant`). Which matmul library verifies faster
  # depends on the CPU, and the gammas with it.
  variants: Mapping[str, Mapping[str, Any]] = dataclasses.field(
      default_factory=dict)
  variant: str | None = None
  variant_probe: tuple[str, float] = ("demo:draft_base", 0.76)


# Configurable before configs/demo.gin imports this module (see experiment).
gin.external_configurable(DemoConfig, module=__name__)


def _task_vocabulary(config: DemoConfig) -> dict[str, Any]:
  """The `tasks.TaskConfig` vocabulary fields of the demo's rows.

  `DemoConfig.vocab_path` with the configured sentinel count, else the
  target's shipped vocabulary with the sentinel count it was saved with
  (the demo models': T5's 100).
  """
  if config.vocab_path:
    return {"vocab_path": config.vocab_path}
  target = checkpoints.load_model(config.target)
  path = getattr(target.vocab, "sentencepiece_model_file", None)
  if not path:
    raise ValueError(f"{config.target} ships no vocabulary; set "
                     f"DemoConfig.vocab_path")
  return {"vocab_path": path,
          "vocab_extra_ids": int(target.vocab.extra_ids or 0)}


def _row_config(config: DemoConfig, task: str, draft: str, gamma,
                temperature: float, name: str, cascade=(),
                tree=None) -> experiment.ExperimentConfig:
  long = task == PARAGRAPHS
  traced = (name != "gamma_sweep"
            and (config.trace_drafts is None or draft in config.trace_drafts)
            and (config.trace_temperatures is None
                 or float(temperature) in map(float,
                                              config.trace_temperatures)))
  return experiment.ExperimentConfig(
      draft_stop=config.draft_stop,
      cascade=tuple((str(s), int(g)) for s, g, *_ in cascade),
      tree=None if tree is None or isinstance(tree, Mapping) else tuple(tree),
      tree_parents=(tuple(tree["parents"]) if isinstance(tree, Mapping)
                    else None),
      task="wmt14_ende_local", split="test", target=config.target,
      draft=draft, temperature=temperature, gamma=gamma,
      max_decode_len=(config.paragraph_max_decode_len if long
                      else config.max_decode_len),
      buckets=tuple(config.paragraph_buckets if long else config.buckets),
      max_examples=(config.paragraph_max_examples if long
                    else config.max_examples),
      repeats=config.repeats, cost_repeats=config.cost_repeats,
      trace_examples=config.trace_examples if traced else 0, seed=0,
      name=name, compiler_options=config.compiler_options,
      overwrite=config.overwrite)


def _rows(config: DemoConfig) -> list[tuple[str, str, Any]]:
  """(task, name, ExperimentConfig) of every row, sweep last."""
  tasks_and_drafts = [(SENTENCES, "", config.drafts)]
  if config.paragraphs:
    tasks_and_drafts.append((PARAGRAPHS, "paragraphs_",
                             config.paragraph_drafts or config.drafts))
  rows = []
  for task, prefix, drafts in tasks_and_drafts:
    for draft, gammas in drafts:
      for temperature in config.temperatures:
        gamma = variants.gamma_for(gammas, temperature, draft)
        name = f"{prefix}{draft.split(':')[-1]}_t{int(temperature)}"
        rows.append((task, name, _row_config(config, task, draft, gamma,
                                             temperature, name)))
  for draft, chain, gammas in config.cascades:  # sentence rows
    for temperature in config.temperatures:
      gamma = variants.gamma_for(gammas, temperature, draft)
      short = "<-".join(s.split(":")[-1] for s in [draft] + [
          entry[0] for entry in chain])
      name = f"{short.replace('<-', '_from_')}_t{int(temperature)}"
      rows.append((SENTENCES, name, _row_config(
          config, SENTENCES, draft, gamma, temperature, name, chain)))
  for draft, tree in config.trees:  # sentence rows
    shape = (TreeShape(tuple(tree["parents"]))
             if isinstance(tree, Mapping) else
             TreeShape.from_branching(tuple(tree)))
    label = shape.describe()
    if " " in label:
      label = f"{shape.num_nodes}n{shape.depth}d"
    for temperature in config.temperatures:
      t = int(temperature)
      short = draft.split(":")[-1]
      rows.append((SENTENCES, f"{short}_tree{label}_t{t}", _row_config(
          config, SENTENCES, draft, shape.depth, temperature,
          f"{short}_tree{label}_t{t}", tree=tree)))
      rows.append((SENTENCES, f"{short}_chain{shape.num_nodes}_t{t}",
                   _row_config(config, SENTENCES, draft, shape.num_nodes,
                               temperature,
                               f"{short}_chain{shape.num_nodes}_t{t}")))
  if config.sweep_draft:
    rows.append((SENTENCES, "gamma_sweep", _row_config(
        config, SENTENCES, config.sweep_draft, tuple(config.sweep_gammas),
        0.0, "gamma_sweep")))
  return rows


def _validate_rows(config: DemoConfig) -> None:
  for _, _, row in _rows(config):
    experiment.validate(row)


def _probe_input_ids(config: DemoConfig) -> np.ndarray:
  """The first sentence, as the variant probe times it."""
  with tasks.override_config(**_task_vocabulary(config),
                             local_data_dir=config.data_dir,
                             wmt_ende_files={"test": config.sentences}):
    example = readers.load_examples("wmt14_ende_local", "test",
                                     max_examples=1)
  return next(batching.batches(example, batch_size=1, buckets=config.buckets,
                               max_length=128)).input_ids


def resolve_variant(config: DemoConfig, workdir: str) -> DemoConfig:
  """The config to run (`variants.resolve_variant` with the demo's rows)."""
  return variants.resolve_variant(
      config, workdir, validate=_validate_rows,
      probe_input_ids=lambda: _probe_input_ids(config))


def run(config: DemoConfig, workdir: str) -> list[dict]:
  """Runs (or resumes) every demo row; returns the table rows."""
  config = resolve_variant(config, workdir)
  rows_to_run = _rows(config)
  for _, _, row in rows_to_run:
    experiment.validate(row)  # every row's config, before the first decode
  files = {SENTENCES: config.sentences, PARAGRAPHS: config.paragraphs}
  for task, stem in files.items():
    if stem and task in {t for t, _, _ in rows_to_run}:
      for side in ("en", "de"):
        path = os.path.join(config.data_dir, f"{stem}.{side}")
        if not os.path.exists(path):
          raise FileNotFoundError(
              f"{path} not found: the {task} rows read "
              f"<data_dir>/{stem}.{{en,de}} (DemoConfig.data_dir, "
              f"DemoConfig.{'sentences' if task == SENTENCES else 'paragraphs'}"
              "; scripts/build_paragraphs.py writes the paragraphs).")
  vocabulary = _task_vocabulary(config)
  # Rows of one task and temperature run side by side: each example is
  # decoded by the target alone once, then by every draft of the group.
  groups: dict[tuple[str, float], list[int]] = {}
  for i, (task, _, row) in enumerate(rows_to_run):
    groups.setdefault((task, row.temperature), []).append(i)
  summaries, clocks = {}, []
  started = time.perf_counter()
  for number, ((task, temperature), members) in enumerate(groups.items()):
    names = [rows_to_run[i][1] for i in members]
    logging.info("demo group %d/%d: %s at temperature %g, side by side: %s",
                 number + 1, len(groups), task, temperature, ", ".join(names))
    group_start = time.perf_counter()
    with compile_time.compile_clock() as clock, tasks.override_config(
        **vocabulary, local_data_dir=config.data_dir,
        wmt_ende_files={"test": files[task]}):
      results = experiment.run_side_by_side(
          [rows_to_run[i][2] for i in members],
          [os.path.join(workdir, name) for name in names])
    clocks.append({"task": task, "temperature": temperature, "rows": names,
                   "seconds": time.perf_counter() - group_start,
                   "compile_seconds": clock.seconds,
                   "programs": clock.programs})
    logging.info("demo group %d/%d took %.0f s, %.0f s of it compiling %d "
                 "programs", number + 1, len(groups), clocks[-1]["seconds"],
                 clock.seconds, clock.programs)
    summaries.update(zip(members, results))
  _write_timing(os.path.join(workdir, "timing.json"), clocks,
                time.perf_counter() - started)
  table = []
  for i, (task, name, row) in enumerate(rows_to_run):
    if name != "gamma_sweep":
      short = "<-".join(s.split(":")[-1] for s in [row.draft] + [
          entry[0] for entry in row.cascade])
      table.append(dict(summaries[i]["rows"][0], task=task, draft=short))
  report.write_table(os.path.join(workdir, "table"), table, TABLE_COLUMNS)
  plot_rows(os.path.join(workdir, "speedup.png"), table)
  return table


def summary(rows: Sequence[Mapping[str, Any]],
            variant: str | None = None) -> str:
  """The table rows as a few readable lines for the terminal.

  One line per row (task, draft, temperature, gamma, alpha, the measured
  speedup, Theorem 3.8 at the measured output lengths and verification
  cost, their ratio, BLEU of both decodes, whether greedy outputs are
  identical), then the rows whose costs contradicted themselves twice
  (`cost_checks`: their predictions are marked "!"), the best greedy
  speedup of each task and, if given, the variant that ran. Every column
  is in table.md and table.csv.
  """
  header = ("task", "draft", "T", "γ", "verified", "tok/call", "α",
            "speedup", "predicted", "ratio", "BLEU target / spec",
            "identical")
  lines, flagged = [header], []
  for r in rows:
    mark = "!" if r.get("cost_warning") else ""
    predicted = r.get("predicted_at_lengths_with_verify_cost")
    if r.get("tree"):  # a tree's own prediction (report._tree_columns)
      predicted = r.get("predicted_with_verify_cost")
    draft = str(r["draft"]) + (f" tree {r['tree']}" if r.get("tree") else "")
    if mark:
      flagged.append(f"! {str(r.get('task', SENTENCES)).replace('ende_', '')}"
                     f" {draft} T={r['temperature']:g}: {r['cost_warning']}.")
    lines.append((
        str(r.get("task", SENTENCES)).replace("ende_", ""), draft,
        f"{r['temperature']:g}", str(r["gamma"]),
        str(r.get("verified", r["gamma"] + 1)),
        "—" if r.get("tokens_per_call") is None
        else f"{r['tokens_per_call']:.2f}", f"{r['alpha']:.2f}",
        f"{r['speedup']:.2f}x",
        "—" if predicted is None else f"{predicted:.2f}x{mark}",
        "—" if not predicted else f"{r['speedup'] / predicted:.2f}{mark}",
        " / ".join("—" if r.get(k) is None else f"{r[k]:.1f}"
                   for k in ("quality_baseline", "quality_speculative")),
        report.identical_mark(r.get("identical"))))
  widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
  out = ["  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip()
         for line in lines]
  out.append("predicted: Theorem 3.8 at the measured alpha, c, output "
             "lengths and verification cost (a tree: its expected tokens "
             "per call from the measured acceptance of each child rank).")
  if flagged:
    out.append("!: the costs under this prediction contradicted "
               "themselves, and again when timed a second time (a busy "
               "machine?); rerun these rows:")
    out.extend(flagged)
  best = {}
  for r in rows:
    if r["temperature"] == 0 and r["speedup"] > best.get(
        r.get("task", SENTENCES), {}).get("speedup", 0):
      best[r.get("task", SENTENCES)] = r
  if best:
    out.append("Best greedy: " + "; ".join(
        f"{task.replace('ende_', '')} {r['speedup']:.2f}x ({r['draft']}, "
        f"γ {r['gamma']}, α {r['alpha']:.2f})" for task, r in best.items())
               + ".")
  if variant:
    out.append(f"Variant run: {variant}.")
  return "\n".join(out)


def _write_timing(path: str, groups: list[dict], seconds: float) -> None:
  """Where the demo's time went: each group's wall and compile seconds (a
  resumed row costs neither, so a rerun's file describes the rerun)."""
  with open(path, "w") as f:
    json.dump({"seconds": seconds,
               "compile_seconds": sum(g["compile_seconds"] for g in groups),
               "groups": groups}, f, indent=1)


def plot_rows(path: str, rows: list[dict]) -> None:
  """Measured speedup per row beside Theorem 3.8's predictions."""
  # matplotlib: its Agg backend must be chosen before pyplot loads.
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  labels = [f"{r.get('task', SENTENCES).replace('ende_', '')}\n"
            f"{r['draft']}" + (f" tree {r['tree']}" if r.get("tree") else "")
            + f"\nT={r['temperature']:g}, γ={r['gamma']}"
            for r in rows]
  x = np.arange(len(rows))
  bars = [("speedup", "measured"),
          ("predicted_speedup", "Theorem 3.8 (measured α, c)"),
          ("predicted_at_lengths", "… at these output lengths"),
          ("predicted_at_lengths_with_verify_cost",
           "… and the measured verification cost"),
          ("predicted_with_prefill", "… and the measured prefills")]
  width = 0.8 / len(bars)
  fig, ax = plt.subplots(figsize=(max(7, 1.6 * len(rows)), 4.5))
  for i, (key, label) in enumerate(bars):
    ax.bar(x - 0.4 + (i + 0.5) * width,
           [float("nan") if r.get(key) is None else r[key] for r in rows],
           width, label=label)
  for xi, r in zip(x, rows):
    ax.text(xi - 0.4 + 0.5 * width, r["speedup"], f"{r['speedup']:.2f}x",
            ha="center", va="bottom", fontsize=7)
    ax.text(xi, 0.05, f"α={r['alpha']:.2f}", ha="center", fontsize=7)
  ax.axhline(1.0, color="gray", lw=0.5)
  ax.set_xticks(x, labels, fontsize=7)
  ax.set_ylabel("walltime speedup over the target alone")
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def export_model(source: str, name: str, *, out_dir: str | None = None,
                 extra_ids: int | None = None) -> str:
  """Ships a trained model as `demo:<name>`.

  Parameters are stored in bfloat16 (half the bytes in git) and load back as
  float32, the config's `param_dtype`, which is what CPUs compute fastest;
  the vocabulary is copied in with the extra ids it was trained with (the
  demo models': T5's 100, as the tasks use it).

  Args:
    source: a `load_model` spec of the trained model (e.g. the training
      workdir's `model/`).
    name: the demo name (target, draft_large, draft_base, draft_small).
    out_dir: default `specdec_jax/demo_models/`.
    extra_ids: sentinel ids of the vocabulary. None: those the source's
      vocabulary records (training saves `TaskConfig.vocab_extra_ids`).

  Returns:
    The written directory.
  """
  model = checkpoints.load_model(source)
  params = jax.tree.map(lambda x: np.asarray(x).astype(jnp.bfloat16),
                        model.params)
  config = dataclasses.replace(model.config, param_dtype="float32",
                               dtype="float32")
  out = os.path.join(out_dir or checkpoints.DEMO_DIR, name)
  return checkpoints.save(Model(model.definition, params, model.vocab), out,
                          config=config, vocab_extra_ids=extra_ids,
                          overwrite=True)
