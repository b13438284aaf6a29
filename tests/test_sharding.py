"""Sharded decoding on 8 simulated CPU devices (see conftest.py).

Invariants: parameters really are split over the `model` axis as the logical
rules say; decoding on a 2x4 (data x model) mesh gives the same tokens as on
one device, greedy and sampled; rows sharded over `data` with ragged
acceptance match batch-1 runs; bad meshes fail with a clear message.
"""

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from specdec_jax import Model
from specdec_jax import generate, speculative_generate
from specdec_jax import sharding
from specdec_jax.models import registry
from tests import helpers


def _t5(name, seed, **overrides):
  cfg = registry.get_config(name, **overrides)
  definition = registry.make_def(cfg)
  return Model(definition=definition,
               params=definition.init_params(jax.random.PRNGKey(seed)))


@pytest.fixture(scope="module")
def models():
  if len(jax.devices()) < 8:
    pytest.skip("needs XLA_FLAGS=--xla_force_host_platform_device_count=8")
  target = _t5("t5_1_1_tiny", 0)
  draft = _t5("t5_1_1_tiny", 1, num_encoder_layers=1, num_decoder_layers=1)
  return target, draft


def _on_mesh(model, mesh, replicate=False):
  params = sharding.shard_params(model.definition, model.params, mesh,
                                 replicate=replicate)
  return Model(model.definition, params, model.vocab)


def _inputs(batch=4):
  rng = np.random.default_rng(0)
  ids = np.zeros((batch, 7), np.int32)
  for b in range(batch):
    n = rng.integers(2, 7)
    ids[b, :n - 1] = rng.integers(2, 128, size=n - 1)
    ids[b, n - 1] = 1
  return ids


def test_parameters_are_sharded_by_logical_rules(models):
  """MLP, heads and vocabulary dims are split over `model`; norms are not."""
  target, _ = models
  mesh = sharding.make_mesh(data=2, model=4)
  params = _on_mesh(target, mesh).params
  wi = params["decoder"]["layers_0"]["mlp"]["wi_0"]["kernel"]
  assert wi.sharding.spec == P(None, "model")
  assert wi.addressable_shards[0].data.shape == (32, 16)
  query = params["encoder"]["layers_0"]["attention"]["query"]["kernel"]
  assert query.sharding.spec == P(None, "model")
  logits = params["decoder"]["logits_dense"]["kernel"]
  assert logits.sharding.spec == P(None, "model")
  scale = params["decoder"]["decoder_norm"]["scale"]
  assert scale.sharding.spec == P(None) or scale.sharding.spec == P()
  assert scale.addressable_shards[0].data.shape == scale.shape


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_sharded_speculative_equals_single_device(models, temperature):
  """2x4 mesh == one device: greedy identical; sampled identical for the
  same seed (per-row keys do not depend on the layout; a reduction-order
  flip of a near-tie could change a sample, which these tiny float32 models
  do not hit)."""
  target, draft = models
  mesh = sharding.make_mesh(data=2, model=4)
  ids = _inputs()
  kwargs = dict(gamma=3, max_decode_len=10, temperature=temperature, seed=7)
  single = speculative_generate(target, draft, ids, **kwargs)
  sharded = speculative_generate(_on_mesh(target, mesh),
                                 _on_mesh(draft, mesh, replicate=True), ids,
                                 mesh=mesh, **kwargs)
  np.testing.assert_array_equal(sharded.tokens, single.tokens)
  np.testing.assert_array_equal(sharded.stats.accepted_histogram,
                                single.stats.accepted_histogram)
  base = generate(_on_mesh(target, mesh), ids, max_decode_len=10,
                  temperature=temperature, seed=7, mesh=mesh)
  ref = generate(target, ids, max_decode_len=10, temperature=temperature,
                 seed=7)
  np.testing.assert_array_equal(base.tokens, ref.tokens)
  if temperature == 0.0:
    np.testing.assert_array_equal(sharded.tokens, base.tokens)


def test_data_sharded_rows_match_batch_one_runs():
  """Rows split over `data` with ragged acceptance equal batch-1 runs."""
  if len(jax.devices()) < 8:
    pytest.skip("needs 8 devices")
  target = helpers.table_model(12, seed=5, eos_bias=0.5)
  draft = helpers.table_model(12, seed=6, base=target, noise=1.0)
  mesh = sharding.make_mesh(data=4, model=2)
  ids = np.array([[5, 7, 1, 0], [3, 1, 0, 0], [9, 4, 6, 1], [2, 1, 0, 0]],
                 np.int32)
  seeds = np.array([3, 1, 4, 1], np.int32)
  batch = speculative_generate(target, draft, ids, gamma=3, max_decode_len=10,
                               temperature=1.0, seed=seeds, mesh=mesh)
  assert len({tuple(h) for h in batch.stats.accepted_histogram}) > 1
  for b in range(4):
    one = speculative_generate(target, draft, ids[b:b + 1], gamma=3,
                               max_decode_len=10, temperature=1.0,
                               seed=int(seeds[b]))
    np.testing.assert_array_equal(one.tokens[0], batch.tokens[b])


def test_bad_meshes_fail_clearly(models):
  """Too many devices, or axis sizes that do not divide a sharded dim."""
  target, _ = models
  with pytest.raises(ValueError, match="needs 16 devices"):
    sharding.make_mesh(data=4, model=4)
  mesh = sharding.make_mesh(data=1, model=8)  # 4 heads cannot split 8 ways
  with pytest.raises(ValueError, match=r"not divisible by the 8 devices"):
    sharding.shard_params(target.definition, target.params, mesh)
  replicated = sharding.param_shardings(target.definition, target.params, mesh,
                                        replicate=True)
  assert all(isinstance(s, NamedSharding) and s.spec == P()
             for s in jax.tree.leaves(replicated))
