"""T5Gemma 2 (`models/t5gemma2.py`, `checkpoints/hf_t5gemma2.py`), the
text model, against transformers.

Fixture: testdata/hf_t5gemma2, written by
scripts/make_hf_t5gemma2_fixtures.py with transformers 5.24 (bfloat16
weights, a tiny vision tower the loader skips): vocabulary 48, both stacks
with local and global layers (window 4), global rotary scaled x8,
query_pre_attn_scalar 12 (head_dim 8), a final soft-cap of 5, the
end-of-image id at 30 (input row 1 holds it); inputs of 12, 9 and 4
tokens, 14 teacher-forced decoder tokens, 16 generated.

Invariants:
  - parity: encoder outputs within 1e-4 and teacher-forced logits within
    2e-3 of transformers' (measured 1.9e-5 and 5.7e-4: the fixture's loud
    sub-layers and sharp attention amplify rounding; transformers' own
    float32 logits are 1.6e-3 from its float64 ones, ours 1.1e-3); a
    control shows that the windows one key wider or narrower, or the
    end-of-image embedding ignored, miss by far more;
  - greedy `sd.generate` equals HF `generate` token for token, and
    speculative decoding with a random T5Gemma 2 draft equals it too. (The
    cache contract, chunks and rollback included, is
    tests/test_model_contract.py's, on t5gemma2_tiny.)
  - the published sizes: 270M-270M's config.json reads as the registry's
    config, and each registered size's count from shapes rounds to the
    published total (embedding shared, decoder attention merged).
"""

import dataclasses
import logging
import os

import gin
import jax
import numpy as np
import pytest

import specdec_jax as sd
from specdec_jax.checkpoints import hf_t5gemma2
from specdec_jax.data import tasks
from specdec_jax.experiments import experiment
from specdec_jax.launch import gin_flags
from specdec_jax.models import registry
from specdec_jax.models import t5gemma2
from tests import param_counts

PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "testdata",
                    "hf_t5gemma2")
MAX_NEW = 16


@pytest.fixture(scope="module")
def ref():
  return dict(np.load(os.path.join(PATH, "reference.npz")))


@pytest.fixture(scope="module")
def model():
  return sd.load_model(f"hf:{PATH}")


def _encode_and_forward(config, params, ref):
  definition = t5gemma2.T5Gemma2Def(config)
  encoded = jax.jit(definition.encode)(params, ref["input_ids"])
  logits = jax.jit(definition.forward)(params, ref["input_ids"],
                                       ref["decoder_input_ids"])
  real = ref["input_ids"] > 0
  return (np.abs(np.asarray(encoded)[real] - ref["encoder_hidden"][real]).max(),
          np.abs(np.asarray(logits) - ref["logits"]).max())


def test_the_text_model_loads_and_says_what_it_skipped(caplog):
  """The checkpoint's text model loads (its config as written: layer
  kinds, window, scaled rotary, end-of-image id); a log line counts the
  vision tensors skipped."""
  from safetensors import safe_open  # pylint: disable=g-import-not-at-top
  with safe_open(os.path.join(PATH, "model.safetensors"), "np") as f:
    vision = [n for n in f.keys()
              if "vision_tower" in n or "multi_modal_projector" in n]
  with caplog.at_level(logging.INFO):
    config, _ = hf_t5gemma2.load_t5gemma2(PATH)
  assert f"skipped the {len(vision)} tensors of the vision tower" in (
      caplog.text)
  assert (config.vocab_size, config.eoi_token_id) == (48, 30)
  assert config.encoder.layer_types == (t5gemma2.SLIDING,) * 2 + (
      "full_attention",)
  assert config.decoder.final_logit_softcapping == 5.0
  assert (config.decoder.sliding_window, config.decoder.rope_scale,
          config.decoder.query_pre_attn_scalar) == (4, 8.0, 12.0)


def test_encoder_outputs_and_logits_match_hf(model, ref):
  """Encoder outputs within 1e-4, logits within 2e-3 (see the header)."""
  encoded, logits = _encode_and_forward(model.config, model.params, ref)
  assert encoded < 1e-4 and logits < 2e-3, (encoded, logits)


@pytest.mark.parametrize("change", ["encoder_window_5", "decoder_window_3",
                                    "no_eoi_embedding"])
