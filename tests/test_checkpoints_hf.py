"""Parity of our T5 with HF transformers' PyTorch T5 on the same weights.

The fixtures in testdata/hf_t5_* are tiny random checkpoints written by
scripts/make_hf_fixtures.py with transformers 5.24, together with HF's own
outputs on them (see that script for what each variant covers).

The export (`save_t5`) tests at the end check that it is the exact inverse
of `load_t5`, without torch, and (with torch) that transformers reads it.
"""

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from specdec_jax.checkpoints import hf
from specdec_jax.models import t5

TESTDATA = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                        "testdata")
FIXTURES = ("hf_t5_v1_0", "hf_t5_v1_0_tf5", "hf_t5_v1_1", "hf_t5_v1_1_tf5")


def _fixture(name):
  return os.path.join(TESTDATA, name)


def _reference(name):
  return dict(np.load(os.path.join(_fixture(name), "reference.npz")))


def _greedy(definition, params, input_ids, max_new_tokens):
  """Greedy decoding through prefill/extend, stopping rows at EOS (id 1).

  Returns int [B, 1 + max_new_tokens] starting with the decoder start id and
  0-padded after EOS, the layout of HF's `generate`.
  """
  extend = jax.jit(definition.extend)
  pre = definition.prefill(params, input_ids, max_new_tokens)
  cache, tokens, pos = pre.cache, pre.start_token, pre.start_pos
  done = jnp.zeros(tokens.shape, bool)
  out = [tokens]
  for _ in range(max_new_tokens):
    logits, cache = extend(params, cache, tokens[:, None], pos[:, None])
    tokens = jnp.where(done, 0, jnp.argmax(logits[:, 0], -1)).astype(jnp.int32)
    done = done | (tokens == 1)
    out.append(tokens)
    pos = pos + 1
  return np.stack(out, axis=1)


def _copy(name, tmp_path):
  dst = tmp_path / name
  shutil.copytree(_fixture(name), dst)
  return dst


def _edit_config(path, **changes):
  config_file = os.path.join(path, "config.json")
  with open(config_file) as f:
    config = json.load(f)
  for key, value in changes.items():
    if value is None:
      config.pop(key, None)
    else:
      config[key] = value
  with open(config_file, "w") as f:
    json.dump(config, f)


