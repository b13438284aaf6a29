"""Public entry points: `generate` and `speculative_generate`.

They check every argument a user can get wrong BEFORE anything is traced or
compiled, then call the cached jitted loops of `engine.py`. Repeated calls
with the same shapes and settings reuse the compiled loop.
"""

from __future__ import annotations

import contextlib
import dataclasses
import numbers
from typing import Any

import flax.linen as nn
import jax
import numpy as np

from specdec_jax import sampling
from specdec_jax import sharding
from specdec_jax.decoding import engine
from specdec_jax.decoding.protocol import Model
from specdec_jax.decoding.stats import DecodeStats


@dataclasses.dataclass
class DecodeResult:
  """What the decoders return.

  Attributes:
    tokens: int32 [B, max_decode_len] generated tokens (EOS included), 0 after
      each row's end.
    stats: the per-row `DecodeStats` (numpy): lengths, target and draft
      calls, accepted tokens, alpha and its parts, traces.
  """

  tokens: np.ndarray
  stats: DecodeStats


def _check_model(name: str, model: Any) -> Model:
  if not isinstance(model, Model):
    raise TypeError(
        f"{name} must be a specdec_jax.Model (from specdec_jax.load_model), "
        f"got {type(model).__name__}.")
  return model


def _check_positive_int(name: str, value: Any, hint: str) -> int:
  if (isinstance(value, bool) or not isinstance(value, numbers.Integral)
      or value < 1):
    raise ValueError(f"{name} must be an integer >= 1, got {value!r}. {hint}")
  return int(value)


def _check_inputs(input_ids: Any, models: list[tuple[str, Model]]) -> np.ndarray:
  ids = np.asarray(input_ids)
  if ids.ndim != 2 or not np.issubdtype(ids.dtype, np.integer):
    raise ValueError(
        f"input_ids must be an int array [batch, length] (0-padded, each row "
        f"ending in EOS=1), got shape {ids.shape} dtype {ids.dtype}.")
  if ids.shape[0] == 0:
    raise ValueError("input_ids has no rows: pass at least one example.")
  lengths = (ids != 0).sum(axis=1)
  empty = np.flatnonzero(lengths == 0)
  if empty.size:
    raise ValueError(
        f"input rows {empty.tolist()} are empty (all padding). Every row "
        f"needs at least one token; T5 inputs end in EOS (id 1).")
  for name, model in models:
    if ids.min() < 0 or ids.max() >= model.vocab_size:
      raise ValueError(
          f"input_ids hold ids outside [0, {model.vocab_size}) of the {name} "
          f"model's vocabulary (found {ids.min()}..{ids.max()}).")
    limit = model.max_input_len
    if limit is not None and lengths.max() > limit:
      row = int(lengths.argmax())
      raise ValueError(
          f"input row {row} has {int(lengths.max())} tokens but the {name} "
          f"model accepts at most {limit}. Truncate the input (the data "
          f"pipeline's feature length) or raise the model's max_input_len.")
  return ids.astype(np.int32)


def _seeds(seed: Any, batch: int) -> tuple[np.ndarray, np.ndarray]:
  """(seeds [B], rows [B]) for `engine.row_keys`.

  An int seed s gives row b the key fold_in(key(s), b). An array of B seeds
  gives row b the key fold_in(key(seed[b]), 0): the same as a batch-1 call
  with seed=seed[b], which is what makes batched runs reproducible row by row.
  """
  if isinstance(seed, numbers.Integral):
    return (np.full((batch,), seed, np.int32),
            np.arange(batch, dtype=np.int32))
  seeds = np.asarray(seed)
  if seeds.shape != (batch,) or not np.issubdtype(seeds.dtype, np.integer):
    raise ValueError(
        f"seed must be an int or an int array of one seed per row "
        f"([{batch}]), got {seeds.shape} {seeds.dtype}.")
  return seeds.astype(np.int32), np.zeros((batch,), np.int32)


