"""Planning a run from abstract shapes (specdec_jax/planning/plan.py).

Invariants: a plan compiles the run's programs without weights and reports
positive per-device memory; sharding over `model` puts about a 1/model share
of the weights on each device and puts all-reduces inside the decoding loop,
and one device has none; the shape-only fit check passes what fits and
refuses what does not with the numbers and the fix (at T5-XXL size too,
without compiling); the HLO reader finds XLA:CPU's float32 weight copies
and nothing in a float32 program (negative control). (A replicated draft's
steps holding no collective, with its negative control, is checked on the
TPU compiler's programs: tests/test_tpu_compile.py.)
"""

import dataclasses
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax import sharding
from specdec_jax.decoding import api
from specdec_jax.experiments import fit
from specdec_jax.infra import chips
from specdec_jax.experiments import experiment
from specdec_jax.experiments import experiment_config
from specdec_jax.experiments import loading
from specdec_jax.experiments import workdir
from specdec_jax.planning import hlo
from specdec_jax.planning import plan
from specdec_jax.planning import plan_table
from specdec_jax.models import registry
from tests import helpers

V4 = chips.get_chip("tpu_v4")


def _config(mesh_shape, **overrides):
  base = dict(task="wmt14_ende_local", target="t5_1_1_tiny",
              draft="t5_1_1_tiny", target_config="t5_1_1_tiny",
              draft_config="t5_1_1_tiny", dtype="bfloat16", gamma=3,
              max_decode_len=8, mesh_shape=mesh_shape)
  base.update(overrides)
  return experiment.ExperimentConfig(**base)


@pytest.fixture(scope="module")
def plans():
  if len(jax.devices()) < 8:
    pytest.skip("needs XLA_FLAGS=--xla_force_host_platform_device_count=8")
  return {mesh: plan.plan(_config(mesh), V4, input_len=8)
          for mesh in ((1, 1), (1, 4))}


def test_memory_figures_are_positive_and_model_axis_splits_weights(plans):
  one, four = plans[(1, 1)], plans[(1, 4)]
  for p in (one, four):
    assert p["peak_bytes_per_device"] > 0 and p["fits"]
    for program in ("generate", "speculative"):
      memory = p["memory"][program]
      assert memory["argument_bytes"] > 0 and memory["temp_bytes"] > 0
    assert p["target_step_seconds"] > 0 and p["c"] > 0
    assert p["verify_cost"] >= 1.0
    # The compiler's figure and the memory model's, side by side; on CPU
    # the verdict takes the larger.
    assert p["compiled_peak_bytes_per_device"] > 0
    assert p["peak_bytes_per_device"] == max(
        p["compiled_peak_bytes_per_device"], p["peak_bytes_shape_estimate"])
  assert one["devices"] == 1 and four["devices"] == 4
  # No TPU topology: simulated CPU devices, and the plan says so.
  assert one["compiler"] == "XLA:CPU (simulated devices)"
  assert one["topology"] is None
  total = one["param_bytes_per_device"]["target"]
  share = four["param_bytes_per_device"]["target"] / total
  # Norm scales stay whole, so a little over a quarter.
  assert 0.25 <= share < 0.35, share
  # The loop's arguments shrink with the weights.
  assert (four["memory"]["speculative"]["argument_bytes"]
          < 0.5 * one["memory"]["speculative"]["argument_bytes"])


def test_collectives_inside_the_loop_only_with_a_model_axis(plans):
  one, four = plans[(1, 1)], plans[(1, 4)]
  for key, found in one["loop_collectives"].items():
    assert found == [], key
  loops = four["loop_collectives"]
  for key in ("generate_per_target_call", "speculative_per_iteration",
              "speculative_per_draft_step"):
    kinds = {c["kind"] for c in loops[key]}
    assert "all-reduce" in kinds, (key, loops[key])
    assert all(c["bytes"] > 0 and c["count"] > 0 for c in loops[key])
  assert any(c["kind"] == "all-reduce"
             for c in four["steps"]["target_step"]["collectives"])
  assert one["steps"]["target_step"]["collectives"] == []


