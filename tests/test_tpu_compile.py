"""Our programs compiled by the real TPU compiler (libtpu), and what its HLO
shows about the design's promises.

No TPU is needed: libtpu describes a v4-8 host (`v4:2x2x1`, 4 chips) and a
v4-32 slice (`v4:2x2x4`, 16 chips on 4 hosts) and compiles for them ahead
of time (specdec_jax/planning/topology.py). The tiny T5 v1.1 pair runs with
the target split over a (1, 4) model-parallel mesh and the draft replicated,
as a T5-XXL target and T5-small draft run on a v4-8.

Invariants, each with the TPU compiler's own output:
- every decoding loop (generate; speculative greedy, top-p, with
  ConfidenceStop, with a cascade), one training step and one distillation
  step compile for TPU v4 devices, and one loop for all 16 devices of a
  4-host slice in this one process;
- the KV caches are updated in place: no loop body copies a whole cache,
  and a decoder step's donated cache is aliased to its output (negative
  control: a loop that keeps the old cache beside the new one copies it);
- a replicated draft's steps hold no collective (negative control: the same
  loop traced with the draft's constraints naming the model axis);
- no loop all-gathers a weight of the model-parallel target (negative
  control: a matmul that gathers its sharded weight is found);
- no program calls the host (negative control: a loop with
  `jax.debug.callback` is found).

Skips, saying why, where libtpu is not installed (`pip install -e
'.[tpu]'`; `make test` installs it where pip can).
"""

import dataclasses
import platform
import re
import sys

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from specdec_jax import sampling
from specdec_jax import sharding
from specdec_jax.decoding import engine
from specdec_jax.memory import footprint
from specdec_jax.decoding import stopping
from specdec_jax.drafts.cascades import CascadeDef
from specdec_jax.drafts.trees import TreeDef
from specdec_jax.decoding.tree_shape import TreeShape
from specdec_jax.infra import chips
from specdec_jax.experiments import experiment
from specdec_jax.experiments import fit
from specdec_jax.models import registry
from specdec_jax.planning import hlo
from specdec_jax.planning import plan
from specdec_jax.planning import plan_training
from specdec_jax.planning import topology
from specdec_jax.training import distill
from specdec_jax.training import steps
from specdec_jax.training.config import TrainConfig

# Where pip has libtpu (Linux on x86_64, the machines CI and users plan
# on), its absence is a broken set-up, not a reason to skip: the Makefile
# installs it, and these checks are the only ones of the TPU programs.
_LIBTPU_PLATFORM = sys.platform == "linux" and platform.machine() == "x86_64"
if topology.libtpu_missing():
  if _LIBTPU_PLATFORM:
    pytest.fail(f"TPU compile tests: {topology.libtpu_missing()}; "
                "`make test` installs it on this platform",
                pytrace=False)
  pytest.skip(f"TPU compile tests: {topology.libtpu_missing()}",
              allow_module_level=True)

GAMMA, DECODE, INPUT = 3, 12, 16
GREEDY = sampling.SamplingConfig(0.0, 0, 1.0)
TOP_P = sampling.SamplingConfig(1.0, 0, 0.9)


def _tiny(**overrides):
  return registry.make_def(dataclasses.replace(
      registry.get_config("t5_1_1_tiny"), dtype="bfloat16",
      param_dtype="bfloat16", **overrides))


# 16 heads: 4 per device on the (1, 4) mesh, as T5-XXL's 64 heads have 16
# on a v4-8. With one 8-wide head per device the TPU compiler lays the
# cache out differently for the attention and for the write, and copies
# it around every write; at T5 sizes (64-wide heads, 4 or more per
# device) it updates it in place, which is what this file checks.
TARGET = _tiny(num_heads=16)
DRAFT = _tiny(num_decoder_layers=1, num_encoder_layers=1)
DRAFT_OF_DRAFT = _tiny(num_decoder_layers=1, num_encoder_layers=1, mlp_dim=32)
TREE = TreeDef(DRAFT, TreeShape.from_branching((2, 2, 1)))  # depth GAMMA


def _shape(mesh_shape=(1, 4), name="v4:2x2x1", target=TARGET):
  return fit.RunShape(target=target, draft=DRAFT, gamma=GAMMA,
                      max_decode_len=DECODE, input_len=INPUT, batch=1,
                      mesh_shape=mesh_shape, temperature=0.0, top_k=0,
                      top_p=1.0, replicate_draft=True, topology=name)


