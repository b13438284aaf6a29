"""Gemma 3 (`models/gemma3.py`, `checkpoints/hf_gemma3.py`) decodes as
transformers does, and speculative decoding with a narrower draft is exact.

Fixtures: testdata/hf_gemma3_{target,draft}, written by
scripts/make_hf_gemma3_fixtures.py with transformers 5.24 (bfloat16
weights). Target: vocabulary 48, four layers (local, local, global, local),
GQA 4:2. Draft: vocabulary 40 (the target's first ids, as Gemma 3 1B's
262144 beside 27B's 262208), three layers, multi-query. Both: window 4,
global rotary scaled x8, query_pre_attn_scalar 12 with head_dim 8. Two
prompts of 12 and 7 tokens (BOS first, 0-padded on the right), 16 tokens
generated: every window cuts; the target's greedy rows hold ids 40-47,
which the draft lacks.

Invariants:
  - parity with transformers' PyTorch Gemma 3 on the same weights: logits
    over whole sequences within 1e-4, and `sd.generate` equal to HF
    `generate` token for token (each prompt alone in HF, the two ragged
    rows batched here); a control shows the windows, the scaled rotary and
    the attention scalar each move the logits far more than that;
  - chunked scoring (gamma + 1 = 4 tokens a call) with rollback after
    rejections equals the full forward pass in bfloat16 (float32: the
    model contract tests);
  - speculative decoding with the narrower draft (a chain, a token tree, a
    cascade, an adaptive stop rule) and with prompt lookup emits the
    target's greedy output token for token;
  - sampled outputs follow the target's distribution (chi-square below),
    and a rule that skips the residual fails the same test.

Statistics: the exact probability of each first-two-token pair, p(x1) *
p(x2 | x1), from the target's forward pass over prompt 0 + x1 for every
x1, through the same `SamplingConfig.probs`; Pearson's chi-square of
N = 2000 sampled rows (prompt 0 tiled, per-row keys, seed 5) against it,
cells expected fewer than 5 times pooled, at SIGNIFICANCE = 1e-3. Gamma 2,
max_decode_len 4. The draft is an unrelated random model and lacks 8 of
the target's ids, whose mass the residual alone supplies.

Cost: 6 greedy loops, 3 sampled loops and the chunked steps of tiny
models: 155 s on a loaded 2-core machine (load 5-7), about half of that
unloaded.
"""

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specdec_jax as sd
from specdec_jax.models import gemma3
from specdec_jax.models import ngram
from tests import helpers

TESTDATA = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                        "testdata")
TARGET, DRAFT = "hf_gemma3_target", "hf_gemma3_draft"
MAX_NEW = 16  # what the fixtures' `generate` ran
SIGNIFICANCE = 1e-3
N = 2000
GAMMA, MAX_DECODE_LEN = 2, 4
SETTINGS = {"t1": {"temperature": 1.0},
            "t1_top_p0.8": {"temperature": 1.0, "top_p": 0.8}}


def fixture_path(name):
  return os.path.join(TESTDATA, name)


def reference(name):
  return dict(np.load(os.path.join(fixture_path(name), "reference.npz")))


@pytest.fixture(scope="module")
def models():
  return {name: sd.load_model(f"hf:{fixture_path(name)}")
          for name in (TARGET, DRAFT)}