def test_fit_check_passes_what_fits_and_refuses_with_numbers_and_fix():
  config = _config(None, dtype="float32")
  assert fit.check_fits(config, V4)["total_bytes"] > 0
  one = fit.estimate(fit.run_shape(config))["total_bytes"]
  four = fit.estimate(fit.run_shape(_config((1, 4), dtype="float32")))
  # A chip too small for one device's share but not for a quarter of it.
  small = dataclasses.replace(V4, hbm_bytes=(one + four["total_bytes"]) // 2)
  with pytest.raises(experiment.ConfigError) as e:
    fit.check_fits(config, small)
  message = str(e.value)
  assert "use dtype bfloat16 or runs/tpu_v4_8_model_parallel.gin" in message
  assert "float32" in message and "GB" in message
  fit.check_fits(_config((1, 4), dtype="float32"), small)  # the fix fits


def test_t5_xxl_fit_on_one_v4_from_shapes_alone():
  """The paper's setting fits in bfloat16 and is refused in float32
  (45 GB of parameters > 32 GiB), without compiling anything."""
  xxl = dict(target_config="t5_1_1_xxl", draft_config="t5_1_1_small",
             max_decode_len=512, gamma=7)
  est = fit.check_fits(_config((1, 1), **xxl), V4)
  assert 22e9 < est["target_param_bytes"] < 23e9
  with pytest.raises(experiment.ConfigError,
                     match="use dtype bfloat16 or runs/tpu_v4_8_model_parallel"):
    fit.check_fits(_config((1, 1), **dict(xxl, dtype="float32")), V4)


def test_a_tree_row_plans_its_nodes():
  """A tree row's shapes hold its nodes: the target scores nodes + 1 tokens
  a call and the caches get those positions (the fit check counts them);
  its projection prices rank 0 at the paper's alpha and says where the
  sibling rates come from."""
  parents = (0, 0, 0, 1, 1, 2, 4)
  config = _config((1, 1), target_config="t5_1_1_xxl",
                   draft_config="t5_1_1_small", max_decode_len=512,
                   gamma=3, tree_parents=parents, temperature=0.0)
  shape = fit.run_shape(config)
  assert (shape.verified, shape.positions) == (8, 520)
  chain = fit.run_shape(dataclasses.replace(config, tree_parents=None))
  assert fit.estimate(shape)["total_bytes"] > fit.estimate(chain)[
      "total_bytes"]
  rates, source = plan.tree_rank_rates(0.75, 0.0, shape.tree.depth)
  assert rates.shape == (3, 4) and (rates[:, 0] == 0.75).all()
  assert "paper's alpha" in source and "benchmarks/trees.py" in source


def test_draft_replicated_only_where_it_cannot_be_split():
  small = registry.make_def(registry.get_config("t5_1_1_small"))
  config = _config(None)
  assert fit.replicate_draft(config, small, (1, 4))  # 6 heads
  assert not fit.replicate_draft(config, small, (1, 2))
  assert not fit.replicate_draft(config, small, None)
  forced = _config(None, replicate_draft=True)
  assert fit.replicate_draft(forced, small, (1, 2))


def test_collectives_in_any_branch_of_a_loops_conditional_are_found():
  """A collective that only the second branch of a conditional in the loop
  runs is counted with the loop's iteration (a `lax.cond`'s true branch is
  the conditional's branch 1: the reader used to follow branch 0 only, so
  the verification widths of a stop rule, each a branch, went unread).
  Negative control: the same loop whose branches are both local has none."""
  if len(jax.devices()) < 8:
    pytest.skip("needs XLA_FLAGS=--xla_force_host_platform_device_count=8")
  mesh = jax.make_mesh((8,), ("x",))
  rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x"))
  x = jax.ShapeDtypeStruct((8, 16), jnp.float32, sharding=rows)

  def program(axis):
    def loop(x, flag):
      body = lambda _, x: jax.lax.cond(
          flag, lambda x: x - jnp.sum(x, axis=axis, keepdims=True),
          lambda x: x * 2.0, x)
      return jax.lax.fori_loop(0, 3, body, x)
    return jax.jit(loop, out_shardings=rows).lower(
        x, jax.ShapeDtypeStruct((), jnp.bool_)).compile().as_text()

  across = program(axis=0)  # sums over the split rows: an all-reduce
  assert "conditional" in across
  assert any(c["kind"] == "all-reduce" for c in
             hlo.loop_collectives(across)["per_iteration"])
  assert hlo.loop_collectives(program(axis=1))["per_iteration"] == []


def test_cpu_converts_found_in_bf16_programs_only():
  """Negative control: the same matmul in float32 has no copies to find."""
  def program(dtype):
    w = jax.ShapeDtypeStruct((512, 256), dtype)
    x = jax.ShapeDtypeStruct((4, 512), dtype)
    return jax.jit(lambda w, x: x @ w).lower(w, x).compile().as_text()
  assert hlo.cpu_convert_bytes(program(jnp.bfloat16)) == 4 * 512 * 256
  assert hlo.cpu_convert_bytes(program(jnp.float32)) == 0


def test_no_fit_check_on_cpu_devices():
  assert fit.check_fits_on_devices(_config(None)) is None
  assert chips.chip_of_device_kind("cpu") is None
  assert chips.chip_of_device_kind("TPU v4").name == "tpu_v4"
  assert chips.chip_of_device_kind("TPU v5 lite").name == "tpu_v5e"
  assert chips.chip_of_device_kind("NVIDIA H200").name == "h200"
  assert chips.chip_of_device_kind("TPU v6 lite").name == "tpu_v6e"
  assert chips.chip_of_device_kind("TPU v5").name == "tpu_v5p"
  assert np.isfinite(V4.hbm_bytes)


def test_load_models_replicates_the_draft_as_planned():
  """What the plan assumes is what a run loads: target split over `model`,
  draft replicated when told (or when it cannot be split)."""
  if len(jax.devices()) < 8:
    pytest.skip("needs XLA_FLAGS=--xla_force_host_platform_device_count=8")
  mesh = sharding.make_mesh(1, 4)
  config = _config((1, 4), replicate_draft=True)
  target, draft = loading.load_models(config, mesh)
  query = target.params["decoder"]["layers_0"]["self_attention"]["query"][
      "kernel"]
  assert query.addressable_shards[0].data.shape[1] == query.shape[1] // 4
  for leaf in jax.tree.leaves(draft.params):
    assert leaf.addressable_shards[0].data.shape == leaf.shape
  # So the decoding loop traces the draft without the model axis.
  assert api._replicated(draft.params, mesh)  # pylint: disable=protected-access
  assert not api._replicated(target.params, mesh)  # pylint: disable=protected-access
  assert jnp.dtype(query.dtype) == jnp.bfloat16  # param_dtype follows dtype
  shape = fit.run_shape(config)
  assert shape.replicate_draft
  est = fit.estimate(shape)
  assert est["draft_param_bytes"] == est["draft_param_bytes_total"]


def test_a_topology_is_checked_against_the_slices_we_plan_for():
  """A run config's TPU slice must be one libtpu describes for us, with at
  least the mesh's chips; the message names the fix."""
  ok = _config((1, 4), topology="v4:2x2x1")
  assert experiment_config.config_problems(ok) == []
  unknown = experiment_config.config_problems(_config((1, 1),
                                                      topology="v9:2x2"))
  assert len(unknown) == 1 and "v4:2x2x1" in unknown[0], unknown
  small = experiment_config.config_problems(_config((1, 16),
                                                    topology="v4:2x2x1"))
  assert len(small) == 1 and "larger slice or a smaller mesh" in small[0]
  assert chips.TOPOLOGIES["v4:2x2x4"].num_hosts == 4


def test_a_topology_does_not_change_what_a_workdir_holds():
  """The slice a run is planned for changes no recorded number: a workdir
  written under runs/tpu_v4.gin's topology resumes without it and back
  (the fingerprint leaves it out, as `max_examples`); the mesh does not."""
  base = _config((1, 4))
  assert workdir.fingerprint(base) == workdir.fingerprint(
      dataclasses.replace(base, topology="v4:2x2x1"))
  assert workdir.fingerprint(base) != workdir.fingerprint(
      dataclasses.replace(base, mesh_shape=(1, 2)))


def test_the_alpha_sweep_is_theorem_3_8_and_breaks_even_at_speedup_one(plans):
  """Where no alpha is published (T5Gemma), a plan reports Theorem 3.8's
  speedup at each alpha of the sweep from its own c and v, and the alpha
  at which that speedup is exactly 1; a pair whose iteration costs no more
  than a target step breaks even at 0, one that costs gamma + 1 steps or
  more never does."""
  # Theorem 3.8 written out here, not through the library's functions:
  # E[tokens] / (gamma c + v), E[tokens] = (1 - a^(gamma + 1)) / (1 - a).
  def speedup(a, gamma, c, v):
    return (1 - a ** (gamma + 1)) / (1 - a) / (gamma * c + v)

  def first_paying(gamma, c, v):  # a grid search of where speedup >= 1
    grid = np.linspace(0.0, 0.9999, 100_001)
    paying = grid[speedup(grid, gamma, c, v) >= 1.0]
    return float(paying[0]) if paying.size else None

  p = plans[(1, 4)]
  for alpha, measured in p["alpha_sweep"].items():
    assert measured == pytest.approx(speedup(
        float(alpha), p["gamma"], p["c"], p["verify_cost"]), rel=1e-9)
  # The tiny pair's draft is its target: c is about 1 and it never pays.
  assert p["break_even_alpha"] is None
  assert first_paying(p["gamma"], p["c"], p["verify_cost"]) is None
  even = plan.break_even_alpha(p["gamma"], 0.1, p["verify_cost"])
  assert even == pytest.approx(first_paying(p["gamma"], 0.1,
                                            p["verify_cost"]), abs=2e-5)
  assert speedup(even, p["gamma"], 0.1, p["verify_cost"]) == pytest.approx(
      1.0, 1e-9)
  assert plan.break_even_alpha(3, 0.0, 1.0) == 0.0
  assert plan.break_even_alpha(3, 1.0, 1.0) is None


def test_every_shipped_row_is_a_table_row_and_no_include_is():
  """`plan_run --experiments='experiments/qwen3/*.gin'` plans every row of
  a family (the instruction rows and names of three parts, e.g.
  instruct_32b_0_6b_t0, included) and none of the files they include."""
  root = os.path.join(helpers.REPO, "configs", "experiments")
  for family in ("table2", "t5gemma", "t5gemma2", "gemma3", "llama3",
                 "qwen3", "qwen2_5"):
    names = sorted(os.listdir(os.path.join(root, family)))
    rows = [n for n in names if plan_table.is_row(n)]
    assert rows == [n for n in names if re.search(r"_t[01]\.gin$", n)], (
        family, names)
    assert rows, family
  for name in ("instruct_32b_0_6b_t0.gin", "cnndm_1b_t1.gin",
               "ende_small_t0.gin", "ende_2b_2b_t1.gin"):
    assert plan_table.is_row(name), name
  for name in ("ende.gin", "instruct.gin", "checkpoints.gin",
               "checkpoints_t5_v1_0.gin"):
    assert not plan_table.is_row(name), name


def test_a_projection_table_reads_back_and_plots(tmp_path):
  """`plan_run --experiments ... --figure` draws from the table it wrote:
  the rows read back give each planned row's gamma, c and v as printed,
  and the figure is a PNG. Two rows that differ only in their task (the
  same shapes) are compiled once and print the same figures: one plan
  covers both."""
  logged = []
  text = plan_table.project_table(
      ["experiments/x/ende_tiny_t0.gin", "experiments/x/instruct_tiny_t0.gin"],
      lambda f, run: _config((1, 1), task=(
          "wmt14_ende_local" if "ende" in f else "instructions_local")),
      input_len=8, setups=[("One device", "runs/cpu.gin", "tpu_v4")],
      log=logged.append)
  rows = plan_table.read_rows(text)
  assert [(r["setup"], r["row"], r["gamma"]) for r in rows] == [
      ("One device", "ende_tiny_t0", 3), ("One device", "instruct_tiny_t0", 3)]
  compiles = [l for l in logged if "compiling its programs" in l]
  assert len(compiles) == 1, logged
  assert any("instruct_tiny_t0 on One device: the programs of ende_tiny_t0"
             in l for l in logged), logged
  line = next(l for l in text.splitlines() if l.startswith("| ende_tiny_t0"))
  other = next(l for l in text.splitlines()
               if l.startswith("| instruct_tiny_t0"))
  assert line.split("|")[2:] == other.split("|")[2:]
  assert f"| {rows[0]['c']:.4f} | {rows[0]['verify_cost']:.2f} |" in line
  plan_table.plot_alpha_sweep(str(tmp_path / "sweep.png"), rows)
  assert (tmp_path / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
