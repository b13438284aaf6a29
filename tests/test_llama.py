"""The Llama layout (`models/llama.py`, `checkpoints/hf_llama.py`): Llama 3,
Qwen 3 and Qwen 2.5 decode as transformers does, and speculative decoding
is exact.

Fixtures: testdata/hf_{llama,qwen3,qwen2}_{target,draft}, written by
scripts/make_hf_llama_fixtures.py with transformers 5.24 (bfloat16
weights):
  * Llama: Llama 3's scaled rotary (factor 8, bands around 64 positions:
    of head_dim 8's four frequencies one kept, one interpolated, two
    divided), untied output layers, GQA 4:2 (draft 2:1), vocabulary 48.
  * Qwen 3: QK-norm, tied output layers, head_dim 16 != hidden / heads,
    GQA 4:2; the draft's vocabulary is 40 (the target's first ids, as
    Qwen 2.5 0.5B's 151936 beside 72B's 152064) and the target's greedy
    rows hold ids 40-47, which the draft lacks.
  * Qwen 2: biases on queries, keys and values; as Qwen 2.5 72B beside
    0.5B, an untied target of vocabulary 48 and a tied draft of 40.
Two prompts of 12 and 7 tokens (0-padded on the right; Llama's BOS first),
16 tokens generated.

Invariants:
  - parity with transformers' PyTorch Llama and Qwen3 on the same weights:
    logits over whole sequences within 2e-4 (logits reach 23), and
    `sd.generate` equal to HF `generate` token for token (each prompt alone
    in HF, the two ragged rows batched here); a control shows the scaled
    rotary, its bands, the untied head, the QK-norm each move the
    logits far more than that (and Qwen 2's biases);
  - chunked scoring (gamma + 1 = 4 tokens a call) with rollback after
    rejections equals the full forward pass (Qwen 3 in float32, Llama in
    bfloat16: Qwen 3's QK-norm gains near 3 make its attention sharp
    enough that bfloat16's rounding of the same sums in another order moves
    its logits by 0.1);
  - speculative decoding (a chain for the Qwen families, a token tree for
    Llama) emits the target's greedy output token for token;
  - sampled outputs follow the target's distribution (chi-square below),
    and a rule that skips the residual fails the same test.

Statistics: the exact probability of each first-two-token pair from the
target's forward pass over prompt 0 + x1 for every x1
(`helpers.first_two_exact`); Pearson's chi-square of N = 2000 sampled rows
(prompt 0 tiled, per-row keys, seed 5), cells expected fewer than 5 times
pooled, at SIGNIFICANCE = 1e-3: the Llama pair with top-p 0.8 (85 cells
expected 5 times or more), the Qwen 2 pair (narrower draft) at temperature
1. Gamma 2, max_decode_len 4. (The Qwen 3 pair's sharp attention puts its
mass on 15 cells or fewer, where the control below passed at p 0.6: too
little power to show a wrong rule there.)

Cost: 6 greedy loops, 3 sampled loops and the chunked steps of tiny
models, about 70 s on 2 CPU cores.
"""

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specdec_jax as sd
from specdec_jax.models import llama
from tests import helpers

TESTDATA = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                        "testdata")
FAMILIES = ("llama", "qwen3", "qwen2")
NAMES = tuple(f"hf_{family}_{role}" for family in FAMILIES
              for role in ("target", "draft"))
MAX_NEW = 16  # what the fixtures' `generate` ran
SIGNIFICANCE = 1e-3
N = 2000
GAMMA, MAX_DECODE_LEN = 2, 4
SETTINGS = {"llama": {"temperature": 1.0, "top_p": 0.8},
            "qwen2": {"temperature": 1.0}}


def fixture_path(name):
  return os.path.join(TESTDATA, name)


def reference(name):
  return dict(np.load(os.path.join(fixture_path(name), "reference.npz")))


@pytest.fixture(scope="module")
def models():
  return {name: sd.load_model(f"hf:{fixture_path(name)}") for name in NAMES}


