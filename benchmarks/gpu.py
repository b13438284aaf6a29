r"""Accelerator benchmark: T5 v1.1 step times against the bandwidth floor.

Needs only jax, flax, optax's absl and numpy (no gin, seqio, TensorFlow or
network), and runs from the source tree on a machine where the package is
not installed:

  PYTHONPATH=. python benchmarks/gpu.py                      # small..xxl
  PYTHONPATH=. python benchmarks/gpu.py --sizes=t5_1_1_tiny  # CPU smoke test

For each T5 v1.1 size (random bfloat16 weights, batch 1) it measures: the
time of one cached decoder step and its ratio to the bandwidth floor
(decoder + embedding bytes / measured device copy bandwidth: a step must read
every decoder parameter once); the cost of verifying gamma + 1 tokens in one
call relative to one token; c of each smaller size against the largest; and
the walltime speedup Theorem 3.8 then predicts with the paper's alpha values
(Table 2, greedy EnDe). Results print as a table and go to --out as JSON.

Next to each measured time it puts the roofline projection that
scripts/plan_run.py makes for --chip (default: the chip JAX reports, h200
on the lent GPU): the step compiled for this device, its flops and bytes
accessed from `cost_analysis()`, max(flops / peak, bytes / HBM bandwidth)
(specdec_jax/planning/plan.py, specdec_jax/infra/chips.py).
`step_over_roofline` and `c_roofline` against `c` say how far the
projection is from the device.
"""

import json
import os

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import Model, theory
from specdec_jax.infra import chips
from specdec_jax.experiments import step_timers
from specdec_jax.planning import plan
from specdec_jax.experiments import best_of
from specdec_jax.models import registry

flags.DEFINE_list("sizes", ["t5_1_1_small", "t5_1_1_base", "t5_1_1_large",
                            "t5_1_1_xl", "t5_1_1_xxl"], "T5 v1.1 sizes.")
flags.DEFINE_list("gammas", ["3", "5", "7"], "Gammas for v(gamma).")
flags.DEFINE_integer("input_len", 64, "Input tokens.")
flags.DEFINE_integer("cache_positions", 256, "Decoder cache slots.")
flags.DEFINE_enum("chip", None, list(chips.CHIPS),
                  "Roofline chip (default: from the device kind).")
flags.DEFINE_string("hlo_dir", None,
                    "Also write each size's optimized HLO of a one-token "
                    "and a two-token step here (<size>_extend_<n>.hlo.txt).")
flags.DEFINE_string("out", os.path.join(os.environ.get("OUT", "."),
                                        "gpu_benchmark.json"),
                    "JSON output.")
args = flags.FLAGS

PAPER_ALPHA = {"t5_1_1_small": 0.75, "t5_1_1_base": 0.80, "t5_1_1_large": 0.82}