@pytest.mark.parametrize("name", [TARGET, DRAFT])
def test_logits_match_hf(models, name):
  """Logits over each whole sequence (prompt + HF's continuation, 28 and
  23 tokens, 0-padded on the right) equal transformers' within 1e-4."""
  ref = reference(name)
  model = models[name]
  logits = jax.jit(model.definition.forward)(model.params, ref["sequences"])
  assert logits.dtype == jnp.float32
  real = ref["sequences"] != 0
  np.testing.assert_allclose(np.asarray(logits)[real], ref["logits"][real],
                             atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("change", ["no_window", "unscaled_rotary",
                                    "scalar_is_head_dim"])
def test_the_fixtures_exercise_every_option(models, change):
  """Control: the target's weights with all layers global, with unscaled
  global rotary, or with query_pre_attn_scalar = head_dim miss HF's logits
  by far more than the parity tolerance: the parity above checks each."""
  model, ref = models[TARGET], reference(TARGET)
  config = model.config
  config = dataclasses.replace(config, **{
      "no_window": dict(sliding_window=None,
                        layer_types=(gemma3.GLOBAL,) * config.num_layers),
      "unscaled_rotary": dict(rope_scale=1.0),
      "scalar_is_head_dim": dict(query_pre_attn_scalar=config.head_dim),
  }[change])
  logits = jax.jit(gemma3.Gemma3Def(config).forward)(model.params,
                                                     ref["sequences"])
  real = ref["sequences"] != 0
  assert np.abs(np.asarray(logits)[real] - ref["logits"][real]).max() > 1e-2


def test_checkpoints_load_as_written(models):
  """`load_model("hf:DIR")` reads the bfloat16 checkpoints into the
  architecture their config.json states."""
  target, draft = models[TARGET].config, models[DRAFT].config
  assert isinstance(models[TARGET].definition, gemma3.Gemma3Def)
  assert (target.vocab_size, draft.vocab_size) == (48, 40)
  assert target.layer_types == (gemma3.SLIDING, gemma3.SLIDING,
                                gemma3.GLOBAL, gemma3.SLIDING)
  assert (target.sliding_window, target.rope_scale, target.rope_theta,
          target.rope_local_theta) == (4, 8.0, 1e6, 1e4)
  assert (target.query_pre_attn_scalar, target.head_dim) == (12.0, 8)
  assert (target.num_heads, target.num_kv_heads) == (4, 2)
  assert (draft.num_heads, draft.num_kv_heads) == (2, 1)


def test_greedy_generation_matches_hf(models):
  """`sd.generate` of the target on both ragged prompts at once equals HF
  `generate` on each alone, token for token (16 tokens, four windows).
  (The draft's cached decoding is the speculative tests' below.)"""
  ref = reference(TARGET)
  out = sd.generate(models[TARGET], ref["prompts"], max_decode_len=MAX_NEW)
  np.testing.assert_array_equal(out.tokens, ref["generated"])


@pytest.mark.parametrize("dtype,atol", [("bfloat16", 1e-2)])
def test_chunked_scoring_with_rollback_equals_full_forward(dtype, atol):
  """As a speculative loop scores: chunks of 4 tokens at each row's own
  offset, of which only the first `keep` (1-4, varying) are the sequence's
  and the rest stand-ins that the next chunk overwrites (a rollback). The
  kept positions' logits equal the full forward pass in the same dtype
  (measured: equal to the bit). In float32 the same holds within 1e-4
  (measured 3.5e-5); tests/test_model_contract.py checks chunks and
  rollback in float32 on gemma3_tiny, windows included."""
  model = sd.load_model(f"hf:{fixture_path(TARGET)}", dtype=dtype,
                        param_dtype=dtype)
  ref = reference(TARGET)
  checked = helpers.check_chunked_scoring(model, ref["prompts"],
                                          ref["sequences"], MAX_NEW, atol)
  assert checked >= 2 * MAX_NEW


def bigram(models):
  """An n-gram drafter over the draft's ids, fit on its greedy outputs."""
  rows = reference(DRAFT)["generated"]
  return ngram.fit_ngram(rows.tolist(), models[DRAFT].vocab_size,
                         decoder_only=True)


@pytest.mark.parametrize("kind", ["chain", "tree", "cascade", "adaptive",
                                  "prompt_lookup"])
def test_speculative_greedy_equals_target_greedy(models, kind):
  """With the narrower draft as a chain (gamma 3), a token tree (2, 2), a
  cascade over a bigram drafter, a chain with a confidence stop rule, and
  with prompt lookup, greedy speculative output equals the target's (and
  HF's) greedy output, ids the draft lacks included."""
  ref = reference(TARGET)
  target, draft = models[TARGET], models[DRAFT]
  assert (ref["generated"] >= draft.vocab_size).any()
  drafter = {"chain": lambda: draft, "adaptive": lambda: draft,
             "tree": lambda: sd.tree(draft, (2, 2)),
             "cascade": lambda: sd.cascade(draft, bigram(models), gamma=2),
             "prompt_lookup": lambda: sd.prompt_lookup(target, ngram=1),
             }[kind]()
  res = sd.speculative_generate(
      target, drafter, ref["prompts"], gamma=None if kind == "tree" else 3,
      max_decode_len=MAX_NEW,
      draft_stop=sd.ConfidenceStop(0.3) if kind == "adaptive" else None)
  np.testing.assert_array_equal(res.tokens, ref["generated"])


@pytest.fixture(scope="module")
def exact(models):
  """{setting: {(x1, x2): probability}} of the target after prompt 0."""
  return helpers.first_two_exact(models[TARGET],
                                 reference(TARGET)["prompts"][0], SETTINGS,
                                 gemma3.EOS_ID)


def _sample(models, setting, rule=None):
  ids = np.tile(reference(TARGET)["prompts"][:1], (N, 1))
  return helpers.speculative_samples(
      models[TARGET], models[DRAFT], ids, GAMMA, MAX_DECODE_LEN,
      SETTINGS[setting], 5, rule)


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_sampled_first_two_tokens_follow_the_target(models, exact, setting):
  """Speculative sampling with the narrower draft passes the chi-square
  test against the target's exact first-two-token distribution, and
  samples the ids the draft lacks."""
  cells = sum(p * N >= 5 for p in exact[setting].values())
  assert cells >= 5, cells
  tokens = _sample(models, setting)
  assert (tokens[:, :2] >= models[DRAFT].vocab_size).any()
  p_value = helpers.chisquare_vs_exact(tokens[:, :2], exact[setting])
  assert p_value > SIGNIFICANCE, (setting, p_value)
  print(f"p-value {setting}: {p_value:.3g}")


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_skipping_the_residual_fails(models, exact, setting):
  """Negative control, in each setting the test above covers: the same
  harness with a rule that samples the correction from p instead of the
  residual must be rejected."""
  tokens = _sample(models, setting, helpers.SkipResidual())
  p_value = helpers.chisquare_vs_exact(tokens[:, :2], exact[setting])
  assert p_value < SIGNIFICANCE, (setting, p_value)
  print(f"p-value skip-residual {setting}: {p_value:.3g}")
