"""Gemma 3 checkpoints (`checkpoints/hf_gemma3.py`) and vocabulary widths
(`decoding/widths.py`).

Invariants:
  - every published size has, from shapes, the published parameter count
    (keras-hub's, which counts 262144 embedding rows: the 4B-27B
    checkpoints hold 64 more, image tokens);
  - the Hub's own config.json files read as the registry's sizes;
  - a Gemma 3 as the Hub holds 4B-27B (multimodal, sharded, the text model
    under `language_model.model.`) loads its text model exactly, and says
    it skipped the vision tower;
  - export (`save_gemma3`) is the exact inverse of the loader; our format
    round-trips; tokenizer.model next to the weights is the vocabulary;
  - a draft narrower than the target is widened with q exactly 0 on the
    ids it lacks; a wider one, or one with another tokenizer, is refused
    naming both sizes: by the decoder before compiling, by a run before
    any weights are read;
  - with the `hf` extra, transformers reads what we write and we read what
    it writes, logits and greedy output equal (live, skipped without
    torch).
"""

import json
import logging
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specdec_jax as sd
from specdec_jax import checkpoints
from specdec_jax import sampling
from specdec_jax.checkpoints import hf_gemma3
from specdec_jax.decoding import engine
from specdec_jax.decoding import widths
from specdec_jax.experiments import loading
from specdec_jax.experiments.experiment_config import ConfigError
from specdec_jax.experiments.experiment_config import ExperimentConfig
from specdec_jax.models import gemma3
from specdec_jax.models import registry
from tests import hf_layouts
from tests import param_counts

TESTDATA = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                        "testdata")
TARGET = os.path.join(TESTDATA, "hf_gemma3_target")
DRAFT = os.path.join(TESTDATA, "hf_gemma3_draft")


@pytest.fixture(scope="module")
def models():
  return {"target": sd.load_model(f"hf:{TARGET}"),
          "draft": sd.load_model(f"hf:{DRAFT}")}


def _same_params(a, b):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


# keras-hub's `params` of each text preset (keras_hub/src/models/gemma3/
# gemma3_presets.py), which counts 262144 embedding rows.
@pytest.mark.parametrize("name,count", [
    ("gemma3_270m", 268_098_176), ("gemma3_1b", 999_885_952),
    ("gemma3_4b", 3_880_099_328), ("gemma3_12b", 11_765_788_416),
    ("gemma3_27b", 27_009_002_240)])
def test_registry_sizes_match_published_parameter_counts(name, count):
  """Every registered size has its published parameter count, once the 64
  image-token rows of the 4B-27B embeddings are set aside."""
  config = registry.get_config(name)
  # From its shapes at one and two layers
  # (`param_counts.from_two_depths`).
  total = param_counts.from_two_depths(config)
  extra = config.vocab_size - registry.GEMMA3_VOCAB
  assert extra == (64 if name not in ("gemma3_270m", "gemma3_1b") else 0)
  assert total - extra * config.emb_dim == count


# What the Hub's config.json files set (transformers 4 wrote them); the
# multimodal ones leave every other text field to Gemma3TextConfig's
# defaults.
HUB_1B = {
    "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
    "attention_bias": False, "attn_logit_softcapping": None,
    "final_logit_softcapping": None, "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 1152,
    "intermediate_size": 6912, "max_position_embeddings": 32768,
    "num_attention_heads": 4, "num_hidden_layers": 26,
    "num_key_value_heads": 1, "query_pre_attn_scalar": 256,
    "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000,
    "rope_scaling": None, "rope_theta": 1000000, "sliding_window": 512,
    "sliding_window_pattern": 6, "vocab_size": 262144}
HUB_27B = {
    "architectures": ["Gemma3ForConditionalGeneration"],
    "model_type": "gemma3",
    "text_config": {
        "head_dim": 128, "hidden_size": 5376, "intermediate_size": 21504,
        "model_type": "gemma3_text", "num_attention_heads": 32,
        "num_hidden_layers": 62, "num_key_value_heads": 16,
        "query_pre_attn_scalar": 168,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "sliding_window": 1024},
    "vision_config": {"model_type": "siglip_vision_model"}}


@pytest.mark.parametrize("fields,name", [(HUB_1B, "gemma3_1b"),
                                         (HUB_27B, "gemma3_27b")])
def test_hub_configs_read_as_the_registry_sizes(fields, name):
  """The Hub's 1B (gemma3_text) and 27B (gemma3, its text_config) config
  files read as the registry's configs: layer pattern, rotary bases and
  scaling, windows and vocabularies included."""
  assert hf_gemma3.gemma3_config_from_hf(fields) == registry.get_config(name)