def test_the_fixture_exercises_windows_and_eoi(model, ref, change):
  """Control: each change (the encoder's window one key wider, the
  decoder's one narrower, the end-of-image vector ignored) moves the
  encoder outputs or the logits by more than 0.5, hundreds of times the
  tolerances above."""
  config = model.config
  if change == "no_eoi_embedding":
    config = dataclasses.replace(config, eoi_token_id=None)
  else:
    stack, window = change.rsplit("_", 2)[0], int(change[-1])
    config = dataclasses.replace(config, **{stack: dataclasses.replace(
        getattr(config, stack), sliding_window=window)})
  encoded, logits = _encode_and_forward(config, model.params, ref)
  assert max(encoded, logits) > 0.5, (encoded, logits)


def test_greedy_generation_matches_hf(model, ref):
  """`sd.generate` equals HF `generate` token for token (16 tokens)."""
  out = sd.generate(model, ref["input_ids"], max_decode_len=MAX_NEW)
  np.testing.assert_array_equal(out.tokens, ref["generated"][:, 1:])


def test_speculative_greedy_equals_target_greedy(model, ref):
  """With a random T5Gemma 2 draft (t5gemma2_tiny's layout, one layer
  fewer per stack, over the same 48 ids) as a chain of gamma 3, greedy
  speculative output equals HF's greedy output."""
  config = registry.get_config("t5gemma2_tiny", vocab_size=48,
                               eoi_token_id=30)
  config = dataclasses.replace(
      config, encoder=dataclasses.replace(
          config.encoder, num_layers=2, layer_types=None),
      decoder=dataclasses.replace(config.decoder, num_layers=2,
                                  layer_types=None))
  definition = t5gemma2.T5Gemma2Def(config)
  draft = sd.Model(definition, definition.init_params(jax.random.PRNGKey(1)))
  res = sd.speculative_generate(model, draft, ref["input_ids"], gamma=3,
                                max_decode_len=MAX_NEW)
  np.testing.assert_array_equal(res.tokens, ref["generated"][:, 1:])


def test_live_against_transformers(tmp_path):
  """A random T5Gemma 2 built by transformers in this test (its default
  layer pattern, one layer of each kind and one more local; no fixture):
  we load its save_pretrained and give its logits and its greedy output."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  torch.manual_seed(0)
  text = dict(vocab_size=64, hidden_size=32, intermediate_size=64,
              num_hidden_layers=7, num_attention_heads=4,
              num_key_value_heads=1, head_dim=8, query_pre_attn_scalar=8,
              sliding_window=3, max_position_embeddings=64)
  encoder = transformers.T5Gemma2EncoderConfig(
      text_config=text, mm_tokens_per_image=1,
      vision_config=dict(model_type="siglip_vision_model", hidden_size=8,
                         intermediate_size=16, num_hidden_layers=1,
                         num_attention_heads=2, image_size=4, patch_size=2))
  reference = transformers.T5Gemma2ForConditionalGeneration(
      transformers.T5Gemma2Config(
          encoder=encoder, decoder=transformers.T5Gemma2DecoderConfig(**text),
          tie_word_embeddings=True)).eval()
  with torch.no_grad():
    for name, weight in reference.named_parameters():
      if "norm" in name:
        weight.normal_(0.0, 0.5)
  reference.save_pretrained(str(tmp_path / "theirs"))
  ours = sd.load_model(f"hf:{tmp_path / 'theirs'}")
  ids = np.array([[5, 6, 7, 8, 9, 10, 1], [11, 12, 1, 0, 0, 0, 0]], np.int32)
  decoder = np.array([[2, 13, 14, 15, 16, 17]] * 2, np.int32)
  with torch.no_grad():
    expected = reference(input_ids=torch.tensor(ids).long(),
                         attention_mask=torch.tensor(ids != 0),
                         decoder_input_ids=torch.tensor(decoder).long())
    generated = reference.generate(
        torch.tensor(ids).long(), attention_mask=torch.tensor(ids != 0),
        max_new_tokens=8, do_sample=False, decoder_start_token_id=2,
        eos_token_id=1, pad_token_id=0)
  np.testing.assert_allclose(ours.definition.forward(ours.params, ids,
                                                     decoder),
                             expected.logits.numpy(), atol=1e-4)
  tokens = sd.generate(ours, ids, max_decode_len=8).tokens
  width = generated.shape[1] - 1
  np.testing.assert_array_equal(tokens[:, :width], generated.numpy()[:, 1:])


# google/t5gemma-2-270m-270m's config.json (transformers 5), the fields
# that make the text model: the vision tower's are left out.
_HUB_STACK = {
    "attention_bias": False, "attn_logit_softcapping": None,
    "final_logit_softcapping": None, "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 640,
    "intermediate_size": 2048,
    "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 3,
    "max_position_embeddings": 32768, "num_attention_heads": 4,
    "num_hidden_layers": 18, "num_key_value_heads": 1,
    "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06,
    "rope_parameters": {
        "full_attention": {"factor": 8.0, "rope_theta": 1000000,
                           "rope_type": "linear"},
        "sliding_attention": {"rope_theta": 10000, "rope_type": "default"}},
    "sliding_window": 512, "use_bidirectional_attention": False,
    "vocab_size": 262144}
HUB_270M_270M = {
    "architectures": ["T5Gemma2ForConditionalGeneration"],
    "model_type": "t5gemma2", "bos_token_id": 2, "eos_token_id": 1,
    "pad_token_id": 0, "eoi_token_index": 256000, "image_token_index": 256001,
    "is_encoder_decoder": True, "vocab_size": 262144,
    "decoder": dict(_HUB_STACK, model_type="t5gemma2_decoder"),
    "encoder": {"model_type": "t5gemma2_encoder", "eoi_token_index": 256000,
                "text_config": dict(_HUB_STACK, model_type="t5gemma2_text",
                                    tie_word_embeddings=True)}}


def test_the_hub_config_reads_as_the_registry_size():
  """The published 270M-270M config.json reads as 't5gemma2_270m_270m':
  Gemma 3 270M's stacks, but with the global rotary scaled x8."""
  config = hf_t5gemma2.t5gemma2_config_from_hf(HUB_270M_270M)
  assert config == registry.get_config("t5gemma2_270m_270m")
  assert config.encoder.rope_scale == 8.0
  assert registry.get_config("gemma3_270m").rope_scale == 1.0