@pytest.mark.parametrize("name", FIXTURES)
def test_logits_match_hf(name):
  """Encoder outputs and teacher-forced logits equal HF's within 1e-4."""
  ref = _reference(name)
  config, params = hf.load_t5(_fixture(name))
  definition = t5.T5Def(config)
  encoded = np.asarray(jax.jit(definition.encode)(params, ref["input_ids"]))
  real = ref["input_ids"] > 0
  np.testing.assert_allclose(encoded[real], ref["encoder_hidden"][real],
                             atol=1e-4)
  logits = jax.jit(definition.forward)(params, ref["input_ids"],
                                       ref["decoder_input_ids"])
  assert logits.dtype == jnp.float32
  np.testing.assert_allclose(logits, ref["logits"], atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("name", FIXTURES)
def test_greedy_generation_matches_hf(name):
  """Greedy decoding via prefill/extend equals HF generate token for token."""
  ref = _reference(name)
  config, params = hf.load_t5(_fixture(name))
  expected = ref["generated"]
  ours = _greedy(t5.T5Def(config), params, ref["input_ids"], 12)
  # HF stops once every row has finished; we always run 12 steps.
  np.testing.assert_array_equal(ours[:, :expected.shape[1]], expected)
  assert not ours[:, expected.shape[1]:].any()


@pytest.mark.parametrize("name,tied", [("hf_t5_v1_0", True),
                                       ("hf_t5_v1_0_tf5", True),
                                       ("hf_t5_v1_1", False),
                                       ("hf_t5_v1_1_tf5", False)])
def test_tie_conventions(name, tied):
  """v1.0 (either config style) is tied and scaled; v1.1 is untied."""
  config, params = hf.load_t5(_fixture(name))
  assert config.logits_via_embedding == tied
  assert ("logits_dense" in params["decoder"]) == (not tied)
  weights = load_file(os.path.join(_fixture(name), "model.safetensors"))
  if not tied:
    np.testing.assert_array_equal(params["decoder"]["logits_dense"]["kernel"],
                                  weights["lm_head.weight"].T)
  assert config.mlp_activations == (("relu",) if "v1_0" in name
                                    else ("gelu", "linear"))


def test_untied_but_scaled_folds_the_scale(tmp_path):
  """tie true + no scale key + a different lm_head: untied AND scaled.

  transformers 5 unties the two different weights but still scales the
  decoder output by d_model**-0.5 (scale_decoder_outputs is not false), so
  its logits are the v1.1 logits times that factor.
  """
  path = _copy("hf_t5_v1_1", tmp_path)
  _edit_config(path, tie_word_embeddings=True)
  ref = _reference("hf_t5_v1_1")
  config, params = hf.load_t5(str(path))
  assert not config.logits_via_embedding
  logits = t5.T5Def(config).forward(params, ref["input_ids"],
                                    ref["decoder_input_ids"])
  np.testing.assert_allclose(logits, ref["logits"] * 32**-0.5, atol=1e-5)


def test_tied_but_unscaled_copies_the_embedding(tmp_path):
  """tie false + no lm_head: transformers 5 ties anyway, without scaling."""
  path = _copy("hf_t5_v1_0", tmp_path)
  _edit_config(path, tie_word_embeddings=False)
  ref = _reference("hf_t5_v1_0")
  config, params = hf.load_t5(str(path))
  assert not config.logits_via_embedding
  np.testing.assert_array_equal(params["decoder"]["logits_dense"]["kernel"],
                                params["token_embedder"]["embedding"].T)
  logits = t5.T5Def(config).forward(params, ref["input_ids"],
                                    ref["decoder_input_ids"])
  np.testing.assert_allclose(logits, ref["logits"] * 32**0.5, atol=1e-4)


def test_sharded_safetensors_load_like_a_single_file(tmp_path):
  """model.safetensors.index.json + shards give the same parameters."""
  path = _copy("hf_t5_v1_1", tmp_path)
  weights = load_file(os.path.join(path, "model.safetensors"))
  os.remove(os.path.join(path, "model.safetensors"))
  names = sorted(weights)
  weight_map = {}
  for i, part in enumerate((names[::2], names[1::2])):
    shard = f"model-{i + 1:05d}-of-00002.safetensors"
    save_file({n: weights[n] for n in part}, os.path.join(path, shard))
    weight_map.update({n: shard for n in part})
  with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
    json.dump({"metadata": {}, "weight_map": weight_map}, f)
  _, sharded = hf.load_t5(str(path))
  _, single = hf.load_t5(_fixture("hf_t5_v1_1"))
  jax.tree.map(np.testing.assert_array_equal, sharded, single)


def test_bfloat16_parameters():
  """param_dtype='bfloat16' converts every tensor while loading."""
  config, params = hf.load_t5(
      _fixture("hf_t5_v1_1"), dtype="bfloat16", param_dtype="bfloat16")
  assert config.dtype == "bfloat16"
  assert {x.dtype for x in jax.tree.leaves(params)} == {jnp.dtype("bfloat16")}


def test_missing_directory_config_and_weights(tmp_path):
  """Missing files raise FileNotFoundError naming what is missing."""
  with pytest.raises(FileNotFoundError, match="directory not found"):
    hf.load_t5(str(tmp_path / "nowhere"))
  with pytest.raises(FileNotFoundError, match="missing config.json"):
    hf.load_t5(str(tmp_path))
  path = _copy("hf_t5_v1_0", tmp_path)
  os.remove(os.path.join(path, "model.safetensors"))
  with pytest.raises(FileNotFoundError, match="expected model.safetensors"):
    hf.load_t5(str(path))


def test_unknown_architecture(tmp_path):
  """A config of another model type raises, naming it and what is supported."""
  path = _copy("hf_t5_v1_0", tmp_path)
  _edit_config(path, model_type="bart",
               architectures=["BartForConditionalGeneration"])
  with pytest.raises(ValueError,
                     match="model_type='bart'.*only model_type 't5'"):
    hf.load_t5(str(path))
  _edit_config(path, model_type="t5", architectures=["T5EncoderModel"])
  with pytest.raises(hf.UnsupportedCheckpointError,
                     match="T5EncoderModel"):
    hf.load_t5(str(path))


def test_wrong_shape_names_the_parameter(tmp_path):
  """A tensor of the wrong shape raises with its name, expected and found."""
  path = _copy("hf_t5_v1_1", tmp_path)
  file = os.path.join(path, "model.safetensors")
  weights = load_file(file)
  name = "decoder.block.1.layer.1.EncDecAttention.k.weight"
  weights[name] = np.zeros((16, 32), np.float32)
  save_file(weights, file)
  with pytest.raises(hf.ParameterShapeError) as e:
    hf.load_t5(str(path))
  message = str(e.value)
  assert name in message and "(16, 32)" in message and "(32, 32)" in message
  assert "decoder/layers_1/encoder_decoder_attention/key/kernel" in message


def test_missing_parameter_names_it(tmp_path):
  """A tensor the config needs but the file lacks raises with its name."""
  path = _copy("hf_t5_v1_1", tmp_path)
  file = os.path.join(path, "model.safetensors")
  weights = load_file(file)
  del weights["encoder.block.0.layer.1.DenseReluDense.wi_1.weight"]
  save_file(weights, file)
  with pytest.raises(
      hf.MissingParameterError,
      match=r"encoder\.block\.0\.layer\.1\.DenseReluDense\.wi_1"):
    hf.load_t5(str(path))


def test_pytorch_bin_without_torch_names_the_install(tmp_path):
  """pytorch_model.bin without torch installed tells how to get it."""
  try:
    import torch  # pylint: disable=g-import-not-at-top,unused-import
    pytest.skip("torch is installed")
  except ImportError:
    pass
  path = _copy("hf_t5_v1_0", tmp_path)
  os.remove(os.path.join(path, "model.safetensors"))
  (path / "pytorch_model.bin").write_bytes(b"not read")
  with pytest.raises(ImportError, match=r"pip install -e '\.\[hf\]'"):
    hf.load_t5(str(path))


@pytest.mark.parametrize("v1_1", [False, True])
def test_live_against_transformers(tmp_path, v1_1):
  """A fresh random HF model (default buckets) and ours agree; .bin loads too.

  Compares against transformers directly rather than stored outputs, and
  reads the checkpoint both as safetensors and as pytorch_model.bin.
  """
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  torch.manual_seed(1)
  hf_config = transformers.T5Config(
      vocab_size=96, d_model=24, d_kv=6, num_heads=4, d_ff=40, num_layers=2,
      num_decoder_layers=3, decoder_start_token_id=0,
      feed_forward_proj="gated-gelu" if v1_1 else "relu",
      tie_word_embeddings=not v1_1)
  model = transformers.T5ForConditionalGeneration(hf_config).eval()
  if v1_1:
    model.lm_head.weight = torch.nn.Parameter(torch.randn(96, 24))
  input_ids = np.array([[5, 6, 7, 8, 1], [9, 10, 1, 0, 0]], np.int64)
  decoder_ids = np.array([[0, 3, 4, 5], [0, 7, 8, 9]], np.int64)
  with torch.no_grad():
    expected = model(input_ids=torch.tensor(input_ids),
                     attention_mask=torch.tensor(input_ids != 0),
                     decoder_input_ids=torch.tensor(decoder_ids)).logits
  model.save_pretrained(tmp_path / "st")
  # transformers 5 only writes safetensors; a .bin as older versions wrote
  # it holds the full state dict, tied copies included.
  os.makedirs(tmp_path / "bin")
  shutil.copy(tmp_path / "st" / "config.json", tmp_path / "bin")
  torch.save(model.state_dict(), tmp_path / "bin" / "pytorch_model.bin")
  for sub in ("st", "bin"):
    config, params = hf.load_t5(str(tmp_path / sub))
    assert config.num_decoder_layers == 3
    logits = t5.T5Def(config).forward(params, input_ids.astype(np.int32),
                                      decoder_ids.astype(np.int32))
    np.testing.assert_allclose(logits, expected.numpy(), atol=1e-4)


# --- Export: save_t5 is the exact inverse of load_t5. ---


def _assert_same_params(got, want):
  """Same tree structure, and every leaf equal bit for bit (dtype too)."""
  got = jax.tree.map(np.asarray, got)
  want = jax.tree.map(np.asarray, want)
  assert jax.tree.structure(got) == jax.tree.structure(want)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))


