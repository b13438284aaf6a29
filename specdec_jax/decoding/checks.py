"""Checks of everything a caller of the decoder can get wrong, run BEFORE
anything is traced or compiled: the models and their compatibility, the
inputs, sizes, seeds, compiler options, the loop's buffers against the
memory free (counted by `memory.footprint`), and the non-finite policy. Each
failure names the problem and its fix."""

from __future__ import annotations

import functools
import numbers
import os
from typing import Any
import warnings

import jax
import numpy as np

from specdec_jax.decoding import contract
from specdec_jax.decoding import drafters
from specdec_jax.decoding import protocol
from specdec_jax.decoding import widths
from specdec_jax.decoding.protocol import Model
from specdec_jax.decoding.stats import DecodeStats
from specdec_jax.memory import footprint
from specdec_jax.tokens import DEFAULT_STOP_IDS
from specdec_jax.tokens import EOS_ID

NONFINITE_CHOICES = ("error", "warn", "ignore")
_INT32 = np.iinfo(np.int32)


def check_model(name: str, model: Any, cascade_ok: bool = False) -> Model:
  """A `Model` whose definition is a model (`cascade_ok`: or any draft's
  definition, `contract.check_definition`)."""
  if not isinstance(model, Model):
    raise TypeError(
        f"{name} must be a specdec_jax.Model (from specdec_jax.load_model), "
        f"got {type(model).__name__}.")
  if cascade_ok:
    contract.check_definition(name, model.definition)
  elif not contract.is_model(model.definition):
    raise TypeError(
        f"{name} is a drafter ({type(model.definition).__name__}: a "
        f"cascade, a horizontal drafter, a tree, prompt lookup), which can "
        f"only be the draft of speculative_generate; pass its top model "
        f"here instead.")
  return model


def compiler_options_key(options: Any) -> tuple:
  """XLA compiler options {name: value} as sorted (name, value) pairs, the
  hashable form the engine's program caches key on; None -> ()."""
  if options is None:
    return ()
  if not isinstance(options, dict) and not hasattr(options, "items"):
    raise TypeError(f"compiler_options must be a mapping of XLA option names "
                    f"to values (e.g. CPU_EIGEN_MATMULS), got {options!r}")
  for name, value in options.items():
    if not isinstance(name, str) or not isinstance(
        value, (str, bool, int, float)):
      raise TypeError(f"compiler_options: {name!r}: {value!r} is not an XLA "
                      "option (a name and a string, bool or number)")
  key = tuple(sorted(options.items()))
  _check_xla_knows(key)
  return key


@functools.lru_cache(maxsize=64)
def _check_xla_knows(options: tuple) -> None:
  """Refuses options this backend's XLA does not know, before the decoding
  loop compiles (it would fail only then): compiles a one-op program with
  them, once per set of options."""
  if not options:
    return
  try:
    jax.jit(lambda x: x + 1, compiler_options=dict(options)).lower(
        np.int32(0)).compile()
  except Exception as e:  # pylint: disable=broad-except  (XLA's runtime error)
    first = (str(e).strip().splitlines() or [""])[0][:300]
    raise ValueError(
        f"compiler_options {dict(options)!r} are refused by XLA on "
        f"{jax.default_backend()}: {first}. The options this jaxlib knows "
        "are listed by: XLA_FLAGS=--help python -c 'import jax; "
        "jax.numpy.ones(1)' (the --xla_... lines; give them without the "
        "dashes). Backend-specific ones (xla_tpu_*, xla_gpu_*) exist only "
        "on that backend.") from None


def check_positive_int(name: str, value: Any, hint: str) -> int:
  if (isinstance(value, bool) or not isinstance(value, numbers.Integral)
      or value < 1):
    raise ValueError(f"{name} must be an integer >= 1, got {value!r}. {hint}")
  check_width(int(value), name)
  return int(value)


def default_stop_ids(model: Any) -> tuple[int, ...]:
  """The ids a decoder not told any stops at: the model vocabulary's own
  (`stop_ids` of a tokenizer.json's, its generation_config.json's EOS ids:
  Llama 3.1 Instruct's 128001, 128008 and 128009), else EOS (1)."""
  ids = getattr(getattr(model, "vocab", None), "stop_ids", None)
  return tuple(ids) if ids else DEFAULT_STOP_IDS


