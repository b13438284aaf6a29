"""Llama 3, Qwen 3 and Qwen 2.5 checkpoints (`checkpoints/hf_llama.py`)
and their tokenizers (`tokens.BpeVocabulary`).

Invariants:
  - every published size has, from shapes, the published parameter count
    (Llama: the Hub's exact count; Qwen 3: its model cards' total and
    non-embedding counts, at their precision; Qwen 2.5: the Hub's counts,
    and the cards' where they round the shapes' counts);
  - the Hub's own config.json files read as the registry's sizes;
  - a checkpoint as the Hub holds it (transformers 4's config.json with
    `rope_scaling`, sharded safetensors) loads exactly, with its
    tokenizer as the Model's vocabulary;
  - export (`save_llama`) is the exact inverse of the loader, tokenizer
    files included, and so is our orbax format (`checkpoints.convert`); bfloat16 stays bfloat16; an untied checkpoint without
    lm_head.weight, and variants the layout does not run, are refused
    naming what is wrong;
  - a tokenizer.json written by the `tokenizers` library encodes and
    decodes as transformers' AutoTokenizer does (golden ids and texts,
    testdata/hf_bpe_{llama3,qwen3}/reference.json, written by
    scripts/make_hf_bpe_fixtures.py), special ids, stop ids and the chat
    template from the checkpoint's files;
  - a draft carrying another tokenizer is refused before compiling, and
    by a run before any weights are read;
  - with the `hf` extra, transformers reads what we write and we read what
    it writes, logits and greedy output equal (live, skipped without
    torch).
"""

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specdec_jax as sd
from specdec_jax import checkpoints
from specdec_jax import tokens
from specdec_jax.checkpoints import hf_llama
from specdec_jax.decoding import engine
from specdec_jax.experiments import loading
from specdec_jax.experiments.experiment_config import ConfigError
from specdec_jax.experiments.experiment_config import ExperimentConfig
from specdec_jax.models import registry
from tests import hf_layouts
from tests import param_counts

TESTDATA = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                        "testdata")
LLAMA = os.path.join(TESTDATA, "hf_llama_target")
QWEN3 = os.path.join(TESTDATA, "hf_qwen3_target")
QWEN3_DRAFT = os.path.join(TESTDATA, "hf_qwen3_draft")
BPE = {family: os.path.join(TESTDATA, f"hf_bpe_{family}")
       for family in ("llama3", "qwen3")}


def _same_params(a, b):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _count(name):
  """(parameters, parameters outside the embedding and output layer) of a
  registered config, from its shapes at depths 1 and 2
  (`param_counts.from_two_depths`)."""
  config = registry.get_config(name)
  total = param_counts.from_two_depths(config)
  embeddings = config.vocab_size * config.emb_dim * (
      1 if config.tie_embeddings else 2)
  return total, total - embeddings


# Llama: the parameter count the Hub states for each checkpoint (its
# safetensors files: 8B's and 70B's index total_size is twice it, in
# bfloat16).
@pytest.mark.parametrize("name,count", [
    ("llama3_2_1b", 1_235_814_400), ("llama3_2_3b", 3_212_749_824),
    ("llama3_1_8b", 8_030_261_248), ("llama3_1_70b", 70_553_706_496)])
def test_llama_sizes_match_published_parameter_counts(name, count):
  """Every registered Llama 3 size has its published parameter count."""
  assert _count(name)[0] == count


# Qwen 3: the model cards' "Number of Parameters" and "Number of
# Parameters (Non-Embedding)", in billions as printed there.
@pytest.mark.parametrize("name,total,non_embedding", [
    ("qwen3_0_6b", "0.6", "0.44"), ("qwen3_1_7b", "1.7", "1.4"),
    ("qwen3_4b", "4.0", "3.6"), ("qwen3_8b", "8.2", "6.95"),
    ("qwen3_14b", "14.8", "13.2"), ("qwen3_32b", "32.8", "31.2")])
def test_qwen3_sizes_match_published_parameter_counts(name, total,
                                                      non_embedding):
  """Every registered Qwen 3 size rounds to its card's two counts."""
  count, without = _count(name)
  digits = lambda printed: len(printed.split(".")[1])
  assert f"{count / 1e9:.{digits(total)}f}" == total
  assert f"{without / 1e9:.{digits(non_embedding)}f}" == non_embedding


