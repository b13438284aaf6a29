"""Drafts narrower than their target: one vocabulary width for the loop.

Gemma 3 270M and 1B have 262,144 ids; 4B and above 262,208 (64 image
tokens more), with one tokenizer: the narrow model's ids are the first ids
of the wide one. Such a draft is exact as it is. It never proposes an id it
lacks, so its q is zero there, and Algorithm 1's residual
max(0, p - q) / (1 - beta) keeps the target's whole mass on those ids: a
rejection draws them exactly as often as the target's distribution lacks
them. `widen` makes that literal for the engine: the draft's logits are
padded to the target's width with `PAD_LOGIT`, whose probability is 0 at
every temperature, so every drafter (a chain, a tree, a cascade, a stop
rule) works on one width. An id the draft lacks that it must read (the
target emitted it, or a prompt holds it) is fed to it as `FILL_ID`: its
next q then conditions on another prefix, which changes how often it is
accepted, never what the loop samples (a q is whatever the draft proposed
from).

A draft wider than its target is refused (`check_widths`): it could
propose ids the target cannot score. Whether two widths share a tokenizer
is `checks.check_compatible`'s question (the SentencePiece models'
fingerprints).

Dimension letters: B batch, K tokens fed, V the target's vocabulary.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp

from specdec_jax.decoding import composite
from specdec_jax.decoding import protocol
from specdec_jax.decoding.protocol import Model

# The logit of an id the draft lacks: exp() of it (or of it over any
# temperature) is 0 in float32, and a sum of a [B, K, V] block of them stays
# finite (the loop's non-finite check sums logits).
PAD_LOGIT = -1e9
# What the draft reads in place of an id it lacks: Gemma's <unk>. Not 0,
# the padding a prompt's length is counted by: a prompt ending in such an
# id would start the draft a position early.
FILL_ID = 3
# The definition's parts a narrow draft hands on unchanged (each only if
# the inner definition has it: `hasattr` answers as for the inner one).
_DELEGATED = ("copy_slots", "cache_logical_axes", "param_shapes",
              "param_logical_axes", "init_params")


@dataclasses.dataclass(frozen=True)
class WidenedDef:
  """A draft `ModelDef` over the first `inner.vocab_size` of `width` ids:
  logits [B, K, width], PAD_LOGIT past the inner width; same parameters.

  Attributes:
    inner: the draft's own definition.
    width: the target's vocabulary size V.
  """

  inner: Any
  width: int

  @property
  def family(self) -> str | None:
    return protocol.family(self.inner)

  @property
  def vocab_size(self) -> int:
    return self.width

  @property
  def max_input_len(self) -> int | None:
    return self.inner.max_input_len

  @property
  def config(self) -> Any:
    return getattr(self.inner, "config", None)

  def __getattr__(self, name: str) -> Any:
    if name in _DELEGATED:
      return getattr(self.inner, name)
    raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

  def _known(self, ids):
    return jnp.where(ids < self.inner.vocab_size, ids, FILL_ID)

  def prefill(self, params, input_ids, num_decode_positions):
    return self.inner.prefill(params, self._known(input_ids),
                              num_decode_positions)

  def extend(self, params, cache, tokens, positions, tree=None):
    """The inner `extend` on tokens [B, K] (ids it lacks read as FILL_ID);
    logits [B, K, V] padded with PAD_LOGIT."""
    args = (params, cache, self._known(tokens), positions)
    logits, cache = (self.inner.extend(*args) if tree is None
                     else self.inner.extend(*args, tree))
    pad = self.width - logits.shape[-1]
    logits = jnp.pad(logits, [(0, 0)] * (logits.ndim - 1) + [(0, pad)],
                     constant_values=PAD_LOGIT)
    return logits, cache


def check_widths(target_size: int, draft_size: int,
                 draft_name: str = "draft") -> None:
  """Refuses a draft wider than its target, naming both sizes."""
  if draft_size > target_size:
    raise ValueError(
        f"the {draft_name}'s vocabulary ({draft_size:,} ids) is wider than "
        f"the target's ({target_size:,}): a draft may be narrower than its "
        f"target (its ids the target's first ones, as Gemma 3 1B's 262,144 "
        f"beside 27B's 262,208), never wider, since it could propose ids "
        f"the target cannot score. Use a draft of at most {target_size:,} "
        f"ids (or the wider model as the target).")


def widen(definition: Any, width: int) -> Any:
  """`definition` as a draft of a target with `width` ids: itself at that
  width, a `WidenedDef` when narrower, a composite (cascade, horizontal
  drafter, tree) with each part widened; a wider one raises
  (`check_widths`)."""
  if isinstance(definition, composite.CompositeDef):
    parts = {key: widen(part, width) for key, part in definition.parts()}
    if all(parts[key] is part for key, part in definition.parts()):
      return definition  # nothing narrower inside: left as it is
    return definition.with_parts(**parts)
  check_widths(width, definition.vocab_size)
  if definition.vocab_size == width:
    return definition
  return WidenedDef(definition, width)


def widen_model(draft: Model, width: int) -> Model:
  """The draft `Model` with its definition widened to `width` ids (same
  parameters and vocabulary)."""
  definition = widen(draft.definition, width)
  if definition is draft.definition:
    return draft
  return Model(definition, draft.params, draft.vocab)