def _forward_error(definition, params, name):
  ref = reference(name)
  logits = jax.jit(definition.forward)(params, ref["sequences"])
  real = ref["sequences"] != 0
  return logits, np.abs(np.asarray(logits)[real] - ref["logits"][real]).max()


@pytest.mark.parametrize("name", NAMES)
def test_logits_match_hf(models, name):
  """Logits over each whole sequence (prompt + HF's continuation, 0-padded
  on the right) equal transformers' within 2e-4."""
  model = models[name]
  logits, error = _forward_error(model.definition, model.params, name)
  assert logits.dtype == jnp.float32
  assert error < 2e-4, error


@pytest.mark.parametrize("name,change", [
    ("hf_llama_target", "unscaled_rotary"),
    ("hf_llama_target", "linear_rotary"),
    ("hf_llama_target", "tied_head"),
    ("hf_qwen3_target", "no_qk_norm"),
    ("hf_qwen2_target", "no_qkv_bias")])
def test_the_fixtures_exercise_every_option(models, name, change):
  """Control: the same weights with unscaled rotary, with rotary scaled
  linearly by the same factor (Llama 3's bands ignored), with the output
  layer tied to the embedding, or without the QK-norms or the query, key
  and value biases, miss HF's logits
  by far more than the parity tolerance: the parity above checks each."""
  model = models[name]
  config, params = model.config, model.params
  decoder = dict(params["decoder"])
  if change == "tied_head":
    del decoder["logits_dense"]
  for layer in [k for k in decoder if k.startswith("layers_")]:
    attention = dict(decoder[layer]["self_attention"])
    if change == "no_qk_norm":
      del attention["query_norm"], attention["key_norm"]
    if change == "no_qkv_bias":
      attention.update({k: {"kernel": attention[k]["kernel"]}
                        for k in ("query", "key", "value")})
    decoder[layer] = dict(decoder[layer], self_attention=attention)
  config = dataclasses.replace(config, **{
      "unscaled_rotary": dict(rope_scale=1.0, rope_llama3_band=None),
      "linear_rotary": dict(rope_llama3_band=None),
      "tied_head": dict(tie_embeddings=True),
      "no_qk_norm": dict(qk_norm=False),
      "no_qkv_bias": dict(qkv_bias=False),
  }[change])
  _, error = _forward_error(llama.LlamaDef(config), {"decoder": decoder},
                            name)
  assert error > 1e-2, error


