"""Tests of the decoder-only GPT-like model and its cache contract."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.decoding.protocol import ModelDef
from specdec_jax.models import gpt
from specdec_jax.models import layers
from specdec_jax.models import registry

# Rows of lengths 5, 2 and 7, each ending in EOS (1) and 0-padded.
PROMPTS = np.array([[5, 6, 7, 8, 1, 0, 0],
                    [9, 1, 0, 0, 0, 0, 0],
                    [3, 4, 5, 6, 7, 8, 1]], np.int32)
LENGTHS = np.array([5, 2, 7])
CONTINUATION = np.array([[20, 21, 22, 23, 24, 25],
                         [30, 31, 32, 33, 34, 35],
                         [40, 41, 42, 43, 44, 45]], np.int32)


@pytest.fixture(scope="module")
def model():
  definition = gpt.GPTDef(registry.get_config("gpt_tiny"))
  params = definition.init_params(jax.random.PRNGKey(0))
  jitted = dict(forward=jax.jit(definition.forward),
                prefill=jax.jit(definition.prefill, static_argnums=2),
                extend=jax.jit(definition.extend))
  return definition, params, jitted


def _full_row(row, upto):
  """Prompt of `row` (without padding) followed by its continuation."""
  return np.concatenate([PROMPTS[row, :LENGTHS[row]],
                         CONTINUATION[row, :upto]])[None]


def test_param_tree_has_t5x_decoder_only_layout():
  """Params follow t5x/examples/decoder_only: names, shapes, logical axes."""
  definition = gpt.GPTDef(registry.get_config("gpt_tiny"))
  shapes = jax.eval_shape(definition.init_params, jax.random.PRNGKey(0))
  paths = {"/".join(k.key for k in path): leaf.shape
           for path, leaf in jax.tree_util.tree_flatten_with_path(shapes)[0]}
  assert paths["decoder/token_embedder/embedding"] == (128, 32)
  assert paths["decoder/relpos_bias/rel_embedding"] == (4, 32)
  assert paths["decoder/layers_1/self_attention/query/kernel"] == (32, 32)
  assert paths["decoder/layers_1/pre_self_attention_layer_norm/scale"] == (32,)
  assert paths["decoder/layers_0/mlp/wi/kernel"] == (32, 64)
  assert paths["decoder/layers_0/pre_mlp_layer_norm/scale"] == (32,)
  assert paths["decoder/decoder_norm/scale"] == (32,)
  assert paths["decoder/logits_dense/kernel"] == (32, 128)
  axes = definition.param_logical_axes()
  assert tuple(axes["decoder"]["layers_0"]["mlp"]["wi"]["kernel"]) == (
      "embed", "mlp")
  assert isinstance(definition, ModelDef)
  assert definition.max_input_len == 64


@pytest.mark.parametrize("name,millions", [("gpt_97m", 97), ("gpt_6m", 6)])
def test_paper_sizes(name, millions):
  """The paper's GPT-like 97M and 6M configs have about that many params."""
  definition = registry.make_def(registry.get_config(name))
  shapes = jax.eval_shape(definition.init_params, jax.random.PRNGKey(0))
  count = sum(np.prod(s.shape) for s in jax.tree.leaves(shapes))
  assert abs(count / 1e6 - millions) / millions < 0.05, count


def test_prefill_starts_at_last_prompt_token(model):
  """start_token = each row's EOS, start_pos = length - 1, S = L + n + 1."""
  definition, params, jitted = model
  pre = jitted["prefill"](params, PROMPTS, 6)
  np.testing.assert_array_equal(pre.start_token, [1, 1, 1])
  np.testing.assert_array_equal(pre.start_pos, LENGTHS - 1)
  assert pre.start_pos.dtype == jnp.int32
  assert pre.cache.layers[0].key.shape == (3, 4, 8, 7 + 6 + 1)  # [B,N,H,S]
  axes = definition.cache_logical_axes(pre.cache)
  assert jax.tree.structure(axes) == jax.tree.structure(pre.cache)


def test_cached_decoding_equals_uncached_forward(model):
  """prefill + one token at a time == an unpadded forward pass, per row."""
  _, params, jitted = model
  pre = jitted["prefill"](params, PROMPTS, 6)
  cache, tokens, pos = pre.cache, pre.start_token, pre.start_pos
  steps = []
  for step in range(4):
    logits, cache = jitted["extend"](params, cache, tokens[:, None],
                                     pos[:, None])
    steps.append(logits[:, 0])
    tokens, pos = CONTINUATION[:, step], pos + 1
  for row in range(3):
    expected = jitted["forward"](params, _full_row(row, 3))[0]
    np.testing.assert_allclose(
        np.stack([s[row] for s in steps]), expected[LENGTHS[row] - 1:],
        atol=1e-5)


