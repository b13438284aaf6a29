"""T5Gemma (`models/t5gemma.py`, `checkpoints/hf_t5gemma.py`).

Invariants:
  - parity with transformers' PyTorch T5Gemma on the same weights: the
    encoder output and teacher-forced logits of the two tiny checkpoints in
    testdata/hf_t5gemma_{target,draft} (written by
    scripts/make_hf_t5gemma_fixtures.py with transformers 5.24, bfloat16
    weights, sliding window 8) equal HF's within 1e-4, and greedy decoding
    of `load_model("hf:DIR")` equals HF `generate` token for token, on
    inputs of up to 12 tokens and 20 generated ones: both windows cut;
  - speculative decoding with the draft checkpoint (a chain, a token tree
    and a cascade ending in an n-gram drafter) emits the target's greedy
    output token for token;
  - sampled outputs follow the target's distribution (chi-square below),
    and a rule that skips the residual fails the same test;
  - export (`save_t5gemma`) is the exact inverse of the loader; with the
    `hf` extra, transformers reads what we write and we read what it
    writes (live, skipped without torch).

Statistics: the exact probability of each first-two-token pair, p(x1) *
p(x2 | x1), from the target's teacher-forced pass over (BOS, x1) for every
x1, through the same `SamplingConfig.probs`; Pearson's chi-square of
N = 2000 sampled rows (one input row tiled, per-row keys, fixed seed)
against it, cells expected fewer than 5 times pooled, at SIGNIFICANCE =
1e-3. Gamma 2, max_decode_len 4: rejections, residuals and bonus tokens all
happen. The draft is an unrelated random model (acceptance 0.54 on the
first token), so the residual differs from p mostly in the tail: at
N = 400 skipping it gave p = 0.08 (not rejected); at N = 2000 it gives
8e-21, while the exact sampler gives 0.03 (T 1) and 0.04 (top-p 0.8) at
this seed and 0.12 to 0.94 at seeds 6 to 8.

Cost: 4 greedy loops and 3 sampled loops of tiny models (vocabulary 32),
about 45 s on 2 CPU cores.
"""

import dataclasses
import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specdec_jax as sd
from specdec_jax import checkpoints
from specdec_jax import sampling
from specdec_jax.checkpoints import hf_t5gemma
from specdec_jax.decoding import engine
from specdec_jax.models import ngram
from specdec_jax.models import registry
from specdec_jax.models import t5gemma
from tests import helpers
from tests import param_counts

TESTDATA = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                        "testdata")
FIXTURES = ("hf_t5gemma_target", "hf_t5gemma_draft")
MAX_NEW = 20  # what the fixtures' `generate` ran
SIGNIFICANCE = 1e-3
N = 2000
GAMMA, MAX_DECODE_LEN = 2, 4
SETTINGS = {"t1": {"temperature": 1.0},
            "t1_top_p0.8": {"temperature": 1.0, "top_p": 0.8}}


def _fixture(name):
  return os.path.join(TESTDATA, name)


def _reference(name):
  return dict(np.load(os.path.join(_fixture(name), "reference.npz")))


@pytest.fixture(scope="module")
def models():
  return {name: sd.load_model(f"hf:{_fixture(name)}") for name in FIXTURES}


@pytest.mark.parametrize("name", FIXTURES)
def test_logits_match_hf(name):
  """Encoder outputs and teacher-forced logits (14 decoder tokens, window
  8) equal transformers' within 1e-4."""
  ref = _reference(name)
  config, params = hf_t5gemma.load_t5gemma(_fixture(name))
  definition = t5gemma.T5GemmaDef(config)
  encoded = np.asarray(jax.jit(definition.encode)(params, ref["input_ids"]))
  real = ref["input_ids"] > 0
  np.testing.assert_allclose(encoded[real], ref["encoder_hidden"][real],
                             atol=1e-4)
  logits = jax.jit(definition.forward)(params, ref["input_ids"],
                                       ref["decoder_input_ids"])
  assert logits.dtype == jnp.float32
  np.testing.assert_allclose(logits, ref["logits"], atol=1e-4, rtol=1e-5)