# Qwen 2.5: the parameter count the Hub shows for each checkpoint (read
# from its safetensors files), and the model cards' two counts ("Number of
# Parameters", and without the embeddings) where they round ours: up to 3B.
# From 7B up the cards print 7.61/6.53, 14.7/13.1, 32.5/31.0 and 72.7/70.0
# billion, against 7.62/6.53, 14.77/13.21, 32.76/31.21 and 72.71/70.21 from
# the published shapes, which the Hub's counts of the files agree with.
@pytest.mark.parametrize("name,hub,card", [
    ("qwen2_5_0_5b", "0.494", ("0.49", "0.36")),
    ("qwen2_5_1_5b", "1.54", ("1.54", "1.31")),
    ("qwen2_5_3b", "3.09", ("3.09", "2.77")),
    ("qwen2_5_7b", "7.62", None), ("qwen2_5_14b", "14.8", None),
    ("qwen2_5_32b", "32.8", None), ("qwen2_5_72b", "72.7", None)])
def test_qwen2_5_sizes_match_published_parameter_counts(name, hub, card):
  """Every registered Qwen 2.5 size rounds to the Hub's count, and to its
  model card's two counts where the card rounds it."""
  count, without = _count(name)
  digits = lambda printed: len(printed.split(".")[1])
  assert f"{count / 1e9:.{digits(hub)}f}" == hub
  if card:
    assert f"{count / 1e9:.{digits(card[0])}f}" == card[0]
    assert f"{without / 1e9:.{digits(card[1])}f}" == card[1]


# What the Hub's config.json files set (transformers 4 wrote them).
HUB_LLAMA_1B = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False,
    "attention_dropout": 0.0, "bos_token_id": 128000,
    "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu",
    "hidden_size": 2048, "initializer_range": 0.02,
    "intermediate_size": 8192, "max_position_embeddings": 131072,
    "mlp_bias": False, "model_type": "llama", "num_attention_heads": 32,
    "num_hidden_layers": 16, "num_key_value_heads": 8, "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0,
                     "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192,
                     "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": True,
    "torch_dtype": "bfloat16", "use_cache": True, "vocab_size": 128256}
HUB_LLAMA_8B = dict(
    HUB_LLAMA_1B, hidden_size=4096, intermediate_size=14336,
    num_hidden_layers=32, tie_word_embeddings=False,
    rope_scaling=dict(HUB_LLAMA_1B["rope_scaling"], factor=8.0))
del HUB_LLAMA_8B["head_dim"]  # 3.1's configs leave it to hidden / heads
HUB_QWEN3_32B = {
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": False,
    "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151645,
    "head_dim": 128, "hidden_act": "silu", "hidden_size": 5120,
    "initializer_range": 0.02, "intermediate_size": 25600,
    "max_position_embeddings": 40960, "max_window_layers": 64,
    "model_type": "qwen3", "num_attention_heads": 64,
    "num_hidden_layers": 64, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000,
    "sliding_window": None, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "use_cache": True,
    "use_sliding_window": False, "vocab_size": 151936}
HUB_QWEN3_0_6B = dict(
    HUB_QWEN3_32B, hidden_size=1024, intermediate_size=3072,
    max_window_layers=28, num_attention_heads=16, num_hidden_layers=28,
    tie_word_embeddings=True)

# Qwen2.5-0.5B's (model_type qwen2: biases on q/k/v; the window fields are
# there but off), and the same file with 32B-Instruct's shapes and width.
HUB_QWEN2_5_0_5B = {
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151643, "hidden_act": "silu",
    "hidden_size": 896, "initializer_range": 0.02,
    "intermediate_size": 4864, "max_position_embeddings": 32768,
    "max_window_layers": 24, "model_type": "qwen2",
    "num_attention_heads": 14, "num_hidden_layers": 24,
    "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0, "sliding_window": 32768,
    "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    "use_cache": True, "use_mrope": False, "use_sliding_window": False,
    "vocab_size": 151936}
HUB_QWEN2_5_32B = dict(
    HUB_QWEN2_5_0_5B, hidden_size=5120, intermediate_size=27648,
    num_attention_heads=40, num_hidden_layers=64, num_key_value_heads=8,
    tie_word_embeddings=False, vocab_size=152064, eos_token_id=151645)
