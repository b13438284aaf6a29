"""What every composite drafter shares: a drafter built from other drafters
(`cascades.CascadeDef`, `horizontal.HorizontalDef`), usable only as the draft
of `speculative_generate`.

A composite definition subclasses `CompositeDef` and says what it is made
of (`parts`, with the key of each part's parameters), which part it mostly
runs (`top_key`) and how its parts' call sizes combine; the walkers here
(`call_sizes`, `top_model`, `levels_of`, `models_of`) then work for any
nesting of them without knowing their classes.
"""

from __future__ import annotations

import abc
import dataclasses
import numbers
from typing import Any

from specdec_jax.decoding.protocol import Model
from specdec_jax.decoding.protocol import vocab_fingerprint

_INT32_MAX = 2**31 - 1


class CompositeDef(abc.ABC):
  """Base of the drafters made of other drafters; a frozen dataclass whose
  parameters travel as {key: part params} for the keys of `parts`. What
  every composite shares is here: its vocabulary and input limit come from
  its parts, and it cannot be decoded on its own (no prefill/extend)."""

  top_key: str = ""  # the part whose model the drafter mostly runs
  what: str = "a composite drafter"  # its name in errors

  @abc.abstractmethod
  def parts(self) -> tuple[tuple[str, Any], ...]:
    """(params key, definition) of each part, top first; the key also
    names the dataclass field that holds the part (`with_parts`)."""

  def with_parts(self, **parts: Any) -> "CompositeDef":
    """The same drafter over other part definitions, by key (a narrow
    draft widened to its target's vocabulary, `widths.widen`)."""
    return dataclasses.replace(self, **parts)

  @abc.abstractmethod
  def combine_sizes(self, part_sizes):
    """This drafter's `call_sizes` from its parts' (in `parts` order)."""

  @property
  def vocab_size(self) -> int:
    return self.parts()[0][1].vocab_size

  @property
  def max_input_len(self) -> int | None:
    limits = [d.max_input_len for _, d in self.parts()
              if d.max_input_len is not None]
    return min(limits) if limits else None

  def prefill(self, params, input_ids, num_decode_positions):
    raise TypeError(f"{self.what} is a drafter, not a model: pass it as the "
                    "draft of speculative_generate.")

  def extend(self, params, cache, tokens, positions):
    raise TypeError(f"{self.what} is a drafter, not a model: pass it as the "
                    "draft of speculative_generate.")


def size_argument(name: str, value: Any) -> int:
  """int(value) for an integer (Python or numpy) in [1, 2**31 - 1]; else a
  ValueError naming the argument (sizes index int32 buffers on device)."""
  if (isinstance(value, bool) or not isinstance(value, numbers.Integral)
      or value < 1):
    raise ValueError(f"{name} must be an integer >= 1, got {value!r}.")
  if value > _INT32_MAX:
    raise ValueError(f"{name}={value} is beyond int32 ({_INT32_MAX}): "
                     f"decoding sizes index int32 buffers; use a value "
                     f"thousands of times smaller.")
  return int(value)


def call_sizes(definition: Any) -> tuple[list[tuple[Any, int]], int]:
  """([(definition, tokens per call)] of every plain model a draft runs,
  top first, and the extra positions its buffers need). A plain draft
  extends 2 tokens per call; a composite combines its parts'
  (`CompositeDef.combine_sizes`)."""
  if isinstance(definition, CompositeDef):
    return definition.combine_sizes(
        [call_sizes(d) for _, d in definition.parts()])
  return [(definition, 2)], 0


def tree_shape_of(definition: Any) -> Any:
  """The `TreeShape` a draft definition proposes on when it is a token tree
  (it declares `tree_shape`, as `drafts.trees.TreeDef`), else None."""
  return getattr(definition, "tree_shape", None)


def refuse_trees(what: str, *parts: tuple[str, Model]) -> None:
  """A TypeError naming the part that is a token tree (`trees.TreeDef`,
  which declares `tree_shape`): a tree drafts only for the target, its
  walk and cache moves live in the engine's iteration."""
  for name, m in parts:
    if getattr(m.definition, "tree_shape", None) is not None:
      raise TypeError(
          f"{what}: {name} is a token tree (sd.tree), which can only be the "
          f"draft of speculative_generate itself; pass its plain model here "
          f"instead.")


def shared_vocab(what: str, *parts: tuple[str, Model]) -> Any:
  """The vocabulary the named parts share (the first one carried; None if
  none carries one); a ValueError naming both parts when two carry
  different ones (the target is compared with the result, so every part's
  vocabulary is checked against it)."""
  known = [(n, m) for n, m in parts if vocab_fingerprint(m) is not None]
  for n, m in known[1:]:
    if vocab_fingerprint(m) != vocab_fingerprint(known[0][1]):
      raise ValueError(
          f"{what}: {known[0][0]} and {n} carry different vocabularies of "
          f"the same size (tokenizer fingerprints "
          f"{vocab_fingerprint(known[0][1])[0]} vs {vocab_fingerprint(m)[0]}"
          f"): every level must share the target's vocabulary.")
  return known[0][1].vocab if known else next(
      (m.vocab for _, m in parts if m.vocab is not None), None)


def either(a, b):
  """Elementwise or of two optional flags."""
  return None if a is None else a | b


def top_model(draft: Model) -> Model:
  """The model a draft mostly runs: itself, a cascade's top model, a
  horizontal drafter's early part (recursively)."""
  definition, params = draft.definition, draft.params
  while isinstance(definition, CompositeDef):
    key = definition.top_key
    definition, params = dict(definition.parts())[key], params[key]
  return Model(definition, params, draft.vocab)


def levels_of(draft: Model) -> list[tuple[tuple[str, ...], Model]]:
  """(path into the draft's params, model) of every plain model a draft
  runs (itself, or each level of a cascade or part of a horizontal
  drafter), top first; each carries the draft's vocabulary."""
  definition, params = draft.definition, draft.params
  if not isinstance(definition, CompositeDef):
    return [((), draft)]
  parts = definition.parts()
  return [((key,) + path, m) for key, d in parts
          for path, m in levels_of(Model(d, params[key], draft.vocab))]


def models_of(draft: Model) -> list[Model]:
  """Every plain model a draft runs (`levels_of` without the paths)."""
  return [m for _, m in levels_of(draft)]
