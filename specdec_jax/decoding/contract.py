"""Whether an object handed to the decoder honours its contract: an
acceptance rule (`acceptance.AcceptanceRule`), a draft definition, a
drafter (`protocol.Drafter`) and what its `propose` returns.

Each check raises `errors.ContractError` naming the member and what it must
be, before anything compiles: the host's run when a decoder is made; the
proposal's at trace time, which precedes compiling (shapes only, nothing
runs on device). A researcher's new drafter or rule thus fails with a
sentence about itself, not deep inside `vmap` or `while_loop`.

Dimension letters: B batch, G most tokens per proposal, M proposed nodes,
I nodes with children, V vocabulary, D the drafter's levels.
"""

from __future__ import annotations

import numbers
from typing import Any

import jax
import numpy as np

from specdec_jax.decoding import acceptance
from specdec_jax.decoding.protocol import ModelCall
from specdec_jax.decoding.tree_shape import TreeShape
from specdec_jax.errors import ContractError

GUIDE = "docs/extending.md"
DEFINITION_MEMBERS = ("vocab_size", "max_input_len")
DRAFTER_MEMBERS = ("shape", "gamma", "depth", "extra_width", "calls",
                   "checks_finite", "init", "propose", "commit", "nonfinite")


def check_rule(rule: Any, lenience: float = 1.0) -> None:
  """An acceptance rule (None: the default) with every member, hashable
  (it keys the compiled loop), and no `lenience` beside it (lenience
  belongs to the default rule)."""
  if rule is None:
    return
  name = type(rule).__name__
  missing = [m for m in acceptance.RULE_MEMBERS if not hasattr(rule, m)]
  if missing:
    raise ContractError(
        f"rule {name} has no {', '.join(missing)}: an acceptance rule has "
        f"the members of acceptance.AcceptanceRule "
        f"({', '.join(acceptance.RULE_MEMBERS)}); {GUIDE} writes one.")
  for flag in ("uses_q", "exact"):
    if not isinstance(getattr(rule, flag), (bool, np.bool_)):
      raise ContractError(f"rule {name}.{flag} must be True or False, got "
                          f"{getattr(rule, flag)!r}.")
  _hashable(rule, f"rule {name}", "a rule")
  if lenience != 1.0:
    raise ValueError(
        f"lenience={lenience} with rule={name}: lenience is the default "
        f"rule's setting; pass it in the rule instead, e.g. "
        f"rule=acceptance.Sampled({lenience}).")


def _hashable(obj: Any, what: str, kind: str) -> None:
  try:
    hash(obj)
  except TypeError:
    raise ContractError(
        f"{what} is not hashable: {kind} is part of the compiled loop's "
        f"key; make it a frozen dataclass "
        f"(@dataclasses.dataclass(frozen=True)).") from None


def is_model(definition: Any) -> bool:
  """Whether a definition is a model (`protocol.ModelDef`: it decodes on
  its own) rather than a drafter's definition (`make_drafter`)."""
  return (not hasattr(definition, "make_drafter")
          and callable(getattr(definition, "prefill", None))
          and callable(getattr(definition, "extend", None)))


def check_definition(role: str, definition: Any) -> None:
  """A draft's definition: `vocab_size`, `max_input_len`, hashable, and
  either `make_drafter` (a drafter's) or `prefill` and `extend` (a
  model's)."""
  name = type(definition).__name__
  missing = [m for m in DEFINITION_MEMBERS if not hasattr(definition, m)]
  if not hasattr(definition, "make_drafter") and not is_model(definition):
    missing.append("make_drafter")
  if missing:
    raise ContractError(
        f"the {role}'s definition {name} has no {', '.join(missing)}: a "
        f"draft definition has vocab_size, max_input_len (None: any input "
        f"length) and make_drafter(gamma, sampler, refeed, rule), which "
        f"builds its drafter (a model has prefill and extend instead of "
        f"make_drafter); {GUIDE}.")
  _hashable(definition, f"the {role}'s definition {name}", "a definition")


