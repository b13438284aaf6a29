"""Tests for specdec_jax.sampling: the transforms and the exact rejection sampler.

Statistical tests use Pearson's chi-square goodness of fit at significance
SIGNIFICANCE = 1e-3 per test (fixed seeds, so each run is deterministic; a
correct sampler fails a given test with probability 1e-3 over seeds). With
N = 200,000 draws the negative controls below deviate by >= 0.05 in some cell
probability, which gives a chi-square statistic in the thousands: their power
at this level is essentially 1, and the tests assert that they fail.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from specdec_jax import sampling
from specdec_jax import theory
from specdec_jax.decoding import acceptance
from specdec_jax.decoding import verify

pytestmark = pytest.mark.quick  # `make test-quick`

SIGNIFICANCE = 1e-3
N = 200_000
GAMMA = 3
VOCAB = 5


def _dists(case, seed=0):
  """Fixed per-position target p [G+1, V] and draft q [G, V] for one case."""
  rng = np.random.default_rng(seed)
  p = rng.dirichlet(np.ones(VOCAB), size=GAMMA + 1)
  if case == "random":
    q = rng.dirichlet(np.ones(VOCAB), size=GAMMA)
  elif case == "disjoint":
    p = np.zeros((GAMMA + 1, VOCAB))
    p[:, :2] = rng.dirichlet(np.ones(2), size=GAMMA + 1)
    q = np.zeros((GAMMA, VOCAB))
    q[:, 2:] = rng.dirichlet(np.ones(VOCAB - 2), size=GAMMA)
  elif case == "equal":
    q = p[:GAMMA].copy()
  elif case == "onehot_q":
    q = np.eye(VOCAB)[rng.integers(0, VOCAB, size=GAMMA)]
  elif case == "sharp":
    logits = rng.normal(size=(GAMMA * 2 + 1, VOCAB)) * 6.0
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    p, q = probs[:GAMMA + 1], probs[GAMMA + 1:]
  else:
    raise ValueError(case)
  return p.astype(np.float32), q.astype(np.float32)


def _draw(p, q, accept_fn, *, argmax_draft=False, seed=1):
  """Runs N independent rows of one speculative step.

  Returns (num_accepted [N], emitted [N, G+1]) where emitted[:, k] is the
  token at position k+1 when n >= k, else -1.
  """
  key_draft, key_accept = jax.random.split(jax.random.key(seed))
  qb = jnp.broadcast_to(q, (N,) + q.shape)
  pb = jnp.broadcast_to(p, (N,) + p.shape)
  if argmax_draft:
    tokens = jnp.broadcast_to(jnp.argmax(q, -1), (N, GAMMA)).astype(jnp.int32)
  else:
    tokens = sampling.sample(key_draft, qb)
  n, nxt = accept_fn(key_accept, tokens, qb, pb)
  n, nxt, tokens = map(np.asarray, (n, nxt, tokens))
  emitted = np.full((N, GAMMA + 1), -1)
  for k in range(GAMMA + 1):
    draft_tok = tokens[:, k] if k < GAMMA else np.full(N, -1)
    emitted[:, k] = np.where(n > k, draft_tok, np.where(n == k, nxt, -1))
  return n, emitted


def _chisquare_pvalue(observed, expected_probs):
  """Chi-square p-value; cells with zero expected mass must be empty."""
  observed = np.asarray(observed, np.float64)
  expected_probs = np.asarray(expected_probs, np.float64)
  support = expected_probs > 1e-12
  if observed[~support].sum() > 0:
    return 0.0
  if support.sum() <= 1:
    return 1.0
  probs = expected_probs[support] / expected_probs[support].sum()
  return stats.chisquare(observed[support],
                         probs * observed[support].sum()).pvalue


def _exactness_pvalues(p, q, n, emitted):
  """p-values for P(n = k) and for each position's token given n >= k."""
  beta = theory.acceptance_rate(p[:GAMMA].astype(np.float64),
                                q.astype(np.float64))
  reach = np.concatenate([[1.0], np.cumprod(beta)])  # P(n >= k), k = 0..G
  p_n = reach.copy()
  p_n[:-1] -= reach[1:]  # P(n = k) = P(n >= k) - P(n >= k+1)
  pvalues = {"n": _chisquare_pvalue(np.bincount(n, minlength=GAMMA + 1),
                                    p_n / p_n.sum())}
  for k in range(GAMMA + 1):
    rows = n >= k
    if rows.sum() < 1000:
      continue  # position rarely reached: too few samples to test.
    counts = np.bincount(emitted[rows, k], minlength=VOCAB)
    pvalues[f"token{k + 1}"] = _chisquare_pvalue(counts, p[k] / p[k].sum())
  return pvalues