def test_the_fixtures_exercise_the_windows():
  """Control: the same weights with the encoder's, then the decoder's
  layers all global (no window) miss HF's encoder outputs, then its logits,
  by far more than the tolerance: the parity above checks both windows."""
  ref = _reference("hf_t5gemma_target")
  config, params = hf_t5gemma.load_t5gemma(_fixture("hf_t5gemma_target"))
  def unwindowed(stack):
    return dataclasses.replace(stack, sliding_window=None,
                               layer_types=(t5gemma.GLOBAL,) * stack.num_layers)
  real = ref["input_ids"] > 0
  wide = t5gemma.T5GemmaDef(dataclasses.replace(
      config, encoder=unwindowed(config.encoder)))
  encoded = np.asarray(wide.encode(params, ref["input_ids"]))
  assert np.abs(encoded[real] - ref["encoder_hidden"][real]).max() > 1e-2
  wide = t5gemma.T5GemmaDef(dataclasses.replace(
      config, decoder=unwindowed(config.decoder)))
  logits = np.asarray(wide.forward(params, ref["input_ids"],
                                   ref["decoder_input_ids"]))
  assert np.abs(logits - ref["logits"]).max() > 1e-2


def test_checkpoints_load_as_written(models):
  """`load_model("hf:DIR")` reads the bfloat16 checkpoints into the
  architecture their config.json states (the draft: 32-wide encoder,
  16-wide decoder with one key/value head)."""
  target, draft = (models[n].config for n in FIXTURES)
  assert isinstance(models["hf_t5gemma_target"].definition,
                    t5gemma.T5GemmaDef)
  assert (draft.encoder.emb_dim, draft.decoder.emb_dim) == (32, 16)
  assert draft.decoder.num_kv_heads == 1
  assert target.decoder.sliding_window == 8
  assert target.decoder.layer_types == (t5gemma.SLIDING, t5gemma.GLOBAL)
  assert (target.final_logit_softcapping,
          target.encoder.attn_logit_softcapping) == (5.0, 3.0)
  assert target.encoder.query_pre_attn_scalar == 12


@pytest.mark.parametrize("name", FIXTURES)
def test_greedy_generation_matches_hf(models, name):
  """`sd.generate` equals HF `generate` token for token (20 tokens, past
  the window of 8)."""
  ref = _reference(name)
  out = sd.generate(models[name], ref["input_ids"], max_decode_len=MAX_NEW)
  expected = ref["generated"][:, 1:]  # HF's rows start with BOS
  np.testing.assert_array_equal(out.tokens[:, :expected.shape[1]], expected)


def _bigram(models):
  """An n-gram drafter fit on the draft's own greedy outputs."""
  rows = _reference("hf_t5gemma_draft")["generated"][:, 1:]
  return ngram.fit_ngram(rows.tolist(), models["hf_t5gemma_target"].vocab_size)


@pytest.mark.parametrize("kind", ["chain", "tree", "cascade"])
def test_speculative_greedy_equals_target_greedy(models, kind):
  """With the draft checkpoint as a chain (gamma 3), a token tree (2, 2)
  or a cascade over a bigram drafter, greedy speculative output equals the
  target's (and HF's) greedy output."""
  ref = _reference("hf_t5gemma_target")
  target, draft = models["hf_t5gemma_target"], models["hf_t5gemma_draft"]
  drafter = {"chain": lambda: draft,
             "tree": lambda: sd.tree(draft, (2, 2)),
             "cascade": lambda: sd.cascade(draft, _bigram(models),
                                           gamma=2)}[kind]()
  res = sd.speculative_generate(target, drafter, ref["input_ids"],
                                gamma=None if kind == "tree" else 3,
                                max_decode_len=MAX_NEW)
  np.testing.assert_array_equal(res.tokens, ref["generated"][:, 1:])


# A token the tiny target's greedy rows emit early: row 0 opens with it, row
# 2 reaches it at index 9, row 1 never does (testdata reference.npz).
STOP = 9


def _cut_after_stop(rows, stop_ids):
  """Each row up to and including its first stop id, then zeros."""
  out = np.zeros_like(rows)
  for b, row in enumerate(rows):
    hits = np.flatnonzero(np.isin(row, stop_ids))
    end = len(row) if not hits.size else hits[0] + 1
    out[b, :end] = row[:end]
  return out


