"""Tests of the decoder-only GPT-like model (its cache contract: test_model_contract.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.decoding.protocol import ModelDef
from specdec_jax.models import gpt
from specdec_jax.models import registry

# Rows of lengths 5, 2 and 7, each ending in EOS (1) and 0-padded.
PROMPTS = np.array([[5, 6, 7, 8, 1, 0, 0],
                    [9, 1, 0, 0, 0, 0, 0],
                    [3, 4, 5, 6, 7, 8, 1]], np.int32)
LENGTHS = np.array([5, 2, 7])


@pytest.fixture(scope="module")
def model():
  definition = gpt.GPTDef(registry.get_config("gpt_tiny"))
  params = definition.init_params(jax.random.PRNGKey(0))
  jitted = dict(forward=jax.jit(definition.forward),
                prefill=jax.jit(definition.prefill, static_argnums=2),
                extend=jax.jit(definition.extend))
  return definition, params, jitted


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


def test_prompt_longer_than_max_len_is_rejected():
  """A too-long prompt fails before compiling, naming the limit."""
  definition = gpt.GPTDef(registry.get_config("gpt_tiny"))
  with pytest.raises(ValueError, match="max_len=64"):
    definition.prefill(None, np.ones((1, 65), np.int32), 4)