_accept = jax.jit(verify.speculative_accept)


@pytest.mark.parametrize("case",
                         ["random", "disjoint", "equal", "onehot_q", "sharp"])
def test_speculative_accept_is_exact(case):
  """P(n >= k) = prod_{i<=k} beta_i and, given n >= k, the token at position
  k+1 is distributed as p_{k+1}: the output distribution is the target's."""
  p, q = _dists(case)
  n, emitted = _draw(p, q, _accept)
  pvalues = _exactness_pvalues(p, q, n, emitted)
  failed = {k: v for k, v in pvalues.items() if v < SIGNIFICANCE}
  assert not failed, f"{case}: chi-square rejects exactness: {failed}"
  if case == "equal":
    assert np.all(n == GAMMA)
  if case == "disjoint":
    assert np.all(n == 0)


@jax.jit
def _accept_resampling_from_p(rng, draft_tokens, draft_probs, target_probs):
  """Negative control: on rejection, sample from p instead of the residual."""
  n, _ = verify.speculative_accept(rng, draft_tokens, draft_probs,
                                     target_probs)
  p_next = jnp.take_along_axis(target_probs, n[:, None, None], axis=1)[:, 0]
  keys = jax.random.split(jax.random.fold_in(rng, 7), n.shape[0])
  return n, jax.vmap(sampling.sample)(keys, p_next)


@pytest.mark.parametrize("case", ["random", "sharp"])
def test_negative_control_resampling_from_p_fails(case):
  """A sampler that skips the residual correction must fail the same test."""
  p, q = _dists(case)
  n, emitted = _draw(p, q, _accept_resampling_from_p)
  pvalues = _exactness_pvalues(p, q, n, emitted)
  assert min(pvalues.values()) < SIGNIFICANCE, pvalues


def test_negative_control_argmax_draft_fails():
  """A draft that takes its argmax while reporting softmax q must fail."""
  p, q = _dists("random")
  n, emitted = _draw(p, q, _accept, argmax_draft=True)
  pvalues = _exactness_pvalues(p, q, n, emitted)
  assert min(pvalues.values()) < SIGNIFICANCE, pvalues


def test_greedy_accepts_while_draft_matches_target_argmax():
  """With one-hot p and q: accept exactly the prefix where the draft token is
  the target's argmax, then emit the target's argmax."""
  rng = np.random.default_rng(3)
  batch, vocab = 64, 6
  greedy = sampling.SamplingConfig(temperature=0.0)
  target_logits = rng.normal(size=(batch, GAMMA + 1, vocab))
  target_argmax = target_logits.argmax(-1)
  # Draft agrees with the target on a random prefix, then disagrees.
  agree = rng.integers(0, GAMMA + 1, size=batch)
  draft_tokens = target_argmax[:, :GAMMA].copy()
  for b in range(batch):
    if agree[b] < GAMMA:
      draft_tokens[b, agree[b]] = (draft_tokens[b, agree[b]] + 1) % vocab
  q = greedy.probs(jnp.asarray(np.eye(vocab)[draft_tokens] * 5.0))
  p = greedy.probs(jnp.asarray(target_logits))
  n, nxt = _accept(jax.random.key(0), jnp.asarray(draft_tokens, jnp.int32), q,
                   p)
  np.testing.assert_array_equal(np.asarray(n), agree)
  np.testing.assert_array_equal(np.asarray(nxt),
                                target_argmax[np.arange(batch), agree])


def test_per_row_keys_make_rows_independent_of_batch():
  """Row b of a batch given key k_b equals a batch-1 call with key k_b."""
  p, q = _dists("random")
  keys = jax.random.split(jax.random.key(5), 4)
  tokens = sampling.sample(jax.random.key(6), jnp.broadcast_to(q, (4,) + q.shape))
  pb, qb = jnp.broadcast_to(p, (4,) + p.shape), jnp.broadcast_to(q, (4,) + q.shape)
  n, nxt = _accept(keys, tokens, qb, pb)
  for b in range(4):
    n1, nxt1 = _accept(keys[b:b + 1], tokens[b:b + 1], qb[b:b + 1], pb[b:b + 1])
    assert (int(n1[0]), int(nxt1[0])) == (int(n[b]), int(nxt[b]))