del HUB_QWEN2_5_32B["max_window_layers"]

@pytest.mark.parametrize("fields,name", [
    (HUB_LLAMA_1B, "llama3_2_1b"), (HUB_LLAMA_8B, "llama3_1_8b"),
    (HUB_QWEN3_0_6B, "qwen3_0_6b"), (HUB_QWEN3_32B, "qwen3_32b"),
    (HUB_QWEN2_5_0_5B, "qwen2_5_0_5b"), (HUB_QWEN2_5_32B, "qwen2_5_32b")])
def test_hub_configs_read_as_the_registry_sizes(fields, name):
  """The Hub's config files read as the registry's configs: rotary base and
  Llama 3's scaling, head width, tied or untied output layer, QK-norm or
  Qwen 2.5's biases."""
  assert hf_llama.llama_config_from_hf(fields) == registry.get_config(name)


@pytest.mark.parametrize("change,field", [
    ({"attention_bias": True}, "attention_bias"),
    ({"mlp_bias": True}, "mlp_bias"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "'yarn'"),
    ({"model_type": "qwen3", "use_sliding_window": True},
     "use_sliding_window"),
    ({"model_type": "qwen3", "layer_types": ["sliding_attention"] * 16},
     "'sliding_attention'")])
def test_variants_the_layout_does_not_run_are_refused(change, field):
  """Biases, another activation or rotary scheme, sliding windows: an
  UnsupportedCheckpointError naming the field, not a wrong model."""
  with pytest.raises(checkpoints.UnsupportedCheckpointError, match=field):
    hf_llama.llama_config_from_hf(dict(HUB_LLAMA_1B, **change))


@pytest.fixture(scope="module")
def hub_llama(tmp_path_factory):
  """hf_llama_target as the Hub holds Llama 3 (transformers 4's config,
  sharded), with the llama3 tokenizer."""
  return hf_layouts.llama_as_on_the_hub(
      LLAMA, tmp_path_factory.mktemp("hub") / "llama", BPE["llama3"])


def test_a_llama_as_the_hub_holds_it_loads_with_its_tokenizer(hub_llama):
  """transformers 4's rope_scaling and sharded safetensors load the same
  config and parameters as the transformers 5 directory; tokenizer.json
  beside them is the vocabulary, its stop ids generation_config.json's."""
  model = sd.load_model(f"hf:{hub_llama}")
  expected = sd.load_model(f"hf:{LLAMA}")
  assert model.config == expected.config
  _same_params(model.params, expected.params)
  assert expected.vocab is None  # no tokenizer.json there
  assert isinstance(model.vocab, tokens.BpeVocabulary)
  assert model.vocab.stop_ids == (401, 404)  # <|end_of_text|>, <|eot_id|>


def test_decoders_stop_at_the_tokenizers_stop_ids():
  """A decoder told no stop ids stops at the target vocabulary's own
  (generation_config.json's), not at id 1 (a piece of these tokenizers);
  a model without a tokenizer keeps EOS (1); ids given win."""
  vocab = hf_llama.read_vocabulary(BPE["llama3"])
  definition = registry.make_def(registry.get_config(
      "llama3_tiny", vocab_size=vocab.vocab_size))
  params = definition.init_params(jax.random.PRNGKey(0))
  target, bare = sd.Model(definition, params, vocab), sd.Model(definition,
                                                               params)
  decoder = sd.SpeculativeDecoder(target, bare, gamma=2, max_decode_len=4)
  assert decoder.stop_ids == (401, 404) == vocab.stop_ids
  assert sd.SpeculativeDecoder(bare, bare, gamma=2,
                               max_decode_len=4).stop_ids == (1,)
  assert decoder.replace(stop_ids=(7,)).stop_ids == (7,)


def test_save_llama_round_trip(hub_llama, tmp_path):
  """save_hf then load_model gives back the config, the exact parameters
  and the tokenizer files; an existing checkpoint is not overwritten."""
  model = sd.load_model(f"hf:{hub_llama}")
  checkpoints.save_hf(model, str(tmp_path / "out"))
  back = sd.load_model(f"hf:{tmp_path / 'out'}")
  assert back.config == model.config
  _same_params(back.params, model.params)
  assert back.vocab == model.vocab
  assert json.loads((tmp_path / "out" / "config.json").read_text())[
      "model_type"] == "llama"
  with pytest.raises(FileExistsError, match="overwrite=True"):
    checkpoints.save_hf(model, str(tmp_path / "out"))


