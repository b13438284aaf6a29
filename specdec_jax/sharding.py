"""Meshes, logical axis rules and shardings (SPMD over `data` x `model`).

Models name the axes of every parameter, activation and cache leaf with T5X's
logical vocabulary (batch, length, embed, mlp, heads, kv, joined_kv, vocab,
relpos_buckets; caches: cache_batch, cache_sequence, cache_heads, cache_kv).
`logical_axis_rules` is the one place that maps those names to mesh axes:
the batch goes over `data`; vocabulary, MLP, heads and the joined head
dimension over `model` (Megatron-style tensor parallelism); embedding, head
dimension and sequence stay unsharded.

Everything runs through `jax.jit` with `NamedSharding`s (no pjit). Target and
draft may use different layouts: by default both follow the same rules, and a
small draft can instead be replicated (`replicate=True` in `shard_params`),
which removes its all-reduces from the inner drafting loop at the cost of
memory it can easily afford: the decoding loop then traces the draft under
`replicated_rules`, so its activation constraints name no model axis either.
"""

from __future__ import annotations

from typing import Any, Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

MESH_AXES = ("data", "model")


def logical_axis_rules() -> tuple[tuple[str, str | None], ...]:
  """Logical axis name -> mesh axis (None: replicated)."""
  return (
      ("batch", "data"),
      ("vocab", "model"),
      ("mlp", "model"),
      ("heads", "model"),
      ("joined_kv", "model"),
      ("embed", None),
      ("kv", None),
      ("length", None),
      ("relpos_buckets", None),
      ("cache_batch", "data"),
      ("cache_heads", "model"),
      ("cache_sequence", None),
      ("cache_kv", None),
  )


def replicated_rules() -> tuple[tuple[str, str | None], ...]:
  """The rules for a model whose parameters are whole on every device (a
  replicated draft): rows still over `data`, nothing over `model`, so its
  steps run on each device's own copy without a collective."""
  return tuple((name, axis if axis == "data" else None)
               for name, axis in logical_axis_rules())