def test_temperature_top_k_top_p_hand_computed():
  """Hand-computed cases for each transform."""
  logits = jnp.log(jnp.array([0.5, 0.3, 0.15, 0.05]))
  np.testing.assert_allclose(sampling.logits_to_probs(logits, 1.0),
                             [0.5, 0.3, 0.15, 0.05], atol=1e-6)
  np.testing.assert_array_equal(sampling.logits_to_probs(logits, 0.0),
                                [1, 0, 0, 0])
  # Temperature 0.5 squares the probabilities before renormalising.
  sq = np.array([0.25, 0.09, 0.0225, 0.0025])
  np.testing.assert_allclose(sampling.logits_to_probs(logits, 0.5),
                             sq / sq.sum(), atol=1e-6)
  np.testing.assert_allclose(sampling.logits_to_probs(logits, 1.0, top_k=2),
                             [0.625, 0.375, 0, 0], atol=1e-6)
  # top_p = 0.8 keeps {0.5, 0.3}: mass before 0.3 is 0.5 < 0.8, before 0.15
  # is 0.8, not < 0.8.
  np.testing.assert_allclose(sampling.logits_to_probs(logits, 1.0, top_p=0.8),
                             [0.625, 0.375, 0, 0], atol=1e-6)
  np.testing.assert_allclose(sampling.logits_to_probs(logits, 1.0, top_p=0.81),
                             np.array([0.5, 0.3, 0.15, 0]) / 0.95, atol=1e-6)
  # The most likely token survives any top_p.
  np.testing.assert_allclose(sampling.logits_to_probs(logits, 1.0, top_p=0.1),
                             [1, 0, 0, 0], atol=1e-6)
  # Greedy ties go to the lowest id; probabilities are float32.
  tie = sampling.logits_to_probs(jnp.array([1.0, 3.0, 3.0], jnp.bfloat16))
  assert tie.dtype == jnp.float32
  np.testing.assert_array_equal(tie, [0, 1, 0])


def _sorted_nucleus(probs, top_p):
  """Reference nucleus by sorting (float64 sums): bool [..., V] kept, and
  whether a row's boundary is within float32 rounding of top_p."""
  order = np.argsort(-probs, axis=-1, kind="stable")
  sorted_probs = np.take_along_axis(probs, order, -1).astype(np.float64)
  # Ties kept together: a token's mass before is that of the strictly more
  # likely tokens.
  before = np.cumsum(sorted_probs, -1) - sorted_probs
  for i in range(1, sorted_probs.shape[-1]):
    tie = sorted_probs[..., i] == sorted_probs[..., i - 1]
    before[..., i] = np.where(tie, before[..., i - 1], before[..., i])
  kept_sorted = before < top_p
  threshold = np.min(np.where(kept_sorted, sorted_probs, np.inf), -1,
                     keepdims=True)
  # The boundary: the last kept token's mass before and the next one's.
  last = np.max(np.where(kept_sorted, before, -np.inf), -1)
  following = np.min(np.where(kept_sorted, np.inf, before), -1)
  close = (top_p - last < 1e-6) | (following - top_p < 1e-6)
  return probs >= threshold, close


def test_nucleus_threshold_keeps_what_sorting_keeps():
  """`nucleus_threshold` (a bisection, no sort) keeps exactly the tokens a
  sort-and-cumsum nucleus keeps, ties together, for rows of [4, 50, V]
  (smooth, peaked and tied rows; many top_p values), except rows whose
  boundary mass is within 1e-6 of top_p, where the float32 sums may round
  either way (those are counted: a few percent at most)."""
  rng = np.random.default_rng(0)
  vocab = 300
  logits = np.concatenate([
      rng.normal(size=(4, 20, vocab)) * 2,
      rng.normal(size=(4, 20, vocab)) * 8,  # peaked
      rng.integers(0, 4, size=(4, 10, vocab)) * 1.0,  # many ties
  ], axis=1).astype(np.float32)
  probs = np.asarray(jax.nn.softmax(jnp.asarray(logits), -1))
  threshold = sampling.nucleus_threshold  # jitted
  skipped = 0
  for top_p in (0.05, 0.3, 0.5, 0.9, 0.99):
    kept = np.asarray(probs >= threshold(probs, jnp.float32(top_p)))
    expected, close = _sorted_nucleus(probs, top_p)
    np.testing.assert_array_equal(kept[~close], expected[~close],
                                  err_msg=str(top_p))
    assert kept.any(-1).all()  # never empty
    skipped += int(close.sum())
  assert skipped <= 0.05 * 5 * probs[..., 0].size, skipped


