r"""Writes two tiny random HF Gemma 3 checkpoints and HF's outputs on them.

Needs torch and transformers (`pip install -e '.[hf]'`; made with torch
2.13.0+cpu and transformers 5.24.0):

  python scripts/make_hf_gemma3_fixtures.py --out_dir=tests/testdata

Writes tests/testdata/hf_gemma3_{target,draft}: config.json and
model.safetensors as `save_pretrained` writes a `Gemma3ForCausalLM`
(bfloat16 weights: `from_pretrained` and `load_model` both read them as
float32), plus reference.npz with HF's logits over whole sequences and its
greedy `generate` output on two prompts. The target has vocabulary 48, the
draft 40 (a narrower vocabulary over the same first ids, as Gemma 3 1B's
262144 beside 27B's 262208). Both mix local and global layers (the last
one local) with a sliding window of 4, scale the global layers' rotary
linearly (x8), and scale attention by query_pre_attn_scalar 12, not
head_dim 8. The prompts (12 and 7 tokens, BOS first) and the 16 generated
tokens all run past the window.
"""

import os

from absl import app
from absl import flags
import numpy as np
import torch
import transformers

_OUT_DIR = flags.DEFINE_string("out_dir", "tests/testdata", "Output folder.")
_SEED = flags.DEFINE_integer("seed", 2, "Seed of weights and inputs.")

WINDOW, MAX_NEW = 4, 16
PAD, EOS, BOS = 0, 1, 2
LOCAL, GLOBAL = "sliding_attention", "full_attention"
PROMPT_LENGTHS = (12, 7)
PROMPT_VOCAB = 40  # prompts use ids both models have


def _config(draft: bool) -> transformers.Gemma3TextConfig:
  if draft:
    size = dict(vocab_size=40, hidden_size=16, intermediate_size=32,
                num_attention_heads=2, num_key_value_heads=1,
                layer_types=[LOCAL, GLOBAL, LOCAL])
  else:
    size = dict(vocab_size=48, hidden_size=32, intermediate_size=64,
                num_attention_heads=4, num_key_value_heads=2,
                layer_types=[LOCAL, LOCAL, GLOBAL, LOCAL])
  return transformers.Gemma3TextConfig(
      num_hidden_layers=len(size["layer_types"]), head_dim=8,
      query_pre_attn_scalar=12, sliding_window=WINDOW,
      rope_parameters={
          GLOBAL: {"rope_type": "linear", "factor": 8.0,
                   "rope_theta": 1_000_000.0},
          LOCAL: {"rope_type": "default", "rope_theta": 10_000.0}},
      max_position_embeddings=64, rms_norm_eps=1e-6,
      bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD,
      tie_word_embeddings=True, **size)


def _model(draft: bool) -> transformers.Gemma3ForCausalLM:
  model = transformers.Gemma3ForCausalLM(_config(draft))
  # HF's init (std 0.02) gives near-uniform logits and greedy ties: unit-
  # variance weights instead; loud sub-layers (post-norm gains near 12: the
  # residual stream starts as the embedding times sqrt(d), which a tied
  # output layer would otherwise just echo back), sharp attention (QK-norm
  # gains near 5; near 1, every key of the window weighs alike and greedy
  # output repeats one token), a quiet final norm, and quiet PAD and EOS
  # rows so that outputs run past the window.
  with torch.no_grad():
    for name, weight in model.named_parameters():
      if "norm" in name:
        weight.copy_(0.3 * torch.randn_like(weight))
        if ".post_" in name:
          weight.add_(11.0)
        elif "q_norm" in name or "k_norm" in name:
          weight.add_(4.0)
        elif name == "model.norm.weight":
          weight.mul_(0.2).sub_(0.7)
      elif "embed_tokens" in name:
        weight.copy_(torch.randn_like(weight))
      else:
        weight.copy_(torch.randn_like(weight) * 1.5 / weight.shape[1]**0.5)
    model.model.embed_tokens.weight[[PAD, EOS]] *= 0.2
  return model.to(torch.bfloat16).eval()


def _prompts(rng: np.random.Generator) -> np.ndarray:
  """int [2, 12]: BOS, then random ids, 0-padded on the right."""
  prompts = np.zeros((len(PROMPT_LENGTHS), max(PROMPT_LENGTHS)), np.int64)
  for row, length in enumerate(PROMPT_LENGTHS):
    prompts[row, 0] = BOS
    prompts[row, 1:length] = rng.integers(3, PROMPT_VOCAB, length - 1)
  return prompts


def _reference(path: str, prompts: np.ndarray) -> dict:
  """HF's own outputs on the checkpoint as `from_pretrained` reads it: each
  row alone (no padding), greedy continuation, then the logits over the
  whole sequence (prompt + continuation), 0-padded on the right."""
  model = transformers.Gemma3ForCausalLM.from_pretrained(
      path, dtype=torch.float32).eval()
  lengths = (prompts != PAD).sum(1)
  width = prompts.shape[1] + MAX_NEW
  vocab = model.config.vocab_size
  sequences = np.zeros((len(prompts), width), np.int32)
  generated = np.zeros((len(prompts), MAX_NEW), np.int32)
  logits = np.zeros((len(prompts), width, vocab), np.float32)
  margin = np.inf
  for row, length in enumerate(lengths):
    ids = torch.tensor(prompts[row:row + 1, :length])
    with torch.no_grad():
      out = model.generate(ids, max_new_tokens=MAX_NEW, do_sample=False,
                           num_beams=1, eos_token_id=EOS, pad_token_id=PAD)
      row_logits = model(out).logits[0]
    new = out[0, length:].numpy()
    generated[row, :len(new)] = new
    sequences[row, :out.shape[1]] = out[0].numpy()
    logits[row, :out.shape[1]] = row_logits.numpy()
    # Greedy parity is only meaningful if no step is a near tie.
    top2 = torch.topk(row_logits[length - 1:-1], 2, dim=-1).values
    margin = min(margin, (top2[:, 0] - top2[:, 1]).min().item())
  if margin < 1e-3:
    raise ValueError(f"near tie ({margin}) in {path}; try another --seed")
  return dict(prompts=prompts.astype(np.int32), sequences=sequences,
              logits=logits, generated=generated)


def main(_):
  torch.manual_seed(_SEED.value)
  prompts = _prompts(np.random.default_rng(_SEED.value))
  for draft, name in ((False, "hf_gemma3_target"), (True, "hf_gemma3_draft")):
    path = os.path.join(_OUT_DIR.value, name)
    _model(draft).save_pretrained(path)
    ref = _reference(path, prompts)
    np.savez(os.path.join(path, "reference.npz"), **ref)
    print("wrote", path, "generated:", ref["generated"].tolist())


if __name__ == "__main__":
  app.run(main)