def make_mesh(data: int = 1, model: int = 1,
              devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A `data` x `model` device mesh.

  Args:
    data: size of the data-parallel axis (batch rows).
    model: size of the model-parallel axis (heads, MLP, vocabulary).
    devices: the devices to use (default: all of `jax.devices()`, in order,
      of which the first data * model are taken).

  Returns:
    A `jax.sharding.Mesh` with axis names ("data", "model").
  """
  for name, size in [("data", data), ("model", model)]:
    if not isinstance(size, (int, np.integer)) or size < 1:
      raise ValueError(f"mesh axis {name!r} must be a positive int, got "
                       f"{size!r}.")
  devices = list(jax.devices() if devices is None else devices)
  needed = data * model
  if needed > len(devices):
    raise ValueError(
        f"a {data}x{model} (data x model) mesh needs {needed} devices but only "
        f"{len(devices)} exist ({devices[0].platform}). Use a smaller mesh, or "
        f"on CPU simulate devices with "
        f"XLA_FLAGS=--xla_force_host_platform_device_count={needed}.")
  grid = np.asarray(devices[:needed], dtype=object).reshape(data, model)
  return Mesh(grid, MESH_AXES)


def logical_to_mesh(spec: P, rules=None) -> P:
  """A PartitionSpec of logical names -> one of mesh axes."""
  return nn.logical_to_mesh_axes(tuple(spec),
                                 rules or logical_axis_rules())


def _path_name(path) -> str:
  return "/".join(str(getattr(k, "key", getattr(k, "name", k))) for k in path)


def check_divisible(shapes: Any, logical_specs: Any, mesh: Mesh,
                    rules=None) -> None:
  """Raises ValueError naming the first leaf whose sharded dims don't divide.

  Args:
    shapes: pytree of arrays or ShapeDtypeStructs.
    logical_specs: the same tree of PartitionSpecs of logical names.
    mesh: the target mesh.
    rules: logical axis rules (default `logical_axis_rules()`).
  """
  flat_shapes = jax.tree_util.tree_flatten_with_path(shapes)[0]
  flat_specs = jax.tree_util.tree_leaves(
      logical_specs, is_leaf=lambda x: isinstance(x, P))
  if len(flat_shapes) != len(flat_specs):
    raise ValueError(f"the parameter tree has {len(flat_shapes)} leaves but "
                     f"its logical axes name {len(flat_specs)}.")
  for (path, leaf), spec in zip(flat_shapes, flat_specs):
    mesh_spec = logical_to_mesh(spec, rules)
    for dim, (size, logical, axis) in enumerate(
        zip(leaf.shape, tuple(spec), tuple(mesh_spec))):
      if axis is None:
        continue
      axes = axis if isinstance(axis, tuple) else (axis,)
      parts = int(np.prod([mesh.shape[a] for a in axes]))
      if size % parts:
        raise ValueError(
            f"parameter {_path_name(path)} has shape {tuple(leaf.shape)}: its "
            f"dimension {dim} ({logical!r} -> mesh axis {axis!r}) of size "
            f"{size} is not divisible by the {parts} devices on that axis. "
            f"Choose a mesh whose {axis!r} size divides {size}.")


def divides(definition: Any, params: Any, mesh: Mesh, rules=None) -> bool:
  """Whether every sharded dimension of `params` divides its mesh axes."""
  if not hasattr(definition, "param_logical_axes"):
    return True
  try:
    check_divisible(params, definition.param_logical_axes(), mesh, rules)
  except ValueError:
    return False
  return True


def _whole_where_indivisible(shape: Sequence[int], spec: P, mesh: Mesh) -> P:
  """`spec` (mesh axes) with None where its axes do not divide the
  dimension: that dimension stays whole on every device."""
  def parts(axis):
    axes = () if axis is None else axis if isinstance(axis, tuple) else (
        axis,)
    return int(np.prod([mesh.shape[a] for a in axes]))
  return P(*[axis if size % parts(axis) == 0 else None
             for size, axis in zip(shape, tuple(spec))])


def param_shardings(definition: Any, params: Any, mesh: Mesh, *,
                    replicate: bool = False, rules=None,
                    whole_if_indivisible: bool = False) -> Any:
  """NamedShardings for `params` of `definition` (checked for divisibility).

  Definitions without `param_logical_axes` (n-gram and table models) and
  `replicate=True` give fully replicated shardings. `whole_if_indivisible`:
  instead of raising, a dimension its mesh axes do not divide stays whole
  (the demo target's 6 heads on 4 devices; its MLP and vocabulary are
  still split), as `memory.footprint` counts it.
  """
  if replicate or not hasattr(definition, "param_logical_axes"):
    return jax.tree.map(lambda _: NamedSharding(mesh, P()), params)
  specs = definition.param_logical_axes()
  if not whole_if_indivisible:
    check_divisible(params, specs, mesh, rules)
    return jax.tree.map(
        lambda spec: NamedSharding(mesh, logical_to_mesh(spec, rules)), specs,
        is_leaf=lambda x: isinstance(x, P))
  flat_specs = jax.tree.leaves(specs, is_leaf=lambda x: isinstance(x, P))
  leaves, treedef = jax.tree.flatten(params)
  return jax.tree.unflatten(treedef, [
      NamedSharding(mesh, _whole_where_indivisible(
          leaf.shape, logical_to_mesh(spec, rules), mesh))
      for leaf, spec in zip(leaves, flat_specs)])


def put(value: Any, sharding: NamedSharding) -> jax.Array:
  """Places one host array with `sharding`, on one host or many.

  Every process passes the same full value; each device receives only its
  shard, so no device ever holds the full array of a sharded parameter.
  """
  value = np.asarray(value)
  return jax.make_array_from_callback(value.shape, sharding,
                                      lambda index: value[index])


def shard_params(definition: Any, params: Any, mesh: Mesh, *,
                 replicate: bool = False, rules=None) -> Any:
  """Places `params` on `mesh` leaf by leaf (see `param_shardings`)."""
  shardings = param_shardings(definition, params, mesh, replicate=replicate,
                              rules=rules)
  return jax.tree.map(put, params, shardings)


def batch_sharding(mesh: Mesh, batch: int) -> NamedSharding:
  """Rows over `data` when they divide evenly, else replicated rows."""
  if batch % mesh.shape["data"] == 0:
    return NamedSharding(mesh, P("data"))
  return NamedSharding(mesh, P())


def gather(tree: Any) -> Any:
  """Device arrays -> host numpy, across processes where they span several.

  Arrays on a mesh of several processes are gathered collectively (every
  process must call this); arrays on this process's own devices are only
  fetched. So process 0 alone may decode on its first device (a training
  run's evaluation) without a collective its peers never join."""
  spans = any(isinstance(leaf, jax.Array) and not leaf.is_fully_addressable
              for leaf in jax.tree.leaves(tree))
  if spans:
    # only on multi-host runs.
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    tree = multihost_utils.process_allgather(tree, tiled=True)
  return jax.tree.map(np.asarray, jax.device_get(tree))
