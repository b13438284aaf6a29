"""The paper's analysis: alpha, expected tokens, speedup, optimal gamma.

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

import heapq

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
  """Theorem 3.1: E[tokens per target run] = (1 - alpha^(gamma+1)) / (1-alpha).

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
                                    lengths, verify_cost: float = 1.0,
                                    target_prefill: float = 0.0,
                                    draft_prefill: float = 0.0) -> float:
  """Theorem 3.8's prediction for outputs of the given lengths.

  The baseline takes one step per token; speculative decoding takes
  `expected_iterations` runs of cost gamma c + verify_cost steps each (the
  paper's cost model at verify_cost = 1):

    sum(lengths) / (sum_i f(length_i) (gamma c + verify_cost)).

  Like the theorem, it leaves out costs paid once per input by default.
  Given them (`target_prefill`, `draft_prefill`: the models' prefill, e.g.
  a T5 encoder, in target steps), each output's baseline also pays the
  target's prefill and its speculative decode both models':

    sum_i (p_t + n_i) / sum_i (p_t + p_d + f(n_i) (gamma c + verify_cost)).
  """
  lengths = [int(n) for n in lengths]
  if not lengths or sum(lengths) == 0 or min(lengths) < 0:
    raise ValueError("lengths must be >= 0 and hold at least one non-empty "
                     f"output, got {lengths[:8]}")
  if min(target_prefill, draft_prefill) < 0:
    raise ValueError(f"prefill costs must be >= 0, got {target_prefill} and "
                     f"{draft_prefill}")
  table = _runs_table(alpha, gamma, max(lengths))
  runs = float(sum(table[n] for n in lengths))
  once = len(lengths) * target_prefill
  return (sum(lengths) + once) / (
      runs * (gamma * c + verify_cost) + once + len(lengths) * draft_prefill)


def alpha_for_improvement(improvement: float, gamma: int, c: float,
                          verify_cost: float = 1.0, lengths=None,
                          target_prefill: float = 0.0,
                          draft_prefill: float = 0.0) -> float:
  """The smallest alpha at which the predicted improvement reaches a goal.

  The inverse of `walltime_improvement_measured` (lengths None: endless
  outputs, Theorem 3.8 with v = verify_cost) or of
  `walltime_improvement_at_lengths` (given lengths and prefills), in alpha
  at fixed gamma and costs. Both rise monotonically with alpha, so the
  answer is found by bisection to ~1e-12.

  Returns 0.0 when even alpha = 0 reaches the goal, and NaN when alpha = 1
  does not: then no draft, however good, gets there at this gamma and these
  costs (ask for a larger gamma, a cheaper draft or a cheaper verification).
  """
  if gamma < 1:
    raise ValueError(f"need gamma >= 1, got {gamma}")
  if lengths is None:
    if target_prefill or draft_prefill:
      raise ValueError("prefill costs need the outputs' lengths")

    def predict(alpha):
      return float(walltime_improvement_measured(alpha, gamma, c,
                                                 verify_cost))
  else:
    lengths = list(lengths)

    def predict(alpha):
      return walltime_improvement_at_lengths(
          alpha, gamma, c, lengths, verify_cost=verify_cost,
          target_prefill=target_prefill, draft_prefill=draft_prefill)
  if predict(0.0) >= improvement:
    return 0.0
  if predict(1.0) < improvement:
    return float("nan")
  low, high = 0.0, 1.0
  for _ in range(42):  # 2^-42 ~ 2e-13
    middle = (low + high) / 2
    if predict(middle) >= improvement:
      high = middle
    else:
      low = middle
  return high


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


# ----------------------------------------------------------------------------
# Beyond a fixed gamma: adaptive draft lengths and cascades.


def expected_tokens_adaptive(accept, length_probs):
  """Theorem 3.1 for a proposal length K that varies per iteration.

  An iteration that proposes k tokens emits 1 + sum_{i<=k} prod_{j<=i} a_j
  tokens on average (each accepted prefix plus the target's own token), so

    E[tokens per target run] = sum_k P(K = k) (1 + sum_{i<=k} prod_{j<=i} a_j).

  With a_j = alpha and K = gamma it is Theorem 3.1. It assumes that whether a
  token is accepted does not depend on how many were proposed (true when the
  rule reads the draft only and the acceptance of a draft token does not
  depend on its confidence; otherwise pass the acceptance conditional on
  being proposed, position by position).

  Args:
    accept: acceptance probability per draft position, a scalar alpha or
      [G] (a_1 .. a_G).
    length_probs: [G + 1] P(K = k) for k = 0..G (e.g. a normalised
      `proposal_histogram`); k = 0 (no proposal) is a plain target step.

  Returns:
    float.
  """
  length_probs = np.asarray(length_probs, np.float64)
  gamma = length_probs.shape[-1] - 1
  accept = np.broadcast_to(np.asarray(accept, np.float64), (gamma,))
  per_k = 1.0 + np.concatenate([[0.0], np.cumsum(np.cumprod(accept))])
  return float(np.dot(length_probs / length_probs.sum(), per_k))