def test_invalid_settings_raise():
  """Bad lenience / temperature / top-k / top-p name the valid range."""
  p, q = _dists("random")
  toks = jnp.zeros((1, GAMMA), jnp.int32)
  for bad in [0.0, -0.5, 1.5]:
    with pytest.raises(ValueError, match="lenience must be in"):
      verify.speculative_accept(jax.random.key(0), toks, q[None], p[None],
                                  lenience=bad)
  with pytest.raises(ValueError, match="temperature"):
    sampling.SamplingConfig(temperature=-1.0)
  with pytest.raises(ValueError, match="top_k"):
    sampling.SamplingConfig(top_k=-2)
  with pytest.raises(ValueError, match="top_p"):
    sampling.SamplingConfig(top_p=0.0)
  with pytest.raises(ValueError, match="gamma"):
    verify.speculative_accept(jax.random.key(0), toks, q[None], p[None, :2])


def test_lenience_accepts_more_and_uses_its_residual():
  """With lenience l, P(accept x_1) = sum_x q(x) min(1, p(x)/(l q(x))), and a
  rejection samples norm(max(0, p - l q)): checked by chi-square on n=0 rows."""
  p, q = _dists("random")
  lenience = 0.5
  fn = jax.jit(functools.partial(verify.speculative_accept,
                                 lenience=lenience))
  n, emitted = _draw(p, q, fn)
  accept1 = np.sum(q[0] * np.minimum(1.0, p[0] / (lenience * q[0])))
  observed = np.mean(n >= 1)
  assert abs(observed - accept1) < 5 * np.sqrt(accept1 * (1 - accept1) / N)
  assert accept1 > theory.acceptance_rate(p[0], q[0])
  residual = np.maximum(p[0] - lenience * q[0], 0)
  counts = np.bincount(emitted[n == 0, 0], minlength=VOCAB)
  assert _chisquare_pvalue(counts, residual / residual.sum()) > SIGNIFICANCE


class _LenientWithExactResidual(acceptance.Sampled):
  """Lenient acceptance, but the exact rule's residual norm(max(0, p - q))
  after a rejection: wrong on purpose."""

  def residual(self, p, q):
    return sampling.residual(p, q)


def test_lenience_with_the_exact_residual_fails():
  """Negative control of the test above: the lenient acceptance with the
  exact rule's residual instead of its own must fail the same chi-square
  test on the rejected rows."""
  p, q = _dists("random")
  lenience = 0.5
  fn = jax.jit(functools.partial(
      verify.speculative_accept,
      rule=_LenientWithExactResidual(lenience)))
  n, emitted = _draw(p, q, fn)
  residual = np.maximum(p[0] - lenience * q[0], 0)
  counts = np.bincount(emitted[n == 0, 0], minlength=VOCAB)
  assert _chisquare_pvalue(counts, residual / residual.sum()) < SIGNIFICANCE


def test_argmax_is_first_maximum_like_numpy():
  """sampling.argmax (max + first index, for speed on CPU) must pick exactly
  numpy's argmax, ties included: greedy decoding and the greedy fast path
  depend on ties going to the lowest id."""
  rng = np.random.default_rng(0)
  # Small integer logits make ties common; -inf rows parts too.
  logits = rng.integers(-3, 3, size=(64, 7, 50)).astype(np.float32)
  logits[0, 0, :] = 1.0                      # all tied -> id 0
  logits[1, 0, :10] = -np.inf
  got = np.asarray(jax.jit(sampling.argmax)(jnp.asarray(logits)))
  np.testing.assert_array_equal(got, np.argmax(logits, axis=-1))
  assert got.dtype == np.int32
  assert got[0, 0] == 0


def _old_inverse_cdf(probs, u):
  """The sampler before issue 36: the number of cdf entries <= u * total
  (kept here as the negative control of the rounding-step test)."""
  cdf = jnp.cumsum(probs, axis=-1)
  token = jnp.sum(cdf <= u * cdf[..., -1:], axis=-1)
  last = probs.shape[-1] - 1 - jnp.argmax(probs[..., ::-1] > 0, axis=-1)
  return jnp.minimum(token, last).astype(jnp.int32)


