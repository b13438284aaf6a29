"""What the Flax model definitions (T5, GPT-like) share.

A definition is a frozen, hashable dataclass holding only its config (so it
can be a static argument of `jax.jit`); the parameters travel separately.
Subclasses name their linen module class and the dummy inputs `init` needs.
"""

from __future__ import annotations

import functools
from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp


@functools.lru_cache(maxsize=32)
def _jitted_init(module_class: type, config: Any):
  """One compiled initialiser per (module, config): random inits would
  otherwise recompile on every call."""
  return jax.jit(module_class(config).init)


@functools.lru_cache(maxsize=64)
def _abstract_params(definition: "FlaxModelDef") -> tuple[Any, Any]:
  """(ShapeDtypeStructs, PartitionSpecs of logical axis names) of the
  parameters, from one abstract init per definition: tracing a large
  model's init takes seconds, and planning asks for both many times."""
  inputs = definition._init_inputs()  # pylint: disable=protected-access
  boxed = jax.eval_shape(definition.module.init, jax.random.PRNGKey(0),
                         *inputs)["params"]
  return nn.unbox(boxed), nn.get_partition_spec(boxed)


class FlaxModelDef:
  """Shared half of `T5Def` and `GPTDef` (see `decoding.protocol.ModelDef`).

  Subclasses are frozen dataclasses with a `config` field and set
  `module_class` and `num_init_inputs` (the int [1, 4] arrays `__call__`
  takes).
  """

  module_class: ClassVar[type]
  num_init_inputs: ClassVar[int] = 1
  config: Any

  @property
  def module(self) -> nn.Module:
    return self.module_class(self.config)

  @property
  def vocab_size(self) -> int:
    return self.config.vocab_size

  def _apply(self, params, *args, method):
    return self.module.apply({"params": params}, *args, method=method)

  def _init_inputs(self) -> tuple[jax.Array, ...]:
    return (jnp.ones((1, 4), jnp.int32),) * self.num_init_inputs

  def init_params(self, rng: jax.Array) -> Any:
    """Random parameters (T5X initialisers), unboxed, in `param_dtype`."""
    variables = _jitted_init(self.module_class, self.config)(
        rng, *self._init_inputs())
    return nn.unbox(variables["params"])

  def param_shapes(self) -> Any:
    """ShapeDtypeStructs of the parameters (no arrays, computed once)."""
    return _abstract_params(self)[0]

  def param_logical_axes(self) -> Any:
    """PartitionSpecs of logical axis names, same tree as the parameters."""
    return _abstract_params(self)[1]


def constrain_cache(cache: Any, logical_axes: Any) -> Any:
  """Applies the cache's logical axis names (a no-op without rules)."""
  return jax.tree.map(nn.with_logical_constraint, cache, logical_axes)