def walltime_improvement_adaptive(accept, length_probs, c,
                                  verify_costs=None) -> float:
  """Theorem 3.8 for a varying proposal length (renewal-reward: expected
  tokens per iteration over expected time per iteration):

    E[tokens] / (c E[K] + E[v(K)]),

  with v(k) the cost of the target run that verifies k proposals (1, the
  paper's model, unless `verify_costs` [G + 1] gives v(0..G)). Costs are in
  target steps.
  """
  length_probs = np.asarray(length_probs, np.float64)
  length_probs = length_probs / length_probs.sum()
  ks = np.arange(length_probs.shape[-1])
  verify = (np.ones_like(length_probs) if verify_costs is None
            else np.asarray(verify_costs, np.float64))
  time = c * np.dot(length_probs, ks) + np.dot(length_probs, verify)
  return expected_tokens_adaptive(accept, length_probs) / time


def cascade_calls(alphas, gammas) -> np.ndarray:
  """Expected calls of each level per target call in a cascade.

  Level 0 is the target, level i + 1 drafts for level i. Level 1 must hand
  the target gammas[0] tokens per target run; a middle level i >= 1 makes
  them by speculative decoding with level i + 1 as drafter (gammas[i] draft
  tokens per run), until it has at least what was asked: by Theorem 3.1's
  i.i.d. model that takes `expected_iterations(alphas[i], gammas[i], n)`
  runs for n tokens. The bottom level runs once per token it proposes.

  Args:
    alphas: [D] alphas[i]: acceptance of level i + 1's tokens by level i.
    gammas: [D] gammas[i]: tokens level i + 1 proposes per level-i run.

  Returns:
    float [D + 1]: calls of levels 0..D per target call (the first is 1).
  """
  alphas, gammas = list(alphas), [int(g) for g in gammas]
  if len(alphas) != len(gammas) or not alphas:
    raise ValueError(f"need one alpha per gamma, got {alphas}, {gammas}")
  calls, runs = [1.0], 1.0
  for i in range(1, len(gammas)):
    runs *= expected_iterations(alphas[i], gammas[i], gammas[i - 1])
    calls.append(runs)
  calls.append(runs * gammas[-1])
  return np.asarray(calls)


def cascade_walltime_improvement(alphas, gammas, costs) -> float:
  """Theorem 3.8 for a cascade: the target's expected tokens per run
  (Theorem 3.1 with alphas[0], gammas[0]) over the time of one outer
  iteration, 1 + sum_i costs[i] calls_i (see `cascade_calls`), where
  costs[i] is one run of level i + 1 in target runs (its c). With one level
  it is Theorem 3.8. Verification costs are taken as one run at every level,
  as in the paper.
  """
  calls = cascade_calls(alphas, gammas)
  costs = np.asarray(costs, np.float64)
  if costs.shape != (len(calls) - 1,):
    raise ValueError(f"need one cost per draft level ({len(calls) - 1}), got "
                     f"{costs.shape}")
  time = 1.0 + float(np.dot(calls[1:], costs))
  return float(expected_tokens(alphas[0], gammas[0])) / time


# ----------------------------------------------------------------------------
# Token trees (beyond the paper; `drafts/trees.py`, their shapes
# `decoding/tree_shape.py`).
#
# A tree's walk accepts, at each node, the child of rank j with probability
# a[d, j] given that its elder siblings were rejected (d the child's depth
# - 1). With these per-rank rates as the only model of the draft (the
# trees' analogue of the paper's i.i.d. alpha: one rate per depth and rank,
# whatever the prefix), a node is reached with the product of its path's
# acceptances, and the expected tokens per call is 1 plus their sum
# (Theorem 3.8 for a chain: a[d, 0] = alpha gives (1 - alpha^(g+1)) /
# (1 - alpha)).