def test_a_gemma3_as_the_hub_holds_it_loads_its_text_model(models, tmp_path,
                                                           caplog):
  """model_type gemma3, sharded, the text model under
  `language_model.model.` and a vision tower beside it: the text model
  loads exactly, and a log line says the vision tower was skipped."""
  local = hf_layouts.gemma3_as_on_the_hub(TARGET, tmp_path / "hub")
  with caplog.at_level(logging.INFO):
    model = sd.load_model(f"hf:{local}")
  assert model.config == models["target"].config
  _same_params(model.params, models["target"].params)
  assert "skipped the 2 tensors of the vision tower" in caplog.text


def test_save_gemma3_round_trip(models, tmp_path):
  """save_gemma3 then load_gemma3 gives back the config and the exact
  parameters (bfloat16 as float32 both ways: the fixtures' values)."""
  model = models["draft"]
  hf_gemma3.save_gemma3(model, str(tmp_path / "out"))
  config, params = hf_gemma3.load_gemma3(str(tmp_path / "out"))
  assert config == model.config
  _same_params(params, model.params)
  with pytest.raises(FileExistsError, match="overwrite=True"):
    checkpoints.save_hf(model, str(tmp_path / "out"))


def test_bfloat16_parameters():
  """param_dtype='bfloat16' keeps the checkpoint's bfloat16 values."""
  config, params = hf_gemma3.load_gemma3(DRAFT, dtype="bfloat16",
                                         param_dtype="bfloat16")
  assert config.dtype == "bfloat16"
  assert {x.dtype for x in jax.tree.leaves(params)} == {jnp.dtype("bfloat16")}


def test_untied_output_layer_is_refused(tmp_path):
  """An lm_head that differs from the embedding is named, not dropped."""
  from safetensors.numpy import load_file, save_file  # pylint: disable=g-import-not-at-top
  path = tmp_path / "untied"
  shutil.copytree(DRAFT, path)
  tensors = load_file(str(path / "model.safetensors"))
  tensors["lm_head.weight"] = np.ones((40, 16), np.float32)
  save_file(tensors, str(path / "model.safetensors"))
  with pytest.raises(checkpoints.UnsupportedCheckpointError,
                     match="lm_head.weight differs"):
    sd.load_model(f"hf:{path}")


def test_tokenizer_model_and_our_format(models, gemma_vocab, tmp_path):
  """A tokenizer.model next to the weights is the Model's vocabulary
  (SentencePiece, Gemma's special ids); `checkpoints.convert` writes our
  format with it, which reads back into the same Gemma 3."""
  path = tmp_path / "with_tokenizer"
  shutil.copytree(DRAFT, path)
  shutil.copy(gemma_vocab, path / hf_gemma3.TOKENIZER_FILE)
  model = sd.load_model(f"hf:{path}")
  assert model.vocab.decode(model.vocab.encode("a house")) == "a house"
  out = checkpoints.convert(f"hf:{path}", str(tmp_path / "ours"))
  manifest = json.loads((tmp_path / "ours" / "config.json").read_text())
  assert manifest["family"] == "gemma3"
  back = sd.load_model(out)
  assert back.config == models["draft"].config
  assert back.vocab is not None
  _same_params(back.params, models["draft"].params)


def test_a_narrow_draft_proposes_none_of_the_ids_it_lacks(models):
  """Widened to the target's 48 ids, the draft's logits end in PAD_LOGIT,
  so q is exactly 0 on ids 40-47 at T=1 and with top-p; ids it lacks are
  read as FILL_ID (two rows alike but for those ids, written as they are
  and as FILL_ID, get the same logits)."""
  draft = models["draft"]
  wide = widths.widen(draft.definition, 48)
  assert isinstance(wide, widths.WidenedDef) and wide.vocab_size == 48
  assert widths.widen(models["target"].definition, 48) is (
      models["target"].definition)
  prompts = np.array([[2, 5, 6, 44], [2, 5, 6, widths.FILL_ID]], np.int32)
  pre = jax.jit(wide.prefill, static_argnums=2)(draft.params, prompts, 4)
  np.testing.assert_array_equal(pre.start_pos, [3, 3])
  tokens = np.array([[41, 45], [widths.FILL_ID] * 2], np.int32)
  logits, _ = jax.jit(wide.extend)(draft.params, pre.cache, tokens,
                                   pre.start_pos[:, None] + 1 + np.arange(2))
  assert logits.shape == (2, 2, 48)
  np.testing.assert_array_equal(logits[..., 40:], widths.PAD_LOGIT)
  np.testing.assert_array_equal(logits[0], logits[1])
  for setting in ({"temperature": 1.0}, {"temperature": 1.0, "top_p": 0.8}):
    q = sampling.SamplingConfig(**setting).probs(logits)
    assert float(jnp.max(q[..., 40:])) == 0.0
    np.testing.assert_allclose(q.sum(-1), 1.0, rtol=1e-6)


