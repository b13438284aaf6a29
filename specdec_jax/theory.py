"""The paper's analysis: acceptance rate, expected tokens, speedup, optimal gamma.

Notation (Leviathan et al. 2023, Section 3): alpha is the expected acceptance
rate E[beta] with beta = sum_x min(p(x), q(x)); gamma the number of draft
tokens per step; c the walltime cost of one draft run over one target run;
c_hat the same ratio in arithmetic operations.

Every function takes numpy or jax arrays (broadcasting) and returns the same
kind; Python scalars give numpy results. The exceptions are the finite-length
forms (`expected_iterations`, `walltime_improvement_at_lengths`), which take
Python scalars and a list of lengths and return floats.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

# Within this distance of alpha = 1 the closed forms divide 0 by 0; a first
# order expansion around alpha = 1 is exact to ~1e-12 there.
_NEAR_ONE = 1e-6


def _xp(*xs):
  return jnp if any(isinstance(x, jax.Array) for x in xs) else np


def pooled_alpha(alpha_sums, alpha_counts) -> float:
  """alpha pooled over rows or examples: sum(alpha_sum) / sum(alpha_count).

  Each verified position weighs the same, so an example with many verified
  positions counts for more than one with few (the mean of per-row alphas
  would not). Zero positions give 0.
  """
  total = float(np.sum(np.asarray(alpha_counts, np.float64)))
  return float(np.sum(np.asarray(alpha_sums, np.float64))) / max(total, 1.0)


def acceptance_rate(p, q):
  """beta = sum_x min(p(x), q(x)) over the last axis (Definition 3.2)."""
  xp = _xp(p, q)
  return xp.sum(xp.minimum(p, q), axis=-1)


def lk_divergence(p, q):
  """D_LK(p, q) = sum_x |p(x) - M(x)|, M = (p + q) / 2; equals 1 - beta."""
  xp = _xp(p, q)
  return xp.sum(xp.abs(p - q), axis=-1) / 2


def expected_tokens(alpha, gamma):
  """Theorem 3.1: E[tokens per target run] = (1 - alpha^(gamma+1)) / (1 - alpha).

  Equals gamma + 1 at alpha = 1 and 1 at alpha = 0.
  """
  xp = _xp(alpha, gamma)
  alpha = xp.asarray(alpha, dtype=xp.float64 if xp is np else None)
  gamma = xp.asarray(gamma)
  one_minus = 1.0 - alpha
  near_one = xp.abs(one_minus) < _NEAR_ONE
  safe = xp.where(near_one, 1.0, one_minus)
  closed = (1.0 - alpha ** (gamma + 1)) / safe
  # d/d(alpha) of sum_{i<=gamma} alpha^i at alpha = 1 is gamma(gamma+1)/2.
  expansion = (gamma + 1) - one_minus * gamma * (gamma + 1) / 2
  return xp.where(near_one, expansion, closed)


def walltime_improvement(alpha, gamma, c):
  """Theorem 3.8: (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + 1))."""
  return expected_tokens(alpha, gamma) / (gamma * c + 1.0)


def walltime_improvement_measured(alpha, gamma, c, verify_cost):
  """Theorem 3.8 with a measured verification cost v(gamma):

    E[tokens] / (gamma c + v),  v = time(target on gamma + 1 tokens) / time(1).

  The theorem assumes v = 1 (a target run costs the same whatever the number
  of tokens it scores, true for a memory-bound accelerator); on a CPU, or for
  a small model on a GPU, v grows with gamma and the best gamma is smaller.
  """
  return expected_tokens(alpha, gamma) / (gamma * c + verify_cost)


def expected_iterations(alpha: float, gamma: int, length: int) -> float:
  """Expected target runs to emit `length` tokens, under Theorem 3.1's model.

  Theorem 3.1 counts tokens per run for an endless output. A real output
  ends: the run that reaches its last token (EOS) emits only what is left,
  and the rest of that run's gamma + 1 capacity is wasted. With each run
  emitting K tokens, P(K = k) = alpha^(k-1) (1 - alpha) for k <= gamma and
  P(K = gamma + 1) = alpha^gamma, independently (the theorem's i.i.d.
  assumption), the expected number of runs f(n) satisfies

    f(n) = 1 + sum_k P(K = k) f(n - k),   f(m) = 0 for m <= 0.

  length / f(length) tends to `expected_tokens(alpha, gamma)` as length grows;
  for 12-token outputs and gamma = 7 it is about a quarter lower.
  """
  return float(_runs_table(alpha, gamma, length)[int(length)])


def _runs_table(alpha: float, gamma: int, max_length: int) -> np.ndarray:
  """[max_length + 1] expected runs f(0..max_length) (see above)."""
  gamma, max_length = int(gamma), int(max_length)
  if gamma < 1 or max_length < 0:
    raise ValueError(
        f"need gamma >= 1 and length >= 0, got {gamma}, {max_length}")
  alpha = float(alpha)
  probs = np.array([alpha ** (k - 1) * (1.0 - alpha)
                    for k in range(1, gamma + 1)] + [alpha ** gamma])
  runs = np.zeros(max_length + 1)
  steps = np.arange(1, gamma + 2)
  for n in range(1, max_length + 1):
    runs[n] = 1.0 + float(np.dot(probs, runs[np.maximum(n - steps, 0)]))
  return runs


def walltime_improvement_at_lengths(alpha: float, gamma: int, c: float,
                                    lengths, verify_cost: float = 1.0) -> float:
  """Theorem 3.8's prediction for outputs of the given lengths.

  The baseline takes one step per token; speculative decoding takes
  `expected_iterations` runs of cost gamma c + verify_cost steps each (the
  paper's cost model at verify_cost = 1):

    sum(lengths) / (sum_i f(length_i) (gamma c + verify_cost)).

  Like the theorem, it leaves out costs paid once per input (the encoder).
  """
  lengths = [int(n) for n in lengths]
  if not lengths or sum(lengths) == 0 or min(lengths) < 0:
    raise ValueError("lengths must be >= 0 and hold at least one non-empty "
                     f"output, got {lengths[:8]}")
  table = _runs_table(alpha, gamma, max(lengths))
  runs = float(sum(table[n] for n in lengths))
  return sum(lengths) / (runs * (gamma * c + verify_cost))


def operations_factor(alpha, gamma, c_hat):
  """Theorem 3.11: (1 - alpha)(gamma c_hat + gamma + 1) / (1 - alpha^(gamma+1)).

  The factor by which total arithmetic operations grow (>= 1 unless alpha = 1
  and c_hat = 0).
  """
  return (gamma * c_hat + gamma + 1.0) / expected_tokens(alpha, gamma)


def min_improvement(alpha, c):
  """Corollary 3.9: when alpha > c, some gamma improves walltime by at least
  (1 + alpha) / (1 + c) (gamma = 1 attains it). NaN where alpha <= c."""
  xp = _xp(alpha, c)
  alpha = xp.asarray(alpha, dtype=xp.float64 if xp is np else None)
  bound = (1.0 + alpha) / (1.0 + c)
  return xp.where(alpha > c, bound, xp.nan)


def optimal_gamma(alpha, c, max_gamma: int = 64, verify_costs=None):
  """The integer gamma in [1, max_gamma] maximising Theorem 3.8 (Figure 3).

  Args:
    alpha, c: as in `walltime_improvement` (broadcastable arrays).
    max_gamma: the largest gamma considered.
    verify_costs: optional [max_gamma] measured v(gamma) for gamma =
      1..max_gamma (see `walltime_improvement_measured`); None is the
      paper's v = 1.

  Returns int arrays broadcast from alpha and c. Where even the best gamma
  gives an improvement below 1 (alpha <= c), speculative decoding does not
  pay off; the argmax is still returned (use `walltime_improvement` to see).
  """
  if max_gamma < 1:
    raise ValueError(f"max_gamma must be >= 1, got {max_gamma}.")
  xp = _xp(alpha, c)
  alpha = xp.asarray(alpha)[..., None]
  c = xp.asarray(c)[..., None]
  gammas = xp.arange(1, max_gamma + 1)
  if verify_costs is None:
    speed = walltime_improvement(alpha, gammas, c)
  else:
    verify_costs = xp.asarray(verify_costs)
    if verify_costs.shape != (max_gamma,):
      raise ValueError(f"verify_costs must hold one cost per gamma 1.."
                       f"{max_gamma}, got shape {verify_costs.shape}.")
    speed = walltime_improvement_measured(alpha, gammas, c, verify_costs)
  return xp.argmax(speed, axis=-1) + 1
