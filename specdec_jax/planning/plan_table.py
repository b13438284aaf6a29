"""Table 2 projected on accelerators from compiled plans (`plan.py`).

`project_table` plans every Table 2 row on each setup of `SETUPS` (a run
config and a chip), compiling each distinct program set once (the chip only
changes the roofline), and renders Markdown: the rows with alpha (paper), c,
v(gamma), the projected and the paper's speedup, per-device memory (the
compiler's peak beside the count from shapes), the verdict with its fix, and
compile time. TPU setups compile with the TPU compiler where libtpu is
installed; each section names the compiler its figures come from.
"""

from __future__ import annotations

import gc
import re
import time
from typing import Callable, Sequence

import jax
import numpy as np

from specdec_jax import theory
from specdec_jax.experiments import fit
from specdec_jax.experiments import report
from specdec_jax.infra import chips
from specdec_jax.planning import plan
from specdec_jax.experiments.experiment import ConfigError

# (title, run config, chip)
SETUPS = (
    ("One TPU v4 chip (the paper's setting)", "runs/tpu_v4.gin", "tpu_v4"),
    ("TPU v4-8 host, model parallel over 4 chips",
     "runs/tpu_v4_8_model_parallel.gin", "tpu_v4"),
    ("TPU v4-16 slice (2 hosts), model parallel over 8 chips",
     "runs/tpu_v4_16_model_parallel.gin", "tpu_v4"),
    ("One TPU v5e chip", "runs/tpu_v5e.gin", "tpu_v5e"),
    ("TPU v5e-4 host, model parallel over 4 chips",
     "runs/tpu_v5e_4_model_parallel.gin", "tpu_v5e"),
    ("One TPU v6e chip", "runs/tpu_v6e.gin", "tpu_v6e"),
    ("TPU v6e-4 host, model parallel over 4 chips",
     "runs/tpu_v6e_4_model_parallel.gin", "tpu_v6e"),
    ("One NVIDIA H100 SXM", "runs/gpu.gin", "h100"),
    ("One NVIDIA H200", "runs/gpu.gin", "h200"),
)
# A row file: task, the models, temperature. Table 2's (ende_small_t0.gin),
# the T5Gemma tables' (ende_2b_2b_t1.gin) and the decoder-only families'
# (instruct_32b_0_6b_t0.gin, cnndm_1b_t1.gin).
_ROW = re.compile(r"^(ende|cnndm|instruct)_[a-z0-9_]+_t[01]\.gin$")
_TASK_AND_TEMPERATURE = re.compile(r"^(ende|cnndm|instruct)_|_t[01]$")


def is_row(filename: str) -> bool:
  """Row configs (ende_small_t0.gin), not the shared includes (ende.gin,
  checkpoints.gin)."""
  return bool(_ROW.match(filename))


def _x(value, digits=2) -> str:
  return "—" if value is None else f"{value:.{digits}f}x"


def _alpha(value) -> str:
  return "never" if value is None else f"{value:.2f}"


def _gb(n) -> str:
  return f"{n / 1e9:.1f}"


def _refusal(config, chip, error) -> str:
  """The verdict of a row the shape check or the compiler refuses: its
  need and its fix."""
  if isinstance(error, plan.DoesNotFit):
    return f"no: {error}"  # the compiler's need, its fix added (below)
  try:
    shape = fit.run_shape(config)
    need = fit.estimate(shape)["total_bytes"]
  except ConfigError:
    return f"no: {error}"
  return (f"no: needs {_gb(need)} GB of {_gb(chip.hbm_bytes)}; "
          f"{fit.fix_for(shape, chip, chip.hbm_bytes)}")