def test_our_format_round_trip(hub_llama, tmp_path):
  """`checkpoints.convert` writes our orbax format (family "llama") with
  the checkpoint's tokenizer.json and its companions beside the weights;
  it reads back into the same config, parameters and vocabulary (pieces,
  stop ids, chat template), and a run's pre-flight check reads the same
  tokenizer fingerprint from it as from the Hugging Face directory. A
  tokenizer.json given as `vocab=` brings the files beside it."""
  out = checkpoints.convert(f"hf:{hub_llama}", str(tmp_path / "ours"))
  manifest = json.loads((tmp_path / "ours" / "config.json").read_text())
  assert (manifest["family"], manifest["vocab"]) == ("llama",
                                                     tokens.TOKENIZER_FILE)
  back = sd.load_model(out)
  expected = sd.load_model(f"hf:{hub_llama}")
  assert back.config == expected.config
  _same_params(back.params, expected.params)
  assert back.vocab == expected.vocab  # every file, byte for byte
  assert back.vocab.stop_ids == (401, 404)
  assert set(back.vocab.files()) == set(expected.vocab.files()) == {
      n for n in tokens.BPE_FILES if os.path.exists(os.path.join(hub_llama, n))}
  assert checkpoints.vocabulary_of(out) == checkpoints.vocabulary_of(
      f"hf:{hub_llama}")
  again = checkpoints.save(back.params, str(tmp_path / "again"),
                           config=back.config,
                           vocab=os.path.join(hub_llama, tokens.TOKENIZER_FILE))
  assert sd.load_model(again).vocab == expected.vocab


def test_bfloat16_parameters():
  """param_dtype='bfloat16' keeps the checkpoint's bfloat16 values."""
  config, params = hf_llama.load_llama(QWEN3_DRAFT, dtype="bfloat16",
                                       param_dtype="bfloat16")
  assert config.dtype == "bfloat16" and config.tie_embeddings
  assert {x.dtype for x in jax.tree.leaves(params)} == {jnp.dtype("bfloat16")}


def test_an_untied_checkpoint_without_its_output_layer_is_refused(tmp_path):
  """tie_word_embeddings false and no lm_head.weight: the missing tensor is
  named (transformers would start it at random)."""
  from safetensors.numpy import load_file, save_file  # pylint: disable=g-import-not-at-top
  path = tmp_path / "headless"
  shutil.copytree(LLAMA, path)
  tensors = load_file(str(path / "model.safetensors"))
  del tensors["lm_head.weight"]
  save_file(tensors, str(path / "model.safetensors"))
  with pytest.raises(checkpoints.MissingParameterError,
                     match="lm_head.weight"):
    sd.load_model(f"hf:{path}")


@pytest.mark.parametrize("family", ["llama3", "qwen3"])
def test_tokenizer_json_reads_as_autotokenizer(family):
  """Ids with and without special tokens, decoded text with and without
  them, BOS (Llama 3's, none for Qwen), EOS, the size, and a chat prompt's
  ids (special tokens in the text become their ids) all equal
  transformers'; the stop ids are generation_config.json's, the chat
  template tokenizer_config.json's."""
  vocab = hf_llama.read_vocabulary(BPE[family])
  with open(os.path.join(BPE[family], "reference.json")) as f:
    ref = json.load(f)
  assert vocab.vocab_size == ref["vocab_size"]
  assert vocab.eos_id == ref["eos_id"]
  assert vocab.bos_id == (-1 if ref["bos_id"] is None else ref["bos_id"])
  bos = [vocab.bos_id] if vocab.bos_id >= 0 else []
  for row in ref["texts"]:
    assert vocab.encode(row["text"]) == row["ids"], row["text"]
    assert bos + vocab.encode(row["text"]) == row["ids_with_special"]
    assert vocab.decode(row["ids_with_special"]) == row["decoded"]
    assert vocab.decode(row["ids_with_special"],
                        skip_special_tokens=True) == row["decoded_skip"]
  assert vocab.encode(ref["chat"]) == ref["chat_ids"]
  with open(os.path.join(BPE[family], "generation_config.json")) as f:
    assert vocab.stop_ids == tuple(json.load(f)["eos_token_id"])
  with open(os.path.join(BPE[family], "tokenizer_config.json")) as f:
    assert vocab.chat_template == json.load(f)["chat_template"]
  # decode stops before EOS, as the SentencePiece vocabulary's does
  ids = ref["texts"][0]["ids"]
  assert vocab.decode(ids + [vocab.eos_id] + ids) == vocab.decode(ids)