def test_default_stop_ids_are_eos_alone(models):
  """Control: stop_ids=(1,) given explicitly is the default's very program
  (no new compile) and its greedy output is HF's, unchanged."""
  ref = _reference("hf_t5gemma_target")
  target = models["hf_t5gemma_target"]
  default = sd.generate(target, ref["input_ids"], max_decode_len=MAX_NEW)
  misses = engine.build_generate.cache_info().misses
  explicit = sd.generate(target, ref["input_ids"], max_decode_len=MAX_NEW,
                         stop_ids=[t5gemma.EOS_ID])
  assert engine.build_generate.cache_info().misses == misses
  np.testing.assert_array_equal(default.tokens, ref["generated"][:, 1:])
  np.testing.assert_array_equal(explicit.tokens, default.tokens)


@pytest.mark.parametrize("kind", ["chain", "tree", "cascade", "stop_rule"])
def test_rows_end_at_any_stop_id(models, kind):
  """With stop_ids=(1, 9), the target's greedy `generate` ends each row
  right after its first 9 (row 0 at its first token, row 2 at its tenth;
  row 1 never emits 9 and runs to max_decode_len), and greedy speculative
  decoding (a chain, a token tree, a cascade over a bigram, a chain with
  a stop rule) equals it token for token, lengths included."""
  ref = _reference("hf_t5gemma_target")
  target, draft = models["hf_t5gemma_target"], models["hf_t5gemma_draft"]
  stop_ids = (t5gemma.EOS_ID, STOP)
  expected = _cut_after_stop(ref["generated"][:, 1:], stop_ids)
  assert (expected != ref["generated"][:, 1:]).any()  # 9 really stops rows
  base = sd.generate(target, ref["input_ids"], max_decode_len=MAX_NEW,
                     stop_ids=stop_ids)
  np.testing.assert_array_equal(base.tokens, expected)
  np.testing.assert_array_equal(base.stats.length, [1, MAX_NEW, 10])
  drafter = {"chain": lambda: draft, "stop_rule": lambda: draft,
             "tree": lambda: sd.tree(draft, (2, 2)),
             "cascade": lambda: sd.cascade(draft, _bigram(models),
                                           gamma=2)}[kind]()
  res = sd.speculative_generate(
      target, drafter, ref["input_ids"], gamma=None if kind == "tree" else 3,
      max_decode_len=MAX_NEW, stop_ids=(STOP, t5gemma.EOS_ID),
      draft_stop=sd.ConfidenceStop(0.0) if kind == "stop_rule" else None)
  np.testing.assert_array_equal(res.tokens, expected)
  np.testing.assert_array_equal(res.stats.length, base.stats.length)


@pytest.mark.parametrize("stop_ids, error, match", [
    ((), ValueError, "stop_ids is empty"),
    ((1, 32), ValueError, r"\[32\].*below the vocabulary size 32"),
    ((0,), ValueError, "0 is the pad id"),
    ((-1, 1), ValueError, "must be >= 1"),
    ((1, 2.0), TypeError, "stop_ids must be ints"),
    ((True,), TypeError, "stop_ids must be ints"),
    (1, TypeError, r"a tuple of token ids, e.g. stop_ids=\(1,\)"),
    ("1", TypeError, "a tuple of token ids"),
])
def test_bad_stop_ids_are_refused_before_compiling(models, stop_ids, error,
                                                   match):
  """Empty, out-of-vocabulary, pad, negative and non-integer stop ids raise
  a clear error naming the fix before any loop is built or compiled."""
  ref = _reference("hf_t5gemma_target")
  target, draft = models["hf_t5gemma_target"], models["hf_t5gemma_draft"]
  before = (engine.build_generate.cache_info().misses,
            engine.build_speculative.cache_info().misses)
  with pytest.raises(error, match=match):
    sd.generate(target, ref["input_ids"], max_decode_len=4,
                stop_ids=stop_ids)
  with pytest.raises(error, match=match):
    sd.speculative_generate(target, draft, ref["input_ids"], gamma=2,
                            max_decode_len=4, stop_ids=stop_ids)
  assert (engine.build_generate.cache_info().misses,
          engine.build_speculative.cache_info().misses) == before


