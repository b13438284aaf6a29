"""Bytes a decoding run needs per device, from shapes alone.

The one memory model of the project: the decoder's input checks
(`decoding.checks.check_memory`), the fit check (`experiments.fit`) and
the planner (`planning.plan`, beside the compiler's own figure) all count
with it.
Nothing is compiled, allocated or read from HLO text: parameter shapes come
from the definition (`param_shapes`, or the arrays a caller holds), cache
shapes from the model's own `prefill` under `jax.eval_shape`
(`cache_shapes`, the one place they are computed) and intermediates from
the jaxprs of `prefill` and `extend`.

Per device. A leaf is divided by the mesh axes its logical axis names map
to (`sharding.logical_axis_rules`; a replicated draft's,
`sharding.replicated_rules`); a dimension its axis does not divide stays
whole, as the runs place it (`sharding.batch_sharding`). Mesh shapes are
(data, model), `sharding.MESH_AXES`.

Assumptions (where the model is an estimate, not a count):
  caches       held once: the loop updates them in place (the planner's
               `cache_copies_in_loops` checks that promise in the HLO).
  activations  three buffers the size of the largest intermediate of one
               model call live at once (prefill at the input length, or an
               extend of the tokens a call scores), that intermediate split
               over `model` (attention scores over heads, MLP hidden over
               mlp, logits over vocab) and over `data` where the batch
               divides; a dtype conversion of an argument is not counted
               (TPU and GPU compilers fuse it; XLA:CPU materialises bfloat16
               weights in float32, see `planning.hlo.cpu_convert_bytes`), nor
               an intermediate the shape of an argument (a cache written in
               place). Plus the float32 logits and probabilities of one
               iteration (target [B, K, V], each draft [B, max(G, K), V]) and
               the int32 token buffers [B, S] (and the trace [B, S, G]).
A compiler's figure (the planner's `memory_analysis`) is the authority on
a TPU: it knows the fusions and the live ranges this model guesses.

Dimension letters: B batch, L input length, S decoder positions of the
caches, K tokens one call scores, G gamma, V vocabulary.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Sequence

import jax
import numpy as np
from jax.sharding import PartitionSpec as P

from specdec_jax import sharding

MeshShape = tuple[int, int]  # (data, model)
ONE_DEVICE: MeshShape = (1, 1)


def abstract(tree: Any) -> Any:
  """Arrays or ShapeDtypeStructs -> ShapeDtypeStructs (no sharding)."""
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)


def _key(params: Any) -> Any:
  """A hashable stand-in for a tree of shapes (the caches' lru key)."""
  leaves, treedef = jax.tree.flatten(params)
  return treedef, tuple((tuple(x.shape), np.dtype(x.dtype)) for x in leaves)


def _unkey(key: Any) -> Any:
  """`_key` -> the tree of ShapeDtypeStructs it stands for."""
  treedef, leaves = key
  return jax.tree.unflatten(
      treedef, [jax.ShapeDtypeStruct(s, d) for s, d in leaves])


def _params(definition: Any, params: Any) -> Any:
  return definition.param_shapes() if params is None else abstract(params)


@functools.lru_cache(maxsize=64)
def _cache_shapes(definition, params_key, batch, input_len, positions):
  ids = jax.ShapeDtypeStruct((batch, input_len), np.int32)
  return jax.eval_shape(
      lambda p, i: definition.prefill(p, i, positions).cache,
      _unkey(params_key), ids)


def cache_shapes(definition: Any, batch: int, input_len: int,
                 positions: int, params: Any = None) -> Any:
  """ShapeDtypeStructs of the cache `definition.prefill` builds for
  [batch, input_len] inputs and `positions` decoder positions (`params`:
  the arrays or shapes to trace with; default the definition's own)."""
  return _cache_shapes(definition, _key(_params(definition, params)),
                       int(batch), int(input_len), int(positions))


def _split(axis: Any, sizes: dict[str, int]) -> int:
  """Devices a dimension on mesh `axis` (None, a name, a tuple) spans."""
  names = () if axis is None else axis if isinstance(axis, tuple) else (
      axis,)
  return int(np.prod([sizes[a] for a in names]))


def mesh_axes(shape: Sequence[int], logical: P, mesh_shape: MeshShape,
              rules=None) -> P:
  """The mesh axes of each dimension of a leaf of `shape` whose logical
  axes are `logical`; None where the axis does not divide the dimension
  (it then stays whole, as `sharding.batch_sharding` keeps rows)."""
  sizes = dict(zip(sharding.MESH_AXES, mesh_shape))
  return P(*[axis if size % _split(axis, sizes) == 0 else None
             for size, axis in zip(shape, tuple(
                 sharding.logical_to_mesh(logical, rules)))])


def tree_bytes(shapes: Any, logical: Any = None,
               mesh_shape: MeshShape = ONE_DEVICE, rules=None) -> int:
  """Bytes per device of a tree laid out by its logical axes (None: whole
  on every device)."""
  leaves = jax.tree.leaves(shapes)
  specs = [P()] * len(leaves) if logical is None else jax.tree.leaves(
      logical, is_leaf=lambda x: isinstance(x, P))
  sizes = dict(zip(sharding.MESH_AXES, mesh_shape))
  total = 0
  for leaf, spec in zip(leaves, specs):
    axes = tuple(mesh_axes(leaf.shape, spec, mesh_shape, rules))
    axes += (None,) * (len(leaf.shape) - len(axes))
    share = np.prod([d // _split(a, sizes) for d, a in zip(leaf.shape, axes)])
    total += int(share) * np.dtype(leaf.dtype).itemsize
  return total


def _rules(replicate: bool):
  return sharding.replicated_rules() if replicate else None


def decoder_weights(params: Any) -> Any:
  """What one decoder step reads: all but the encoder (the embedding table
  is gathered a row at a time unless the logits are tied to it)."""
  return {k: v for k, v in params.items() if k != "encoder"}


def param_bytes(definition: Any, mesh_shape: MeshShape = ONE_DEVICE,
                replicate: bool = False, params: Any = None,
                decoder_only: bool = False) -> int:
  """Bytes per device of the parameters (`decoder_only`: of what one
  decoder step reads, `decoder_weights`)."""
  shapes = _params(definition, params)
  logical = None if replicate or not hasattr(
      definition, "param_logical_axes") else definition.param_logical_axes()
  if decoder_only:
    shapes = decoder_weights(shapes)
    logical = None if logical is None else decoder_weights(logical)
  return tree_bytes(shapes, logical, mesh_shape)


def cache_logical_axes(definition: Any, cache: Any) -> Any:
  """The cache's logical axes (None for models that name none)."""
  if not hasattr(definition, "cache_logical_axes"):
    return None
  return definition.cache_logical_axes(cache)


def cache_bytes(definition: Any, batch: int, input_len: int, positions: int,
                mesh_shape: MeshShape = ONE_DEVICE, replicate: bool = False,
                params: Any = None, min_rank: int = 0) -> list[int]:
  """Bytes per device of each cache leaf (`min_rank` 3: keys and values
  only, not the per-row indices)."""
  cache = cache_shapes(definition, batch, input_len, positions, params)
  logical = cache_logical_axes(definition, cache)
  specs = [None] * len(jax.tree.leaves(cache)) if logical is None else (
      jax.tree.leaves(logical, is_leaf=lambda x: isinstance(x, P)))
  return [tree_bytes(leaf, None if spec is None else [spec], mesh_shape,
                     _rules(replicate))
          for leaf, spec in zip(jax.tree.leaves(cache), specs)
          if leaf.ndim >= min_rank]


def _subjaxprs(value: Any):
  """The jaxprs an equation's parameter holds (a body, branches)."""
  if hasattr(value, "eqns"):
    yield value
  elif hasattr(getattr(value, "jaxpr", None), "eqns"):
    yield value.jaxpr
  elif isinstance(value, (tuple, list)):
    for v in value:
      yield from _subjaxprs(v)


def _largest(closed: Any) -> int:
  """Bytes of the largest intermediate of a closed jaxpr and its
  sub-jaxprs (loops, conditionals, nested calls), except conversions of
  its arguments and buffers the shape of an argument."""
  top = closed.jaxpr
  args = {id(v) for v in top.invars}
  arg_shapes = {(tuple(v.aval.shape), v.aval.dtype) for v in top.invars}

  def walk(jaxpr) -> int:
    best = 0
    for eqn in jaxpr.eqns:
      for sub in (s for p in eqn.params.values() for s in _subjaxprs(p)):
        best = max(best, walk(sub))
      if (eqn.primitive.name == "convert_element_type"
          and id(eqn.invars[0]) in args):
        continue
      for v in eqn.outvars:
        aval = v.aval
        if not hasattr(aval, "shape") or (
            (tuple(aval.shape), aval.dtype) in arg_shapes):
          continue
        itemsize = getattr(aval.dtype, "itemsize", 4)
        best = max(best, int(np.prod(aval.shape)) * itemsize)
    return best

  return walk(top)


@functools.lru_cache(maxsize=64)
def _largest_intermediate(definition, params_key, batch, input_len,
                          positions, num_tokens) -> int:
  params = _unkey(params_key)
  ids = jax.ShapeDtypeStruct((batch, input_len), np.int32)
  prefill = lambda p, i: definition.prefill(p, i, positions)  # noqa: E731
  cache = _cache_shapes(definition, params_key, batch, input_len, positions)
  tokens = jax.ShapeDtypeStruct((batch, num_tokens), np.int32)
  return max(_largest(jax.make_jaxpr(prefill)(params, ids)),
             _largest(jax.make_jaxpr(definition.extend)(params, cache,
                                                        tokens, tokens)))


def largest_intermediate(definition: Any, batch: int, input_len: int,
                         positions: int, num_tokens: int,
                         mesh_shape: MeshShape = ONE_DEVICE,
                         replicate: bool = False, params: Any = None) -> int:
  """Bytes per device of the largest buffer one call of the model makes
  (`prefill`, or an `extend` of `num_tokens`): see the module's
  assumptions."""
  whole = _largest_intermediate(
      definition, _key(_params(definition, params)), int(batch),
      int(input_len), int(positions), int(num_tokens))
  data, model = mesh_shape
  return whole // ((1 if replicate else model) *
                   (data if batch % data == 0 else 1))


@dataclasses.dataclass(frozen=True)
class ModelBytes:
  """One model's bytes per device (see `model_bytes`)."""

  params: int
  cache: int  # all its leaves (keys, values, encoder output, indices)
  largest: int  # the largest intermediate of one call


def model_bytes(definition: Any, batch: int, input_len: int, positions: int,
                num_tokens: int, mesh_shape: MeshShape = ONE_DEVICE,
                replicate: bool = False, params: Any = None) -> ModelBytes:
  """Parameters, cache and largest intermediate per device of a model that
  decodes [batch, input_len] inputs into caches of `positions` and scores
  `num_tokens` a call."""
  args = (batch, input_len, positions)
  return ModelBytes(
      params=param_bytes(definition, mesh_shape, replicate, params),
      cache=sum(cache_bytes(definition, *args, mesh_shape, replicate,
                            params)),
      largest=largest_intermediate(definition, *args, num_tokens, mesh_shape,
                                   replicate, params))


def loop_bytes(models: Sequence[ModelBytes], tokens_per_call: Sequence[int],
               batch: int, vocab: int, positions: int, gamma: int,
               record_trace: bool = False) -> dict[str, int]:
  """Bytes per device of a decoding loop of `models` (target first; each
  scores its `tokens_per_call`): {params, caches, activations, logits,
  tokens, total}; see the module's assumptions."""
  logits = 2 * 4 * batch * vocab * (tokens_per_call[0] + sum(
      max(gamma, t) for t in tokens_per_call[1:]))
  token_buffers = 4 * batch * positions * (1 + (gamma if record_trace else 0))
  out = {"params": sum(m.params for m in models),
         "caches": sum(m.cache for m in models),
         "largest": max(m.largest for m in models),
         "logits": logits, "tokens": token_buffers}
  out["activations"] = 3 * out["largest"] + logits + token_buffers
  out["total"] = out["params"] + out["caches"] + out["activations"]
  return out


def placement(params: Any) -> tuple[MeshShape, bool]:
  """(mesh shape, replicated) of parameters placed by `sharding`; one
  device for arrays not on a (data, model) mesh."""
  leaves = jax.tree.leaves(params)
  layout = getattr(leaves[0], "sharding", None) if leaves else None
  mesh = getattr(layout, "mesh", None)
  if mesh is None or tuple(mesh.axis_names) != sharding.MESH_AXES:
    return ONE_DEVICE, False
  replicated = all(getattr(x, "sharding", layout).is_fully_replicated
                   for x in leaves)
  return (mesh.shape["data"], mesh.shape["model"]), replicated
