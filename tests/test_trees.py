"""Token trees (`drafts/trees.py`): the models score a tree chunk as they
score each of its paths, the tree loop keeps the target's distribution, and
a wrong verifier is caught.

Statistics (as tests/test_negative_controls.py): N_SEQ = 20,000 rows of one
input tiled as a batch with per-row keys, 5-token sequences over the
4-token vocabulary of the toy table models (`helpers.chi_square_family`),
Pearson's chi-square against the exact distribution (cells expected fewer
than 5 times pooled), significance SIGNIFICANCE = 1e-3 per test, fixed
seeds. The exact walk passes at (temperature 1, top-k 3) and at
(temperature 0.7, top-p 0.9) for the shape (2, 2, 1), and for (3, 1) at
the latter; the negative control (an acceptance rule that skips the
residual: siblings tested against p instead of the residual their elder
siblings left, the correction drawn from p) must fail at p < 1e-3 with the
same models, shape, seed and N, so the test has power against that bug. The shipped demo models' check is in
tests/test_exact_demo.py (the "tree" drafter).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specdec_jax as sd
from specdec_jax import sampling
from specdec_jax.decoding import acceptance
from specdec_jax.decoding import cursor as cursor_lib
from specdec_jax.decoding import engine
from specdec_jax.decoding import protocol
from specdec_jax.decoding import verify
from specdec_jax.decoding.cursor import ModelCursor
from specdec_jax.models import registry
from tests import helpers

SIGNIFICANCE = 1e-3
N_SEQ = 20_000
SEQ_LEN = 5
SETTINGS = {"t1_top_k3": dict(temperature=1.0, top_k=3),
            "t0.7_top_p0.9": dict(temperature=0.7, top_p=0.9)}


@pytest.fixture(scope="module")
def toy():
  return helpers.chi_square_family()


def _sampled(target, draft, shape, rule=None, **setting):
  """Tokens [N_SEQ, SEQ_LEN] of the tree loop from one tiled input."""
  ids = np.tile(np.array([[2, 3, 1]], np.int32), (N_SEQ, 1))
  tree = sd.tree(draft, shape)
  fn = engine.build_speculative(
      target.definition, tree.definition, tree.definition.tree_shape.depth,
      SEQ_LEN, sampling.SamplingConfig(**setting), rule=rule)
  tokens, stats = fn(target.params, tree.params, ids,
                     np.full((N_SEQ,), 11, np.int32),
                     np.arange(N_SEQ, dtype=np.int32))
  return np.asarray(tokens), stats


@pytest.mark.parametrize("setting,shape", [
    ("t1_top_k3", (2, 2, 1)), ("t0.7_top_p0.9", (2, 2, 1)),
    ("t0.7_top_p0.9", (3, 1))])
def test_tree_samples_the_targets_distribution(toy, setting, shape):
  """Whole 5-token sequences of the tree loop pass the chi-square test
  against the target's exact distribution (module docstring)."""
  target, draft, _, _ = toy
  exact = helpers.exact_distribution(
      target, np.array([2, 3, 1]), SEQ_LEN, **SETTINGS[setting])
  tokens, stats = _sampled(target, draft, shape, **SETTINGS[setting])
  p_value = helpers.chisquare_vs_exact(tokens, exact)
  assert p_value > SIGNIFICANCE, (setting, shape, p_value)
  # The walk took siblings other than the first: the test covers them.
  ranks = np.asarray(stats.rank_histogram).sum(axis=(0, 1))
  assert ranks[1] > 0, ranks


def test_skipping_the_sibling_residual_fails(toy):
  """Negative control: each child tested against the target's p itself
  instead of the residual its rejected elder siblings left (and the
  correction drawn from p) over-accepts the tokens the draft over-proposes;
  the same chi-square test must reject it (p < SIGNIFICANCE) where the
  exact walk passes (above, same shape, models, seed and N). The wrong rule
  (`helpers.SkipResidual`) is passed as the loop's `rule`."""
  target, draft, _, _ = toy
  setting = SETTINGS["t1_top_k3"]
  exact = helpers.exact_distribution(target, np.array([2, 3, 1]), SEQ_LEN,
                                     **setting)
  tokens, _ = _sampled(target, draft, (2, 2, 1),
                       rule=helpers.SkipResidual(), **setting)
  p_value = helpers.chisquare_vs_exact(tokens, exact)
  assert p_value < SIGNIFICANCE, p_value


