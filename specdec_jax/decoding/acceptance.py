"""The acceptance rule: when a draft token is kept, and what replaces it.

Algorithm 1 of the paper, split into the few operations that every walk
over a proposal (`verify.walk`: a chain, a token tree, a cascade's middle
model checking its drafter) calls. A rule is a small object; to try a new
one, write a class with these methods and return it from `rule_for`:

  target(sampler, logits) -> P       the verifier's distribution at each
                                     position ([..., V] probabilities, or
                                     for `Greedy` the argmax ids [...])
  at(P, x) -> p(x)                   float32 [B]
  accepts(u, p_x, q_x) -> bool [B]   u ~ U[0, 1) per row
  residual(P, q) -> P                the distribution after a rejection
  draw(u, P) -> int32 [B]            a token of P
  overlap(P, q, x) -> beta [B]       sum_x min(p, q) (the paper's beta)
  accept_prob(p_x, q_x) -> [B]       min(1, p(x) / q(x))
  uses_q                             whether drafters must hand over q

`Sampled` is Algorithm 1 itself (with the paper's lenience l: accept while
r * l * q(x) <= p(x), r ~ U(0, 1], residual norm(max(0, p - l * q)); l = 1
is exact). `Greedy` is the same rule where p and q are one-hot: p(x) is 1
iff x is the verifier's argmax, min(1, p(x) / q(x)) is p(x), and after a
rejection norm(max(0, p - q)) is p again. So it needs no probabilities at
all: an argmax and a comparison (the "fast greedy path"). The tests check
that `Sampled` on one-hot distributions gives the same tokens and counters.

Dimension letters: B batch, V vocabulary.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from specdec_jax import sampling


@dataclasses.dataclass(frozen=True)
class Sampled:
  """Algorithm 1 over probabilities (exact at lenience 1).

  Attributes:
    lenience: l in (0, 1], a float or a traced float32 scalar.
  """

  lenience: Any = 1.0
  uses_q = True

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
  """The rule of a loop: `Greedy` at temperature 0, else `Sampled`."""
  if sampler.greedy:
    return Greedy()
  return Sampled(lenience)