@pytest.fixture(scope="module")
def exact(models):
  """{setting: {(x1, x2): probability}} of the target on input row 0."""
  target = models["hf_t5gemma_target"]
  row = _reference("hf_t5gemma_target")["input_ids"][:1]
  vocab = target.vocab_size
  decoder = np.stack([np.full(vocab, t5gemma.BOS_ID), np.arange(vocab)], 1)
  logits = jax.jit(target.definition.forward)(
      target.params, np.tile(row, (vocab, 1)), decoder.astype(np.int32))
  out = {}
  for name, setting in SETTINGS.items():
    cfg = sampling.SamplingConfig(**setting)
    p1 = np.asarray(cfg.probs(logits[0, 0]), np.float64)
    p2 = np.asarray(cfg.probs(logits[:, 1]), np.float64)
    out[name] = helpers.two_token_table(p1, p2, t5gemma.EOS_ID)
  return out


def _sample(models, setting, rule=None):
  ids = np.tile(_reference("hf_t5gemma_target")["input_ids"][:1], (N, 1))
  target, draft = models["hf_t5gemma_target"], models["hf_t5gemma_draft"]
  return sd.speculative_generate(
      target, draft, ids, gamma=GAMMA, max_decode_len=MAX_DECODE_LEN,
      seed=5, rule=rule, **SETTINGS[setting]).tokens


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_sampled_first_two_tokens_follow_the_target(models, exact, setting):
  """Speculative sampling with the T5Gemma draft passes the chi-square
  test against the target's exact first-two-token distribution."""
  cells = sum(p * N >= 5 for p in exact[setting].values())
  assert cells >= 5, cells
  tokens = _sample(models, setting)
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


# --- Export and errors (no torch). ---


def test_save_t5gemma_round_trip(models, tmp_path):
  """save_t5gemma then load_t5gemma gives back the config and the exact
  parameters (bfloat16 as float32 both ways: the fixtures' values)."""
  model = models["hf_t5gemma_draft"]
  hf_t5gemma.save_t5gemma(model, str(tmp_path / "out"))
  config, params = hf_t5gemma.load_t5gemma(str(tmp_path / "out"))
  assert config == model.config
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(model.params)):
    np.testing.assert_array_equal(a, np.asarray(b))
  with pytest.raises(FileExistsError, match="overwrite=True"):
    hf_t5gemma.save_t5gemma(model, str(tmp_path / "out"))


def test_bfloat16_parameters():
  """param_dtype='bfloat16' keeps the checkpoint's bfloat16 values."""
  config, params = hf_t5gemma.load_t5gemma(
      _fixture("hf_t5gemma_target"), dtype="bfloat16",
      param_dtype="bfloat16")
  assert config.dtype == "bfloat16"
  assert {x.dtype for x in jax.tree.leaves(params)} == {jnp.dtype("bfloat16")}


def test_untied_output_layer_is_refused(tmp_path):
  """An lm_head that differs from the decoder embedding is named, not
  silently dropped."""
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  path = tmp_path / "untied"
  shutil.copytree(_fixture("hf_t5gemma_draft"), path)
  config, params = hf_t5gemma.load_t5gemma(str(path))
  model = sd.Model(t5gemma.T5GemmaDef(config), params)
  hf_t5gemma.save_t5gemma(model, str(path), overwrite=True)
  from safetensors import safe_open  # pylint: disable=g-import-not-at-top
  with safe_open(str(path / "model.safetensors"), framework="np") as f:
    tensors = {k: f.get_tensor(k) for k in f.keys()}
  tensors[hf_t5gemma.LM_HEAD] = np.ones((32, 16), np.float32)
  save_file(tensors, str(path / "model.safetensors"))
  with pytest.raises(checkpoints.UnsupportedCheckpointError,
                     match="lm_head"):
    sd.load_model(f"hf:{path}")


def test_a_t5_loader_error_names_t5gemma(tmp_path):
  """A config.json of another model_type is refused naming both loaders."""
  path = tmp_path / "bart"
  shutil.copytree(_fixture("hf_t5gemma_draft"), path)
  config = json.loads((path / "config.json").read_text())
  config["model_type"] = "bart"
  (path / "config.json").write_text(json.dumps(config))
  with pytest.raises(checkpoints.UnsupportedCheckpointError,
                     match="model_type='bart'.*'t5gemma'"):
    sd.load_model(f"hf:{path}")


