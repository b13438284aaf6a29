r"""Writes two tiny random HF T5Gemma checkpoints and HF's outputs on them.

Needs torch and transformers (`pip install -e '.[hf]'`; made with torch
2.13.0+cpu and transformers 5.24.0):

  python scripts/make_hf_t5gemma_fixtures.py --out_dir=tests/testdata

Writes tests/testdata/hf_t5gemma_{target,draft}: config.json and
model.safetensors as `save_pretrained` writes them (bfloat16 weights:
`from_pretrained` and `load_model` both read them as float32), plus
reference.npz with HF's encoder output, teacher-forced logits and greedy
`generate` output on fixed inputs. Vocabulary 32 (no tokenizer), sliding
window 8, inputs of up to 12 tokens and 20 generated tokens, so both the
encoder's and the decoder's windows cut. Attention and final soft-caps are
small (3 and 5) so the tanh bends, and query_pre_attn_scalar (12) is not
head_dim (8). The draft has a narrower decoder than its encoder (as 9B-2B)
and one key/value head (multi-query).
"""

import os

from absl import app
from absl import flags
import numpy as np
import torch
import transformers

_OUT_DIR = flags.DEFINE_string("out_dir", "tests/testdata", "Output folder.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of weights and inputs.")

VOCAB, WINDOW, MAX_NEW_TOKENS = 32, 8, 20
BOS, EOS, PAD = 2, 1, 0


def _stack(hidden, layers, heads, kv_heads, mlp):
  return dict(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=mlp,
              num_hidden_layers=layers, num_attention_heads=heads,
              num_key_value_heads=kv_heads, head_dim=8,
              query_pre_attn_scalar=12, sliding_window=WINDOW,
              attn_logit_softcapping=3.0, final_logit_softcapping=5.0,
              max_position_embeddings=64, rms_norm_eps=1e-6,
              bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD)


def _model(draft: bool) -> transformers.T5GemmaForConditionalGeneration:
  if draft:
    encoder, decoder = _stack(32, 2, 4, 2, 64), _stack(16, 2, 2, 1, 32)
  else:
    encoder, decoder = _stack(32, 2, 4, 2, 64), _stack(32, 2, 4, 2, 64)
  config = transformers.T5GemmaConfig(
      encoder=encoder, decoder=decoder, vocab_size=VOCAB,
      tie_word_embeddings=True, bos_token_id=BOS, eos_token_id=EOS,
      pad_token_id=PAD, decoder_start_token_id=BOS)
  model = transformers.T5GemmaForConditionalGeneration(config)
  # HF's init (std 0.02) gives near-uniform logits and greedy ties: unit-
  # variance weights instead; loud sub-layers (post-norm gains near 12: the
  # residual stream starts as the embedding times sqrt(d), which a tied
  # output layer would otherwise just echo back), a quiet final norm (the
  # soft-cap saturates otherwise), and a quiet EOS row so that outputs run
  # past the window.
  with torch.no_grad():
    for name, weight in model.named_parameters():
      if "norm" in name:
        weight.copy_(0.3 * torch.randn_like(weight))
        if ".post_" in name:
          weight.add_(11.0)
        elif name == "model.decoder.norm.weight":
          weight.mul_(0.2).sub_(0.85)
      elif "embed_tokens" in name:
        weight.copy_(torch.randn_like(weight))
      else:
        weight.copy_(torch.randn_like(weight) * 1.5 / weight.shape[1]**0.5)
    model.model.decoder.embed_tokens.weight[EOS].mul_(0.2)
  return model.to(torch.bfloat16).eval()


def _inputs(rng: np.random.Generator):
  input_ids = np.zeros((3, 12), np.int64)
  for row, length in enumerate((12, 10, 3)):
    input_ids[row, :length - 1] = rng.integers(3, VOCAB, length - 1)
    input_ids[row, length - 1] = EOS
  decoder_input_ids = rng.integers(3, VOCAB, (3, 14))
  decoder_input_ids[:, 0] = BOS  # decoder start id
  return input_ids, decoder_input_ids


def _reference(path: str, input_ids, decoder_input_ids) -> dict:
  """HF's own outputs on the checkpoint as `from_pretrained` reads it."""
  model = transformers.T5GemmaForConditionalGeneration.from_pretrained(
      path, dtype=torch.float32).eval()
  ids = torch.tensor(input_ids)
  mask = ids != PAD
  with torch.no_grad():
    out = model(input_ids=ids, attention_mask=mask,
                decoder_input_ids=torch.tensor(decoder_input_ids))
    generated = model.generate(
        ids, attention_mask=mask, max_new_tokens=MAX_NEW_TOKENS,
        do_sample=False, num_beams=1, decoder_start_token_id=BOS,
        eos_token_id=EOS, pad_token_id=PAD)
    # Greedy parity is only meaningful if no step is a near tie.
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
  rng = np.random.default_rng(_SEED.value)
  input_ids, decoder_input_ids = _inputs(rng)
  for draft, name in ((False, "hf_t5gemma_target"), (True, "hf_t5gemma_draft")):
    path = os.path.join(_OUT_DIR.value, name)
    _model(draft).save_pretrained(path)
    ref = _reference(path, input_ids, decoder_input_ids)
    np.savez(os.path.join(path, "reference.npz"), **ref)
    print("wrote", path, "generated lengths",
          (ref["generated"] != PAD).sum(1))


if __name__ == "__main__":
  app.run(main)