def check_stop_ids(stop_ids: Any, vocab_size: int | None) -> tuple[int, ...]:
  """The ids a row stops at, as the loop's static key: sorted, each once.

  Args:
    stop_ids: a non-empty sequence of ints in [1, vocab_size).
    vocab_size: the model's vocabulary size (None: not checked here).

  Raises:
    TypeError, ValueError: naming the problem and the fix.
  """
  example = f"e.g. stop_ids=({EOS_ID},) (EOS, the default) or ({EOS_ID}, 107)"
  if isinstance(stop_ids, (str, bytes)) or not isinstance(
      stop_ids, (tuple, list, np.ndarray)):
    raise TypeError(f"stop_ids must be a tuple of token ids, {example}; got "
                    f"{stop_ids!r} ({type(stop_ids).__name__}).")
  ids = list(stop_ids)
  if not ids:
    raise ValueError(f"stop_ids is empty: a row would never end before "
                     f"max_decode_len. Name at least one id, {example}.")
  bad = [t for t in ids if isinstance(t, (bool, np.bool_))
         or not isinstance(t, numbers.Integral)]
  if bad:
    raise TypeError(f"stop_ids must be ints, got {bad[0]!r} "
                    f"({type(bad[0]).__name__}) in {stop_ids!r}; {example}.")
  ids = sorted({int(t) for t in ids})
  high = ("" if vocab_size is None
          else f" and below the vocabulary size {vocab_size}")
  out = [t for t in ids
         if t < 1 or (vocab_size is not None and t >= vocab_size)]
  if out:
    raise ValueError(
        f"stop_ids {out} are outside the ids a row can stop at: each must "
        f"be >= 1 (0 is the pad id that fills a row after its end){high}. "
        f"Use the ids of the end tokens, {example}.")
  return tuple(ids)


def check_width(value: int, what: str) -> None:
  """Decoding sizes index int32 buffers on device: refuse, before tracing,
  any beyond int32 (JAX would raise an OverflowError deep inside)."""
  if value > _INT32.max:
    raise ValueError(
        f"{what} = {value} is beyond int32 ({_INT32.max}): decoding sizes "
        f"index int32 buffers. Use a far smaller value (the buffers grow "
        f"with it; see docs/reliability.md).")


def family_of(model: Model) -> str | None:
  """'encoder-decoder', 'decoder-only', or None (a model we cannot tell)."""
  return protocol.family(model.definition)


def check_inputs(input_ids: Any,
                  models: list[tuple[str, Model]]) -> np.ndarray:
  try:
    ids = np.asarray(input_ids)
  except (ValueError, TypeError):  # numpy refuses ragged nested lists
    ids = None
  if ids is None or (ids.dtype == object and ids.ndim == 1
                     and isinstance(input_ids, (list, tuple))):
    raise ValueError(
        "input_ids must be a rectangular int array [batch, length]: the rows "
        "given have different lengths. Pad every row with 0 on the right to "
        "the longest row (each row ending in EOS=1).")
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
  if any(family_of(m) == protocol.ENCODER_DECODER
         and getattr(m.definition, "reads_inputs", True) for _, m in models):
    # T5 saw every training input end in EOS; without it the encoder output,
    # and so the translation, changes silently.
    last_index = ids.shape[1] - 1 - np.argmax(ids[:, ::-1] != 0, axis=1)
    last = ids[np.arange(ids.shape[0]), last_index]
    bad = np.flatnonzero(last != EOS_ID)
    if bad.size:
      raise ValueError(
          f"input rows {bad[:10].tolist()} do not end in EOS (id {EOS_ID}): "
          f"an encoder-decoder (T5) input is the tokens then EOS, then 0 "
          f"padding. Append {EOS_ID} after each row's last token (seqio's "
          f"append_eos, or the data pipeline, does this).")
  return ids.astype(np.int32)


def seeds(seed: Any, batch: int) -> tuple[np.ndarray, np.ndarray]:
  """(seeds [B], rows [B]) for `engine.row_keys`.

  An int seed s gives row b the key fold_in(key(s), b). An array of B seeds
  gives row b the key fold_in(key(seed[b]), 0): the same as a batch-1 call
  with seed=seed[b], which is what makes batched runs reproducible row by row.
  """
  if isinstance(seed, numbers.Integral) and not isinstance(seed, bool):
    seeds = np.full((batch,), int(seed), np.int64)
    rows = np.arange(batch, dtype=np.int32)
  else:
    try:
      seeds = np.asarray(seed)
    except (ValueError, TypeError):
      seeds = np.asarray(None)
    if (seeds.shape != (batch,) or seeds.dtype == bool
        or not np.issubdtype(seeds.dtype, np.integer)):
      raise TypeError(
          f"seed must be an int or an int array of one seed per row "
          f"([{batch}]), got {seed!r:.80} ({type(seed).__name__}).")
    rows = np.zeros((batch,), np.int32)
  if seeds.min() < _INT32.min or seeds.max() > _INT32.max:
    raise ValueError(
        f"seed must fit in int32 ([{_INT32.min}, {_INT32.max}]), got "
        f"{seed!r:.80}: reduce it, e.g. seed % 2**31.")
  return seeds.astype(np.int32), rows