def project_table(files: Sequence[str], make_config: Callable,
                  input_len: int | None = None, command: str = "",
                  setups=SETUPS, log=print) -> str:
  """Markdown tables of every row file on every setup."""
  compiled: dict = {}
  sections, ratios = [], {}
  for title, run_file, chip_name in setups:
    chip = chips.get_chip(chip_name)
    lines = [
        f"### {title}", "",
        f"`{run_file}`, roofline for {chip.name}: "
        f"{chip.bf16_flops / 1e12:.0f} TFLOP/s bf16, "
        f"{chip.hbm_bytes_per_s / 1e9:.0f} GB/s HBM, "
        f"{chip.hbm_bytes / 1e9:.1f} GB, interconnect "
        f"{chip.interconnect_bytes_per_s / 1e9:.0f} GB/s.", "",
        "| row | γ | α (paper) | c | v(γ) | projected | paper | "
        "break-even α | at α " + " / ".join(
            f"{a:.1f}" for a in plan.SWEEP_ALPHAS) + " | "
        "params/device GB (target + draft) | peak/device GB | from shapes GB "
        "| fits | collectives/iteration | compile s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    used, first = set(), {}
    for f in files:
      name = f.rsplit("/", 1)[-1].removesuffix(".gin")
      config = make_config(f, run_file)
      try:
        fit.check_fits(config, chip)
        shape = fit.run_shape(config, input_len)
        if shape in first:
          # A plan's programs are a function of the run's shapes
          # (`fit.run_shape`): a task's data and prompts are inputs, and
          # its stop ids (constants of a run's loop, one comparison a token
          # each) are planned at EOS. Rows that differ only there share one
          # plan.
          log(f"{name} on {title}: the programs of {first[shape]} "
              "(the same shapes), compiled once")
        first.setdefault(shape, name)
        if shape not in compiled:
          started = time.perf_counter()
          # What the previous row compiled stays in JAX's caches (at XXL
          # size about a GB per row with the TPU compiler): let it go.
          jax.clear_caches()
          gc.collect()
          log(f"{name} on {title}: compiling its programs "
              f"({len(compiled) + 1} distinct so far)")
          try:
            compiled[shape] = plan.compile_programs(shape)
            done = "compiled"
          except plan.DoesNotFit as e:
            compiled[shape] = e  # the rows of the same shapes: refused too
            done = "refused by the compiler"
          log(f"{name} on {shape.mesh_shape}: {done} in "
              f"{time.perf_counter() - started:.0f} s")
        if isinstance(compiled[shape], plan.DoesNotFit):
          raise plan.with_fix(compiled[shape], shape, chip)
        r = plan.project(config, shape, compiled[shape], chip)
      except ConfigError as e:
        lines.append(f"| {name} | | | | | | | | | | | | "
                     f"{_refusal(config, chip, e)} | | |")
        log(lines[-1])
        continue
      used.add(r["compiler"])
      params = r["param_bytes_per_device"]
      if r["paper_speedup"] and r["predicted_speedup"]:
        ratios.setdefault(title, []).append(
            r["predicted_speedup"] / r["paper_speedup"])
      alpha = r["alpha_paper"]
      lines.append(
          f"| {name} | {r['gamma']} | "
          f"{'—' if alpha is None else f'{alpha:.2f}'} | {r['c']:.4f} "
          f"| {r['verify_cost']:.2f} | {_x(r['predicted_speedup'])} | "
          f"{_x(r['paper_speedup'], 1)} | "
          f"{_alpha(r['break_even_alpha'])} | "
          + " / ".join(f"{v:.2f}" for v in r["alpha_sweep"].values()) +
          f" | {_gb(params['target'])} + "
          f"{params['draft'] / 1e9:.2f} | {_gb(r['peak_bytes_per_device'])} "
          f"| {_gb(r['peak_bytes_shape_estimate'])} | "
          f"{'yes' if r['fits'] else 'NO: ' + r['fix']} | "
          f"{r['collectives_per_iteration']['speculative']} | "
          f"{r['compile_seconds']:.0f} |")
      log(lines[-1])
    if used:
      lines[2:2] = [f"Figures from {' and '.join(sorted(used))}.", ""]
    sections.append("\n".join(lines))
  tail = []
  if ratios:  # Rows the paper measured (Table 2).
    summary = ["| setup | projected / paper: mean | min | max |",
               "|---|---|---|---|"]
    for title, rs in ratios.items():
      summary.append(f"| {title} | {np.mean(rs):.2f} | {min(rs):.2f} | "
                     f"{max(rs):.2f} |")
    tail = ["### Projected over the paper's measured speedup",
            "\n".join(summary)]
  return "\n\n".join(
      [f"Generated by `{command}`." if command else "", *sections, *tail])


# ------------------------------ alpha sweeps ---------------------------------


def read_rows(markdown: str) -> list[dict]:
  """The planned rows of a `project_table` text: setup, row, gamma, c, v.

  Rows a setup refused (no c) are left out.
  """
  rows, setup, header = [], None, None
  for line in markdown.splitlines():
    if line.startswith("### "):
      setup, header = line[4:].strip(), None
    elif line.startswith("| row |"):
      header = [h.strip() for h in line.strip("|").split("|")]
    elif header and line.startswith("| ") and not line.startswith("|---"):
      cells = dict(zip(header, (c.strip() for c in line.strip("|").split("|"))))
      if cells.get("c"):
        rows.append({"setup": setup, "row": cells["row"],
                     "gamma": int(cells["γ"]), "c": float(cells["c"]),
                     "verify_cost": float(cells["v(γ)"])})
  return rows


def plot_alpha_sweep(path: str, rows: Sequence[dict],
                     paper_alphas: tuple[float, float] = (0.62, 0.82)) -> None:
  """Theorem 3.8's speedup against alpha, one panel per setup, one curve
  per draft (rows of one draft and gamma differ only in task and
  temperature, which change neither c nor v), over the band of alphas the
  paper's T5-XXL pairs had (Table 3: 0.62 at T 1 with T5-small to 0.82 at
  T 0 with T5-large)."""
  plt = report.pyplot()
  setups = list(dict.fromkeys(r["setup"] for r in rows))
  fig, axes = plt.subplots(1, len(setups), figsize=(4.2 * len(setups), 3.6),
                           sharey=True, squeeze=False)
  alphas = np.linspace(0.0, 0.95, 96)
  for ax, setup in zip(axes[0], setups):
    curves = {}
    for r in rows:
      if r["setup"] == setup:
        draft = _TASK_AND_TEMPERATURE.sub("", r["row"])
        curves.setdefault((draft, r["gamma"]), r)
    for (draft, gamma), r in curves.items():
      ax.plot(alphas, theory.walltime_improvement_measured(
          alphas, gamma, r["c"], r["verify_cost"]),
              label=f"{draft} (γ {gamma}, c {r['c']:.3f})")
    ax.axvspan(*paper_alphas, color="gray", alpha=0.15,
               label="α of the paper's T5 pairs")
    ax.axhline(1.0, color="black", lw=0.5)
    ax.set_title(setup, fontsize=8)
    ax.set_xlabel("α")
  axes[0][0].set_ylabel("projected walltime speedup")
  axes[0][0].legend(fontsize=7)
  fig.tight_layout()
  report.save_figure(fig, path, dpi=110)
  plt.close(fig)
