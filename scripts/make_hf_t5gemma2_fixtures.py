r"""Writes a tiny random HF T5Gemma 2 checkpoint and HF's outputs on it.

Needs torch and transformers (`pip install -e '.[hf]'`; made with torch
2.13.0+cpu and transformers 5.24.0):

  python scripts/make_hf_t5gemma2_fixtures.py --out_dir=tests/testdata

Writes tests/testdata/hf_t5gemma2: config.json and model.safetensors as
`save_pretrained` writes them (bfloat16 weights; a one-layer vision tower
of width 8, which the text model never reads), plus reference.npz with
HF's encoder output, teacher-forced logits and greedy `generate` output on
fixed inputs. Vocabulary 48, both stacks mixing local and global layers
(window 4: the encoder's local layers see 2 keys back and 2 ahead), global
rotary scaled x8, query_pre_attn_scalar 12 (head_dim 8), a final soft-cap
of 5, and the end-of-image id moved to 30 (an input holds it) so that its
embedding is read. Inputs of up to 12 tokens, 16 generated.
"""

import os

from absl import app
from absl import flags
import numpy as np
import torch
import transformers

_OUT_DIR = flags.DEFINE_string("out_dir", "tests/testdata", "Output folder.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of weights and inputs.")

VOCAB, WINDOW, MAX_NEW, EOI = 48, 4, 16, 30
PAD, EOS, BOS = 0, 1, 2
LOCAL, GLOBAL = "sliding_attention", "full_attention"


def _text(layer_types):
  return dict(
      vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
      num_hidden_layers=len(layer_types), num_attention_heads=4,
      num_key_value_heads=2, head_dim=8, query_pre_attn_scalar=12,
      sliding_window=WINDOW, layer_types=layer_types,
      final_logit_softcapping=5.0,
      rope_parameters={
          GLOBAL: {"rope_type": "linear", "factor": 8.0,
                   "rope_theta": 1_000_000.0},
          LOCAL: {"rope_type": "default", "rope_theta": 10_000.0}},
      max_position_embeddings=64, rms_norm_eps=1e-6, bos_token_id=BOS,
      eos_token_id=EOS, pad_token_id=PAD)


def _model() -> transformers.T5Gemma2ForConditionalGeneration:
  vision = dict(model_type="siglip_vision_model", hidden_size=8,
                intermediate_size=16, num_hidden_layers=1,
                num_attention_heads=2, image_size=4, patch_size=2)
  encoder = transformers.T5Gemma2EncoderConfig(
      text_config=_text([LOCAL, LOCAL, GLOBAL]), vision_config=vision,
      mm_tokens_per_image=1, eoi_token_index=EOI)
  decoder = transformers.T5Gemma2DecoderConfig(
      **_text([LOCAL, GLOBAL, LOCAL]))
  config = transformers.T5Gemma2Config(
      encoder=encoder, decoder=decoder, tie_word_embeddings=True,
      eoi_token_index=EOI)
  model = transformers.T5Gemma2ForConditionalGeneration(config)
  # As scripts/make_hf_gemma3_fixtures.py: unit-variance weights, loud
  # sub-layers, sharp attention (QK-norm gains near 5), a quiet final norm,
  # quiet PAD and EOS rows, and an end-of-image vector of its own.
  with torch.no_grad():
    for name, weight in model.named_parameters():
      if "vision" in name or "multi_modal" in name:
        continue
      if "norm" in name:
        weight.copy_(0.3 * torch.randn_like(weight))
        if ".post_" in name:
          weight.add_(11.0)
        elif "q_norm" in name or "k_norm" in name:
          weight.add_(4.0)
        elif name.endswith("decoder.norm.weight"):
          weight.mul_(0.2).sub_(0.7)
      elif "embed_tokens" in name:
        weight.copy_(torch.randn_like(weight))
      else:
        weight.copy_(torch.randn_like(weight) * 1.5 / weight.shape[-1]**0.5)
    embedding = model.model.encoder.text_model.embed_tokens.weight
    embedding[[PAD, EOS]] *= 0.2
  return model.to(torch.bfloat16).eval()


def _inputs(rng: np.random.Generator):
  input_ids = np.zeros((3, 12), np.int64)
  for row, length in enumerate((12, 9, 4)):
    input_ids[row, :length - 1] = rng.integers(3, VOCAB, length - 1)
    input_ids[row, length - 1] = EOS
  input_ids[1, 3] = EOI
  decoder_input_ids = rng.integers(3, VOCAB, (3, 14))
  decoder_input_ids[:, 0] = BOS  # decoder start id
  return input_ids, decoder_input_ids


def _reference(path: str, input_ids, decoder_input_ids) -> dict:
  """HF's own outputs on the checkpoint as `from_pretrained` reads it."""
  model = transformers.T5Gemma2ForConditionalGeneration.from_pretrained(
      path, dtype=torch.float32).eval()
  ids = torch.tensor(input_ids)
  mask = ids != PAD
  with torch.no_grad():
    out = model(input_ids=ids, attention_mask=mask,
                decoder_input_ids=torch.tensor(decoder_input_ids))
    generated = model.generate(
        ids, attention_mask=mask, max_new_tokens=MAX_NEW, do_sample=False,
        num_beams=1, decoder_start_token_id=BOS, eos_token_id=EOS,
        pad_token_id=PAD)
    logits = model(input_ids=ids, attention_mask=mask,
                   decoder_input_ids=generated).logits
  top2 = torch.topk(logits[:, :-1], 2, dim=-1).values
  margin = (top2[..., 0] - top2[..., 1]).min().item()
  if margin < 1e-3:
    raise ValueError(f"near tie ({margin}) in {path}; try another --seed")
  return dict(input_ids=input_ids.astype(np.int32),
              decoder_input_ids=decoder_input_ids.astype(np.int32),
              encoder_hidden=out.encoder_last_hidden_state.numpy(),
              logits=out.logits.numpy(),
              generated=generated.numpy().astype(np.int32))


def main(_):
  torch.manual_seed(_SEED.value)
  input_ids, decoder_input_ids = _inputs(np.random.default_rng(_SEED.value))
  path = os.path.join(_OUT_DIR.value, "hf_t5gemma2")
  _model().save_pretrained(path)
  ref = _reference(path, input_ids, decoder_input_ids)
  np.savez(os.path.join(path, "reference.npz"), **ref)
  print("wrote", path, "generated:", ref["generated"].tolist())


if __name__ == "__main__":
  app.run(main)