@pytest.mark.parametrize("shape", [(3, 2, 1), sd.TreeShape((0, 0, 1))])
def test_greedy_tree_equals_target_greedy_on_toy_models(toy, shape):
  """Greedy decoding with a tree (children: the draft's top k) emits the
  target's greedy tokens, for every row of a ragged batch (per-row paths,
  rollbacks and cache moves), with more than one token per call; in a
  shape whose second child has no children of its own, a walk that ends
  there is not counted as a rejection at depth 2 (its rank histogram
  holds one walk per target call at depth 1 and fewer at depth 2)."""
  target, draft, _, _ = toy
  ids = np.array([[2, 3, 1], [3, 1, 0], [1, 0, 0], [2, 2, 1]], np.int32)
  base = sd.generate(target, ids, max_decode_len=12)
  tree = sd.tree(draft, shape)
  # No gamma: a tree's is its depth.
  res = sd.speculative_generate(target, tree, ids, max_decode_len=12)
  np.testing.assert_array_equal(res.tokens, base.tokens)
  assert res.stats.length.sum() > res.stats.target_calls.sum()
  hist = np.asarray(res.stats.rank_histogram).sum(axis=0)
  assert hist[0].sum() <= res.stats.target_calls.sum()
  if isinstance(shape, sd.TreeShape):
    # Depth 2 is tested only below the first child (the second has none).
    assert hist[1].sum() <= hist[0][0]


def test_gamma_defaults_to_the_trees_depth_and_is_required_for_a_chain(toy):
  """A tree fixes gamma (its depth): the decoder takes it from the tree and
  refuses another; a chain draft without gamma is refused, naming gamma,
  before anything compiles."""
  target, draft, _, _ = toy
  decoder = sd.SpeculativeDecoder(target, sd.tree(draft, (2, 1, 1)),
                                  max_decode_len=8)
  assert decoder.gamma == 3
  with pytest.raises(ValueError, match="pass gamma=3"):
    sd.SpeculativeDecoder(target, sd.tree(draft, (2, 1, 1)), gamma=2,
                          max_decode_len=8)
  with pytest.raises(ValueError, match="gamma is required"):
    sd.speculative_generate(target, draft, np.array([[2, 3, 1]], np.int32),
                            max_decode_len=8)


@pytest.mark.parametrize("fast", [True, False])
def test_a_walk_ending_at_a_childless_node_tests_nothing_there(fast):
  """Shape (0, 0, 1): the root's second child has no children. A walk that
  accepts it emits the target's token after it (greedy: its argmax) and
  reports depth 2 as untested (rank k + 1, `tested` False), so the
  counters do not take it for a rejection."""
  shape = sd.TreeShape((0, 0, 1))
  vocab = 5
  tokens = jnp.asarray([[0, 2, 3, 4]], jnp.int32)   # nodes 1, 2, 3
  logits = np.full((1, 4, vocab), -5.0, np.float32)
  logits[0, 0, 3] = 5.0   # at the root the target wants node 2's token
  logits[0, 2, 1] = 5.0   # after node 2: EOS... any token; here 1
  q = np.full((1, 2, vocab), 1e-3, np.float32)   # internal nodes 0, 1
  q[0, 0, [2, 3]] = 0.5 - 1e-3
  q[0, 1, 4] = 1.0 - 4e-3
  prop = protocol.Proposal(tokens=tokens[:, 1:],
                           valid=jnp.ones((1, 3), jnp.bool_),
                           probs=None if fast else jnp.asarray(q),
                           conf=jnp.zeros((1, 2)),
                           length=jnp.full((1,), 2, jnp.int32))
  sampler = sampling.SamplingConfig(0.0 if fast else 0.05)
  rule = acceptance.rule_for(sampler)
  verdict = verify.walk(rule, rule.target(sampler, jnp.asarray(logits)),
                        prop, shape, jax.random.key(0)[None])
  path, rank, tested = verdict.path, verdict.rank, verdict.tested
  assert int(verdict.accepted[0]) == 1 and int(path[0, 0]) == 2
  assert int(verdict.tokens[0, 1]) == 1
  assert rank[0].tolist() == [1, 3] and tested[0].tolist() == [True, False]


