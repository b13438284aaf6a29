"""The memory model (specdec_jax/memory/footprint.py).

Invariants: the model's parameter bytes are the summed nbytes of a tiny
model's initialised parameters, and its cache bytes the nbytes of the cache
`prefill` really allocates; on the 8 simulated CPU devices, its per-device
bytes are the bytes of the shards device 0 holds, for a model split over
(data, model) and for a replicated draft; the largest intermediate it reads
from the jaxprs is the encoder's float32 attention scores [B, N, L, L] (the
largest buffer of a tiny T5 at a long input), not a parameter's float32
copy.
"""

import flax.linen as nn
import jax
import numpy as np
import pytest

from specdec_jax import sharding
from specdec_jax.memory import footprint
from specdec_jax.models import registry

BATCH, INPUT, POSITIONS = 2, 8, 16


def _definition(name):
  return registry.make_def(registry.get_config(name))


def _nbytes(tree):
  return sum(x.nbytes for x in jax.tree.leaves(tree))


def _on_device_0(tree):
  device = jax.devices()[0]
  return sum(s.data.nbytes for x in jax.tree.leaves(tree)
             for s in x.addressable_shards if s.device == device)


def _cache(definition, params, mesh=None, rules=None):
  ids = np.ones((BATCH, INPUT), np.int32)
  prefill = jax.jit(lambda p, i: definition.prefill(p, i, POSITIONS).cache)
  if mesh is None:
    return prefill(params, ids)
  ids = jax.device_put(ids, sharding.batch_sharding(mesh, BATCH))
  with jax.set_mesh(mesh), nn.logical_axis_rules(
      rules or sharding.logical_axis_rules()):
    return prefill(params, ids)


@pytest.mark.parametrize("name", ["t5_1_1_tiny", "gpt_tiny"])
def test_bytes_from_shapes_are_the_allocated_bytes(name):
  definition = _definition(name)
  params = definition.init_params(jax.random.PRNGKey(0))
  assert footprint.param_bytes(definition) == _nbytes(params)
  assert sum(footprint.cache_bytes(definition, BATCH, INPUT, POSITIONS)) == (
      _nbytes(_cache(definition, params)))


def test_per_device_bytes_are_device_0s_shards():
  if len(jax.devices()) < 8:
    pytest.skip("needs XLA_FLAGS=--xla_force_host_platform_device_count=8")
  definition = _definition("t5_1_1_tiny")
  mesh = sharding.make_mesh(2, 4)
  params = definition.init_params(jax.random.PRNGKey(0))
  for replicate in (False, True):
    placed = sharding.shard_params(definition, params, mesh,
                                   replicate=replicate)
    cache = _cache(definition, placed, mesh,
                   sharding.replicated_rules() if replicate else None)
    assert footprint.placement(placed) == ((2, 4), replicate)
    assert footprint.param_bytes(definition, (2, 4), replicate) == (
        _on_device_0(placed)), replicate
    assert sum(footprint.cache_bytes(definition, BATCH, INPUT, POSITIONS,
                                  (2, 4), replicate)) == (
        _on_device_0(cache)), replicate
  # Split: each device holds less than the whole (the count is not vacuous).
  assert footprint.param_bytes(definition, (2, 4)) < footprint.param_bytes(
      definition)


def test_largest_intermediate_is_the_encoders_attention_scores():
  definition = _definition("t5_1_1_tiny")
  cfg = definition.config
  length = 64
  scores = BATCH * cfg.num_heads * length * length * 4
  assert footprint.largest_intermediate(definition, BATCH, length, POSITIONS,
                                     3) == scores
  # Per device: split over `model` (heads) and `data` (rows).
  assert footprint.largest_intermediate(definition, BATCH, length, POSITIONS,
                                     3, (2, 4)) == scores // 8
