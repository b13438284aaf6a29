"""Issue 36: the stop rules' numbers are traced inputs of the compiled
loop, and the smaller items of its point 6.

Invariants: a rule's `static()` (the compiled loop's cache key) depends only
on its type and bin count, so calibrating a `ConfidenceStop` threshold or an
`ExpectedGainStop`'s cost and prior compiles the speculative loop once per
rule type; the numbers still reach the loop (outputs differ between
settings); and a run that reused the program equals a fresh one compiled
for that setting alone. Every model a cascade or horizontal drafter runs
is checked against the target before compiling.
"""

import types

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

import specdec_jax as sd
from specdec_jax import sampling
from specdec_jax.decoding import checks
from specdec_jax.drafts import cascades
from specdec_jax.decoding import engine
from specdec_jax.models import ngram
from specdec_jax.decoding import stopping
from tests import helpers

VOCAB = 12
GAMMA = 4
MAX_LEN = 9  # Settings no other test uses, so the first run compiles.

CONFIDENCE = [sd.ConfidenceStop(t) for t in (0.2, 0.5, 0.8)]
EXPECTED_GAIN = [
    sd.ExpectedGainStop(cost=0.05),
    sd.ExpectedGainStop(cost=0.6, verify_growth=0.1, bins=(0.2, 0.4, 0.6,
                                                           0.8, 0.9),
                        prior=(0.05, 0.1, 0.2, 0.3, 0.4, 0.5),
                        prior_weight=6.0),
]


def _models():
  target = helpers.table_model(VOCAB, seed=31, eos_bias=-2.0)
  draft = helpers.table_model(VOCAB, seed=32, base=target, noise=1.0)
  return target, draft


def _run(target, draft, rule):
  ids = np.tile(helpers.example_inputs(), (4, 1))  # 16 rows, each with its own key.
  return sd.speculative_generate(target, draft, ids, gamma=GAMMA,
                                 max_decode_len=MAX_LEN, temperature=1.0,
                                 seed=3, draft_stop=rule)


def _same(a, b):
  np.testing.assert_array_equal(a.tokens, b.tokens)
  np.testing.assert_array_equal(a.stats.proposal_histogram,
                                b.stats.proposal_histogram)
  np.testing.assert_array_equal(a.stats.accepted_histogram,
                                b.stats.accepted_histogram)


@pytest.mark.parametrize("rules", [CONFIDENCE, EXPECTED_GAIN],
                         ids=["confidence", "expected_gain"])
def test_calibrating_a_stop_rule_compiles_the_loop_once(rules):
  """Running the loop with each setting of one rule type compiles once (the
  first run; no backend compile and one `_build_speculative` cache miss
  over the sweep); the proposal histograms differ between every two
  settings (the numbers reach the loop); each later setting's result
  equals a fresh run, compiled after clearing every cache, with that
  setting alone (the first setting's run was one: the sweep built the loop
  for it)."""
  target, draft = _models()
  assert len({r.static() for r in rules}) == 1
  misses = engine.build_speculative.cache_info().misses
  results = []
  with helpers.CompileCounter() as compiles:
    for i, rule in enumerate(rules):
      results.append(_run(target, draft, rule))
      if i == 0:
        first = compiles.count
  assert first >= 1 and compiles.count == first, (first, compiles.count)
  assert engine.build_speculative.cache_info().misses == misses + 1
  hists = [r.stats.proposal_histogram for r in results]
  for i in range(len(hists)):
    for j in range(i):
      assert not np.array_equal(hists[i], hists[j]), (rules[i], rules[j])
  for rule, result in list(zip(rules, results))[1:]:
    engine._build_speculative.cache_clear()
    jax.clear_caches()
    with helpers.CompileCounter() as fresh:
      _same(_run(target, draft, rule), result)
    assert fresh.count >= 1  # Really compiled anew.