@pytest.fixture(scope="module")
def v4():
  shape = _shape()
  mesh = plan.mesh_for(shape)
  return dict(shape=shape, mesh=mesh,
              target=plan.abstract_params(TARGET, mesh),
              draft=plan.abstract_params(DRAFT, mesh, replicate=True),
              inputs=plan._inputs(shape, mesh))  # pylint: disable=protected-access


def _compile(fn, *args):
  return plan._compile(fn, *args)  # pylint: disable=protected-access


@pytest.fixture(scope="module")
def loops(v4):
  """Optimized TPU HLO of every decoding loop, compiled once."""
  def spec(draft_def, draft_params, sampler, **kw):
    fn = engine.build_speculative(TARGET, draft_def, GAMMA, DECODE, sampler,
                                  draft_replicated=True, **kw)
    return _compile(fn, v4["target"], draft_params, *v4["inputs"])

  cascade_params = {"draft": v4["draft"], "drafter": plan.abstract_params(
      DRAFT_OF_DRAFT, v4["mesh"], replicate=True)}
  compiled = {
      "generate": _compile(engine.build_generate(TARGET, DECODE, GREEDY),
                           v4["target"], *v4["inputs"]),
      "greedy": spec(DRAFT, v4["draft"], GREEDY),
      "top_p": spec(DRAFT, v4["draft"], TOP_P),
      "confidence_stop": spec(DRAFT, v4["draft"], GREEDY,
                              draft_stop=stopping.ConfidenceStop()),
      "cascade": spec(CascadeDef(draft=DRAFT, drafter=DRAFT_OF_DRAFT,
                                 gamma=2), cascade_params, GREEDY),
      # Token trees: the tree mask, the walk and the path's cache moves.
      "tree": spec(TREE, {"draft": v4["draft"]}, GREEDY),
      "tree_top_p": spec(TREE, {"draft": v4["draft"]}, TOP_P),
  }
  return {k: c.as_text() for k, c in compiled.items()}


def _cache_bytes(definition, mesh_shape):
  """Bytes per device of each key and value cache of `definition`."""
  return footprint.cache_bytes(definition, 1, INPUT, DECODE + GAMMA + 1,
                            mesh_shape, min_rank=3)


def test_every_topology_describes_its_chips():
  """Each slice a run config can name: libtpu gives its number of chips,
  over its number of hosts, of the kind our chip table maps to its chip."""
  for name, spec in chips.TOPOLOGIES.items():
    devices = topology.devices(name)
    assert len(devices) == spec.num_chips, name
    assert chips.chip_of_device_kind(devices[0].device_kind).name == \
        spec.chip, (name, devices[0].device_kind)
    assert len({d.process_index for d in devices}) == spec.num_hosts, name


def test_every_decoding_loop_compiles_for_tpu_v4(v4, loops):
  assert v4["mesh"].devices.flat[0].device_kind == "TPU v4"
  assert v4["mesh"].devices.shape == (1, 4)
  assert set(loops) == {"generate", "greedy", "top_p", "confidence_stop",
                        "cascade", "tree", "tree_top_p"}
  for name, text in loops.items():
    assert "while" in text, name
    # Compiled for the TPU: its layouts carry TPU tiles.
    assert ":T(" in text, name


def test_caches_are_updated_in_place(v4, loops):
  """No loop body copies an array as large as the smallest key or value
  cache of either model (per device); the other arrays a loop copies (a
  chunk's new keys) are smaller, or float32 (relative-position biases;
  the caches are bfloat16). The plan makes
  the same check on every Table 2 program (`promises` in its JSON)."""
  smallest = plan.smallest_cache_leaf_bytes(v4["shape"])
  assert smallest == min(_cache_bytes(TARGET, (1, 4)) +
                         _cache_bytes(DRAFT, (1, 1)))
  for name, text in loops.items():
    assert hlo.loop_copies(text, smallest, "bf16") == [], name


