"""Parameter counts of full-size registered configs, from shallow copies.

Tracing a full-size model's init takes seconds (80 layers: 8 s; the
9B-9B T5Gemma: 3.6 s). A stack's layers are built alike (one layer class,
one config; local and global layers differ in masks, not in weights), so
its count is linear in its depth: L layers hold the count at depth 1 plus
L - 1 times what a second layer adds. The published-size tests of every
family count this way.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax
import numpy as np

from specdec_jax.models import registry


def _at_depth(stack: Any, depth: int) -> Any:
  """A stack config cut to its first `depth` layers (and layer types, where
  they are a field)."""
  fields = {"num_layers": depth}
  if "layer_types" in {f.name for f in dataclasses.fields(stack)}:
    fields["layer_types"] = tuple(stack.layer_types[:depth])
  return dataclasses.replace(stack, **fields)


def count(config: Any) -> int:
  """Parameters of `config`'s definition, from its full shapes."""
  shapes = registry.make_def(config).param_shapes()
  return sum(int(np.prod(s.shape)) for s in jax.tree.leaves(shapes))


def from_two_depths(config: Any, stacks: Sequence[str] = ()) -> int:
  """The parameter count of `config`'s definition, from its shapes at depths
  one and two of each stack (`stacks`: the attributes holding the stack
  configs, e.g. ("encoder", "decoder"); none: `config` is the stack): one
  depth-1 model, then one with each stack at depth 2 in turn."""

  def with_depths(depths):
    if not stacks:
      return _at_depth(config, depths[0])
    return dataclasses.replace(config, **{
        name: _at_depth(getattr(config, name), d)
        for name, d in zip(stacks, depths)})

  names = stacks or (None,)
  ones = [1] * len(names)
  base = count(with_depths(ones))
  total = base
  for i, name in enumerate(names):
    layers = (getattr(config, name) if name else config).num_layers
    two = count(with_depths(ones[:i] + [2] + ones[i + 1:]))
    total += (layers - 1) * (two - base)
  return total