@pytest.mark.parametrize("name,tied", [("t5_tiny", True),
                                       ("t5_1_1_tiny", False)])
def test_save_t5_round_trip(tmp_path, name, tied):
  """save_t5 then load_t5 (and load_model('hf:DIR')) gives back the config
  and every parameter bit for bit, for v1.0 (tied, scaled, ReLU) and v1.1
  (untied lm_head, gated GELU); the files say which convention HF must use.
  """
  from specdec_jax import checkpoints  # pylint: disable=g-import-not-at-top
  model = checkpoints.load_model(name, seed=3)
  path = str(tmp_path / name)
  assert hf.save_t5(model, path) == path
  config, params = hf.load_t5(path)
  assert config == model.config
  _assert_same_params(params, model.params)
  again = checkpoints.load_model(f"hf:{path}")
  assert again.config == model.config
  _assert_same_params(again.params, model.params)

  with open(os.path.join(path, "config.json")) as f:
    hf_config = json.load(f)
  assert hf_config["tie_word_embeddings"] is tied
  assert hf_config["scale_decoder_outputs"] is tied
  assert hf_config["feed_forward_proj"] == ("relu" if tied else "gated-gelu")
  assert (hf_config["decoder_start_token_id"], hf_config["pad_token_id"],
          hf_config["eos_token_id"]) == (0, 0, 1)
  weights = load_file(os.path.join(path, "model.safetensors"))
  assert ("lm_head.weight" in weights) == (not tied)
  # Relative attention bias only in block 0, [R, N] as HF holds it.
  bias = [n for n in weights if "relative_attention_bias" in n]
  assert sorted(bias) == [
      f"{s}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
      for s in ("decoder", "encoder")]
  np.testing.assert_array_equal(
      weights["encoder.block.0.layer.0.SelfAttention."
              "relative_attention_bias.weight"],
      np.asarray(model.params["encoder"]["relpos_bias"]["rel_embedding"]).T)