def check_drafter(drafter: Any, definition: Any) -> Any:
  """The drafter `definition.make_drafter` built, with every member of
  `protocol.Drafter` of the right kind; returns it."""
  name = (f"the drafter {type(drafter).__name__} (from "
          f"{type(definition).__name__}.make_drafter)")
  missing = [m for m in DRAFTER_MEMBERS if not hasattr(drafter, m)]
  if missing:
    raise ContractError(
        f"{name} has no {', '.join(missing)}: a drafter has the members of "
        f"protocol.Drafter ({', '.join(DRAFTER_MEMBERS)}); subclass "
        f"protocol.DrafterBase for the defaults of a chain; {GUIDE}.")
  shape = drafter.shape
  if not isinstance(shape, TreeShape):
    raise ContractError(f"{name}.shape must be a TreeShape "
                        f"(TreeShape.chain(gamma) for a chain), got "
                        f"{shape!r}.")
  for member, low in (("gamma", 1), ("depth", 1), ("extra_width", 0)):
    value = getattr(drafter, member)
    if (isinstance(value, bool) or not isinstance(value, numbers.Integral)
        or value < low):
      raise ContractError(f"{name}.{member} must be an int >= {low}, got "
                          f"{value!r}.")
  if drafter.gamma != shape.depth:
    raise ContractError(f"{name}.gamma is {drafter.gamma} but its shape is "
                        f"{shape.depth} deep: gamma must be shape.depth.")
  if not isinstance(drafter.checks_finite, (bool, np.bool_)):
    raise ContractError(f"{name}.checks_finite must be True or False, got "
                        f"{drafter.checks_finite!r}.")
  calls = drafter.calls
  if not isinstance(calls, tuple) or not all(
      isinstance(c, ModelCall) for c in calls):
    raise ContractError(f"{name}.calls must be a tuple of "
                        f"protocol.ModelCall (one per model it runs; () for "
                        f"none), got {calls!r}.")
  for member in ("init", "propose", "commit", "nonfinite"):
    if not callable(getattr(drafter, member)):
      raise ContractError(f"{name}.{member} must be a method.")
  return drafter


def check_proposal(drafter: Any, prop: Any, levels: Any, batch: int,
                   vocab: int, uses_q: bool) -> None:
  """What `drafter.propose` returned, at trace time: a `Proposal` and
  `Levels` of the shapes `protocol.Drafter.propose` states."""
  shape, gamma = drafter.shape, drafter.gamma
  m, internal = shape.num_nodes, int(np.sum(shape.num_children > 0))
  q = ((f"float32 [B, I, V] = [{batch}, {internal}, {vocab}] (the q each "
        f"node's children were drawn from)") if uses_q
       else "None (the rule's uses_q is False)")
  want = {"tokens": ((batch, m), "int", f"int32 [B, M] = [{batch}, {m}]"),
          "conf": ((batch, gamma), "float",
                   f"float32 [B, G] = [{batch}, {gamma}]"),
          "length": ((batch,), "int", f"int32 [B] = [{batch}]"),
          "valid": ((batch, m), "bool", f"bool [B, M] = [{batch}, {m}]"),
          "probs": ((batch, internal, vocab), "float", q) if uses_q
                   else (None, None, q)}
  depth = drafter.depth
  for field, wanted in (("calls", depth), ("alpha_sum", depth - 1),
                        ("alpha_count", depth - 1)):
    want["Levels." + field] = ((batch, wanted), None,
                               f"[B, depth] = [{batch}, {wanted}]"
                               if field == "calls" else
                               f"[B, depth - 1] = [{batch}, {wanted}]")
  for field, (dims, kind, text) in want.items():
    holder = levels if field.startswith("Levels.") else prop
    value = getattr(holder, field.removeprefix("Levels."), "missing")
    got = "None" if value is None else getattr(value, "shape", value)
    if dims is None:
      ok = value is None
    else:
      ok = (value is not None and tuple(getattr(value, "shape", ())) == dims
            and (kind is None or _kind(value.dtype) == kind))
    if not ok:
      dtype = getattr(value, "dtype", "")
      raise ContractError(
          f"the drafter {type(drafter).__name__}'s propose returned "
          f"{'Proposal.' if holder is prop else ''}{field} {got} {dtype}; "
          f"it must be {text} ({GUIDE}).")


def check_state(drafter: Any, before: Any, after: Any, member: str) -> None:
  """A drafter's state keeps its structure and shapes across `member`
  (the engine's loop carries it)."""
  shapes = lambda t: jax.tree.map(  # noqa: E731
      lambda x: (tuple(x.shape), str(x.dtype)), t)
  if (jax.tree.structure(before) != jax.tree.structure(after)
      or shapes(before) != shapes(after)):
    raise ContractError(
        f"the drafter {type(drafter).__name__}'s {member} returned a state "
        f"that differs from init's in structure, shapes or dtypes: the loop "
        f"carries the state, which must keep all three.")


def _kind(dtype) -> str:
  if np.issubdtype(dtype, np.bool_):
    return "bool"
  return "int" if np.issubdtype(dtype, np.integer) else "float"