def test_each_traced_number_reaches_the_rule():
  """For every number of each rule, one jitted function of the rule's
  `values()` (traced once for the static rule) gives exactly what the
  concrete rule gives, and changing that number alone changes the
  decision somewhere: init, keep_going and update read the traced values,
  not the static rule's placeholders."""
  batch, gamma = 8, 6
  conf = jax.random.uniform(jax.random.key(0), (batch, gamma))
  tokens = jnp.full((batch, gamma), 5, jnp.int32)
  accept = jax.random.uniform(jax.random.key(1), (batch, gamma))
  verified = jnp.ones((batch, gamma), bool)

  def decide(rule):
    state = rule.init(batch)
    state = rule.update(state, conf, accept, verified)
    return rule.keep_going(tokens, conf, state), state

  base = {sd.ConfidenceStop: sd.ConfidenceStop(0.5),
          sd.ExpectedGainStop: sd.ExpectedGainStop(cost=0.1)}
  changed = [
      sd.ConfidenceStop(0.3),
      sd.ExpectedGainStop(cost=0.4),
      sd.ExpectedGainStop(cost=0.1, verify_growth=0.5),
      sd.ExpectedGainStop(cost=0.1, bins=(0.1, 0.2, 0.3, 0.4, 0.45)),
      sd.ExpectedGainStop(cost=0.1, prior=(0.9,) * 6),
      sd.ExpectedGainStop(cost=0.1, prior=(0.3, 0.4, 0.5, 0.6, 0.7, 0.8),
                          prior_weight=50.0),
  ]
  traces = []
  for rule in changed:
    static = rule.static()
    assert static == base[type(rule)].static()

    @jax.jit
    def traced(values, static=static):
      traces.append(1)
      return decide(static.traced(values))

    for r in (base[type(rule)], rule):
      keep, state = traced(r.values())
      want_keep, want_state = decide(r)
      np.testing.assert_array_equal(keep, want_keep)
      jax.tree.map(np.testing.assert_allclose, state, want_state)
    assert not np.array_equal(traced(rule.values())[0],
                              traced(base[type(rule)].values())[0]), rule
  assert len(traces) == len(changed)  # One trace per jitted function.


def test_bin_count_stays_static_and_calibration_reads_the_sums():
  """The number of bins is a shape (the per-row statistics are [B, N]), so
  it stays in the static key; `calibration` still turns a run's per-bin
  sums into a prior: the bin that saw acceptance 0.7 reports 0.7, the
  others keep the prior (the bins' centers)."""
  assert (sd.ExpectedGainStop(bins=(0.5,)).static()
          != sd.ExpectedGainStop().static())
  rule = sd.ExpectedGainStop(cost=0.2, prior_weight=1.0)
  state = rule.init(2)
  state = rule.update(state, jnp.full((2, 3), 0.6), jnp.full((2, 3), 0.7),
                      jnp.ones((2, 3), bool))
  prior = stopping.calibration(rule, types.SimpleNamespace(stop_state=state))
  centers = rule.values()["prior"]
  np.testing.assert_allclose(prior, np.where(np.arange(6) == 2, 0.7, centers),
                             atol=1e-4)


# -- Issue 36, point 6: every level of a cascade is checked ---------------


def _ngram(decoder_only=False, vocab=VOCAB):
  return ngram.fit_ngram([[3, 4, 3, 1], [3, 5, 1]], vocab,
                         decoder_only=decoder_only)


