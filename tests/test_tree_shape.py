"""Tests for decoding/tree_shape.py: a token tree's static shape, and the
best shape under per-rank acceptance rates (`theory`'s expected tokens)."""

import numpy as np
import pytest

import specdec_jax as sd
from specdec_jax import theory

pytestmark = pytest.mark.quick  # `make test-quick`


def test_tree_shapes():
  """Branching per depth numbers nodes breadth first; bad shapes name the
  problem; the best tree under per-rank rates is a tree whose expected
  tokens per call beat the chain of as many nodes; Theorem 3.8 is the
  chain's case."""
  shape = sd.TreeShape.from_branching((3, 2, 1))
  assert shape.parents == (0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 5, 6, 7, 8, 9)
  assert (shape.num_nodes, shape.depth, shape.max_children) == (15, 3, 3)
  assert shape.describe() == "3x2x1"
  with pytest.raises(ValueError, match="breadth first"):
    sd.TreeShape((0, 1, 0))
  with pytest.raises(ValueError, match="earlier node"):
    sd.TreeShape((0, 2))
  with pytest.raises(ValueError, match="integers >= 1"):
    sd.TreeShape.from_branching((2, 0))
  rates = np.array([[0.7, 0.4, 0.2]] * 5)
  chain = sd.TreeShape.chain(5)
  np.testing.assert_allclose(
      theory.tree_expected_tokens(chain.parents, rates),
      theory.expected_tokens(0.7, 5))
  best = sd.TreeShape.best(rates, 8)
  assert best.num_nodes == 8 and best.max_children > 1
  assert (theory.tree_expected_tokens(best.parents, rates)
          > theory.tree_expected_tokens(sd.TreeShape.chain(8).parents, rates))
  # rank_acceptance inverts what a walk counts.
  hist = np.array([[50, 30, 20], [10, 10, 80]])  # rank 0, rank 1, none
  np.testing.assert_allclose(theory.rank_acceptance(hist),
                             [[0.5, 0.6], [0.1, 10 / 90]])