def _run(fn, params: list[Any], arrays: list[np.ndarray],
         mesh: jax.sharding.Mesh | None) -> DecodeResult:
  """Calls a jitted loop, on `mesh` when given, and fetches the result.

  With a mesh, per-row inputs are placed over `data` (replicated when the
  batch does not divide) and tracing happens under the logical axis rules, so
  the models' activation and cache constraints take effect. Parameters are
  used where they already live (see `load_model(mesh=...)`).
  """
  if mesh is None:
    context = contextlib.nullcontext()
  else:
    rows = sharding.batch_sharding(mesh, arrays[0].shape[0])
    arrays = [sharding.put(a, rows) for a in arrays]
    context = contextlib.ExitStack()
    context.enter_context(jax.set_mesh(mesh))
    context.enter_context(nn.logical_axis_rules(sharding.logical_axis_rules()))
  with context:
    tokens, stats = fn(*params, *arrays)
  tokens, stats = sharding.gather((tokens, stats))
  return DecodeResult(tokens=tokens, stats=stats)


def generate(model: Model, input_ids: Any, *, max_decode_len: int,
             temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
             seed: Any = 0,
             mesh: jax.sharding.Mesh | None = None) -> DecodeResult:
  """Plain autoregressive decoding: one target call per token.

  Args:
    model: the model to decode with.
    input_ids: int [batch, length], 0-padded, each row ending in EOS (1).
      For a decoder-only model the row is the prompt.
    max_decode_len: the most tokens generated per row.
    temperature, top_k, top_p: see `sampling.SamplingConfig`.
    seed: int, or one int per row (see `DecodeResult` and `_seeds`).
    mesh: run sharded on this mesh (see `specdec_jax.sharding`).

  Returns:
    A `DecodeResult`.
  """
  model = _check_model("model", model)
  max_decode_len = _check_positive_int("max_decode_len", max_decode_len,
                                       "It bounds the generated tokens.")
  sampler = sampling.SamplingConfig(temperature, top_k, top_p)
  ids = _check_inputs(input_ids, [("target", model)])
  seeds, rows = _seeds(seed, ids.shape[0])
  fn = engine.build_generate(model.definition, max_decode_len, sampler)
  return _run(fn, [model.params], [ids, seeds, rows], mesh)


def speculative_generate(target: Model, draft: Model, input_ids: Any, *,
                         gamma: int, max_decode_len: int,
                         temperature: float = 0.0, top_k: int = 0,
                         top_p: float = 1.0, seed: Any = 0,
                         lenience: float = 1.0,
                         record_trace: bool = False,
                         mesh: jax.sharding.Mesh | None = None
                         ) -> DecodeResult:
  """Speculative decoding (Algorithm 1): exact samples from the target.

  Args:
    target: the model whose output distribution is kept.
    draft: the cheaper approximation model; same vocabulary size.
    input_ids: int [batch, length], 0-padded, each row ending in EOS (1).
    gamma: draft tokens per iteration (static; >= 1).
    max_decode_len: the most tokens generated per row.
    temperature, top_k, top_p: applied identically to target and draft.
    seed: int, or one int per row.
    lenience: in (0, 1]; 1 (default) is exact, smaller is the paper's lossy
      variant.
    record_trace: also return per-iteration draft tokens, accepted counts and
      target tokens (`DecodeStats.trace_*`, [B, max_decode_len, ...]) for
      plots.
    mesh: run sharded on this mesh (see `specdec_jax.sharding`).

  Returns:
    A `DecodeResult`.
  """
  target = _check_model("target", target)
  draft = _check_model("draft", draft)
  gamma = _check_positive_int("gamma", gamma,
                              "It is the number of draft tokens per step.")
  max_decode_len = _check_positive_int("max_decode_len", max_decode_len,
                                       "It bounds the generated tokens.")
  lenience = sampling.validate_lenience(lenience)
  sampler = sampling.SamplingConfig(temperature, top_k, top_p)
  if target.vocab_size != draft.vocab_size:
    raise ValueError(
        f"draft and target vocabularies differ in size (target "
        f"{target.vocab_size}, draft {draft.vocab_size}): speculative "
        f"decoding compares their distributions token by token, so both "
        f"models must share one vocabulary.")
  ids = _check_inputs(input_ids, [("target", target), ("draft", draft)])
  seeds, rows = _seeds(seed, ids.shape[0])
  fn = engine.build_speculative(target.definition, draft.definition, gamma,
                                max_decode_len, sampler, lenience,
                                bool(record_trace))
  return _run(fn, [target.params, draft.params], [ids, seeds, rows], mesh)