def _tree_vs_paths(definition, params, input_ids, prefix, shape, seed):
  """(logits of every node of a tree chunk fed after `prefix`, logits of
  each node when its root-to-leaf path is fed alone as a chain: every node
  lies on one, at its depth)."""
  rng = np.random.default_rng(seed)
  batch = input_ids.shape[0]
  tokens = rng.integers(2, definition.vocab_size,
                        (batch, shape.verified)).astype(np.int32)
  n = len(prefix)
  extend = jax.jit(definition.extend)
  pre = definition.prefill(params, input_ids, n + shape.verified + 2)
  start = np.asarray(pre.start_pos)
  seq = jnp.asarray(np.tile(np.asarray(prefix, np.int32), (batch, 1)))
  _, cache = extend(params, pre.cache, seq,
                    jnp.asarray(start[:, None] + np.arange(n)))
  root = jnp.asarray(start + n)
  tree_logits, _ = extend(
      params, cache, jnp.asarray(tokens),
      root[:, None] + shape.depths[None, :],
      cursor_lib.tree_mask(shape, root, np.arange(shape.verified)))
  path_logits = np.full(tree_logits.shape, np.nan, np.float32)
  for leaf in shape.levels[-1]:
    path = np.flatnonzero(shape.ancestors[leaf])      # root .. leaf
    logits, _ = extend(params, cache, jnp.asarray(tokens[:, path]),
                       root[:, None] + np.arange(len(path))[None, :])
    path_logits[:, path] = np.asarray(logits)
  return np.asarray(tree_logits), path_logits


@pytest.mark.parametrize("name", ["t5_1_1_tiny", "gpt_tiny"])
def test_models_score_a_tree_as_its_paths(name):
  """Each node of a tree chunk (attention mask over the chunk's nodes,
  positions by depth, slots past the root) gets the logits it gets on its
  root-to-leaf path fed alone as a chain, for T5's relative
  position buckets and for the GPT-like model (float tolerance); rows of
  different prompt lengths (GPT) put the root at different slots."""
  cfg = registry.get_config(name)
  definition = registry.make_def(cfg)
  params = definition.init_params(jax.random.PRNGKey(0))
  ids = np.array([[5, 7, 9, 1], [4, 1, 0, 0]], np.int32)
  shape = sd.TreeShape.from_branching((3, 2, 1))
  tree, paths = _tree_vs_paths(definition, params, ids, [0, 11, 12], shape,
                               seed=1)
  assert not np.isnan(paths).any()  # every node was on a path
  np.testing.assert_allclose(tree, paths, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["t5_1_1_tiny", "gpt_tiny"])
def test_kept_path_continues_like_a_chain(name):
  """After a tree chunk, `keep_path` moves one path's keys/values into the
  slots of its positions: the next token's logits then equal those of a
  cache that saw the path as a plain chain (the stale sibling slots are
  invisible)."""
  cfg = registry.get_config(name)
  definition = registry.make_def(cfg)
  params = definition.init_params(jax.random.PRNGKey(1))
  ids = np.array([[5, 7, 9, 1], [4, 1, 0, 0]], np.int32)
  shape = sd.TreeShape.from_branching((2, 2, 1))
  tokens = np.random.default_rng(2).integers(
      2, cfg.vocab_size, (2, shape.verified)).astype(np.int32)
  extend = jax.jit(definition.extend)
  pre = definition.prefill(params, ids, shape.verified + 4)
  cursor = ModelCursor(pre.cache, pre.start_token,
                                          pre.start_pos)
  n = jnp.zeros((2,), jnp.int32)
  _, tree_cursor = cursor.extend_tree(definition, params, jnp.asarray(tokens),
                                      n, shape, np.arange(shape.verified))
  path = jnp.asarray([[2, 6, 10], [1, 3, 7]], jnp.int32)  # second, first
  kept = tree_cursor.keep_path(definition, n, path)
  nxt = jnp.asarray([[3], [3]], jnp.int32)
  at = pre.start_pos[:, None] + 4
  after_tree, _ = extend(params, kept.cache, nxt, at)
  chain = np.concatenate([tokens[:, :1], np.take_along_axis(
      tokens, np.asarray(path), 1)], axis=1)
  _, chain_cache = extend(
      params, pre.cache, jnp.asarray(chain),
      pre.start_pos[:, None] + np.arange(4)[None, :])
  after_chain, _ = extend(params, chain_cache, nxt, at)
  np.testing.assert_allclose(np.asarray(after_tree), np.asarray(after_chain),
                             rtol=1e-4, atol=1e-4)