def test_a_decoder_step_donates_its_cache(v4):
  shape, mesh = v4["shape"], v4["mesh"]
  cache = plan._abstract_cache(TARGET, v4["target"], shape, mesh)  # pylint: disable=protected-access
  ids = jax.ShapeDtypeStruct((1, GAMMA + 1), jnp.int32,
                             sharding=sharding.batch_sharding(mesh, 1))
  compiled = _compile(jax.jit(TARGET.extend, donate_argnums=1),
                      v4["target"], cache, ids, ids)
  cache_bytes = sum(_cache_bytes(TARGET, (1, 4)))
  assert compiled.memory_analysis().alias_size_in_bytes >= cache_bytes


def test_loop_copy_check_finds_a_copied_cache(v4):
  """Negative control: keeping the old cache beside the updated one forces
  the compiler to copy it every iteration, and the check sees it."""
  mesh = sharding.make_mesh(1, 1, devices=v4["mesh"].devices.flat)
  cache = jax.ShapeDtypeStruct((4, 64, 128), jnp.bfloat16, sharding=(
      jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())))

  def loop(c, keep_old):
    def body(i, carry):
      new = lax.dynamic_update_slice(carry[0], jnp.ones((4, 1, 128),
                                                        c.dtype), (0, i, 0))
      return (new, carry[0] if keep_old else carry[1])
    return lax.fori_loop(0, 8, body, (c, c))

  sizes = 4 * 64 * 128 * 2
  for keep_old, expected in ((True, 1), (False, 0)):
    text = jax.jit(lambda c: loop(c, keep_old)).lower(cache).compile(
    ).as_text()
    assert len(hlo.loop_copies(text, sizes)) == expected, keep_old


def test_a_replicated_draft_steps_without_collectives(v4, loops):
  for name in ("greedy", "top_p", "confidence_stop", "cascade"):
    found = hlo.loop_collectives(loops[name])
    assert found["per_inner_step"] == [], (name, found["per_inner_step"])
    # The target's verification reduces over its split heads.
    assert any(c["kind"] == "all-reduce" for c in found["per_iteration"])
  # Top-p's nucleus of the target's split p: 31 bisection steps (a rolled
  # loop of the sampler, counted per trip in the iteration), each summing
  # the GAMMA + 1 rows over the split vocabulary.
  sums = [c["count"] for c in hlo.loop_collectives(loops["top_p"])[
      "per_iteration"] if c["kind"] == "all-reduce" and
          c["shape"] == f"f32[{GAMMA + 1}]"]
  assert sums and sums[0] >= 31, sums
  # Negative control: the draft traced as if split over `model`.
  fn = engine.build_speculative(TARGET, DRAFT, GAMMA, DECODE, GREEDY,
                                draft_replicated=False)
  text = _compile(fn, v4["target"], v4["draft"], *v4["inputs"]).as_text()
  assert hlo.loop_collectives(text)["per_inner_step"]


def _weight_gathers(text, definition):
  """All-gathers in any loop whose result is a whole bfloat16 weight (its
  element count; the compiler may gather a reshaped weight)."""
  sizes = {int(np.prod(leaf.shape)) for leaf in
           jax.tree.leaves(definition.param_shapes()) if leaf.ndim > 1}
  found = hlo.loop_collectives(text)
  out = []
  for c in found["per_iteration"] + found["per_inner_step"]:
    if c["kind"] != "all-gather" or not c["shape"].startswith("bf16["):
      continue
    dims = re.findall(r"\[([\d,]*)\]", c["shape"])
    n = sum(int(np.prod([int(d) for d in ds.split(",") if d])) for ds in dims)
    if n in sizes:
      out.append(c)
  return out


def test_no_weight_is_all_gathered_in_a_loop(v4, loops):
  for name, text in loops.items():
    assert _weight_gathers(text, TARGET) == [], name
  # Negative control: a loop whose matmul gathers its sharded weight.
  mesh = v4["mesh"]
  w = jax.ShapeDtypeStruct((32, 64), jnp.bfloat16, sharding=(
      jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(
          None, "model"))))

  def gathers(w):
    def body(i, carry):
      # The weight changes every iteration (as a sharded weight would not),
      # so its gather cannot be hoisted out of the loop.
      w, x = carry
      full = lax.with_sharding_constraint(w, jax.sharding.NamedSharding(
          mesh, jax.sharding.PartitionSpec()))
      return w + jnp.bfloat16(1e-3), jnp.tanh(x @ full)[:, :32]
    return lax.fori_loop(0, 4, body, (w, jnp.ones((1, 32), jnp.bfloat16)))

  text = jax.jit(gathers).lower(w).compile().as_text()
  # The target has weights of that size (its MLP's [32, 64] kernels).
  assert 32 * 64 in {int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(
      TARGET.param_shapes())}
  assert _weight_gathers(text, TARGET)


