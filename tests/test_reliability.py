"""Nothing silent: bad arguments, NaN/inf, mismatched models, impossible sizes.

Each test reproduces one finding of issue 18 (numbered as there) and holds
the fix: the public decoders either decode or refuse with a ValueError /
TypeError naming the argument and the fix, BEFORE anything is compiled
(`engine.build_*` cache misses unchanged), and a NaN or inf logit is never
turned into tokens without a word. docs/reliability.md lists the checks and
their costs.
"""

import types
import warnings

import jax
import numpy as np
import pytest

import specdec_jax as sd
from specdec_jax.decoding import checks
from specdec_jax.decoding import engine
from specdec_jax.memory import footprint
from specdec_jax.models import ngram
from tests import helpers

VOCAB = 16
IDS = np.array([[5, 1, 0], [4, 6, 1]], np.int32)


def _misses():
  return (engine.build_generate.cache_info().misses,
          engine.build_speculative.cache_info().misses)


@pytest.fixture(scope="module")
def tables():
  target = helpers.table_model(VOCAB, seed=0, eos_bias=0.5)
  return target, helpers.table_model(VOCAB, seed=1, base=target)


@pytest.fixture(scope="module")
def t5():
  """A tiny random T5 target and a second one as its draft."""
  return sd.load_model("t5_tiny"), sd.load_model("t5_tiny", seed=1)


def _refused(error, match, fn, **kwargs):
  before = _misses()
  with pytest.raises(error, match=match):
    fn(**kwargs)
  assert _misses() == before, "refused only after compiling"


# -- 3 and 6: sampling settings, seed, input_ids -------------------------


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(temperature=float("nan")), ValueError, "temperature must be a finite"),
    (dict(temperature=float("inf")), ValueError, "temperature must be a finite"),
    (dict(temperature="1"), TypeError, "temperature must be a number"),
    (dict(top_k=2.0), TypeError, "top_k must be an int"),
    (dict(top_p=float("nan")), ValueError, "top_p must be in"),
    (dict(seed=2**40), ValueError, "seed must fit in int32"),
    (dict(seed=np.array([0, 2**40])), ValueError, "seed must fit in int32"),
    (dict(seed=1.5), TypeError, "seed must be an int"),
    (dict(lenience=float("nan")), ValueError, "lenience must be in"),
    (dict(on_nonfinite="raise"), ValueError, "on_nonfinite must be one of"),
])
def test_bad_settings_are_refused_naming_the_argument(tables, kwargs, error,
                                                      match):
  """Finding 3 (NaN temperature decoded all-pad with alpha NaN) and 6
  (float top_k failed in tracing; str temperature and 2**40 seed did not
  name the argument): each is refused before compiling."""
  target, draft = tables
  args = dict(gamma=2, max_decode_len=4)
  args.update(kwargs)
  _refused(error, match, sd.speculative_generate, target=target, draft=draft,
           input_ids=IDS, **args)
  if "lenience" not in kwargs:
    args.pop("gamma")
    _refused(error, match, sd.generate, model=target, input_ids=IDS, **args)


def test_numpy_and_jax_scalars_are_accepted_and_share_one_compiled_loop(
    tables):
  """Normalising settings to Python numbers keeps np.float32(1) and 1.0 one
  cache entry (negative control for the checks above: valid values pass)."""
  target, draft = tables
  a = sd.speculative_generate(target, draft, IDS, gamma=2, max_decode_len=4,
                              temperature=1.0, top_k=np.int64(3), seed=3)
  before = _misses()
  b = sd.speculative_generate(target, draft, IDS, gamma=2, max_decode_len=4,
                              temperature=np.float32(1.0), top_k=3,
                              seed=np.int32(3))
  assert _misses() == before
  np.testing.assert_array_equal(a.tokens, b.tokens)


def test_ragged_lists_are_refused_with_our_message(tables):
  """Finding 6: ragged Python lists gave numpy's message."""
  target, _ = tables
  _refused(ValueError, "rectangular int array.*Pad every row with 0",
           sd.generate, model=target, input_ids=[[5, 1], [4, 6, 1]],
           max_decode_len=4)