def test_chunk_at_per_row_offsets_equals_single_steps(model):
  """A chunk of K tokens at per-row offsets == K single steps."""
  _, params, jitted = model
  pre = jitted["prefill"](params, PROMPTS, 6)
  singles, cache = [], pre.cache
  tokens, pos = pre.start_token, pre.start_pos
  for step in range(3):
    logits, cache = jitted["extend"](params, cache, tokens[:, None],
                                     pos[:, None])
    singles.append(logits[:, 0])
    tokens, pos = CONTINUATION[:, step], pos + 1
  chunk_tokens = np.concatenate([pre.start_token[:, None],
                                 CONTINUATION[:, :2]], axis=1)
  chunk_pos = np.asarray(pre.start_pos)[:, None] + np.arange(3)
  chunk, _ = jitted["extend"](params, pre.cache, chunk_tokens,
                              chunk_pos.astype(np.int32))
  np.testing.assert_allclose(chunk, np.stack(singles, axis=1), atol=1e-5)


def test_repeated_position_changes_nothing(model):
  """Re-feeding the start token at its own position changes nothing."""
  _, params, jitted = model
  pre = jitted["prefill"](params, PROMPTS, 6)
  start = np.asarray(pre.start_pos)[:, None]
  tokens = np.concatenate([pre.start_token[:, None], CONTINUATION[:, :2]], 1)
  plain, plain_cache = jitted["extend"](params, pre.cache, tokens,
                                        (start + np.arange(3)).astype(np.int32))
  tokens2 = np.concatenate([pre.start_token[:, None], tokens], axis=1)
  pos2 = start + np.array([0, 0, 1, 2])
  twice, twice_cache = jitted["extend"](params, pre.cache, tokens2,
                                        pos2.astype(np.int32))
  np.testing.assert_allclose(twice[:, 1:], plain, atol=1e-6)
  for a, b in zip(jax.tree.leaves(plain_cache), jax.tree.leaves(twice_cache)):
    np.testing.assert_allclose(a, b, atol=1e-6)


def test_stale_slots_do_not_affect_logits(model):
  """Rollback by position: slots past the current position are invisible."""
  _, params, jitted = model
  pre = jitted["prefill"](params, PROMPTS, 6)
  start = np.asarray(pre.start_pos)
  draft = np.concatenate([pre.start_token[:, None], CONTINUATION[:, :4]], 1)
  _, cache = jitted["extend"](params, pre.cache, draft,
                              (start[:, None] + np.arange(5)).astype(np.int32))
  # Reject after the first draft token; also scribble over later slots.
  keep = start + 2  # slots <= start + 1 stay valid
  stale = (np.arange(cache.layers[0].length)[None] >= keep[:, None])  # [B,S]
  cache = gpt.GPTCache(layers=tuple(
      layers.KVCache(jnp.where(stale[:, None, None, :], 1e3, kv.key),
                     jnp.where(stale[:, None, :, None], -5.0, kv.value))
      for kv in cache.layers))
  new = np.array([[60], [61], [62]], np.int32)
  logits, _ = jitted["extend"](params, cache, new,
                               keep[:, None].astype(np.int32))
  for row in range(3):
    seq = np.concatenate([_full_row(row, 1), new[row:row + 1]], axis=1)
    expected = jitted["forward"](params, seq)[0, -1]
    np.testing.assert_allclose(logits[row, 0], expected, atol=1e-5)


def test_greedy_decode_equals_argmax_of_teacher_forced_pass(model):
  """Greedy decoding through the cache == argmax of a forward pass over it."""
  _, params, jitted = model
  pre = jitted["prefill"](params, PROMPTS, 8)
  cache, tokens, pos = pre.cache, pre.start_token, pre.start_pos
  generated = []
  for _ in range(8):
    logits, cache = jitted["extend"](params, cache, tokens[:, None],
                                     pos[:, None])
    tokens, pos = jnp.argmax(logits[:, 0], -1).astype(jnp.int32), pos + 1
    generated.append(tokens)
  generated = np.stack(generated, axis=1)
  for row in range(3):
    seq = np.concatenate([PROMPTS[row, :LENGTHS[row]], generated[row]])[None]
    teacher = jitted["forward"](params, seq)[0]
    np.testing.assert_array_equal(
        np.argmax(teacher[LENGTHS[row] - 1:-1], -1), generated[row])


def test_prompt_longer_than_max_len_is_rejected():
  """A too-long prompt fails before compiling, naming the limit."""
  definition = gpt.GPTDef(registry.get_config("gpt_tiny"))
  with pytest.raises(ValueError, match="max_len=64"):
    definition.prefill(None, np.ones((1, 65), np.int32), 4)