def test_every_level_of_a_cascade_is_checked_against_the_target():
  """An inner model of another family or vocabulary size, or a part that
  carries another vocabulary, is refused with a ValueError naming it,
  before anything compiles (only the top level was checked, so such a
  cascade compiled and decoded garbage); the same cascade with matching
  inner models passes the check (negative control)."""
  target = _ngram()                       # encoder-decoder
  top = _ngram()
  before = engine.build_speculative.cache_info().misses
  inner_family = sd.cascade(top, _ngram(decoder_only=True), gamma=2)
  with pytest.raises(ValueError, match=(
      r"the target is encoder-decoder but the draft's model 2 of 2, top "
      r"first \(params\['drafter'\]\) is decoder-only")):
    sd.speculative_generate(target, inner_family, helpers.example_inputs(), gamma=2,
                            max_decode_len=4)
  deep = sd.horizontal(top, sd.cascade(top, sd.cascade(
      top, _ngram(decoder_only=True), gamma=2), gamma=2), split=1)
  with pytest.raises(ValueError, match=(
      r"model 4 of 4, top first \(params\['late'\]\['drafter'\]"
      r"\['drafter'\]\) is decoder-only")):
    sd.speculative_generate(target, deep, helpers.example_inputs(), gamma=2,
                            max_decode_len=4)
  # `cascade` refuses another size itself; a hand-built definition is
  # refused by the call.
  other = _ngram(vocab=VOCAB + 1)
  with pytest.raises(ValueError, match="vocabularies differ in size"):
    sd.cascade(top, other, gamma=2)
  hand_built = sd.Model(
      cascades.CascadeDef(top.definition, other.definition, 2),
      {"draft": top.params, "drafter": other.params})
  with pytest.raises(ValueError, match=(
      r"draft's model 2 of 2, top first \(params\['drafter'\]\)'s "
      r"vocabulary \(13 ids\) is wider than the target's \(12\)")):
    sd.speculative_generate(target, hand_built, helpers.example_inputs(), gamma=2,
                            max_decode_len=4)
  spm = lambda data: types.SimpleNamespace(sp_model=data, extra_ids=0)
  with_vocab = lambda m, data: sd.Model(m.definition, m.params, spm(data))
  with pytest.raises(ValueError, match=(
      "cascade: draft and draft_of_draft carry different vocabularies")):
    sd.cascade(with_vocab(top, b"a"), with_vocab(_ngram(), b"b"), gamma=2)
  # The inner part's vocabulary stands for the cascade when the top has
  # none, so the call compares it with the target's.
  casc = sd.cascade(top, with_vocab(_ngram(), b"b"), gamma=2)
  with pytest.raises(ValueError, match="different vocabularies of the same"):
    sd.speculative_generate(with_vocab(target, b"a"), casc, helpers.example_inputs(),
                            gamma=2, max_decode_len=4)
  assert engine.build_speculative.cache_info().misses == before
  # Negative control: matching levels pass.
  checks.check_compatible(target, sd.cascade(top, _ngram(), gamma=2))
  checks.check_compatible(with_vocab(target, b"b"), casc)


def _nuclei(target, draft, top_p):
  """Top-p nuclei the speculative loop computes (one per probs computed):
  calls of the jitted `sampling.nucleus_threshold` in its jaxpr, nested
  jaxprs included (each call site of a shared helper once; the lowered
  text shares them)."""
  ids = helpers.example_inputs()
  loop = engine.build_speculative(
      target.definition, draft.definition, 3, 6,
      sampling.SamplingConfig(1.0, 0, top_p))
  jaxpr = jax.make_jaxpr(loop.jitted)(
      target.params, draft.params, ids, np.zeros(len(ids), np.int32),
      np.arange(len(ids), dtype=np.int32), loop.values)

  def count(jaxpr):
    n = 0
    for eqn in jaxpr.eqns:
      n += eqn.params.get("name") == "nucleus_threshold"
      for sub in jax.extend.core.jaxprs_in_params(eqn.params):
        n += count(getattr(sub, "jaxpr", sub))
    return n

  return count(jaxpr.jaxpr)


def test_a_cascade_computes_each_probability_once():
  """Issue 36 point 6 (fixed with the shared verification step): a
  cascade's middle model turns its logits into probabilities once per
  inner iteration (the verification's p is reused as the q it proposes,
  with its confidences), so with top-p a cascade's loop computes exactly
  one nucleus more than the same loop with its inner drafter as the draft
  (the middle model's verification); computing q_M again added a second
  one. Without top-p there is no nucleus at all (the count's control)."""
  target, draft = _models()
  small = helpers.table_model(VOCAB, seed=33, base=draft, noise=1.0)
  casc = sd.cascade(draft, small, gamma=2)
  assert _nuclei(target, small, 1.0) == _nuclei(target, casc, 1.0) == 0
  plain = _nuclei(target, small, 0.9)
  assert plain >= 2  # The target's verification and the draft's sampling.
  assert _nuclei(target, casc, 0.9) == plain + 1
