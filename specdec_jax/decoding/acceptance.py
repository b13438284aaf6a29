"""The acceptance rule: when a draft token is kept, and what replaces it.

Algorithm 1 of the paper, split into the few operations that every walk
over a proposal (`verify.walk`: a chain, a token tree, a cascade's middle
model checking its drafter) calls. A rule is a small hashable object (a
frozen dataclass) with the members of `AcceptanceRule`; pass one as
`rule=` to `speculative_generate`, `SpeculativeDecoder` or the experiment
config. It is part of what a loop is compiled for, so a new rule always
runs as itself. Without `rule=`, `rule_for` picks the default:

  target(sampler, logits) -> P       the verifier's value at each position
                                     (here [..., V] probabilities, or for
                                     `Greedy` the argmax ids [...]); the
                                     walk only indexes its leading axes
  at(P, x) -> score [B]              what `accepts` and `accept_prob` read
                                     of token x (p(x) for `Sampled`)
  accepts(u, score, q_x) -> bool [B] u ~ U[0, 1) per row
  residual(P, q) -> P                the value after a rejection
  draw(u, P) -> int32 [B]            a token of P
  overlap(P, q, x) -> beta [B]       sum_x min(p, q) (the paper's beta)
  accept_prob(score, q_x) -> [B]     the probability that x is accepted
  uses_q                             drafters sample and hand over q (else
                                     they propose their argmax, no q)
  exact                              the output is distributed exactly as
                                     the target's (False: lossy; results
                                     say so, `DecodeStats.exact`)

`Sampled` is Algorithm 1 itself (with the paper's lenience l: accept while
r * l * q(x) <= p(x), r ~ U(0, 1], residual norm(max(0, p - l * q)); l = 1
is exact). `Greedy` is the same rule where p and q are one-hot: p(x) is 1
iff x is the verifier's argmax, min(1, p(x) / q(x)) is p(x), and after a
rejection norm(max(0, p - q)) is p again. So it needs no probabilities at
all: an argmax and a comparison (the "fast greedy path"). The tests check
that `Sampled` on one-hot distributions gives the same tokens and counters.
docs/extending.md writes a lossy research rule (`rules/typical.py`).

Dimension letters: B batch, V vocabulary.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

import jax
import jax.numpy as jnp

from specdec_jax import sampling


class AcceptanceRule(Protocol):
  """What the walk asks of an acceptance rule (see the module docstring).

  Implementations are hashable (frozen dataclasses): a rule keys the
  compiled loop. Shapes: B rows, V vocabulary; P is the rule's own value
  per position (its leading axes [B, ...] are the walk's).
  """

  uses_q: bool
  exact: bool

  def target(self, sampler: Any, logits: jax.Array) -> Any:
    """P from the verifier's logits [B, K, V] (`sampler`: the loop's
    `SamplingConfig`, whose `probs(logits)` applies temperature, top-k
    and top-p)."""

  def at(self, p: Any, x: jax.Array) -> jax.Array:
    """float32 [B]: the score of tokens x [B] under P [B, ...]."""

  def accepts(self, u: jax.Array, p_x: jax.Array,
              q_x: jax.Array | None) -> jax.Array:
    """bool [B]: accept the token of score p_x, drawn with q(x) = q_x (None
    without q), given u [B] ~ U[0, 1)."""

  def residual(self, p: Any, q: jax.Array | None) -> Any:
    """P after a rejected token drawn from q [B, V]."""

  def draw(self, u: jax.Array, p: Any) -> jax.Array:
    """int32 [B]: a token of P, from u [B] ~ U[0, 1)."""

  def overlap(self, p: Any, q: jax.Array | None, x: jax.Array) -> jax.Array:
    """float32 [B]: beta = sum_x min(p, q) at this position."""

  def accept_prob(self, p_x: jax.Array, q_x: jax.Array | None) -> jax.Array:
    """float32 [B]: the probability of accepting (the stop rules' data)."""


# Every member a rule must have, for the check before compiling.
RULE_MEMBERS = ("uses_q", "exact", "target", "at", "accepts", "residual",
                "draw", "overlap", "accept_prob")


@dataclasses.dataclass(frozen=True)
class Sampled:
  """Algorithm 1 over probabilities (exact at lenience 1).

  Attributes:
    lenience: l in (0, 1], a float or a traced float32 scalar.
  """

  lenience: Any = 1.0
  uses_q = True

  @property
  def exact(self) -> bool:
    """Lenience 1 is Algorithm 1 itself; below it, lossy (read on the
    host, where lenience is a number)."""
    return (not isinstance(self.lenience, jax.Array)
            and float(self.lenience) == 1.0)

  def target(self, sampler, logits: jax.Array) -> jax.Array:
    return sampler.probs(logits)

  def at(self, p: jax.Array, x: jax.Array) -> jax.Array:
    return jnp.take_along_axis(p, x[:, None], axis=-1)[:, 0]

  def accepts(self, u: jax.Array, p_x: jax.Array,
              q_x: jax.Array) -> jax.Array:
    # r = 1 - u in (0, 1]: a token of p(x) = 0 is never accepted, and
    # neither is one its q gives 0 (the draft cannot have sampled it).
    return (q_x > 0) & ((1.0 - u) * (self.lenience * q_x) <= p_x)

  def residual(self, p: jax.Array, q: jax.Array) -> jax.Array:
    return sampling.residual(p, self.lenience * q)

  def draw(self, u: jax.Array, p: jax.Array) -> jax.Array:
    return sampling.inverse_cdf(p, u[:, None])

  def overlap(self, p: jax.Array, q: jax.Array, x: jax.Array) -> jax.Array:
    del x
    return jnp.sum(jnp.minimum(p, q), axis=-1)

  def accept_prob(self, p_x: jax.Array, q_x: jax.Array) -> jax.Array:
    return jnp.where(q_x > 0, jnp.minimum(1.0, p_x / jnp.maximum(q_x, 1e-30)),
                     0.0)


@dataclasses.dataclass(frozen=True)
class Greedy:
  """`Sampled` where p and q are one-hot: P is the argmax id [B]."""

  uses_q = False
  exact = True

  def target(self, sampler, logits: jax.Array) -> jax.Array:
    del sampler
    return sampling.argmax(logits)

  def at(self, p: jax.Array, x: jax.Array) -> jax.Array:
    return (x == p).astype(jnp.float32)

  def accepts(self, u, p_x, q_x) -> jax.Array:
    del u, q_x
    return p_x > 0

  def residual(self, p: jax.Array, q: Any) -> jax.Array:
    del q  # p - q leaves p's one-hot when x was not the argmax
    return p

  def draw(self, u, p: jax.Array) -> jax.Array:
    del u
    return p

  def overlap(self, p: jax.Array, q: Any, x: jax.Array) -> jax.Array:
    del q
    return self.at(p, x)

  def accept_prob(self, p_x: jax.Array, q_x: Any) -> jax.Array:
    del q_x
    return p_x


def rule_for(sampler, lenience: Any = 1.0):
  """The default rule of a loop (no `rule=`): `Greedy` at temperature 0,
  else `Sampled(lenience)`."""
  if sampler.greedy:
    return Greedy()
  return Sampled(lenience)
