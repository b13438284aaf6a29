"""What every composite drafter shares: a drafter built from other drafters
(`cascades.CascadeDef`, `horizontal.HorizontalDef`, `trees.TreeDef`),
usable only as the draft of `speculative_generate`.

A composite definition subclasses `CompositeDef` and says what it is made
of (`parts`, with the key of each part's parameters); its drafter declares
the rest (`protocol.Drafter`: shape, extra width, the models it calls,
whether it checks for NaN), combining its parts' declarations, so any
drafter can be a part (a model, prompt lookup, another composite, a user's
own) and every reader of a drafter works for any nesting.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import numbers
import operator
from typing import Any

from specdec_jax.decoding import drafters
from specdec_jax.decoding.protocol import Model
from specdec_jax.decoding.protocol import vocab_fingerprint

_INT32_MAX = 2**31 - 1


class CompositeDef(abc.ABC):
  """Base of the drafters made of other drafters; a frozen dataclass whose
  parameters travel as {key: part params} for the keys of `parts`. What
  every composite shares is here: its vocabulary and input limit come from
  its parts, and it cannot be decoded on its own (it has `make_drafter`,
  no prefill/extend)."""

  what: str = "a composite drafter"  # its name in errors

  @abc.abstractmethod
  def parts(self) -> tuple[tuple[str, Any], ...]:
    """(params key, definition) of each part, top first; the key also
    names the dataclass field that holds the part (`with_parts`)."""

  def with_parts(self, **parts: Any) -> "CompositeDef":
    """The same drafter over other part definitions, by key (a narrow
    draft widened to its target's vocabulary, `widths.widen`)."""
    return dataclasses.replace(self, **parts)

  @property
  def vocab_size(self) -> int:
    return self.parts()[0][1].vocab_size

  @property
  def max_input_len(self) -> int | None:
    limits = [d.max_input_len for _, d in self.parts()
              if d.max_input_len is not None]
    return min(limits) if limits else None


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


def refuse_trees(what: str, *parts: tuple[str, Model]) -> None:
  """A TypeError naming the part whose drafter proposes a token tree
  (`sd.tree`, or any drafter whose shape branches): a tree drafts only for
  the target, its walk and cache moves live in the engine's iteration."""
  for name, m in parts:
    if drafters.declared(m, 1).shape.max_children > 1:
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


def either(*flags):
  """Elementwise or of the flags that exist (None where none does): a
  part that checks nothing (prompt lookup) leaves the others' checks."""
  flags = [f for f in flags if f is not None]
  return functools.reduce(operator.or_, flags) if flags else None