def test_sample_never_draws_a_zero_probability_id_inside_a_rounding_step():
  """XLA's cumsum is not flat across zero-probability ids (a parallel scan
  rounds differently at each index). Uniforms placed exactly inside those
  steps (u * total strictly between the cdf before and at a zero id) must
  still give an id of positive probability; the old count of cdf <= u*total
  returned the zero id there, and must fail (negative control)."""
  vocab, rows = 4224, 256
  logits = jax.random.normal(jax.random.key(0), (rows, vocab)) * 3
  probs = sampling.logits_to_probs(logits, 1.0, top_k=40)
  cdf = np.asarray(jax.jit(lambda p: jnp.cumsum(p, -1))(probs))
  p = np.asarray(probs)
  before = np.concatenate([np.zeros((rows, 1), np.float32), cdf[:, :-1]], 1)
  r, i = np.nonzero((p == 0) & (cdf > before))
  total = cdf[r, -1]
  # The steps are an ulp or two wide: try the uniforms around
  # before / total and keep one whose u * total (float32) lands in
  # [before, cdf) of the zero id.
  u = (before[r, i] / total).astype(np.float32)
  found = np.zeros(r.size, bool)
  for shift in (0, 1, -1, 2, -2):
    cand = u
    for _ in range(abs(shift)):
      cand = np.nextafter(cand, np.float32(np.sign(shift)), dtype=np.float32)
    t = cand * total
    ok = ~found & (t >= before[r, i]) & (t < cdf[r, i]) & (cand < 1)
    u = np.where(ok, cand, u)
    found |= ok
  r, u = r[found], u[found]
  assert r.size > 50, "too few rounding steps found to test"
  rows_p = jnp.asarray(p[r])
  u = jnp.asarray(u)[:, None]
  new = np.asarray(jax.jit(sampling.inverse_cdf)(rows_p, u))
  old = np.asarray(jax.jit(_old_inverse_cdf)(rows_p, u))
  assert np.all(p[r, new] > 0), "sample drew a zero-probability id"
  assert np.mean(p[r, old] == 0) > 0.5, "negative control should fail"


def test_inverse_cdf_matches_the_exact_inverse_away_from_rounding():
  """Away from rounding steps the new rule is the textbook inverse CDF."""
  probs = jnp.asarray([[0.0, 0.2, 0.0, 0.5, 0.3, 0.0]], jnp.float32)
  for u, want in ((0.0, 1), (0.19, 1), (0.21, 3), (0.69, 3), (0.71, 4),
                  (0.999999, 4)):
    got = int(sampling.inverse_cdf(probs, jnp.full((1, 1), u))[0])
    assert got == want, (u, got)


def test_a_draft_token_with_zero_q_is_never_accepted():
  """r * q(x) <= p(x) holds for every r when q(x) = 0: a token the draft
  could not have sampled (padding, or a bug's token outside its top-k) must
  be rejected, and the correction drawn from the residual."""
  p = jnp.asarray([[[0.5, 0.5, 0.0], [0.5, 0.5, 0.0]]] * 64, jnp.float32)
  q = jnp.asarray([[[1.0, 0.0, 0.0]]] * 64, jnp.float32)
  tokens = jnp.ones((64, 1), jnp.int32)  # q(1) = 0, p(1) = 0.5
  n, nxt = verify.speculative_accept(jax.random.key(0), tokens, q, p)
  assert np.all(np.asarray(n) == 0)
  assert np.all(np.asarray(nxt) == 1)  # the residual max(0, p - q) is {1}


def _fewer_proposals(p, q, k, broken=False):
  """emitted tokens of speculative_accept(num_proposed=k) on N rows whose
  draft sampled real tokens (with their real q) in every slot, also past k.
  `broken` draws the token after k accepted ones from the residual of the
  q of the first unproposed slot (the bug a padded q of 0 used to hide)."""
  def accept(key, tokens, qb, pb):
    n, nxt = verify.speculative_accept(key, tokens, qb, pb,
                                         num_proposed=jnp.full((N,), k))
    if broken:
      residual = np.maximum(p[k] - q[k], 0)
      wrong = jax.random.choice(jax.random.key(7), VOCAB, (N,),
                                p=jnp.asarray(residual / residual.sum()))
      nxt = jnp.where(n == k, wrong, nxt)
    return n, nxt
  return _draw(p, q, accept)


def test_fewer_proposals_than_slots_with_real_q_in_the_unused_slots():
  """With num_proposed = k < G and real tokens and q past k, nothing past k
  is accepted and the token at every position j <= k (given n >= j) follows
  p_j: chi-square at SIGNIFICANCE over N rows. Negative control: drawing
  the token after k accepted ones from max(0, p_k - q_k) (the q of the first
  unproposed slot) must fail."""
  p, q = _dists("random")
  k = 1
  n, emitted = _fewer_proposals(p, q, k)
  assert n.max() <= k
  for j in range(k + 1):
    rows = n >= j
    counts = np.bincount(emitted[rows, j], minlength=VOCAB)
    assert _chisquare_pvalue(counts, p[j]) > SIGNIFICANCE, j
  n, emitted = _fewer_proposals(p, q, k, broken=True)
  counts = np.bincount(emitted[n >= k, k], minlength=VOCAB)
  assert _chisquare_pvalue(counts, p[k]) < SIGNIFICANCE
