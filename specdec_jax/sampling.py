"""Sampling distributions and the speculative rejection sampler (Algorithm 1).

Two rules keep speculative decoding exact, and this module is where both live:

1. The same transform (temperature, top-k, top-p) turns target logits into p
   and draft logits into q: `SamplingConfig.probs` is the one function for
   both.
2. The draft samples from exactly the q that enters the ratio p/q: the engine
   samples draft tokens from `SamplingConfig.probs(draft_logits)` and hands
   those same probabilities to the verification (`decoding/verify.py`,
   with the acceptance rule of `decoding/acceptance.py`).

Everything here is float32 and vectorised over the batch (no Python loops).

Dimension letters: B batch, G gamma (draft tokens per step), V vocabulary.
"""

from __future__ import annotations

import dataclasses
import math
import numbers

import jax
import jax.numpy as jnp
import numpy as np

# The smallest positive temperature: float32's smallest normal number. Below
# it the temperature itself is subnormal (flushed to 0 on some backends) and
# (logits - max) / T is 0 / 0 at the most likely token.
MIN_TEMPERATURE = float(np.finfo(np.float32).tiny)

# Below this total mass the residual max(0, p - l*q) is rounding noise (it is
# the total variation distance between p and q, and a rejection happens with
# at most that probability), so we sample from p instead.
RESIDUAL_EPS = 1e-6


def argmax(logits: jax.Array) -> jax.Array:
  """int32 argmax over the last axis, ties to the lowest id (as jnp.argmax).

  Written as a max and the first index reaching it: two plain reductions
  that XLA vectorises, where `jnp.argmax` lowers to a (value, index) pair
  reduction that XLA on CPU runs element by element (`iota_reduce_fusion` in
  `benchmarks/profile_loop.py`: 0.41 ms of a 12-token speculative decode,
  gone with this form). A row holding a NaN gives an arbitrary id
  (jnp.argmax gives the NaN's).
  """
  vocab = logits.shape[-1]
  best = jnp.max(logits, axis=-1, keepdims=True)
  ids = jnp.arange(vocab, dtype=jnp.int32)
  first = jnp.min(jnp.where(logits == best, ids, vocab), axis=-1)
  return jnp.minimum(first, vocab - 1)


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
  """How logits become the distribution we sample from.

  Attributes:
    temperature: 0 means greedy (a one-hot argmax, ties to the lowest id);
      otherwise the logits, less their maximum, are divided by it. Any
      temperature from `MIN_TEMPERATURE` (float32's smallest normal number,
      about 1.18e-38) up works: the shifted logits are <= 0, so dividing
      can only push them to -inf (probability 0), never overflow to +inf,
      and a tiny temperature gives the limit distribution (the argmax, ties
      shared). Positive values below it are refused. The same rule holds
      for `generate` and `speculative_generate` (both build this config).
    top_k: keep the k most likely tokens (0 = off). Ties at the k-th value are
      all kept.
    top_p: keep the smallest set of most likely tokens whose mass reaches
      top_p (1.0 = off).
  """

  temperature: float = 0.0
  top_k: int = 0
  top_p: float = 1.0

  def __post_init__(self):
    # Checked (and normalised to Python numbers, so equal settings hash
    # alike for the compiled-loop cache) before anything is traced: NaN
    # slips through `< 0` comparisons, and a float top_k or a string
    # temperature would fail deep inside tracing.
    temperature = _real("temperature", self.temperature,
                        "a number >= 0 (0 = greedy)")
    if not math.isfinite(temperature) or temperature < 0:
      raise ValueError(
          f"temperature must be a finite number >= 0 (0 = greedy), got "
          f"{self.temperature!r}.")
    if 0 < temperature < MIN_TEMPERATURE:
      raise ValueError(
          f"temperature {temperature!r} is below the smallest supported "
          f"positive temperature {MIN_TEMPERATURE!r} (float32's smallest "
          f"normal number): pass 0 for greedy decoding, which is what such a "
          f"temperature means.")
    top_k = self.top_k
    if (isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral)):
      raise TypeError(
          f"top_k must be an int >= 0 (0 = off), got {top_k!r} "
          f"({type(top_k).__name__}): pass an int, e.g. top_k=40.")
    if top_k < 0:
      raise ValueError(f"top_k must be an int >= 0 (0 = off), got {top_k}.")
    top_p = _real("top_p", self.top_p, "a number in (0, 1] (1.0 = off)")
    if not 0.0 < top_p <= 1.0:  # False for NaN too
      raise ValueError(
          f"top_p must be in (0, 1] (1.0 = off), got {self.top_p!r}.")
    object.__setattr__(self, "temperature", temperature)
    object.__setattr__(self, "top_k", int(top_k))
    object.__setattr__(self, "top_p", top_p)

  @property
  def greedy(self) -> bool:
    return self.temperature == 0.0

  def static(self) -> "SamplingConfig":
    """What a compiled loop depends on: greedy or not, top_k (a shape),
    top-p on or off. The numbers themselves (`values`) are traced inputs,
    so a temperature sweep or a top-p change reuses one compiled loop."""
    return SamplingConfig(0.0 if self.greedy else 1.0, self.top_k,
                          1.0 if self.top_p == 1.0 else 0.5)

  def values(self) -> dict:
    """The traced numbers of `static()`'s loop: float32 0-d arrays."""
    return {"temperature": np.float32(self.temperature or 1.0),
            "top_p": np.float32(self.top_p)}

  def traced(self, values: dict) -> "TracedSampling":
    """This (static) config with the numbers `values` (possibly traced)."""
    return TracedSampling(self, values["temperature"], values["top_p"])

  def probs(self, logits: jax.Array, temperature: jax.Array | None = None,
            top_p: jax.Array | None = None) -> jax.Array:
    """Turns logits [..., V] into float32 probabilities [..., V]; the
    temperature and top_p, when given (arrays, possibly traced), replace
    this config's numbers (whether top-p is on stays this config's)."""
    temperature = self.temperature if temperature is None else temperature
    top_p = self.top_p if top_p is None else top_p
    logits = jnp.asarray(logits, jnp.float32)
    vocab = logits.shape[-1]
    if self.greedy:
      return jax.nn.one_hot(argmax(logits), vocab,
                            dtype=jnp.float32)
    # Shifted first: (logits - max) / T is <= 0 and never overflows.
    logits = (logits - jnp.max(logits, axis=-1, keepdims=True)) / jnp.asarray(
        temperature, jnp.float32)
    if 0 < self.top_k < vocab:
      # The k-th largest value as the min of the k largest, not their last:
      # XLA:CPU turns a top-k whose last value alone is read back into a
      # full sort of the vocabulary (about 40x slower at k = 5, V = 4,224).
      kth = jnp.min(jax.lax.top_k(logits, self.top_k)[0], axis=-1,
                    keepdims=True)
      logits = jnp.where(logits >= kth, logits, -jnp.inf)
    probs = jax.nn.softmax(logits, axis=-1)
    if self.top_p < 1.0:
      threshold = nucleus_threshold(probs, jnp.asarray(top_p, jnp.float32))
      probs = jnp.where(probs >= threshold, probs, 0.0)
      probs = probs / jnp.sum(probs, axis=-1, keepdims=True)
    return probs


