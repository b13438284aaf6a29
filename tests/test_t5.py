"""Tests of the Flax T5, the registry and gin configs (the cache contract:
test_model_contract.py)."""

import dataclasses
import glob
import os
import re

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax import Model
from specdec_jax import sampling
from specdec_jax.decoding import api
from specdec_jax.decoding import checks
from specdec_jax.decoding import engine
from specdec_jax.decoding.protocol import ModelDef
from specdec_jax.models import layers
from specdec_jax.models import registry
from specdec_jax.models import t5
from tests import helpers

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAMES = ("t5_tiny", "t5_1_1_tiny")


class Jitted:
  """A definition's entry points under jit (eager Flax is slow on CPU)."""

  def __init__(self, definition):
    self.definition = definition
    self.forward = jax.jit(definition.forward)
    self.prefill = jax.jit(definition.prefill, static_argnums=2)
    self.extend = jax.jit(definition.extend)
    self.cache_logical_axes = definition.cache_logical_axes


@pytest.fixture(scope="module", params=NAMES)
def model(request):
  definition = t5.T5Def(registry.get_config(request.param))
  params = definition.init_params(jax.random.PRNGKey(0))
  return Jitted(definition), params


def _inputs():
  input_ids = np.array([[5, 6, 7, 8, 9, 1], [10, 11, 1, 0, 0, 0]], np.int32)
  decoder_ids = np.array([[0, 3, 4, 5, 6, 7, 8], [0, 9, 9, 2, 3, 4, 5]],
                         np.int32)
  return input_ids, decoder_ids