# The totals T5Gemma 2's announcement and model cards give, the vision
# encoder (417M) left out: "~370M", "~1.7B", "~7B".
GEMMA3_OF = {"t5gemma2_270m_270m": "gemma3_270m",
             "t5gemma2_1b_1b": "gemma3_1b", "t5gemma2_4b_4b": "gemma3_4b"}


@pytest.mark.parametrize("name,billions", [
    ("t5gemma2_270m_270m", "0.37"), ("t5gemma2_1b_1b", "1.7"),
    ("t5gemma2_4b_4b", "7")])
def test_registry_sizes_match_published_parameter_counts(name, billions):
  """One embedding shared by encoder, decoder and output, and merged
  decoder attention (no cross-attention weights): a published size's
  count is the embedding plus twice its Gemma 3 stack, which rounds to the
  published total."""
  config = registry.get_config(name)
  # Counts from shapes at one and two layers a stack
  # (`param_counts.from_two_depths`).
  count = param_counts.from_two_depths(config, ("encoder", "decoder"))
  digits = len(billions.split(".")[1]) if "." in billions else 0
  assert f"{count / 1e9:.{digits}f}" == billions, count
  # The embedding, the end-of-image vector, and twice a Gemma 3 model of
  # the size without its embedding (its layers and final norm).
  gemma3 = dataclasses.replace(registry.get_config(GEMMA3_OF[name]),
                               vocab_size=config.vocab_size)
  embedding = config.vocab_size * config.encoder.emb_dim
  layers = param_counts.from_two_depths(gemma3) - embedding
  assert count == embedding + config.encoder.emb_dim + 2 * layers


@pytest.mark.parametrize("row,task,draft,gamma", [
    ("ende_270m_270m_t0", "wmt14_ende", "t5gemma2_270m_270m", 5),
    ("cnndm_1b_1b_t1", "cnn_dailymail", "t5gemma2_1b_1b", 2)])
def test_rows_bind_the_published_sizes(row, task, draft, gamma):
  """A row of configs/experiments/t5gemma2/ names the 4B-4B target and its
  draft by registered architecture, Gemma 3's tokenizer with BOS and no
  sentinels, and stops at EOS; its temperature is its file name's."""
  try:
    gin_flags.parse([f"experiments/t5gemma2/{row}.gin"], [],
                    extra_search_paths=[])
    config = gin.get_configurable(experiment.ExperimentConfig)()
    settings = tasks.current_config()
  finally:
    gin.clear_config()
  assert (config.task, tuple(config.stop_ids), config.gamma) == (
      task, (1,), gamma)
  assert (config.target_config, config.draft_config) == ("t5gemma2_4b_4b",
                                                         draft)
  assert (settings.vocab_extra_ids, settings.inputs_bos) == (0, True)
  assert config.temperature == float(row[-1])
  target, small = (registry.get_config(n) for n in (config.target_config,
                                                    config.draft_config))
  assert small.vocab_size == target.vocab_size