def test_save_t5_round_trip_bfloat16(tmp_path):
  """bfloat16 parameters are written as bfloat16 and read back unchanged."""
  from specdec_jax import checkpoints  # pylint: disable=g-import-not-at-top
  model = checkpoints.load_model("t5_1_1_tiny", param_dtype="bfloat16")
  hf.save_t5(model, str(tmp_path))
  with open(tmp_path / "config.json") as f:
    assert json.load(f)["dtype"] == "bfloat16"
  config, params = hf.load_t5(
      str(tmp_path), dtype=model.config.dtype, param_dtype="bfloat16")
  assert config == model.config
  _assert_same_params(params, model.params)


def test_save_t5_refuses_other_models_and_overwriting(tmp_path):
  """A non-T5 model raises TypeError naming it; an existing export is kept
  unless overwrite=True."""
  from specdec_jax import checkpoints  # pylint: disable=g-import-not-at-top
  with pytest.raises(TypeError, match="T5 models only.*GPTConfig"):
    hf.save_t5(checkpoints.load_model("gpt_tiny"), str(tmp_path))
  model = checkpoints.load_model("t5_tiny")
  hf.save_t5(model, str(tmp_path))
  with pytest.raises(FileExistsError, match="overwrite=True"):
    hf.save_t5(model, str(tmp_path))
  hf.save_t5(model, str(tmp_path), overwrite=True)