def copy_bandwidth(num_bytes=2 << 30, repeats=10):
  """Device memory bandwidth (bytes/s) of a read+write elementwise copy."""
  x = jnp.ones((num_bytes // 2,), jnp.bfloat16)
  f = jax.jit(lambda a: a * 2)
  f(x).block_until_ready()  # compile
  _, seconds = best_of.best_time(lambda: f(x), repeats)
  return 2 * num_bytes / seconds


def random_model(name, seed):
  cfg = registry.get_config(name, dtype="bfloat16", param_dtype="bfloat16")
  definition = registry.make_def(cfg)
  params = jax.jit(definition.init_params)(jax.random.PRNGKey(seed))
  return Model(definition, params)


def step_bytes(model):
  """Bytes a decoder step reads: every parameter but the encoder's."""
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(
      {k: v for k, v in model.params.items() if k != "encoder"}))


def write_step_hlo(model, ids, cache_positions, name, directory):
  """The compiled HLO of a cached `extend` of 1 and of 2 tokens (the cache
  donated, as in `plan.step_cost`): how the device's compiler lowers a
  matrix-vector step against a two-row one."""
  os.makedirs(directory, exist_ok=True)
  cache = jax.jit(lambda p, i: model.definition.prefill(
      p, i, cache_positions).cache)(model.params, jnp.asarray(ids))
  for n in (1, 2):
    tokens = jax.ShapeDtypeStruct((ids.shape[0], n), jnp.int32)
    text = jax.jit(model.definition.extend, donate_argnums=1).lower(
        model.params, cache, tokens, tokens).compile().as_text()
    with open(os.path.join(directory, f"{name}_extend_{n}.hlo.txt"),
              "w") as f:
      f.write(text)


def roofline(model, ids, cache_positions, gammas, chip):
  """Roofline times (ms) of one step and verify costs from this device's
  compiled step programs, with this device compiler's own bytes accessed
  (a plan counts them from shapes: the two can be compared here)."""
  prefill = jax.jit(lambda p, i: model.definition.prefill(
      p, i, cache_positions).cache)
  cache = prefill(model.params, jnp.asarray(ids))
  one = plan.step_cost(model.definition, model.params, cache, 1)
  t1 = plan.roofline_seconds(one, chip, 1, one["bytes_accessed"])
  out = {"roofline_ms": t1 * 1e3, "flops": one["flops"],
         "bytes_accessed": one["bytes_accessed"]}
  for g in gammas:
    cost = plan.step_cost(model.definition, model.params, cache, g + 1)
    out[f"verify_cost_roofline_g{g}"] = plan.roofline_seconds(
        cost, chip, 1, cost["bytes_accessed"]) / t1
  return out


def main(argv):
  del argv
  sizes = args.sizes
  gammas = [int(g) for g in args.gammas]
  print(f"devices: {jax.devices()}", flush=True)
  bandwidth = copy_bandwidth(64 << 20 if jax.devices()[0].platform == "cpu"
                             else 2 << 30)
  print(f"copy bandwidth: {bandwidth / 1e9:.0f} GB/s", flush=True)
  chip = (chips.get_chip(args.chip) if args.chip else
          chips.chip_of_device_kind(jax.devices()[0].device_kind))
  print(f"roofline chip: {chip.name if chip else 'none (unknown device)'}",
        flush=True)
  ids = np.zeros((1, args.input_len), np.int32)
  ids[0, :-1] = np.arange(2, args.input_len + 1) % 1000 + 2
  ids[0, -1] = 1
  results = {"bandwidth_GBps": bandwidth / 1e9, "sizes": {},
             "chip": chip.name if chip else None}
  step, roof = {}, {}
  for i, name in enumerate(sizes):
    model = random_model(name, i)
    # One step and every verification, timed in interleaved rounds.
    times = step_timers.time_extends(
        [(model, n, args.cache_positions) for n in [1] + [g + 1 for g in
                                                          gammas]],
        ids, repeats=5)
    t1 = times[0]
    floor = step_bytes(model) / bandwidth
    row = {"step_ms": t1 * 1e3, "floor_ms": floor * 1e3,
           "step_over_floor": t1 / floor,
           "params_M": step_timers.count_params(model.params) / 1e6}
    for g, t in zip(gammas, times[1:]):
      row[f"verify_cost_g{g}"] = t / t1
    if chip is not None:
      row.update(roofline(model, ids, args.cache_positions, gammas, chip))
      row["step_over_roofline"] = row["step_ms"] / row["roofline_ms"]
      roof[name] = row["roofline_ms"]
    if args.hlo_dir:
      write_step_hlo(model, ids, args.cache_positions, name, args.hlo_dir)
    step[name] = t1
    results["sizes"][name] = row
    print(name, {k: round(v, 3) for k, v in row.items()}, flush=True)
    _write(results)  # what a run cut short has measured stays
    del model
  largest = sizes[-1]
  for name in sizes[:-1]:
    c = step[name] / step[largest]
    alpha = PAPER_ALPHA.get(name)
    entry = {"c": c}
    if roof:
      entry["c_roofline"] = roof[name] / roof[largest]
    if alpha is not None:
      g = int(theory.optimal_gamma(alpha, c))
      entry.update(alpha_paper=alpha, optimal_gamma=g,
                   predicted_speedup=float(
                       theory.walltime_improvement(alpha, g, c)),
                   predicted_speedup_g7=float(
                       theory.walltime_improvement(alpha, 7, c)))
      if roof:
        entry["projected_speedup_g7"] = float(theory.walltime_improvement(
            alpha, 7, entry["c_roofline"]))
    results["sizes"][name]["vs_largest"] = entry
    print(f"{name} drafting for {largest}: {entry}", flush=True)
  _write(results)
  print(f"wrote {args.out}")


def _write(results):
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  with open(args.out, "w") as f:
    json.dump(results, f, indent=2)


if __name__ == "__main__":
  app.run(main)
