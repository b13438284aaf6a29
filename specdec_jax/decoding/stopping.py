"""Adaptive draft length: rules that decide, per row and per iteration, when
the draft stops proposing.

`speculative_generate(..., gamma=G, draft_stop=rule)` drafts at most G tokens
per iteration; after each draft token the rule says whether the row drafts
one more. A rule is any hashable object (a frozen dataclass) with the
members of `StopRule`; the engine calls three methods:

  init(batch) -> state               per-row online statistics (a pytree)
  keep_going(tokens, conf, state)    bool [B, G]: after draft token j (with
                                     tokens/conf 0..j known), draft j + 1.
                                     Must be causal: entry j may only read
                                     entries 0..j (the engine evaluates it on
                                     partly filled buffers).
  update(state, conf, accept_prob, verified) -> state   after verification.

Whatever a rule says, the engine ends a proposal after a stop id (EOS, or
the loop's `stop_ids`): the tokens after one would never be emitted.

`conf` [B, G] is the draft's probability of each token it proposed: q(x) when
sampling, the largest softmax probability of the draft's logits when greedy
(where q itself is one-hot). `accept_prob` [B, G] is the probability with
which each verified draft token was accepted: min(1, p(x)/q(x)) when
sampling, 1 or 0 when greedy.

Why any such rule keeps the output exact: the decision to propose position
j + 1 depends only on the draft tokens up to j, their q, and statistics of
earlier iterations, never on the target's verdict about this iteration's
tokens. So at each position the draft token is still a sample from q given
the prefix, and Algorithm 1's acceptance emits a sample from p there; where
nothing was proposed the target samples from p directly
(`verify.speculative_accept(num_proposed=...)`).

What is compiled and what is traced. Like `sampling.SamplingConfig`, a rule
splits into `static()`, the part of the compiled loop's cache key, and
`values()`, float32 arrays passed to the loop as traced inputs; inside the
loop the engine uses `static().traced(values)`, the same rule whose numbers
are those (traced) arrays. Static is only what fixes the program's
structure: the rule's type and, for `ExpectedGainStop`, the number of
confidence bins (the shape of its per-row statistics). Every number is
traced: `ConfidenceStop.threshold`; `ExpectedGainStop`'s cost,
verify_growth, prior_weight, the bins' edges and the per-bin prior (the
bins' centers when no prior is given, so whether one is given is not
static either). So calibrating a threshold or a prior reuses one compiled
loop per rule type and bin count. (`top_k` of the sampler stays static: it
is a shape of `lax.top_k`.)

Dimension letters: B batch, G most draft tokens per iteration (gamma), N
confidence bins.
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.errors import ContractError


class StopRule(Protocol):
  """What the engine asks of a draft-length rule (see the module docstring).

  Any hashable object with `init`, `keep_going` and `update` is a rule; it
  keys the compiled loop. `static`, `values` and `traced` are optional:
  with them only `static()` keys the loop and the numbers of `values()` are
  traced (`ConfidenceStop`, `ExpectedGainStop`); without them the rule
  itself is the key. Shapes: B rows, G most draft tokens per iteration.
  """

  def init(self, batch: int) -> Any:
    """Per-row statistics before the first iteration (a pytree)."""

  def keep_going(self, tokens: jax.Array, conf: jax.Array,
                 state: Any) -> jax.Array:
    """bool [B, G], causal: after draft token j, propose j + 1."""

  def update(self, state: Any, conf: jax.Array, accept_prob: jax.Array,
             verified: jax.Array) -> Any:
    """The statistics after a verification (conf, accept_prob float32
    [B, G]; verified bool [B, G], the positions counted)."""


STOP_MEMBERS = ("init", "keep_going", "update")


def split(rule: Any) -> tuple[Any, dict]:
  """(the compiled loop's key, the traced numbers) of a rule."""
  if hasattr(rule, "static") and hasattr(rule, "values"):
    return rule.static(), rule.values()
  return rule, {}


def bind(static: Any, values: dict) -> Any:
  """The rule a loop traces with: `static` with the (traced) `values`."""
  return static.traced(values) if hasattr(static, "traced") else static



def proposal_length(keep: jax.Array, limit: jax.Array) -> jax.Array:
  """int32 [B] tokens each row proposes: up to and including the first
  position whose `keep` [B, G] is False, at most `limit` [B]."""
  gamma = keep.shape[1]
  idx = jnp.arange(gamma)[None, :]
  first_stop = jnp.min(jnp.where(keep, gamma, idx), axis=1)
  return jnp.clip(jnp.minimum(first_stop + 1, limit), 1, gamma).astype(
      jnp.int32)


@dataclasses.dataclass(frozen=True)
class ConfidenceStop:
  """Stop after a draft token whose draft probability is below `threshold`
  (Hugging Face's "dynamic lookahead" rule; the engine also ends every
  proposal after a stop id, as it does for any rule).

  Attributes:
    threshold: in [0, 1]; 0 never stops early (but still stops after a stop
      id).
  """

  threshold: float = 0.4

  def __post_init__(self):
    threshold = _number("ConfidenceStop.threshold", self.threshold,
                        "a number in [0, 1], e.g. ConfidenceStop(0.4)")
    if not 0.0 <= threshold <= 1.0:  # False for NaN too
      raise ValueError(f"ConfidenceStop.threshold must be in [0, 1], got "
                       f"{self.threshold!r}.")
    object.__setattr__(self, "threshold", threshold)

  def static(self) -> "ConfidenceStop":
    """The compiled loop's cache key: the type alone (threshold traced)."""
    return ConfidenceStop()

  def values(self) -> dict:
    """The traced numbers: {"threshold": float32 0-d array}."""
    return {"threshold": np.float32(self.threshold)}

  def traced(self, values: dict) -> "ConfidenceStop":
    """This rule with the numbers `values` (possibly traced arrays); not
    validated nor hashable, for use inside the compiled loop only."""
    return _with_numbers(self, values)

  def init(self, batch: int) -> dict:
    del batch
    return {}

  def keep_going(self, tokens, conf, state):
    del tokens, state
    return conf >= jnp.asarray(self.threshold, jnp.float32)

  def update(self, state, conf, accept_prob, verified):
    del conf, accept_prob, verified
    return state


@dataclasses.dataclass(frozen=True)
class ExpectedGainStop:
  r"""Draft one more token while its expected gain exceeds its cost
  (Theorem 3.8 applied one token at a time).

  Derivation. Theorem 3.8 prices an iteration that proposes k tokens at
  T(k) = k c + v(k) target-call times (v(k): cost of verifying k + 1 tokens,
  1 in the paper's model, 1 + g k with a per-token growth g on hardware that
  is not idle, e.g. CPUs) and expects it to emit E(k) = 1 + sum_{i<=k} P_i
  tokens, where P_i is the probability that the first i draft tokens are
  all accepted. The walltime improvement is E(k) / T(k). Drafting token
  k + 1 adds Delta E = P_{k+1} = P_k a_{k+1} tokens and Delta T = c + g
  time, and raises the improvement exactly when

      Delta E / Delta T > E(k) / T(k),   i.e.   P_k a_{k+1} > lambda_k (c + g)

  with lambda_k = E(k) / T(k) the improvement of stopping now. With a
  constant acceptance a = alpha the left side shrinks geometrically and the
  right side grows, so the first k where the test fails is the gamma that
  maximises Theorem 3.8 (`theory.optimal_gamma`); with varying acceptance
  the rule stops early where the draft is unsure and drafts long where it is
  sure.

  Estimates, per row and online: P_k = prod_{i<=k} a_hat(conf_i), where
  a_hat(s) is the mean acceptance probability of earlier draft tokens whose
  confidence fell in the same bin as s (calibration on the draft's
  confidence), starting from a prior with weight `prior_weight`
  pseudo-tokens per bin: `prior` (per-bin acceptance measured offline,
  e.g. from the `stop_state` stats of a probe run; see `calibration`), or
  a_hat(s) = the bin's center (a calibrated draft); a_{k+1}, the acceptance
  of a token not drafted yet, is estimated by the row's mean acceptance over
  all bins. Acceptance is measured noise-free as min(1, p(x)/q(x)) for each
  verified token (its probability of acceptance, not the coin flip).

  Attributes:
    cost: c, the time of one draft step over one target step.
    verify_growth: g, the verification cost's growth per extra verified
      token, in target steps (0 in the paper's model).
    bins: interior edges of the confidence bins, increasing in (0, 1).
    prior: None, or the prior acceptance of each bin (len(bins) + 1 values
      in [0, 1]).
    prior_weight: pseudo-tokens of the prior per bin.
  """

  cost: float = 0.1
  verify_growth: float = 0.0
  bins: tuple[float, ...] = (0.3, 0.5, 0.7, 0.85, 0.95)
  prior: tuple[float, ...] | None = None
  prior_weight: float = 2.0

  def __post_init__(self):
    # Normalised to floats and tuples (hashable: the rule keys the compiled
    # loop), with the argument named when it is not a number or a sequence.
    for name in ("cost", "verify_growth", "prior_weight"):
      object.__setattr__(self, name, _number(
          f"ExpectedGainStop.{name}", getattr(self, name), "a number"))
    for name in ("bins", "prior"):
      value = getattr(self, name)
      if value is None and name == "prior":
        continue
      if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise TypeError(f"ExpectedGainStop.{name} must be a sequence of "
                        f"numbers, got {value!r}.")
      object.__setattr__(self, name, tuple(
          _number(f"ExpectedGainStop.{name}", v, "a sequence of numbers")
          for v in value))
    if not float(self.cost) >= 0.0 or not float(self.verify_growth) >= 0.0:
      raise ValueError(
          f"ExpectedGainStop needs cost >= 0 and verify_growth >= 0 (times "
          f"relative to one target step), got {self.cost}, "
          f"{self.verify_growth}.")
    edges = tuple(float(b) for b in self.bins)
    if any(not 0.0 < b < 1.0 for b in edges) or list(edges) != sorted(
        set(edges)):
      raise ValueError(f"ExpectedGainStop.bins must be increasing edges in "
                       f"(0, 1), got {self.bins}.")
    if self.prior is not None and (
        len(self.prior) != len(edges) + 1
        or any(not 0.0 <= float(a) <= 1.0 for a in self.prior)):
      raise ValueError(f"ExpectedGainStop.prior must give one acceptance in "
                       f"[0, 1] per bin ({len(edges) + 1}), got {self.prior}.")
    if not float(self.prior_weight) > 0.0:
      raise ValueError(f"ExpectedGainStop.prior_weight must be > 0, got "
                       f"{self.prior_weight}.")

  def static(self) -> "ExpectedGainStop":
    """The compiled loop's cache key: the type and the number of bins
    (canonical edges and defaults stand in for the traced numbers)."""
    n = len(self.bins)
    return ExpectedGainStop(bins=tuple((i + 1) / (n + 1) for i in range(n)))

  def values(self) -> dict:
    """The traced numbers, float32 arrays: cost, verify_growth and
    prior_weight (0-d), bins [N - 1] and prior [N] (the bins' centers when
    no prior is given)."""
    if self.prior is not None:
      prior = self.prior
    else:
      edges = (0.0,) + tuple(self.bins) + (1.0,)
      prior = [(a + b) / 2 for a, b in zip(edges[:-1], edges[1:])]
    return {"cost": np.float32(self.cost),
            "verify_growth": np.float32(self.verify_growth),
            "prior_weight": np.float32(self.prior_weight),
            "bins": np.asarray(self.bins, np.float32),
            "prior": np.asarray(prior, np.float32)}

  def traced(self, values: dict) -> "ExpectedGainStop":
    """This rule with the numbers `values` (possibly traced arrays); not
    validated nor hashable, for use inside the compiled loop only."""
    return _with_numbers(self, values)

  def _centers(self) -> jax.Array:
    return jnp.asarray(self.values()["prior"] if self.prior is None
                       else self.prior, jnp.float32)

  def _bin(self, conf):
    return jnp.searchsorted(jnp.asarray(self.bins, jnp.float32), conf,
                            side="right")

  def _num_bins(self) -> int:
    return len(self.bins) + 1

  def init(self, batch: int) -> dict:
    w = jnp.asarray(self.prior_weight, jnp.float32)
    centers = jnp.broadcast_to(self._centers(), (batch, self._num_bins()))
    return {"accept_sum": w * centers, "count": w * jnp.ones_like(centers)}

  def keep_going(self, tokens, conf, state):
    mean = state["accept_sum"] / state["count"]               # [B, N]
    a_hat = jnp.take_along_axis(mean, self._bin(conf), axis=1)  # [B, G]
    reach = jnp.cumprod(a_hat, axis=1)                        # P_1 .. P_G
    expected = 1.0 + jnp.cumsum(reach, axis=1)                # E(1) .. E(G)
    k = jnp.arange(1, tokens.shape[1] + 1, dtype=jnp.float32)[None, :]
    c = jnp.asarray(self.cost, jnp.float32)
    g = jnp.asarray(self.verify_growth, jnp.float32)
    time = k * c + 1.0 + g * k                                # T(1) .. T(G)
    next_accept = (jnp.sum(state["accept_sum"], 1, keepdims=True)
                   / jnp.sum(state["count"], 1, keepdims=True))
    gain = reach * next_accept
    return gain > expected / time * (c + g)

  def update(self, state, conf, accept_prob, verified):
    onehot = jax.nn.one_hot(self._bin(conf), self._num_bins(),
                            dtype=jnp.float32)
    w = onehot * verified.astype(jnp.float32)[..., None]      # [B, G, N]
    return {"accept_sum": state["accept_sum"] + jnp.sum(
                w * accept_prob[..., None], axis=1),
            "count": state["count"] + jnp.sum(w, axis=1)}


def _with_numbers(rule, values: dict):
  """A copy of `rule` whose fields named in `values` hold those arrays.
  Built without `__post_init__` (its checks and float() conversions would
  fail on traced arrays); the numbers were validated when `values()` was
  taken from a constructed rule."""
  copy = object.__new__(type(rule))
  for field in dataclasses.fields(rule):
    object.__setattr__(copy, field.name,
                       values.get(field.name, getattr(rule, field.name)))
  return copy


def _number(name: str, value, what: str) -> float:
  """float(value) for a real number (numpy ones too); a TypeError naming
  `name` for anything else (None, strings, bools)."""
  if isinstance(value, (bool, np.bool_)) or not isinstance(
      value, (numbers.Real, np.number)):
    raise TypeError(f"{name} must be {what}, got {value!r} "
                    f"({type(value).__name__}).")
  return float(value)


def calibration(rule: ExpectedGainStop, stats) -> tuple[float, ...]:
  """Per-bin acceptance measured by a run with `rule` (the `DecodeStats`
  of that run, whose `stop_state` holds the rule's final per-row sums;
  pooled over rows, the rule's prior taken out); a bin no verified token
  fell in keeps the rule's prior. Pass the result as
  `ExpectedGainStop(prior=...)`."""
  init = rule.init(1)
  prior_sum = np.asarray(init["accept_sum"][0])
  prior_count = np.asarray(init["count"][0])
  state = stats.stop_state
  rows = np.asarray(state["count"]).shape[0]
  sums = np.asarray(state["accept_sum"]).sum(0) - rows * prior_sum
  counts = np.asarray(state["count"]).sum(0) - rows * prior_count
  means = np.where(counts > 0.5, sums / np.maximum(counts, 1e-9),
                   prior_sum / prior_count)
  return tuple(round(float(m), 4) for m in np.clip(means, 0.0, 1.0))


def check_rule(rule) -> None:
  """Raises a TypeError (`ContractError`) naming the fix unless `rule` is
  None or a hashable object with the members of `StopRule`."""
  if rule is None:
    return
  missing = [m for m in STOP_MEMBERS if not callable(getattr(rule, m, None))]
  if missing:
    raise ContractError(
        f"draft_stop must be None (fixed gamma), sd.ConfidenceStop(threshold), "
        f"sd.ExpectedGainStop(...) or a rule with the methods of "
        f"stopping.StopRule; {type(rule).__name__} has no "
        f"{', '.join(missing)}.")
  try:
    hash(split(rule)[0])
  except TypeError:
    raise ContractError(
        f"draft_stop {type(rule).__name__} is not hashable: a stop rule is "
        f"part of the compiled loop's key; make it a frozen dataclass "
        f"(@dataclasses.dataclass(frozen=True)).") from None