_SORT = re.compile(r"\bsort\(")


def test_top_p_over_gemmas_vocabulary_compiles_without_a_sort(v4, loops):
  """Top-p over T5Gemma's 256,000 ids (logits split over the model axis, as
  a T5Gemma's are on a v4-8) compiles for TPU v4 to a program with no sort
  (`sampling.nucleus_threshold` bisects on the probabilities), and so does
  the tiny pair's top-p loop. The control: a sort-and-cumsum nucleus over
  the same logits compiles to a sort, which the check finds."""
  spec = jax.sharding.NamedSharding(
      v4["mesh"], jax.sharding.PartitionSpec(None, "model"))
  logits = jax.ShapeDtypeStruct((1, 256_000), jnp.float32, sharding=spec)

  def sorted_nucleus(z):
    p = jax.nn.softmax(z)
    desc = -jnp.sort(-p, axis=-1)
    cut = jnp.take_along_axis(
        desc, jnp.argmax(jnp.cumsum(desc, -1) >= 0.9, -1)[:, None], -1)
    return jnp.where(p >= cut, p, 0.0)

  ours = _compile(jax.jit(TOP_P.probs), logits).as_text()
  control = _compile(jax.jit(sorted_nucleus), logits).as_text()
  assert not _SORT.search(ours)
  assert not _SORT.search(loops["top_p"])
  assert _SORT.search(control)


def test_no_program_calls_the_host(v4, loops):
  for name, text in loops.items():
    assert hlo.host_callbacks(text) == [], name
  # Negative control: a debug callback in a loop crosses to the host.
  mesh = sharding.make_mesh(1, 1, devices=v4["mesh"].devices.flat)
  x = jax.ShapeDtypeStruct((8,), jnp.float32, sharding=(
      jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())))

  def noisy(x):
    def body(i, x):
      jax.debug.callback(lambda i: None, i)
      return x + 1
    return lax.fori_loop(0, 3, body, x)

  assert hlo.host_callbacks(jax.jit(noisy).lower(x).compile().as_text())


def test_training_and_distillation_steps_compile_for_tpu_v4(v4):
  mesh = v4["mesh"]
  tx = optax.adafactor(1e-3)
  # A training step of the draft, replicated, batch rows over `data`.
  params = plan.abstract_params(DRAFT, mesh, replicate=True)
  rep = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  state = steps.TrainState(
      jax.ShapeDtypeStruct((), jnp.int32, sharding=rep), params,
      jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype,
                                                  sharding=rep),
                   jax.eval_shape(tx.init, params)))
  rows = sharding.batch_sharding(mesh, 4)
  batch = {k: jax.ShapeDtypeStruct((4, INPUT), jnp.float32 if k == "weights"
                                   else jnp.int32, sharding=rows)
           for k in ("inputs", "decoder_inputs", "targets", "weights")}
  train = steps.make_train_step(DRAFT, tx, TrainConfig())
  bad = jax.ShapeDtypeStruct((), jnp.int32, sharding=rep)
  text = _compile(train, state, batch, None, bad).as_text()
  assert ":T(" in text and hlo.host_callbacks(text) == []
  # A distillation step: the draft learns from the split target.
  config = experiment.ExperimentConfig(
      task="wmt14_ende_local", target="t5_1_1_tiny", draft="t5_1_1_tiny",
      target_config="t5_1_1_tiny", draft_config="t5_1_1_tiny",
      dtype="bfloat16", gamma=GAMMA, max_decode_len=DECODE,
      mesh_shape=(1, 4), topology="v4:2x2x1")
  d = distill.DistillConfig(batch_size=4, input_len=INPUT, target_len=INPUT)
  result = plan_training.plan_distill_step(
      config, d, chips.get_chip("tpu_v4"))
  assert result["compiler"].startswith("libtpu")
  assert result["device_kind"] == "TPU v4"
  assert result["peak_bytes_per_device"] >= result["memory"][
      "argument_bytes"] > 0


