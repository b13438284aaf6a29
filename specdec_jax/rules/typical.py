"""Medusa's typical acceptance (Cai et al. 2024): a lossy research rule.

A draft token x is kept while the target finds it typical enough,
p(x) > min(epsilon, delta * exp(-H(p))) with H the entropy of the target's
p at that position, and the token after the kept ones is drawn from p
itself. No coin decides an acceptance and no residual corrects a rejection,
so the output is NOT distributed as the target's: `exact` is False and
results say so (`DecodeStats.exact`). At temperature 0, p is one-hot: only
the argmax is typical, and greedy decoding is unchanged.

  rule = TypicalAcceptance(epsilon=0.09, delta=0.3)
  sd.speculative_generate(target, draft, ids, gamma=4, temperature=1.0,
                          max_decode_len=64, rule=rule)

Dimension letters: B batch, V vocabulary.
"""

import dataclasses

import jax
import jax.numpy as jnp

from specdec_jax import sampling


@dataclasses.dataclass(frozen=True)
class TypicalAcceptance:
  """Keep x while p(x) > min(epsilon, delta * exp(-H(p))); then draw from p.

  Attributes:
    epsilon: the hard threshold (Medusa's posterior_threshold), in (0, 1].
    delta: the entropy-scaled threshold's factor (Medusa's posterior_alpha),
      in (0, 1].
  """

  epsilon: float = 0.09
  delta: float = 0.3
  uses_q = True   # drafts are sampled from q as usual (the rule ignores q)
  exact = False   # lossy

  def __post_init__(self):
    for name in ("epsilon", "delta"):
      value = getattr(self, name)
      if not 0.0 < value <= 1.0:  # False for NaN too
        raise ValueError(f"TypicalAcceptance.{name} must be in (0, 1], got "
                         f"{value!r}.")

  def target(self, sampler, logits: jax.Array) -> jax.Array:
    return sampler.probs(logits)

  def at(self, p: jax.Array, x: jax.Array) -> jax.Array:
    # The score: p(x) over the row's threshold, so typical means > 1.
    p_x = jnp.take_along_axis(p, x[:, None], axis=-1)[:, 0]
    entropy = -jnp.sum(jnp.where(p > 0, p * jnp.log(p), 0.0), axis=-1)
    return p_x / jnp.minimum(self.epsilon, self.delta * jnp.exp(-entropy))

  def accepts(self, u: jax.Array, p_x: jax.Array, q_x) -> jax.Array:
    del u, q_x  # a threshold, not a coin; q plays no part
    return p_x > 1.0

  def residual(self, p: jax.Array, q) -> jax.Array:
    del q  # Medusa draws the next token from p itself
    return p

  def draw(self, u: jax.Array, p: jax.Array) -> jax.Array:
    return sampling.inverse_cdf(p, u[:, None])

  def overlap(self, p: jax.Array, q: jax.Array, x: jax.Array) -> jax.Array:
    del x  # beta is the paper's, whatever the rule
    return jnp.sum(jnp.minimum(p, q), axis=-1)

  def accept_prob(self, p_x: jax.Array, q_x) -> jax.Array:
    del q_x
    return (p_x > 1.0).astype(jnp.float32)