def test_t5_rows_without_eos_are_refused(t5):
  """Finding 6: a T5 row without EOS silently changed the output. Rows
  ending in EOS (padded or not) pass; a decoder-only or table model keeps
  taking rows without EOS (its row is a prompt)."""
  target, _ = t5
  _refused(ValueError, r"rows \[1\] do not end in EOS", sd.generate,
           model=target, input_ids=np.array([[5, 1, 0], [4, 6, 7]]),
           max_decode_len=2)
  sd.generate(target, np.array([[5, 1, 0], [4, 6, 1]]), max_decode_len=2)
  table = helpers.table_model(VOCAB, seed=0)
  sd.generate(table, np.array([[5, 6]]), max_decode_len=2)


# -- 4: non-finite numbers -----------------------------------------------


def _with_nan(model, token):
  """The model with NaN logits for `token` everywhere (a table model), or
  a NaN row for it in the embedding (T5: its logits are NaN too)."""
  params = jax.tree.map(np.array, model.params)
  if "table" in params:
    params["table"][..., token] = np.nan
  else:
    params["token_embedder"]["embedding"][token] = np.nan
  return sd.Model(model.definition, params, model.vocab)


def test_nan_in_the_target_is_an_error_naming_the_target(tables, t5):
  """Finding 4: one NaN row in a T5 target's embedding made greedy
  speculative decoding return copies of the last id (and sampling return
  pads with alpha 1) without a word. Now both decoders raise, naming the
  target; on_nonfinite='warn' returns the result with the per-row flag.
  (Table models, whose logits are an explicit table, for the loops; the T5
  case once, as in the issue.)"""
  target, draft = tables
  bad = _with_nan(target, 7)
  for temperature in (0.0, 1.0):
    with pytest.raises(FloatingPointError, match="the target model produced "
                       r"non-finite logits \(NaN or inf\) for rows \[0, 1\]"):
      sd.speculative_generate(bad, draft, IDS, gamma=3, max_decode_len=4,
                              temperature=temperature)
  with pytest.raises(FloatingPointError, match="target model"):
    sd.generate(bad, IDS, max_decode_len=4)
  with pytest.warns(RuntimeWarning, match="target model"):
    result = sd.speculative_generate(bad, draft, IDS, gamma=3,
                                     max_decode_len=4, on_nonfinite="warn")
  assert result.stats.target_nonfinite.tolist() == [True, True]
  assert result.stats.draft_nonfinite.tolist() == [False, False]
  with pytest.raises(FloatingPointError, match="target model"):
    sd.generate(_with_nan(t5[0], 7), np.array([[5, 1]]), max_decode_len=2)


def test_nan_in_the_draft_is_named_and_finite_models_raise_nothing(tables):
  """NaNs in the draft leave the output exact but made alpha NaN silently:
  now an error naming the draft (a warning at the user's choice, with the
  greedy output still the target's). Negative control: finite models set
  no flag and warn about nothing."""
  target, draft = tables
  bad = _with_nan(draft, 7)
  with pytest.raises(FloatingPointError, match="the draft model"):
    sd.speculative_generate(target, bad, IDS, gamma=3, max_decode_len=4)
  with pytest.warns(RuntimeWarning, match="draft model"):
    result = sd.speculative_generate(target, bad, IDS, gamma=3,
                                     max_decode_len=4, on_nonfinite="warn")
  assert result.stats.draft_nonfinite.all()
  np.testing.assert_array_equal(
      result.tokens, sd.generate(target, IDS, max_decode_len=4).tokens)
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    clean = sd.speculative_generate(target, draft, IDS, gamma=3,
                                    max_decode_len=4)
  assert not clean.stats.target_nonfinite.any()
  assert not clean.stats.draft_nonfinite.any()
  ignored = sd.speculative_generate(target, bad, IDS, gamma=3,
                                    max_decode_len=4, on_nonfinite="ignore")
  assert ignored.stats.draft_nonfinite is None


# -- 5: vocabularies and families ----------------------------------------