def test_a_loop_compiles_for_a_four_host_slice_in_one_process():
  """v4-32: 16 chips on hosts 0-3, a (1, 16) mesh, compiled here."""
  wide = _tiny(num_heads=16, head_dim=2)
  shape = _shape((1, 16), "v4:2x2x4", target=wide)
  mesh = plan.mesh_for(shape)
  assert {d.process_index for d in mesh.devices.flat} == {0, 1, 2, 3}
  fn = engine.build_speculative(wide, DRAFT, GAMMA, DECODE, GREEDY,
                                draft_replicated=True)
  text = _compile(fn, plan.abstract_params(wide, mesh),
                  plan.abstract_params(DRAFT, mesh, replicate=True),
                  *plan._inputs(shape, mesh)).as_text()  # pylint: disable=protected-access
  assert "while" in text and ":T(" in text
  assert hlo.loop_collectives(text)["per_inner_step"] == []


def test_a_plan_names_the_tpu_compiler_and_reports_its_memory():
  """scripts/plan_run.py's plan of a run that names a TPU topology: the
  TPU compiler's figures, labelled, and the promises counted on the run's
  own programs."""
  config = experiment.ExperimentConfig(
      task="wmt14_ende_local", target="t5_1_1_tiny", draft="t5_1_1_tiny",
      target_config="t5_1_1_tiny", draft_config="t5_1_1_tiny",
      dtype="bfloat16", gamma=GAMMA, max_decode_len=DECODE,
      mesh_shape=(1, 4), replicate_draft=True, topology="v4:2x2x1")
  p = plan.plan(config, chips.get_chip("tpu_v4"),
                input_len=INPUT)
  assert p["compiler"].startswith("libtpu ") and "TPU compiler" in p[
      "compiler"]
  assert p["device_kind"] == "TPU v4" and p["topology"] == "v4:2x2x1"
  memory = p["memory"]["speculative"]
  # No CPU correction: the compiler's own peak.
  assert "cpu_convert_bytes" not in memory
  assert memory["peak_bytes"] == (memory["argument_bytes"] +
                                  memory["output_bytes"] +
                                  memory["temp_bytes"] -
                                  memory["alias_bytes"])
  assert p["fits"] and p["fix"] is None
  assert p["promises"] == {"cache_copies_in_loops": 0, "host_callbacks": 0,
                           "collectives_per_draft_step": 0}
  # The roofline reads bytes counted from shapes, the compiler's beside.
  step = p["steps"]["target_step"]
  assert 0 < step["bytes_from_shapes"] != step["bytes_accessed"]


def test_a_program_the_tpu_compiler_cannot_fit_is_a_one_line_refusal():
  """A program whose temporaries exceed a v5e chip's 16 GiB (the running
  sum of a 80,000 x 80,000 float32 outer product, 24 GB a chip) passes no
  count from shapes, but the TPU compiler refuses it: the plan turns its
  RESOURCE_EXHAUSTED error into a ConfigError of one line (plan_run prints
  it and exits 1, as for a refusal from shapes), with the compiler's need
  and a fix, instead of a traceback (Gemma 3 27B + 4B on a v5e-4 met
  this with an experimental projection: docs/log/gemma3_plans.md)."""
  shape = _shape(name="v5e:2x2")
  mesh = plan.mesh_for(shape)
  x = jax.ShapeDtypeStruct((80_000,), jnp.float32,
                           sharding=jax.sharding.NamedSharding(
                               mesh, jax.sharding.PartitionSpec()))
  with pytest.raises(plan.DoesNotFit) as info:
    plan._compile(  # pylint: disable=protected-access
        jax.jit(lambda v: jnp.cumsum(jnp.outer(v, v), axis=0)[::1000]), x)
  error = info.value
  assert isinstance(error, experiment.ConfigError)
  assert str(error).startswith("the compiler: Ran out of memory"), error
  assert "\n" not in str(error)
  assert error.needed_bytes > chips.get_chip("tpu_v5e").hbm_bytes
  refusal = plan.with_fix(error, shape, chips.get_chip("tpu_v5e"))
  assert str(refusal).startswith(str(error)) and "Fix: use " in str(refusal)
  assert refusal.needed_bytes == error.needed_bytes