def check_compatible(target: Model, draft: Model,
                     drafter: protocol.Drafter | None = None) -> None:
  """A vocabulary no wider than the target's (`widths`), the same family
  and (when both carry one) the same SentencePiece model as the target,
  for the draft and every model it runs (`drafter.calls`, the draft's
  declared drafter by default: each level of a cascade, each part of a
  horizontal drafter), naming the one that differs. (`cascade` and
  `horizontal` refuse parts whose vocabularies differ, so the draft's
  vocabulary stands for all of them.)"""
  drafter = drafters.declared(draft, 1) if drafter is None else drafter
  levels = [(call.path, model)
            for call, model in drafters.called_models(draft, drafter)]

  def name(i, path):
    if len(levels) == 1:
      return "draft"
    return (f"draft's model {i + 1} of {len(levels)}, top first "
            f"(params{''.join(f'[{k!r}]' for k in path)})")

  for i, (path, model) in enumerate(levels):
    # A narrower draft is widened to the target's ids (`widths.widen`).
    widths.check_widths(target.vocab_size, model.vocab_size, name(i, path))
  # Each level predicts the target's decoder sequence from the same start;
  # with a target of unknown family, the draft's levels must agree.
  want, what = family_of(target), "target"
  for i, (path, model) in enumerate(levels):
    family = family_of(model)
    if family is None:
      continue
    if want is None:
      want, what = family, name(i, path)
    elif family != want:
      raise ValueError(
          f"the {what} is {want} but the {name(i, path)} is {family}: a "
          f"draft must predict the target's decoder sequence from the same "
          f"start. Use a draft of the target's family ({want}), or an "
          f"n-gram drafter (ngram.fit_ngram(..., decoder_only="
          f"{want == 'decoder-only'})).")
  mine = protocol.vocab_fingerprint(target)
  theirs = protocol.vocab_fingerprint(draft)
  if mine is not None and theirs is not None and mine != theirs:
    sizes = ("of the same size" if target.vocab_size == draft.vocab_size
             else f"(target {target.vocab_size:,} ids, draft "
             f"{draft.vocab_size:,})")
    raise ValueError(
        f"target and draft carry different vocabularies {sizes} "
        f"(tokenizer fingerprints {mine[0]}, {mine[1]} extra ids vs "
        f"{theirs[0]}, {theirs[1]}): the same id means different pieces, so "
        f"drafts would almost never be accepted. Use a draft trained with "
        f"the target's vocabulary.")


def available_bytes() -> tuple[int | None, str]:
  """Free memory of the default device, and what it is (None: unknown)."""
  try:
    stats = jax.devices()[0].memory_stats()
  except Exception:  # pylint: disable=broad-except  (backends differ)
    stats = None
  if stats and "bytes_limit" in stats:
    free = int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))
    return free, f"free on {jax.devices()[0].device_kind}"
  try:
    free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return int(free), "available host RAM"
  except (ValueError, OSError, AttributeError):
    return None, "unknown"


# Below this many B x (G+1) x positions, every buffer of a sane model fits
# (an attention score tensor of 64 heads is then 1 GiB): skip the estimate.
_ESTIMATE_ABOVE = 1 << 22