def _tree_paths(tree):
  return {"/".join(k.key for k in path): leaf.shape
          for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def test_param_tree_has_t5x_names_shapes_and_axes():
  """Params use T5X's names, 2-D kernel layouts and logical axis names."""
  v10 = t5.T5Def(registry.get_config("t5_tiny"))
  v11 = t5.T5Def(registry.get_config("t5_1_1_tiny"))
  shapes11 = jax.eval_shape(v11.init_params, jax.random.PRNGKey(0))
  p10 = _tree_paths(jax.eval_shape(v10.init_params, jax.random.PRNGKey(0)))
  p11 = _tree_paths(shapes11)
  assert p10["token_embedder/embedding"] == (128, 32)
  assert p10["encoder/relpos_bias/rel_embedding"] == (4, 32)
  assert p10["encoder/layers_1/attention/query/kernel"] == (32, 32)
  assert p10["encoder/layers_0/attention/out/kernel"] == (32, 32)
  assert p10["encoder/layers_0/mlp/wi/kernel"] == (32, 64)
  assert p10["encoder/layers_0/mlp/wo/kernel"] == (64, 32)
  assert p10["encoder/encoder_norm/scale"] == (32,)
  for sub in ("self_attention/key/kernel",
              "encoder_decoder_attention/value/kernel",
              "pre_self_attention_layer_norm/scale",
              "pre_cross_attention_layer_norm/scale",
              "pre_mlp_layer_norm/scale"):
    assert f"decoder/layers_1/{sub}" in p10
  assert "decoder/logits_dense/kernel" not in p10  # tied
  assert p11["decoder/logits_dense/kernel"] == (32, 128)
  assert p11["decoder/layers_0/mlp/wi_0/kernel"] == (32, 64)
  assert p11["decoder/layers_0/mlp/wi_1/kernel"] == (32, 64)
  axes = v11.param_logical_axes()
  layer = axes["decoder"]["layers_0"]
  attention = layer["self_attention"]
  assert tuple(attention["query"]["kernel"]) == ("embed", "joined_kv")
  assert tuple(attention["out"]["kernel"]) == ("joined_kv", "embed")
  assert tuple(layer["mlp"]["wo"]["kernel"]) == ("mlp", "embed")
  assert tuple(axes["decoder"]["logits_dense"]["kernel"]) == ("embed", "vocab")
  assert tuple(axes["token_embedder"]["embedding"]) == ("vocab", "embed")
  assert tuple(axes["encoder"]["relpos_bias"]["rel_embedding"]) == (
      "heads", "relpos_buckets")
  assert jax.tree.structure(axes) == jax.tree.structure(shapes11)


def test_definition_is_a_hashable_model_def():
  """The engine needs a hashable ModelDef to use as a static jit argument."""
  definition = t5.T5Def(registry.get_config("t5_tiny"))
  assert isinstance(definition, ModelDef)
  assert hash(definition) == hash(t5.T5Def(registry.get_config("t5_tiny")))
  assert definition.vocab_size == 128 and definition.max_input_len == 64


def test_a_parameter_of_another_shape_is_refused_when_applied():
  """Parameters are read without tracing their initializers
  (`layers._param`), but a parameter whose shape is not the architecture's
  still fails, naming it and both shapes; the unchanged tree runs."""
  definition = t5.T5Def(registry.get_config("t5_tiny"))
  params = definition.init_params(jax.random.PRNGKey(0))
  input_ids, decoder_ids = _inputs()
  jax.eval_shape(definition.forward, params, input_ids, decoder_ids)
  # A scale of shape (1,) would broadcast silently: only the check sees it.
  bad = jax.tree.map(lambda x: x, params)
  bad["decoder"]["decoder_norm"]["scale"] = jnp.ones((1,), jnp.float32)
  with pytest.raises(flax.errors.ScopeParamShapeError,
                     match=r'"scale" in "/decoder/decoder_norm".*shape '
                     r"\(32,\).*shape \(1,\)"):
    jax.eval_shape(definition.forward, bad, input_ids, decoder_ids)


def test_prefill_allocates_cache_and_starts_at_zero(model):
  """prefill: start token 0 at position 0, S = num_decode_positions + 1."""
  definition, params = model
  input_ids, _ = _inputs()
  pre = definition.prefill(params, input_ids, 9)
  np.testing.assert_array_equal(pre.start_token, [0, 0])
  np.testing.assert_array_equal(pre.start_pos, [0, 0])
  # Keys [B, N, H, S], values [B, N, S, H] (see layers.KVCache).
  assert pre.cache.self_attention[0].key.shape == (2, 4, 8, 10)
  assert pre.cache.self_attention[0].value.shape == (2, 4, 10, 8)
  assert pre.cache.cross_attention[1].value.shape == (2, 4, 6, 8)
  np.testing.assert_array_equal(pre.cache.encoder_mask, input_ids > 0)
  axes = definition.cache_logical_axes(pre.cache)
  assert jax.tree.structure(axes) == jax.tree.structure(pre.cache)
  assert tuple(axes.self_attention[0].key) == (
      "cache_batch", "cache_heads", "cache_kv", "cache_sequence")
  assert tuple(axes.cross_attention[0].value) == (
      "cache_batch", "cache_heads", "cache_sequence", "cache_kv")


def test_kv_cache_write_puts_each_row_at_its_positions():
  """KVCache.write: row b's token t lands in slot positions[b, t] of both
  layouts (keys [B, N, H, S], values [B, N, S, H]); rewriting a slot
  replaces it; positions past the last slot are dropped, not wrapped or
  clamped onto the last slot."""
  batch, slots, heads, dim = 2, 5, 3, 4
  cache = layers.KVCache.zeros(batch, slots, heads, dim, "float32")
  rng = np.random.default_rng(0)
  key = rng.normal(size=(batch, 2, heads, dim)).astype(np.float32)
  value = rng.normal(size=(batch, 2, heads, dim)).astype(np.float32)
  positions = np.array([[1, 2], [4, 5]], np.int32)  # row 1: slot 5 is past
  out = cache.write(key, value, positions)
  expected_k = np.zeros((batch, heads, dim, slots), np.float32)
  expected_v = np.zeros((batch, heads, slots, dim), np.float32)
  for b in range(batch):
    for t in range(2):
      if positions[b, t] < slots:
        expected_k[b, :, :, positions[b, t]] = key[b, t]
        expected_v[b, :, positions[b, t], :] = value[b, t]
  np.testing.assert_array_equal(out.key, expected_k)
  np.testing.assert_array_equal(out.value, expected_v)
  again = out.write(-key, -value, positions)
  np.testing.assert_array_equal(again.key, -expected_k)
  np.testing.assert_array_equal(again.value, -expected_v)


def _cache_copies_in_step_loop(definition, params, num_tokens):
  """Copies of cache-sized arrays in the compiled loop of cached steps of
  `num_tokens` tokens (batch 1, as in the paper's decoding)."""
  num_positions = 16
  pre = definition.prefill(params, np.array([[5, 6, 7, 1]], np.int32),
                           num_positions)

  def loop(params, cache):
    def body(i, cache):
      positions = i * num_tokens + jnp.arange(num_tokens)[None, :]
      tokens = jnp.full((1, num_tokens), 3, jnp.int32)
      return definition.extend(params, cache, tokens, positions)[1]
    return jax.lax.fori_loop(0, 4, body, cache)

  hlo = jax.jit(loop).lower(params, pre.cache).compile(
      compiler_options=helpers.USERS_XLA_CPU_OPTIONS).as_text()
  shapes = {str(list(leaf.shape)).replace(" ", "")
            for kv in pre.cache.self_attention
            for leaf in (kv.key, kv.value)}
  copies = re.findall(r"= f32(\[[0-9,]*\])\{[0-9,]*\} copy\(", hlo)
  return sum(shape in shapes for shape in copies), 2 * len(
      pre.cache.self_attention)


def test_one_token_steps_update_the_cache_in_place(monkeypatch):
  """A plain decoding step (batch 1, one token) writes its keys and values
  into the cache in place: the compiled loop copies each cache array at most
  once (on entry, its arguments not being donated), where a lone
  (row, slot) scatter made XLA copy every layer's cache four more times per
  step (about 10% of the demo target's step). Negative control: that lone
  scatter, put back, brings the copies back."""
  definition = t5.T5Def(registry.get_config("t5_tiny"))
  params = definition.init_params(jax.random.PRNGKey(0))
  copies, arrays = _cache_copies_in_step_loop(definition, params, 1)
  assert copies <= arrays

  def lone_scatter(self, key, value, positions):
    rows = jnp.arange(positions.shape[0])[:, None]
    return layers.KVCache(
        self.key.at[rows, :, :, positions].set(key, mode="drop"),
        self.value.at[rows, :, positions, :].set(value, mode="drop"))

  monkeypatch.setattr(layers.KVCache, "write", lone_scatter)
  copies, arrays = _cache_copies_in_step_loop(definition, params, 1)
  assert copies > arrays


def test_bfloat16_compute_gives_float32_logits():
  """Logits are float32 whatever the compute dtype, and stay close."""
  input_ids, decoder_ids = _inputs()
  cfg = registry.get_config("t5_1_1_tiny")
  f32 = Jitted(t5.T5Def(cfg))
  bf16 = Jitted(t5.T5Def(dataclasses.replace(cfg, dtype="bfloat16")))
  params = f32.definition.init_params(jax.random.PRNGKey(1))
  cache = bf16.prefill(params, input_ids, 4).cache
  assert cache.self_attention[0].key.dtype == jnp.bfloat16
  logits, _ = bf16.extend(params, cache, decoder_ids[:, :2],
                          np.tile(np.arange(2), (2, 1)))
  assert logits.dtype == jnp.float32
  expected = f32.forward(params, input_ids, decoder_ids[:, :2])
  scale = float(jnp.abs(expected).max())
  np.testing.assert_allclose(logits, expected, atol=0.05 * scale)


def test_input_longer_than_max_input_len_is_rejected():
  """A too-long input fails before compiling, naming the limit."""
  definition = t5.T5Def(registry.get_config("t5_tiny"))
  with pytest.raises(ValueError, match="max_input_len=64"):
    definition.prefill(None, np.ones((1, 65), np.int32), 4)


def test_relative_position_buckets():
  """T5 buckets: exact below R/2 per side, log-spaced up to max_distance."""
  rel = jnp.array([0, -1, -7, -8, -12, -16, -32, -64, -127, -128, -1000,
                   1, 5, 200])
  bi = layers.relative_position_bucket(rel, bidirectional=True,
                                       num_buckets=32, max_distance=128)
  np.testing.assert_array_equal(
      bi, [0, 1, 7, 8, 9, 10, 12, 14, 15, 15, 15, 17, 21, 31])
  uni = layers.relative_position_bucket(rel, bidirectional=False,
                                        num_buckets=32, max_distance=128)
  np.testing.assert_array_equal(
      uni, [0, 1, 7, 8, 12, 16, 21, 26, 31, 31, 31, 0, 0, 0])


def test_unknown_activation_is_rejected():
  """A config naming an unknown MLP activation fails when it is built."""
  with pytest.raises(ValueError, match="unknown MLP activation 'gelu2'"):
    t5.T5Config(vocab_size=8, mlp_activations=("gelu2",))


@pytest.mark.parametrize("name,millions", [("t5_small", 60), ("t5_base", 222),
                                           ("t5_1_1_small", 77),
                                           ("t5_1_1_base", 248)])
def test_registry_sizes_match_published_parameter_counts(name, millions):
  """The registry's real sizes give the published parameter counts."""
  definition = registry.make_def(registry.get_config(name))
  shapes = jax.eval_shape(definition.init_params, jax.random.PRNGKey(0))
  count = sum(np.prod(s.shape) for s in jax.tree.leaves(shapes))
  assert abs(count / 1e6 - millions) / millions < 0.03, count


def test_registry_rejects_unknown_names_and_fields():
  """Unknown config names and override fields raise, naming the choices."""
  with pytest.raises(ValueError, match="t5_1_1_xxl"):
    registry.get_config("t5_xxxl")
  with pytest.raises(ValueError, match="bad override"):
    registry.get_config("t5_small", n_layers=3)
  assert registry.get_config("t5_1_1_xxl", dtype="bfloat16").dtype == "bfloat16"


def test_gin_files_bind_the_registry_configs():
  """configs/models/<name>.gin gives exactly registry.get_config(name)."""
  gin = pytest.importorskip("gin")
  files = sorted(glob.glob(os.path.join(REPO, "configs", "models", "*.gin")))
  assert {os.path.basename(f)[:-4] for f in files} == set(registry.NAMES)
  gin.clear_config()
  try:
    for f in files:  # all at once: the scopes must keep them apart
      gin.parse_config_file(f)
    for name in registry.NAMES:
      ref = gin.query_parameter(f"%{name.upper()}")
      assert ref.scoped_configurable_fn() == registry.get_config(name), name
  finally:
    gin.clear_config()


def test_compiler_options_reach_the_loop_and_keep_the_output():
  """`compiler_options` are given to XLA for the decoding loops and keep
  programs apart in the engine's cache, and they change how the loop runs,
  not what it emits. On CPU, XLA hands a verification's matmuls (several
  rows) to YNNPACK by default; with `CPU_EIGEN_MATMULS` the optimized
  program has no YNNPACK fusion left, and greedy speculative decoding still
  returns the target's own greedy output."""
  if jax.default_backend() != "cpu":
    pytest.skip("XLA:CPU options")
  definition = t5.T5Def(registry.get_config("t5_tiny"))
  target = Model(definition, definition.init_params(jax.random.PRNGKey(0)))
  draft = Model(definition, definition.init_params(jax.random.PRNGKey(1)))
  ids = np.array([[5, 6, 7, 8, 1]], np.int32)

  def program_text(options):
    fn = engine.build_speculative(
        definition, definition, 3, 8, sampling.SamplingConfig(0.0),
        compiler_options=api.compiler_options_key(options))
    seeds, rows = checks.seeds(0, 1)  # pylint: disable=protected-access
    return fn.lower(target.params, draft.params, ids, seeds,
                    rows).compile().as_text()

  assert "ynn" not in program_text(api.CPU_EIGEN_MATMULS).lower()
  baseline = api.generate(target, ids, max_decode_len=8)
  for options in (None, api.CPU_EIGEN_MATMULS):
    spec = api.speculative_generate(target, draft, ids, gamma=3,
                                    max_decode_len=8,
                                    compiler_options=options)
    np.testing.assert_array_equal(spec.tokens, baseline.tokens)
  with pytest.raises(TypeError, match="compiler_options"):
    api.speculative_generate(target, draft, ids, gamma=3, max_decode_len=8,
                             compiler_options=["eigen"])
  # The control: without the option the same program uses YNNPACK (on CPUs
  # XLA builds it for; elsewhere the option's effect cannot be seen).
  if "ynn" not in program_text(None).lower():
    pytest.skip("XLA:CPU uses no YNNPACK on this CPU: nothing to route")