# keras-hub's `params` of each size's t5gemma_*_prefixlm preset
# (keras_hub/src/models/t5gemma/t5gemma_presets.py).
@pytest.mark.parametrize("name,count", [
    ("t5gemma_s_s", 312_517_632), ("t5gemma_b_b", 591_490_560),
    ("t5gemma_l_l", 1_241_761_792), ("t5gemma_ml_ml", 2_200_345_344),
    ("t5gemma_xl_xl", 3_766_980_608), ("t5gemma_2b_2b", 5_596_853_760),
    ("t5gemma_9b_2b", 12_292_375_296), ("t5gemma_9b_9b", 20_333_401_088)])
def test_registry_sizes_match_published_parameter_counts(name, count):
  """Every registered size has exactly its published parameter count
  (from its shapes at one and two layers a stack:
  `param_counts.from_two_depths`)."""
  assert param_counts.from_two_depths(
      registry.get_config(name), ("encoder", "decoder")) == count


# --- Live, with the hf extra (torch and transformers). ---


def test_live_against_transformers(tmp_path):
  """transformers reads our export of a random registry config and gives
  our logits and our greedy output; we read its save_pretrained back."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  definition = registry.make_def(registry.get_config("t5gemma_tiny_draft"))
  params = definition.init_params(jax.random.PRNGKey(3))
  ours = sd.Model(definition, params)
  hf_t5gemma.save_t5gemma(ours, str(tmp_path / "ours"))
  reference = transformers.T5GemmaForConditionalGeneration.from_pretrained(
      str(tmp_path / "ours"), dtype=torch.float32).eval()
  ids = np.array([[5, 6, 7, 8, 9, 10, 11, 1], [12, 13, 1, 0, 0, 0, 0, 0]],
                 np.int32)
  decoder = np.array([[2, 3, 4, 5, 6, 7, 8, 9]] * 2, np.int32)
  with torch.no_grad():
    expected = reference(input_ids=torch.tensor(ids).long(),
                         attention_mask=torch.tensor(ids != 0),
                         decoder_input_ids=torch.tensor(decoder).long())
    generated = reference.generate(
        torch.tensor(ids).long(), attention_mask=torch.tensor(ids != 0),
        max_new_tokens=10, do_sample=False, decoder_start_token_id=2,
        eos_token_id=1, pad_token_id=0)
  np.testing.assert_allclose(definition.forward(params, ids, decoder),
                             expected.logits.numpy(), atol=1e-4)
  tokens = sd.generate(ours, ids, max_decode_len=10).tokens
  width = generated.shape[1] - 1
  np.testing.assert_array_equal(tokens[:, :width], generated.numpy()[:, 1:])
  reference.save_pretrained(str(tmp_path / "theirs"))
  back = sd.load_model(f"hf:{tmp_path / 'theirs'}")
  for a, b in zip(jax.tree.leaves(back.params), jax.tree.leaves(params)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=0)


def test_tokenizer_model_next_to_the_weights_is_the_vocabulary(tmp_path):
  """A tokenizer.model in the directory becomes the Model's vocabulary
  (SentencePiece, no sentinel ids); without one there is none. (Any
  SentencePiece model shows it: the demo's stands in for Gemma's 4 MB.)"""
  spiece = os.path.join(os.path.dirname(TESTDATA), os.pardir, "specdec_jax",
                        "demo_models", "target", "vocab.model")
  pytest.importorskip("seqio")
  path = tmp_path / "with_tokenizer"
  shutil.copytree(_fixture("hf_t5gemma_draft"), path)
  shutil.copy(spiece, path / hf_t5gemma.TOKENIZER_FILE)
  model = sd.load_model(f"hf:{path}")
  assert model.vocab is not None and not model.vocab.extra_ids
  assert model.vocab.decode(model.vocab.encode("a house")) == "a house"
  assert sd.load_model(f"hf:{_fixture('hf_t5gemma_draft')}").vocab is None


def test_convert_to_our_format_and_back(models, tmp_path):
  """`checkpoints.convert` (scripts/convert_checkpoint.py's default) writes
  our format, whose config.json nests the two stacks and reads back into
  the same T5Gemma."""
  out = checkpoints.convert(f"hf:{_fixture('hf_t5gemma_draft')}",
                            str(tmp_path / "ours"))
  manifest = json.loads((tmp_path / "ours" / "config.json").read_text())
  assert manifest["family"] == "t5gemma"
  back = sd.load_model(out)
  assert back.config == models["hf_t5gemma_draft"].config
  for a, b in zip(jax.tree.leaves(back.params),
                  jax.tree.leaves(models["hf_t5gemma_draft"].params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