def check_memory(models: list[tuple[Model, int]],
                 ids_shape: tuple[int, int], gamma: int, max_decode_len: int,
                 record_trace: bool, what: str, extra_width: int = 0) -> None:
  """Refuses, before compiling, a loop whose buffers cannot fit.

  Counts, per device of the models' mesh, each model's cache, the largest
  buffer of one model call, the float32 logits and probabilities of one
  iteration and the token buffers (`footprint.loop_bytes`), against the
  memory free beside the parameters already placed. `models`: (model, the
  most tokens it scores a call) of the target (gamma + 1, a tree's nodes +
  1), then of each model the draft declares (`protocol.Drafter.calls`);
  `extra_width` the drafter's scratch positions. A rough bound: it catches
  the impossible (gamma=10**6, max_decode_len=10**7), not the tight.
  Skipped for sizes that always fit (`_ESTIMATE_ABOVE`).
  """
  batch = ids_shape[0]
  width = max_decode_len + gamma + 1 + extra_width
  tokens_per_call = [t for _, t in models]
  if batch * width * max(tokens_per_call) <= _ESTIMATE_ABOVE:
    return
  counted = []
  for model, tokens in models:
    mesh_shape, replicated = footprint.placement(model.params)
    counted.append(footprint.model_bytes(
        model.definition, batch, ids_shape[1], width, tokens, mesh_shape,
        replicated, params=model.params))
  need = footprint.loop_bytes(counted, tokens_per_call, batch,
                              models[0][0].vocab_size, width, gamma,
                              record_trace)
  # The parameters are on the device already: `available_bytes` is what
  # is left beside them.
  total = need["total"] - need["params"]
  free, where = available_bytes()
  if free is not None and total > free:
    raise ValueError(
        f"{what} needs at least {total / 2**30:,.1f} GiB of buffers (caches "
        f"{need['caches'] / 2**30:,.1f} GiB for {width} positions x batch "
        f"{batch}, the largest buffer of one model call "
        f"{need['largest'] / 2**30:,.1f} GiB, logits/probabilities "
        f"{need['logits'] / 2**30:,.1f} GiB) but only "
        f"{free / 2**30:,.1f} GiB is {where}: lower max_decode_len, gamma "
        f"or the batch size.")


def check_tree(shape: Any, target: Model, gamma: int, max_decode_len: int,
               lenience: float, draft_stop: Any) -> None:
  """Refuses, before compiling, settings a token tree cannot take."""
  name = f"the tree {shape.describe()} ({shape.num_nodes} nodes, depth " \
         f"{shape.depth})"
  if gamma != shape.depth:
    raise ValueError(
        f"gamma={gamma} but {name} proposes up to {shape.depth} tokens per "
        f"iteration: pass gamma={shape.depth} (a tree's gamma is its depth).")
  if shape.depth > max_decode_len:
    raise ValueError(
        f"{name} is deeper than max_decode_len={max_decode_len}: its deepest "
        f"nodes could never be emitted; use a shallower tree or raise "
        f"max_decode_len.")
  if shape.max_children > target.vocab_size:
    raise ValueError(
        f"{name} gives a node {shape.max_children} children but the "
        f"vocabulary has {target.vocab_size} tokens: children are distinct "
        f"tokens; narrow the tree.")
  if lenience != 1.0:
    raise ValueError(
        f"lenience={lenience}: token trees are verified exactly only; use "
        f"lenience=1.0 with a tree (or a chain draft for the lossy variant).")
  if draft_stop is not None:
    raise ValueError(
        "draft_stop rules shorten a chain of draft tokens; a token tree has a "
        "static shape: pass draft_stop=None with a tree (or a plain draft "
        "with the rule).")
  if not hasattr(target.definition, "copy_slots"):
    raise TypeError(
        f"the target {type(target.definition).__name__} cannot score token "
        f"trees (it needs extend(..., tree=) and copy_slots, as T5 and the "
        f"GPT-like model have).")


def check_nonfinite(stats: DecodeStats, on_nonfinite: str,
                     names: list[tuple[str, str]]) -> None:
  for key, name in names:
    flags = getattr(stats, key)
    rows = np.flatnonzero(flags) if flags is not None else np.zeros(0)
    if not rows.size:
      continue
    message = (
        f"the {name} model produced non-finite logits (NaN or inf) for rows "
        f"{rows[:10].tolist()}: its outputs for them are meaningless. Check "
        f"its parameters (load_model(..., check_finite=True)) and its dtype "
        f"(float16 overflows; use bfloat16 or float32). Pass "
        f"on_nonfinite='warn' to get the result anyway (stats.{key}).")
    if on_nonfinite == "error":
      raise FloatingPointError(message)
    warnings.warn(message, RuntimeWarning, stacklevel=3)


def check_on_nonfinite(value: Any) -> str:
  if value not in NONFINITE_CHOICES:
    raise ValueError(f"on_nonfinite must be one of {NONFINITE_CHOICES}, got "
                     f"{value!r}.")
  return value
