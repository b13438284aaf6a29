"""The static shape of a proposal: each draft node's parent, breadth first
(a chain of gamma tokens is `TreeShape.chain(gamma)`).

A `TreeShape` is what a tree drafter (`drafts/trees.py`) expands level by
level and what the target verifies in one call; its combinatorics (depths,
levels, children, ranks, ancestors) are numpy arrays computed once, so the
decoding loop closes over them as constants. Its expected tokens per call
under a measured profile of acceptance per child rank is in `theory`
(`tree_expected_tokens`), which `TreeShape.best` maximises.

Letters: M tree nodes (root excluded), D depth, k most children of a node.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Sequence

import numpy as np

from specdec_jax import theory


@dataclasses.dataclass(frozen=True)
class TreeShape:
  """A static tree of draft positions, breadth first.

  Attributes:
    parents: the parent of nodes 1..M (node 0 is the root, the pending
      token): non-decreasing, each below its node, so that nodes come
      breadth first and siblings are contiguous, in rank order (the first
      child is the draft's first sample, or its argmax when greedy).
  """

  parents: tuple[int, ...]

  def __post_init__(self):
    parents = tuple(self.parents)
    object.__setattr__(self, "parents", parents)
    if not parents:
      raise ValueError("a tree shape needs at least one node below the root.")
    for i, p in enumerate(parents):
      if (isinstance(p, bool) or not isinstance(p, (int, np.integer))
          or not 0 <= p <= i):
        raise ValueError(
            f"tree shape: node {i + 1}'s parent must be an earlier node "
            f"(0..{i}), got {p!r}.")
      if i and p < parents[i - 1]:
        raise ValueError(
            f"tree shape: parents must be listed breadth first "
            f"(non-decreasing), but node {i + 1}'s parent {p} comes after "
            f"node {i}'s parent {parents[i - 1]}.")

  @classmethod
  def from_branching(cls, branching: Sequence[int]) -> "TreeShape":
    """Every node of depth d gets branching[d] children."""
    branching = tuple(branching)
    if not branching or any(
        isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b < 1
        for b in branching):
      raise ValueError(f"tree branching must be integers >= 1, one per "
                       f"depth, e.g. (3, 2, 1, 1); got {branching!r}.")
    parents, level, next_id = [], [0], 1
    for b in branching:
      new_level = []
      for node in level:
        for _ in range(b):
          parents.append(node)
          new_level.append(next_id)
          next_id += 1
      level = new_level
    return cls(tuple(parents))

  @classmethod
  def chain(cls, gamma: int) -> "TreeShape":
    """The paper's chain of gamma tokens, as a tree."""
    return cls.from_branching((1,) * gamma)

  @property
  def num_nodes(self) -> int:
    """M, the draft positions (root excluded)."""
    return len(self.parents)

  @property
  def verified(self) -> int:
    """Tokens the target scores per call: M + 1."""
    return len(self.parents) + 1

  @functools.cached_property
  def depths(self) -> np.ndarray:
    """int32 [M + 1], each node's depth (root 0)."""
    depth = [0]
    for p in self.parents:
      depth.append(depth[p] + 1)
    return np.asarray(depth, np.int32)

  @property
  def depth(self) -> int:
    """D, the longest path (the most draft tokens one call can accept)."""
    return int(self.depths.max())

  @functools.cached_property
  def levels(self) -> tuple[np.ndarray, ...]:
    """The node indices of each depth 0..D."""
    return tuple(np.flatnonzero(self.depths == d)
                 for d in range(self.depth + 1))

  @functools.cached_property
  def children(self) -> np.ndarray:
    """int32 [M + 1, k]: node i's children in rank order, padded with 0."""
    kids = [[] for _ in range(self.verified)]
    for i, p in enumerate(self.parents):
      kids[p].append(i + 1)
    width = max(len(k) for k in kids)
    return np.asarray([k + [0] * (width - len(k)) for k in kids], np.int32)

  @functools.cached_property
  def num_children(self) -> np.ndarray:
    """int32 [M + 1]."""
    return np.bincount(np.asarray(self.parents),
                       minlength=self.verified).astype(np.int32)

  @property
  def max_children(self) -> int:
    return int(self.num_children.max())

  @functools.cached_property
  def ranks(self) -> np.ndarray:
    """int32 [M + 1], each node's rank among its siblings (root 0)."""
    rank, seen = [0], {}
    for p in self.parents:
      rank.append(seen.get(p, 0))
      seen[p] = rank[-1] + 1
    return np.asarray(rank, np.int32)

  @functools.cached_property
  def ancestors(self) -> np.ndarray:
    """bool [M + 1, M + 1]: [i, j] iff j is i or an ancestor of i."""
    out = np.eye(self.verified, dtype=bool)
    for i, p in enumerate(self.parents, start=1):
      out[i] |= out[p]
    return out

  def describe(self) -> str:
    """Branching per depth when uniform ("3x2x1x1"), else the node count
    and depth ("31 nodes, depth 7")."""
    uniform = []
    for level in self.levels[:-1]:
      counts = set(self.num_children[level].tolist())
      if len(counts) != 1:
        return f"{self.num_nodes} nodes, depth {self.depth}"
      uniform.append(counts.pop())
    return "x".join(map(str, uniform))

  @classmethod
  def best(cls, rank_accept: np.ndarray, size: int) -> "TreeShape":
    """The shape of `size` nodes with the largest expected accepted length
    when a child of rank j at depth d is accepted with probability
    rank_accept[d, j] given that its elder siblings were rejected (a
    Sequoia-style shape; see `theory.tree_node_probabilities`): the most
    probable nodes, taken one at a time where they keep a tree
    (`theory.best_tree_parents` says when that is the optimum: always for
    the profiles measured here)."""
    return cls(theory.best_tree_parents(np.asarray(rank_accept), size))