@pytest.mark.parametrize("spec", ["demo:draft_small", "t5_1_1_tiny"])
def test_save_t5_live_against_transformers(tmp_path, spec):
  """HF's from_pretrained on our export computes our logits (within 1e-4).

  demo:draft_small is a trained v1.0 model (tied, scaled output layer);
  t5_1_1_tiny a random v1.1 one, whose separate lm_head transformers 5
  must keep untied.
  """
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  from specdec_jax import checkpoints  # pylint: disable=g-import-not-at-top
  model = checkpoints.load_model(spec, seed=5)
  hf.save_t5(model, str(tmp_path))
  reference = transformers.T5ForConditionalGeneration.from_pretrained(
      str(tmp_path)).eval()
  vocab = model.config.vocab_size
  rng = np.random.default_rng(0)
  input_ids = np.concatenate([rng.integers(3, vocab, (2, 9)),
                              np.ones((2, 1), np.int64)], 1)
  input_ids[1, 6:] = [1, 0, 0, 0]  # a shorter, padded row
  decoder_ids = np.concatenate([np.zeros((2, 1), np.int64),
                                rng.integers(3, vocab, (2, 5))], 1)
  with torch.no_grad():
    expected = reference(input_ids=torch.tensor(input_ids),
                         attention_mask=torch.tensor(input_ids != 0),
                         decoder_input_ids=torch.tensor(decoder_ids)).logits
  logits = model.definition.forward(model.params, input_ids.astype(np.int32),
                                    decoder_ids.astype(np.int32))
  assert np.asarray(logits).dtype == np.float32
  np.testing.assert_allclose(logits, expected.numpy(), atol=1e-4)


def _safetensors_header(path: str) -> dict:
  """A safetensors file's tensors: name -> (dtype, shape), from its header
  (what a reader sees before any weight)."""
  with open(path, "rb") as f:
    size = int.from_bytes(f.read(8), "little")
    header = json.loads(f.read(size))
  return {name: (entry["dtype"], tuple(entry["shape"]))
          for name, entry in header.items() if name != "__metadata__"}


# The fields of config.json where our export differs from transformers'
# own, on purpose: its version, and T5 v1.1's output layer, which we state
# as untied (tie_word_embeddings false, as the Hub's v1.1 configs do) so
# that transformers 4 reads it as 5 does (checkpoints/hf.py's docstring);
# our n_positions (the longest input) is a field transformers ignores.
_ON_PURPOSE = {"transformers_version": None,
               "tie_word_embeddings": "hf_t5_v1_1_tf5",
               "n_positions": None}


@pytest.mark.parametrize("name", ["hf_t5_v1_0_tf5", "hf_t5_v1_1_tf5",
                                  "hf_t5gemma_target", "hf_t5gemma_draft"])
def test_our_export_is_what_transformers_writes(name, tmp_path):
  """Without torch in the suite, CI still checks what transformers will
  read: a directory transformers 5.24 wrote (`save_pretrained`), loaded and
  exported again by us, has the same tensor names, dtypes and shapes in
  model.safetensors, and every config.json field transformers wrote with
  the same value (its version aside). The live tests (`hf` extra) load the
  export with transformers itself."""
  from specdec_jax import checkpoints  # pylint: disable=g-import-not-at-top
  from specdec_jax.checkpoints import hf_t5gemma  # pylint: disable=g-import-not-at-top
  source = os.path.join(TESTDATA, name)
  with open(os.path.join(source, "config.json")) as f:
    dtype = json.load(f).get("dtype", "float32")
  model = checkpoints.load_model(f"hf:{source}", param_dtype=dtype)
  out = str(tmp_path / "export")
  if name.startswith("hf_t5gemma"):
    hf_t5gemma.save_t5gemma(model, out)
  else:
    hf.save_t5(model, out)
  assert _safetensors_header(os.path.join(out, "model.safetensors")) == (
      _safetensors_header(os.path.join(source, "model.safetensors")))
  with open(os.path.join(source, "config.json")) as f:
    theirs = json.load(f)
  with open(os.path.join(out, "config.json")) as f:
    ours = json.load(f)
  def on_purpose(key):
    return key in _ON_PURPOSE and _ON_PURPOSE[key] in (None, name)

  differ = {k: (theirs.get(k, "<missing>"), ours.get(k, "<missing>"))
            for k in set(theirs) | set(ours)
            if not on_purpose(k) and ours.get(k) != theirs.get(k)}
  assert not differ, differ