def test_checkpoints_load_as_written(models):
  """`load_model("hf:DIR")` reads the bfloat16 checkpoints into the
  architecture their config.json states."""
  target, draft = (models["hf_llama_target"].config,
                   models["hf_llama_draft"].config)
  assert isinstance(models["hf_llama_target"].definition, llama.LlamaDef)
  assert (target.rope_theta, target.rope_scale, target.rope_llama3_band) == (
      1e4, 8.0, (1.0, 4.0, 64))
  assert not target.tie_embeddings and not target.qk_norm
  assert (target.num_heads, target.num_kv_heads, draft.num_kv_heads) == (
      4, 2, 1)
  qwen, qwen_draft = (models["hf_qwen3_target"].config,
                      models["hf_qwen3_draft"].config)
  assert qwen.qk_norm and qwen.tie_embeddings and qwen.rope_scale == 1.0
  assert (qwen.head_dim, qwen.emb_dim // qwen.num_heads) == (16, 8)
  assert (qwen.vocab_size, qwen_draft.vocab_size) == (48, 40)
  assert (target.layer_norm_epsilon, qwen.layer_norm_epsilon) == (1e-5, 1e-6)
  qwen2, qwen2_draft = (models["hf_qwen2_target"].config,
                        models["hf_qwen2_draft"].config)
  assert qwen2.qkv_bias and not qwen2.qk_norm and not qwen2.tie_embeddings
  assert qwen2_draft.tie_embeddings and qwen2_draft.vocab_size == 40


@pytest.mark.parametrize("name", [f"hf_{f}_target" for f in FAMILIES])
def test_greedy_generation_matches_hf(models, name):
  """`sd.generate` of each target on both ragged prompts at once equals HF
  `generate` on each alone, token for token (16 tokens). (The drafts'
  cached decoding is the speculative tests' below.)"""
  ref = reference(name)
  out = sd.generate(models[name], ref["prompts"], max_decode_len=MAX_NEW)
  np.testing.assert_array_equal(out.tokens, ref["generated"])


@pytest.mark.parametrize("name,dtype,atol", [
    ("hf_qwen3_target", "float32", 2e-4),
    ("hf_llama_target", "bfloat16", 1e-2)])
def test_chunked_scoring_with_rollback_equals_full_forward(name, dtype,
                                                           atol):
  """As a speculative loop scores: chunks of 4 tokens at each row's own
  offset, some of them stand-ins the next chunk overwrites (a rollback).
  The kept positions' logits equal the full forward pass in the same
  dtype."""
  model = sd.load_model(f"hf:{fixture_path(name)}", dtype=dtype,
                        param_dtype=dtype)
  ref = reference(name)
  checked = helpers.check_chunked_scoring(model, ref["prompts"],
                                          ref["sequences"], MAX_NEW, atol)
  assert checked >= 2 * MAX_NEW


@pytest.mark.parametrize("family,kind", [("llama", "tree"),
                                         ("qwen3", "chain"),
                                         ("qwen2", "chain")])
def test_speculative_greedy_equals_target_greedy(models, family, kind):
  """With the draft as a chain (gamma 3), and Llama's as a token tree
  (2, 2: its nodes' keys rotated by Llama 3's scaled rotary at their
  depth, then moved to their slots), greedy speculative output equals the
  target's (and HF's) greedy output, the narrower Qwen drafts' missing ids
  included. (Chains of Llama drafts run in the chi-square tests below.)"""
  ref = reference(f"hf_{family}_target")
  target, draft = (models[f"hf_{family}_target"],
                   models[f"hf_{family}_draft"])
  if family != "llama":
    assert (ref["generated"] >= draft.vocab_size).any()
  drafter = draft if kind == "chain" else sd.tree(draft, (2, 2))
  res = sd.speculative_generate(
      target, drafter, ref["prompts"], gamma=3 if kind == "chain" else None,
      max_decode_len=MAX_NEW)
  np.testing.assert_array_equal(res.tokens, ref["generated"])


@pytest.fixture(scope="module")
def exact(models):
  """{family: {(x1, x2): probability}} of each target after prompt 0."""
  return {family: helpers.first_two_exact(
      models[f"hf_{family}_target"],
      reference(f"hf_{family}_target")["prompts"][0],
      {family: setting})[family] for family, setting in SETTINGS.items()}


def _sample(models, family, rule=None):
  ids = np.tile(reference(f"hf_{family}_target")["prompts"][:1], (N, 1))
  return helpers.speculative_samples(
      models[f"hf_{family}_target"], models[f"hf_{family}_draft"], ids, GAMMA,
      MAX_DECODE_LEN, SETTINGS[family], 5, rule)


@pytest.mark.parametrize("family", list(SETTINGS))
def test_sampled_first_two_tokens_follow_the_target(models, exact, family):
  """Speculative sampling (Llama with top-p 0.8; Qwen 2 at temperature 1
  with a narrower draft) passes the chi-square test against the target's
  exact first-two-token distribution."""
  cells = sum(p * N >= 5 for p in exact[family].values())
  assert cells >= 5, cells
  tokens = _sample(models, family)
  p_value = helpers.chisquare_vs_exact(tokens[:, :2], exact[family])
  assert p_value > SIGNIFICANCE, (family, p_value)
  print(f"p-value {family}: {p_value:.3g}")


@pytest.mark.parametrize("family", list(SETTINGS))
def test_skipping_the_residual_fails(models, exact, family):
  """Negative control, for each pair and setting the test above covers:
  the same harness with a rule that samples the correction from p instead
  of the residual must be rejected."""
  tokens = _sample(models, family, helpers.SkipResidual())
  p_value = helpers.chisquare_vs_exact(tokens[:, :2], exact[family])
  assert p_value < SIGNIFICANCE, (family, p_value)
  print(f"p-value skip-residual {family}: {p_value:.3g}")