def test_a_different_vocabulary_of_the_same_size_is_refused(tables):
  """Finding 5: a draft with another vocabulary of the same size decoded
  with alpha ~ 0. Both models carry a vocabulary: compared by the
  SentencePiece model's bytes and the extra ids. Same vocabulary: runs."""
  target, draft = tables
  spm = lambda data, extra=100: types.SimpleNamespace(sp_model=data,
                                                      extra_ids=extra)
  with_vocab = lambda m, v: sd.Model(m.definition, m.params, v)
  for other in (spm(b"other"), spm(b"same", extra=99)):
    _refused(ValueError, "different vocabularies of the same size",
             sd.speculative_generate, target=with_vocab(target, spm(b"same")),
             draft=with_vocab(draft, other), input_ids=IDS, gamma=2,
             max_decode_len=4)
  sd.speculative_generate(with_vocab(target, spm(b"same")),
                          with_vocab(draft, spm(b"same")), IDS, gamma=2,
                          max_decode_len=4)


def test_families_must_match(t5):
  """Finding 5: a GPT-like draft for a T5 target is refused (and the other
  way round); a T5 target takes a T5 draft or an encoder-decoder n-gram
  drafter, not a decoder-only one."""
  target, _ = t5
  gpt = sd.load_model("gpt_tiny")
  assert gpt.vocab_size == target.vocab_size
  ids = np.array([[5, 1]])
  for t, d in ((target, gpt), (gpt, target)):
    _refused(ValueError, "the target is .* but the draft is",
             sd.speculative_generate, target=t, draft=d, input_ids=ids,
             gamma=2, max_decode_len=2)
  seqs = [np.array([5, 6, 1])]
  _refused(ValueError, "encoder-decoder but the draft is decoder-only",
           sd.speculative_generate, target=target,
           draft=ngram.fit_ngram(seqs, target.vocab_size, decoder_only=True),
           input_ids=ids, gamma=2, max_decode_len=2)
  # Negative control: the checks pass a T5 target with an encoder-decoder
  # n-gram drafter or another T5.
  checks.check_compatible(target, ngram.fit_ngram(seqs, target.vocab_size))
  checks.check_compatible(target, t5[1])


# -- 7: buffers that cannot fit ------------------------------------------


def test_impossible_sizes_are_refused_with_the_number_before_compiling(
    t5, monkeypatch):
  """Finding 7: gamma=10**6 or max_decode_len=10**7 compiled first and then
  failed with a multi-terabyte RESOURCE_EXHAUSTED. Now the buffers are
  estimated from shapes and refused with the number and the memory free.
  gamma=10**6 needs terabytes anywhere; max_decode_len=10**7 is checked
  against a 4 GiB device so the test does not depend on this machine."""
  target, draft = t5
  ids = np.array([[5, 1]])
  _refused(ValueError, r"gamma=1000000.*needs at least [\d,.]+ GiB.*lower",
           sd.speculative_generate, target=target, draft=draft,
           input_ids=ids, gamma=10**6, max_decode_len=4)
  monkeypatch.setattr(checks, "available_bytes",
                      lambda: (4 << 30, "free on a test device"))
  _refused(ValueError, r"max_decode_len=10000000 needs .* 4\.0 GiB is free",
           sd.generate, model=target, input_ids=ids, max_decode_len=10**7)
  # Ordinary sizes are not estimated at all (no tracing per call).
  monkeypatch.setattr(footprint, "model_bytes",
                      lambda *a: pytest.fail("estimated an ordinary size"))
  checks.check_memory([(target, 8), (draft, 2)], (8, 64), 7, 128, True,
                     "ordinary")


# -- The fuzz test -------------------------------------------------------

_VALID = {
    "gamma": [2], "max_decode_len": [3], "temperature": [0.0, 1.0,
                                                         np.float32(1.0)],
    "top_k": [0], "top_p": [1.0], "seed": [0, 5, np.array([1, 2])],
    "lenience": [1.0], "on_nonfinite": ["error"], "record_trace": [False],
    "input_ids": [IDS, IDS.tolist()],
}
_INVALID = {
    "gamma": [0, -1, 2.5, "3", None, True, 10**6],
    "max_decode_len": [0, -5, 3.0, "3", None, False],
    "temperature": [-1.0, float("nan"), float("inf"), "1", None, 1j],
    "top_k": [-1, 2.0, "2", None, True],
    "top_p": [0.0, 1.5, float("nan"), "0.9", None],
    "seed": [2**40, -2**40, 1.5, "0", None, np.array([1]), [[1, 2]],
             np.array([0.5, 1.0])],
    "lenience": [0.0, 2.0, float("nan"), "1"],
    "on_nonfinite": ["raise", None, 1],
    "input_ids": [[[5, 1], [4, 6, 1]], IDS.astype(np.float32), IDS[0],
                  np.zeros((2, 3), np.int32), IDS + VOCAB, IDS - 2,
                  np.zeros((0, 3), np.int32), "5 1", None, IDS[:, :, None]],
}