# float32 1.0 as an int32: the bit patterns of the floats in [0, 1] are the
# integers in [0, _ONE_BITS], in the same order.
_ONE_BITS = 0x3F800000


@jax.jit
def nucleus_threshold(probs: jax.Array, top_p: jax.Array) -> jax.Array:
  """The top-p nucleus of probabilities [..., V] as a threshold [..., 1].

  The nucleus is the smallest set of most likely tokens whose mass reaches
  top_p, with every token as likely as its least likely member (ties are
  kept together): the tokens of probability p with mass(> p) < top_p,
  where mass(> v) sums the probabilities above v. mass(> v) only falls as
  v grows, so the returned threshold, the least float32 v with
  mass(> v) < top_p, keeps exactly those tokens (`probs >= threshold`; the
  most likely token always). It is found by bisecting the bit patterns of
  the floats in [0, 1] (31 halvings), each a masked sum over the
  vocabulary: no sort, which XLA:CPU runs about 20x slower (8 ms against
  165 ms for 250 rows of 4,224 ids, docs/benchmarks.md). It matches a
  sort-and-cumsum nucleus except where mass(> p) is within float32
  rounding of top_p (the two sum in different orders).
  """
  def halve(_, bounds):
    lo, hi = bounds  # mass(> lo) >= top_p (lo = -1: none), mass(> hi) < top_p
    mid = jnp.where(hi - lo > 1, lo + (hi - lo) // 2, hi)
    value = jax.lax.bitcast_convert_type(mid, jnp.float32)
    inside = jnp.sum(jnp.where(probs > value, probs, 0.0), axis=-1,
                     keepdims=True) < top_p
    return jnp.where(inside, lo, mid), jnp.where(inside, mid, hi)

  shape = probs.shape[:-1] + (1,)
  _, hi = jax.lax.fori_loop(0, 31, halve, (jnp.full(shape, -1, jnp.int32),
                                           jnp.full(shape, _ONE_BITS,
                                                    jnp.int32)))
  return jax.lax.bitcast_convert_type(hi, jnp.float32)


@dataclasses.dataclass(frozen=True)
class TracedSampling:
  """A `SamplingConfig.static()` with its numbers as (traced) arrays: the
  sampler a compiled loop uses, with `greedy` and `probs` like the config."""

  config: SamplingConfig
  temperature: jax.Array
  top_p: jax.Array

  @property
  def greedy(self) -> bool:
    return self.config.greedy

  def probs(self, logits: jax.Array) -> jax.Array:
    return self.config.probs(logits, self.temperature, self.top_p)


def _real(name: str, value, what: str) -> float:
  """float(value) for a real number or a 0-d numeric array; else TypeError
  naming `name` (bools and strings are refused: float('1') would pass)."""
  numeric = (not isinstance(value, (bool, str, bytes))
             and (isinstance(value, numbers.Real)
                  or (getattr(value, "shape", None) == ()
                      and jnp.issubdtype(getattr(value, "dtype", object),
                                         jnp.number))))
  if not numeric:
    raise TypeError(f"{name} must be {what}, got {value!r} "
                    f"({type(value).__name__}).")
  return float(value)


def logits_to_probs(logits: jax.Array, temperature: float = 0.0,
                    top_k: int = 0, top_p: float = 1.0) -> jax.Array:
  """Functional form of `SamplingConfig(temperature, top_k, top_p).probs`."""
  return SamplingConfig(temperature, top_k, top_p).probs(logits)


def sample(rng: jax.Array, probs: jax.Array) -> jax.Array:
  """Samples int32 ids from probabilities [..., V] (zeros are never drawn).

  Inverse CDF: one uniform per row against the cumulative sum, instead of
  one Gumbel variate per vocabulary entry (on a CPU, generating V random
  numbers per draft step cost about as much as the small draft itself).
  """
  probs = jnp.asarray(probs, jnp.float32)
  u = jax.random.uniform(rng, probs.shape[:-1] + (1,), jnp.float32)
  return inverse_cdf(probs, u)


def inverse_cdf(probs: jax.Array, u: jax.Array) -> jax.Array:
  """The id [...] of probs [..., V] that the uniform u [..., 1] in [0, 1)
  selects: the first id of positive probability whose cumulative mass
  exceeds u * total.

  "Of positive probability" is not implied by the cumulative sum: XLA's
  cumsum is a parallel scan that rounds differently at each index, so the
  cdf is not flat across zero-probability entries (on XLA:CPU, about half
  the zeros of a top-40 distribution over 4,224 ids carry a step, some
  going down). Counting cdf <= u * total drew such an id about once in
  5 million draws. Reductions are a min and a max, no `jnp.argmax` (which
  XLA on CPU runs element by element, see `argmax`).
  """
  vocab = probs.shape[-1]
  ids = jnp.arange(vocab, dtype=jnp.int32)
  cdf = jnp.cumsum(probs, axis=-1)
  positive = probs > 0
  hit = positive & (cdf > u * cdf[..., -1:])
  token = jnp.min(jnp.where(hit, ids, vocab), axis=-1)
  # u * total can round up to the total (no hit): the last positive id.
  last = jnp.max(jnp.where(positive, ids, 0), axis=-1)
  return jnp.where(token < vocab, token, last).astype(jnp.int32)


def validate_lenience(lenience: float) -> float:
  lenience = _real("lenience", lenience, "a number in (0, 1]")
  if not 0.0 < lenience <= 1.0:  # False for NaN too
    raise ValueError(
        f"lenience must be in (0, 1] (1 = exact speculative sampling, smaller "
        f"is faster but lossy), got {lenience}.")
  return float(lenience)


def residual(p: jax.Array, q: jax.Array) -> jax.Array:
  """norm(max(0, p - q)) over the last axis, or p itself where that mass
  is rounding noise (below RESIDUAL_EPS: p == q, so no rejection can have
  led here). The distribution after a rejected draft token (a chain's, or
  a tree's sibling: `verify.walk`)."""
  rest = jnp.maximum(p - q, 0.0)
  mass = jnp.sum(rest, axis=-1, keepdims=True)
  return jnp.where(mass > RESIDUAL_EPS, rest / jnp.maximum(mass, 1e-30), p)
