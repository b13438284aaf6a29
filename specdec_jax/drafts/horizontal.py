"""Horizontal drafters: different drafters for the early and the late
positions of a proposal.

`horizontal(early, late, split=j)`: the first j tokens of each proposal
from one drafter (a model or a cascade), the rest from another, which
continues from the early tokens. Every token is a sample from the q of the
model that proposed it, and that q enters the acceptance, so the output
stays exact. Refeed: see `HorizontalDrafter`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax
import jax
import jax.numpy as jnp

from specdec_jax import sampling
from specdec_jax.decoding import composite
from specdec_jax.decoding.cursor import Stream
from specdec_jax.decoding.cursor import write_rows
from specdec_jax.decoding import protocol
from specdec_jax.decoding.protocol import KeepFn
from specdec_jax.decoding.protocol import chain_proposal
from specdec_jax.decoding.protocol import Levels
from specdec_jax.decoding.drafters import make_drafter
from specdec_jax.decoding.protocol import Model


@dataclasses.dataclass(frozen=True)
class HorizontalDef(composite.CompositeDef):
  """Different drafters for the early and the late positions of a proposal.

  The first `split` draft tokens of every iteration come from `early`, the
  rest (up to gamma) from `late`, which continues from the early tokens.
  Like `CascadeDef` it is only usable as a draft; its parameters travel as
  {"early": ..., "late": ...}.

  Attributes:
    early, late: any drafters' definitions (models, cascades, prompt
      lookup, further HorizontalDefs, your own).
    split: how many positions the early drafter proposes (>= 1).
  """

  early: Any
  late: Any
  split: int

  what = "a horizontal drafter"

  def parts(self) -> tuple[tuple[str, Any], ...]:
    return (("early", self.early), ("late", self.late))

  def make_drafter(self, gamma, sampler, refeed, rule):
    return HorizontalDrafter(self, gamma, sampler, refeed, rule)


def horizontal(early: Model, late: Model, *, split: int) -> Model:
  """A draft whose first `split` tokens per iteration come from `early` and
  the rest from `late` (e.g. a strong draft where acceptance matters most,
  then a cheap one). Every token is still a sample from the q of the model
  that proposed it, and that q enters the acceptance, so output is exact.

  Args:
    early: the drafter of positions 1..split (a model or a cascade).
    late: the drafter of the later positions.
    split: >= 1; speculative_generate's gamma must exceed it for `late` to
      be used.

  Returns:
    A `Model` usable as the draft of `speculative_generate`.
  """
  for name, m in (("early", early), ("late", late)):
    if not isinstance(m, Model):
      raise TypeError(f"horizontal: {name} must be a specdec_jax.Model, got "
                      f"{type(m).__name__}.")
  composite.refuse_trees("horizontal", ("early", early), ("late", late))
  split = composite.size_argument("horizontal: split", split)
  if early.vocab_size != late.vocab_size:
    raise ValueError(f"horizontal: vocabularies differ in size (early "
                     f"{early.vocab_size}, late {late.vocab_size}).")
  return Model(definition=HorizontalDef(early.definition, late.definition,
                                        int(split)),
               params={"early": early.params, "late": late.params},
               vocab=composite.shared_vocab("horizontal", ("early", early),
                                   ("late", late)))


@flax.struct.dataclass
class HorizontalState:
  """A horizontal drafter's carried state: each part's drafter state."""

  early: Any
  late: Any


class HorizontalDrafter(protocol.DrafterBase):
  """Positions 1..split from the early drafter, the rest from the late one.

  Refeed: the late drafter is fed every iteration from length - refeed up to
  the early proposal's end (refeed + split tokens back), so it stays in sync
  even on iterations where its own tokens were not used. The early drafter
  can fall gamma - split tokens further behind than a plain drafter (an
  iteration may accept late tokens it never saw), so its refeed grows by
  that much.
  """

  def __init__(self, definition: HorizontalDef, gamma: int,
               sampler: sampling.SamplingConfig, refeed: int, rule: Any):
    self.split = min(definition.split, gamma)
    self.gamma = gamma
    late_gamma = max(gamma - self.split, 1)
    self.early = make_drafter(definition.early, self.split, sampler,
                              refeed + gamma - self.split, rule)
    self.late = make_drafter(definition.late, late_gamma, sampler,
                             refeed + self.split, rule)
    self.depth = self.early.depth + self.late.depth
    self.extra_width = max(self.early.extra_width, self.late.extra_width)
    self.calls = (protocol.under("early", self.early.calls)
                  + protocol.under("late", self.late.calls))
    self.checks_finite = self.early.checks_finite or self.late.checks_finite

  def init(self, params, input_ids, num_positions,
           check_finite: bool = True) -> HorizontalState:
    return HorizontalState(
        early=self.early.init(params["early"], input_ids, num_positions,
                              check_finite),
        late=self.late.init(params["late"], input_ids, num_positions,
                            check_finite))

  def __repr__(self) -> str:
    return (f"HorizontalDrafter(split={self.split}, gamma={self.gamma}, "
            f"early={self.early!r}, late={self.late!r})")

  def nonfinite(self, state: HorizontalState):
    return composite.either(self.early.nonfinite(state.early),
                            self.late.nonfinite(state.late))

  def propose(self, params, state: HorizontalState, stream: Stream, keys,
              keep: KeepFn | None, limit: jax.Array):
    """Same contract as `ModelDrafter.propose`."""
    split, gamma = self.split, self.gamma
    batch = stream.length.shape[0]
    early_keep = None
    if keep is not None:
      early_keep = lambda t, c: keep(
          jnp.pad(t, ((0, 0), (0, gamma - split))),
          jnp.pad(c, ((0, 0), (0, gamma - split)), constant_values=1.0)
      )[:, :split]
    e_limit = jnp.minimum(limit, split) if keep is not None else jnp.full(
        (batch,), split, jnp.int32)
    early, e_state, e_stats = self.early.propose(
        params["early"], state.early, stream, keys[:, :split], early_keep,
        e_limit)
    # The late drafter continues after the early tokens.
    local = stream.replace(
        tokens=write_rows(stream.tokens, stream.length, early.tokens),
        length=stream.length + split)
    late_keep = None
    if keep is not None:
      late_keep = lambda t, c: keep(
          jnp.concatenate([early.tokens, t], 1)[:, :gamma],
          jnp.concatenate([early.conf, c], 1)[:, :gamma])[:, split:]
    l_limit = jnp.clip(limit - split, 1, self.late.gamma)
    late_keys = keys[:, split:] if gamma > split else keys[:, :1]
    late, l_state, l_stats = self.late.propose(
        params["late"], state.late, local, late_keys, late_keep, l_limit)
    n_late = gamma - split
    tokens = jnp.concatenate([early.tokens, late.tokens[:, :n_late]], 1)
    conf = jnp.concatenate([early.conf, late.conf[:, :n_late]], 1)
    probs = None
    if early.probs is not None:
      probs = jnp.concatenate([early.probs, late.probs[:, :n_late]], 1)
    went_on = (early.length >= split) & (n_late > 0)
    if keep is not None:
      went_on &= keep(tokens, conf)[:, split - 1] & (limit > split)
    length = jnp.where(went_on, split + late.length, early.length)
    length = jnp.minimum(length, gamma)
    used = went_on.astype(jnp.int32)[:, None]
    zero = jnp.zeros((batch, 1), jnp.float32)
    stats = Levels(
        calls=jnp.concatenate([e_stats.calls, used * l_stats.calls], 1),
        # No alpha between the two parts (they do not verify each other).
        alpha_sum=jnp.concatenate([e_stats.alpha_sum, zero,
                                   used * l_stats.alpha_sum], 1),
        alpha_count=jnp.concatenate(
            [e_stats.alpha_count, zero.astype(jnp.int32),
             used * l_stats.alpha_count], 1))
    return (chain_proposal(tokens, probs, conf, length),
            HorizontalState(early=e_state, late=l_state), stats)