def _with_tokenizer(source, tokenizer, path):
  shutil.copytree(source, path)
  for name in ("tokenizer.json", "tokenizer_config.json",
               "generation_config.json"):
    shutil.copy(os.path.join(tokenizer, name), path / name)
  return f"hf:{path}"


def test_a_draft_with_another_tokenizer_is_refused(tmp_path):
  """A Qwen 3 draft carrying another tokenizer.json than its target's is
  refused naming both sizes: by the decoder before compiling, by a run
  before any weights are read (the same tokenizer passes on to them)."""
  target = _with_tokenizer(QWEN3, BPE["qwen3"], tmp_path / "target")
  draft = _with_tokenizer(QWEN3_DRAFT, BPE["qwen3"], tmp_path / "draft")
  other = _with_tokenizer(QWEN3_DRAFT, BPE["llama3"], tmp_path / "other")
  ids = np.array([[3, 5, 6, 7]], np.int32)
  before = engine.build_speculative.cache_info().misses
  with pytest.raises(ValueError, match=r"different vocabularies \(target 48 "
                     r"ids, draft 40\)"):
    # stop ids given: the tiny models' 48 ids hold none of the tokenizer's
    sd.speculative_generate(sd.load_model(target), sd.load_model(other), ids,
                            gamma=2, max_decode_len=4, stop_ids=(1,))
  assert engine.build_speculative.cache_info().misses == before
  with pytest.raises(ConfigError, match=r"\(40 ids\) and target .* \(48 ids\) "
                     "carry different vocabularies"):
    loading.check_draft_vocabularies(ExperimentConfig(target=target,
                                                      draft=other))
  loading.check_draft_vocabularies(ExperimentConfig(target=target,
                                                    draft=draft))


# --- Live, with the hf extra (torch and transformers). ---


@pytest.mark.parametrize("name,options", [
    ("llama3_tiny", {}), ("qwen3_tiny", {}),
    ("qwen3_tiny", {"qk_norm": False, "qkv_bias": True})])
def test_live_against_transformers(name, options, tmp_path):
  """transformers reads our export of a random registry config (Llama 3's
  scaled rotary and an untied head; Qwen 3's QK-norm and a tied one; Qwen
  2's biases, drawn at random) and gives our logits and greedy output; we
  read its save_pretrained back."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  definition = registry.make_def(registry.get_config(name, **options))
  params = definition.init_params(jax.random.PRNGKey(3))
  noise = np.random.default_rng(0)
  params = jax.tree_util.tree_map_with_path(
      lambda path, x: x + noise.normal(size=x.shape).astype(x.dtype)
      if path[-1].key == "bias" else x, params)
  ours = sd.Model(definition, params)
  hf_llama.save_llama(ours, str(tmp_path / "ours"))
  reference = transformers.AutoModelForCausalLM.from_pretrained(
      str(tmp_path / "ours"), dtype=torch.float32).eval()
  ids = np.array([[2, 5, 6, 7, 8, 9, 10, 11, 12, 13]], np.int32)
  with torch.no_grad():
    expected = reference(torch.tensor(ids).long()).logits.numpy()
    generated = reference.generate(torch.tensor(ids).long(),
                                   max_new_tokens=10, do_sample=False,
                                   eos_token_id=1, pad_token_id=0)
  np.testing.assert_allclose(definition.forward(params, ids), expected,
                             atol=1e-4)
  tokens_ = sd.generate(ours, ids, max_decode_len=10).tokens
  new = generated.numpy()[:, ids.shape[1]:]
  np.testing.assert_array_equal(tokens_[:, :new.shape[1]], new)
  reference.save_pretrained(str(tmp_path / "theirs"))
  back = sd.load_model(f"hf:{tmp_path / 'theirs'}")
  _same_params(back.params, params)