def test_bad_tree_settings_are_refused_before_compiling(toy):
  """gamma other than the depth, a lossy lenience, a stop rule, a tree
  deeper than max_decode_len or wider than the vocabulary: a ValueError
  naming the tree and the fix, before anything is traced."""
  target, draft, _, _ = toy
  ids = np.array([[2, 3, 1]], np.int32)
  tree = sd.tree(draft, (2, 1))
  cases = [
      (dict(gamma=3), "gamma=2"),
      (dict(gamma=2, lenience=0.5), "lenience"),
      (dict(gamma=2, draft_stop=sd.ConfidenceStop(0.5)), "draft_stop"),
      (dict(gamma=2, max_decode_len=1), "deeper than max_decode_len"),
  ]
  with helpers.CompileCounter() as compiles:
    for kwargs, message in cases:
      kwargs.setdefault("max_decode_len", 8)
      with pytest.raises(ValueError, match=message):
        sd.speculative_generate(target, tree, ids, **kwargs)
    with pytest.raises(ValueError, match="vocabulary has 4"):
      sd.speculative_generate(target, sd.tree(draft, (5,)), ids, gamma=1,
                              max_decode_len=8)
    with pytest.raises(TypeError, match="plain model"):
      sd.tree(sd.cascade(draft, draft, gamma=2), (2,))
    with pytest.raises(TypeError, match="token tree"):
      sd.cascade(draft, sd.tree(draft, (2,)), gamma=2)
    with pytest.raises(TypeError, match="token tree"):
      sd.horizontal(sd.tree(draft, (2,)), draft, split=1)
  assert compiles.count == 0


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_chains_walk_is_the_general_walk_on_a_chain(temperature):
  """`verify.walk` takes every depth of a chain at once (`_walk_chain`);
  on a chain it must decide exactly what the depth-by-depth walk of any
  tree (`_walk_tree`) decides with the same uniforms: the tokens, the
  counts and every counter the loop takes (beta, accept_prob at the
  tested depths), for rows that accept 0..G tokens and rows that proposed
  fewer than G (`valid`)."""
  batch, gamma, vocab = 256, 4, 6
  rng = np.random.default_rng(0)
  logits = jnp.asarray(rng.normal(0, 1.5, (batch, gamma + 1, vocab)),
                       jnp.float32)
  sampler = sampling.SamplingConfig(temperature)
  rule = acceptance.rule_for(sampler)
  q = jax.nn.softmax(jnp.asarray(rng.normal(0, 1.5, (batch, gamma, vocab)),
                                 jnp.float32) + logits[:, :gamma], -1)
  tokens = jnp.asarray(np.argmax(
      rng.gumbel(size=q.shape) + np.log(np.asarray(q)), -1), jnp.int32)
  length = jnp.asarray(rng.integers(1, gamma + 1, batch), jnp.int32)
  prop = protocol.chain_proposal(tokens, q if rule.uses_q else None,
                                 jnp.zeros((batch, gamma)), length)
  p = rule.target(sampler, logits)
  u = jax.random.uniform(jax.random.key(3), (batch, gamma + 1))
  fast = verify._walk_chain(rule, p, prop, u)  # pylint: disable=protected-access
  slow = verify._walk_tree(rule, p, prop, sd.TreeShape.chain(gamma), u)  # pylint: disable=protected-access
  assert 0 < int(jnp.sum(fast.accepted == 0)) < batch
  assert int(jnp.sum(fast.accepted == length)) > 0
  for name in ("accepted", "next", "count", "path", "rank", "tested"):
    np.testing.assert_array_equal(getattr(fast, name), getattr(slow, name),
                                  err_msg=name)
  tested = np.asarray(slow.tested)
  for name in ("beta", "accept_prob"):
    np.testing.assert_allclose(np.where(tested, getattr(fast, name), 0),
                               np.where(tested, getattr(slow, name), 0),
                               rtol=1e-6, err_msg=name)