def test_fuzz_every_input_is_decoded_or_refused_before_compiling(tables):
  """400 seeded random argument sets for both decoders, each argument
  invalid with probability 0.2 (about 1 set in 6 is all-valid): every
  all-valid set decodes to [batch, max_decode_len] tokens; every other set
  raises ValueError or TypeError before any loop is built. Anything else
  (a crash inside JAX, a wrong error type) fails."""
  target, draft = tables
  rng = np.random.default_rng(18)
  decoded = refused = 0
  for case in range(400):
    speculative = bool(rng.integers(2))
    names = list(_VALID) if speculative else [
        n for n in _VALID if n not in ("gamma", "lenience", "record_trace")]
    args, valid = {}, True
    for name in names:
      pool = _VALID[name]
      if name in _INVALID and rng.random() < 0.2:
        pool, valid = _INVALID[name], False
      args[name] = pool[rng.integers(len(pool))]
    before = _misses()
    try:
      if speculative:
        result = sd.speculative_generate(target, draft, **args)
      else:
        result = sd.generate(target, **args)
    except (ValueError, TypeError) as e:
      assert not valid, f"case {case}: valid {args} refused: {e}"
      assert _misses() == before, f"case {case}: {args} compiled first"
      assert str(e), case
      refused += 1
      continue
    assert valid, f"case {case}: invalid {args} decoded"
    assert result.tokens.shape == (2, args["max_decode_len"])
    decoded += 1
  assert decoded >= 20 and refused >= 200, (decoded, refused)


def test_an_unknown_xla_option_is_refused_before_compiling(tables):
  """Issue 38, finding 6: an unknown XLA option in `compiler_options` failed
  only when the decoding loop compiled. It is refused first, naming the
  option and how to list the valid ones; a known option decodes (negative
  control)."""
  target, draft = tables
  for fn, args in ((sd.generate, dict(model=target)),
                   (sd.speculative_generate,
                    dict(target=target, draft=draft, gamma=2))):
    _refused(ValueError, r"(?s)xla_no_such_option.*XLA_FLAGS=--help", fn,
             input_ids=IDS, max_decode_len=4,
             compiler_options={"xla_no_such_option": True}, **args)
  out = sd.generate(target, IDS, max_decode_len=4,
                    compiler_options={"xla_cpu_enable_fast_math": False})
  assert out.tokens.shape[1] == 4


def test_a_workdir_that_is_a_file_is_named(tmp_path):
  """Issue 38, finding 6: a workdir or convert --output that is a regular
  file (or lies under one) gave a bare FileExistsError/NotADirectoryError."""
  # pylint: disable-next=g-import-not-at-top
  from specdec_jax.experiments import workdir as workdir_lib
  from specdec_jax.training import train  # pylint: disable=g-import-not-at-top
  blocker = tmp_path / "results"
  blocker.write_text("not a directory")
  for path, where in ((blocker, "is a regular file"),
                      (blocker / "run1", f"lies under {blocker}, which is")):
    with pytest.raises(workdir_lib.WorkdirError, match=where):
      workdir_lib.make_directory(str(path))
    with pytest.raises(ValueError, match=f"workdir {path} {where}"):
      train.TrainConfig(workdir=str(path), num_steps=1).check()
  with pytest.raises(workdir_lib.WorkdirError, match="--output .* regular"):
    workdir_lib.check_directory_path(str(blocker), "--output")
  workdir_lib.make_directory(str(tmp_path / "a" / "b"))  # negative control
  workdir_lib.check_directory_path("gs://bucket/x")