def test_a_wider_draft_or_another_tokenizer_is_refused_before_compiling(
    models, gemma_vocab, tiny_vocab):
  """The target as the draft of its narrower draft names both sizes; a
  narrower draft carrying another SentencePiece model is refused naming
  both sizes too; neither builds a loop."""
  target, draft = models["target"], models["draft"]
  ids = np.array([[2, 5, 6, 7]], np.int32)
  before = engine.build_speculative.cache_info().misses
  with pytest.raises(ValueError, match=r"the draft's vocabulary \(48 ids\) "
                     r"is wider than the target's \(40\)"):
    sd.speculative_generate(draft, target, ids, gamma=2, max_decode_len=4)
  vocab = lambda m, path: sd.Model(m.definition, m.params,
                                   checkpoints.native._make_vocab(path))  # pylint: disable=protected-access
  with pytest.raises(ValueError, match=r"different vocabularies \(target 48 "
                     r"ids, draft 40\)"):
    sd.speculative_generate(vocab(target, gemma_vocab),
                            vocab(draft, tiny_vocab), ids, gamma=2,
                            max_decode_len=4)
  assert engine.build_speculative.cache_info().misses == before


def test_a_run_refuses_them_before_reading_weights(gemma_vocab, tiny_vocab,
                                                   tmp_path):
  """A run's draft wider than its target, or with another tokenizer, is a
  ConfigError naming both sizes while the weights are still unread (here
  there are none: only config.json and tokenizer.model)."""
  def header(source, name, tokenizer):
    path = tmp_path / name
    path.mkdir()
    shutil.copy(os.path.join(source, "config.json"), path)
    shutil.copy(tokenizer, path / hf_gemma3.TOKENIZER_FILE)
    return f"hf:{path}"
  target = header(TARGET, "target", gemma_vocab)
  draft = header(DRAFT, "draft", gemma_vocab)
  other = header(DRAFT, "other", tiny_vocab)
  with pytest.raises(ConfigError, match=r"draft 'hf:.*/target''s vocabulary "
                     r"\(48 ids\) is wider than the target's \(40\)"):
    loading.load_models(ExperimentConfig(target=draft, draft=target))
  with pytest.raises(ConfigError, match=r"\(40 ids\) and target .* \(48 ids\) "
                     "carry different vocabularies"):
    loading.load_models(ExperimentConfig(target=target, draft=other))
  with pytest.raises(checkpoints.CheckpointNotFoundError,
                     match="no weights"):  # same tokenizer: on to the weights
    loading.load_models(ExperimentConfig(target=target, draft=draft))


# --- Live, with the hf extra (torch and transformers). ---


def test_live_against_transformers(tmp_path):
  """transformers reads our export of a random registry config and gives
  our logits and our greedy output; we read its save_pretrained back."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  definition = registry.make_def(registry.get_config("gemma3_tiny"))
  params = definition.init_params(jax.random.PRNGKey(3))
  ours = sd.Model(definition, params)
  hf_gemma3.save_gemma3(ours, str(tmp_path / "ours"))
  reference = transformers.Gemma3ForCausalLM.from_pretrained(
      str(tmp_path / "ours"), dtype=torch.float32).eval()
  ids = np.array([[2, 5, 6, 7, 8, 9, 10, 11, 12, 13]], np.int32)
  with torch.no_grad():
    expected = reference(torch.tensor(ids).long()).logits.numpy()
    generated = reference.generate(torch.tensor(ids).long(),
                                   max_new_tokens=10, do_sample=False,
                                   eos_token_id=gemma3.EOS_ID,
                                   pad_token_id=gemma3.PAD_ID)
  np.testing.assert_allclose(definition.forward(params, ids), expected,
                             atol=1e-4)
  tokens = sd.generate(ours, ids, max_decode_len=10).tokens
  new = generated.numpy()[:, ids.shape[1]:]
  np.testing.assert_array_equal(tokens[:, :new.shape[1]], new)
  reference.save_pretrained(str(tmp_path / "theirs"))
  back = sd.load_model(f"hf:{tmp_path / 'theirs'}")
  _same_params(back.params, params)