def rank_acceptance(rank_histogram, children=None) -> np.ndarray:
  """a [D, k]: the measured rate at which the child of rank j is accepted
  at depth d, given that the walk reached depth d and rejected its elder
  siblings, from `DecodeStats.rank_histogram` summed over rows ([D, k + 1],
  column k counting the walks that accepted none). NaN where no walk got
  that far. `children` [D] (the number of children of every node of each
  depth, `trees.shape.TreeShape.describe`'s numbers) marks ranks past a depth's
  children NaN; nodes of one depth with different numbers of children
  would be pooled: measure with a shape whose depths are uniform."""
  hist = np.asarray(rank_histogram, np.float64)
  if hist.ndim == 3:
    hist = hist.sum(axis=0)
  reached = np.cumsum(hist[:, ::-1], axis=1)[:, ::-1]   # rank >= j or none
  with np.errstate(invalid="ignore", divide="ignore"):
    rates = np.where(reached[:, :-1] > 0, hist[:, :-1] / reached[:, :-1],
                     np.nan)
  if children is not None:
    ranks = np.arange(rates.shape[1])[None, :]
    rates = np.where(ranks < np.asarray(children)[:, None], rates, np.nan)
  return rates


def _child_probability(rank_accept: np.ndarray, depth: int, rank: int):
  """P(the walk at a node of depth `depth` accepts its rank-`rank` child),
  from the per-rank rates a (NaN and missing entries count as 0)."""
  a = np.nan_to_num(np.asarray(rank_accept, np.float64))
  if depth >= a.shape[0] or rank >= a.shape[1]:
    return 0.0
  return float(a[depth, rank] * np.prod(1.0 - a[depth, :rank]))


def tree_node_probabilities(parents, rank_accept) -> np.ndarray:
  """P(the walk reaches node i) [M + 1] of the tree whose nodes 1..M have
  `parents` (breadth first, `trees.shape.TreeShape.parents`), under the per-rank
  rates a [D, k] (`rank_acceptance`); node 0, the root, has 1."""
  reach, depth, seen = [1.0], [0], {}
  for p in parents:
    rank = seen.get(p, 0)
    seen[p] = rank + 1
    depth.append(depth[p] + 1)
    reach.append(reach[p] * _child_probability(rank_accept, depth[p], rank))
  return np.asarray(reach)


def tree_expected_tokens(parents, rank_accept) -> float:
  """Expected tokens per target call of a tree (accepted draft tokens plus
  the target's own), ignoring the end of the sequence."""
  return float(np.sum(tree_node_probabilities(parents, rank_accept)))


def best_tree_parents(rank_accept, size: int) -> tuple[int, ...]:
  """The parents (breadth first) of a tree of at most `size` nodes with
  the most `tree_expected_tokens` under the per-rank rates: its nodes are
  the most probable ones, taken one at a time from the frontier (a node's
  first child and its next younger sibling), which keeps a tree. That is
  the optimum whenever a younger sibling is never more probable than its
  elder (a[d, j+1] (1 - a[d, j]) <= a[d, j]: true of every profile
  measured here, where a first child is accepted far more often than the
  rest); otherwise it is a good tree, not the best. Nodes of probability 0
  (past the rates' depth or ranks) are never taken, so the tree can have
  fewer than `size` nodes."""
  if size < 1:
    raise ValueError(f"a tree needs at least one node, got size={size}.")
  # A node is its path of ranks from the root; ties go to the shallower.
  frontier, chosen = [], []

  def offer(reach, path, parent_reach):
    if reach > 0:
      heapq.heappush(frontier, (-reach, len(path), path, parent_reach))

  offer(_child_probability(rank_accept, 0, 0), (0,), 1.0)
  while frontier and len(chosen) < size:
    neg, depth, path, parent_reach = heapq.heappop(frontier)
    chosen.append(path)
    offer(-neg * _child_probability(rank_accept, depth, 0), path + (0,),
          -neg)
    offer(parent_reach * _child_probability(rank_accept, depth - 1,
                                            path[-1] + 1),
          path[:-1] + (path[-1] + 1,), parent_reach)
  if not chosen:
    raise ValueError("the rates accept no first child at depth 1: no tree "
                     "has a node worth verifying.")
  order = sorted(chosen, key=lambda path: (len(path), path))
  index = {(): 0}
  index.update({path: i + 1 for i, path in enumerate(order)})
  return tuple(index[path[:-1]] for path in order)
