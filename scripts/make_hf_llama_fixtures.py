r"""Writes tiny random HF Llama and Qwen 3 checkpoints and HF's outputs.

Needs torch and transformers (`pip install -e '.[hf]'`; made with torch
2.13.0+cpu and transformers 5.24.0):

  python scripts/make_hf_llama_fixtures.py --out_dir=tests/testdata

Writes tests/testdata/hf_{llama,qwen3,qwen2}_{target,draft}: config.json
and model.safetensors as `save_pretrained` writes a `LlamaForCausalLM`, a
`Qwen3ForCausalLM` or a `Qwen2ForCausalLM` (bfloat16 weights: `from_pretrained` and `load_model`
both read them as float32), plus reference.npz with HF's logits over whole
sequences and its greedy `generate` output on two prompts.

  * Llama: Llama 3's scaled rotary (`rope_type: llama3`, factor 8, bands
    around 64 positions, so that of head_dim 8's four frequencies one is
    kept, one interpolated and two divided), an untied output layer, GQA
    4:2 (the draft: 2:1, narrower and shallower), vocabulary 48 both.
  * Qwen 3: per-head QK-norm, a tied output layer, head_dim 16 (not
    hidden / heads), GQA 4:2; the draft has vocabulary 40 (the target's
    first ids, as Qwen 2.5's small models' 151936 beside 72B's 152064).
  * Qwen 2 (2.5): biases on queries, keys and values; as Qwen 2.5 72B and
    0.5B, an untied target of vocabulary 48 and a tied draft of 40.
Prompts: 12 and 7 tokens (the Llama ones BOS first), 0-padded on the
right; 16 tokens generated.
"""

import os

from absl import app
from absl import flags
import numpy as np
import torch
import transformers

_OUT_DIR = flags.DEFINE_string("out_dir", "tests/testdata", "Output folder.")

MAX_NEW = 16
PAD, EOS, BOS = 0, 1, 2  # as Gemma 3 and the project number them
PROMPT_LENGTHS = (12, 7)
PROMPT_VOCAB = 40  # prompts use ids every model has
# Each family's seed of weights and prompts: the first (from 1) whose greedy
# rows have no near tie, hold at least 5 distinct ids, and (Qwen) hold ids
# the narrower draft lacks.
SEEDS = {"llama": 1, "qwen3": 2, "qwen2": 2}
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 10_000.0, "factor": 8.0,
               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}


def _config(family: str, draft: bool) -> transformers.PretrainedConfig:
  size = (dict(hidden_size=16, intermediate_size=32, num_attention_heads=2,
               num_key_value_heads=1, num_hidden_layers=2) if draft else
          dict(hidden_size=32, intermediate_size=64, num_attention_heads=4,
               num_key_value_heads=2, num_hidden_layers=3))
  common = dict(max_position_embeddings=128, bos_token_id=BOS,
                eos_token_id=EOS, pad_token_id=PAD, **size)
  if family == "llama":
    return transformers.LlamaConfig(
        vocab_size=48, head_dim=8, rms_norm_eps=1e-5,
        rope_parameters=LLAMA3_ROPE, tie_word_embeddings=False, **common)
  rope = {"rope_type": "default", "rope_theta": 10_000.0}
  if family == "qwen2":
    return transformers.Qwen2Config(
        vocab_size=40 if draft else 48, rms_norm_eps=1e-6,
        rope_parameters=rope, tie_word_embeddings=draft, **common)
  return transformers.Qwen3Config(
      vocab_size=40 if draft else 48, head_dim=8 if draft else 16,
      rms_norm_eps=1e-6, rope_parameters=rope, tie_word_embeddings=True,
      **common)


def _model(family: str, draft: bool) -> transformers.PreTrainedModel:
  model = transformers.AutoModelForCausalLM.from_config(
      _config(family, draft))
  # HF's init (std 0.02) gives near-uniform logits and greedy ties: unit-
  # variance weights, norm gains spread around 1 (QK-norm gains near 3, for
  # attention sharp enough that greedy output does not repeat one token),
  # and quiet PAD and EOS rows so that outputs run the whole 16 tokens.
  with torch.no_grad():
    for name, weight in model.named_parameters():
      if "norm" in name:
        weight.copy_(1.0 + 0.3 * torch.randn_like(weight))
        if "q_norm" in name or "k_norm" in name:
          weight.mul_(3.0)
      elif "embed_tokens" in name:
        weight.copy_(torch.randn_like(weight))
      elif name.endswith(".bias"):
        weight.copy_(0.5 * torch.randn_like(weight))
      else:
        weight.copy_(torch.randn_like(weight) * 1.5 / weight.shape[1]**0.5)
    model.get_output_embeddings().weight[[PAD, EOS]] *= 0.2
  return model.to(torch.bfloat16).eval()


def _prompts(family: str, rng: np.random.Generator) -> np.ndarray:
  """int [2, 12]: (Llama: BOS, then) random ids, 0-padded on the right."""
  prompts = np.zeros((len(PROMPT_LENGTHS), max(PROMPT_LENGTHS)), np.int64)
  for row, length in enumerate(PROMPT_LENGTHS):
    prompts[row, :length] = rng.integers(3, PROMPT_VOCAB, length)
    if family == "llama":
      prompts[row, 0] = BOS
  return prompts


def _reference(path: str, prompts: np.ndarray) -> dict:
  """HF's own outputs on the checkpoint as `from_pretrained` reads it: each
  row alone (no padding), greedy continuation, then the logits over the
  whole sequence (prompt + continuation), 0-padded on the right."""
  model = transformers.AutoModelForCausalLM.from_pretrained(
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
    if len(new) != MAX_NEW or (new == PAD).any():
      raise ValueError(f"{path} row {row} stopped early or emitted id 0 "
                       f"({new}); try another --seed")
    generated[row] = new
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
  for family, seed in SEEDS.items():
    torch.manual_seed(seed)
    prompts = _prompts(family, np.random.default_rng(seed))
    for draft in (False, True):
      path = os.path.join(_OUT_DIR.value,
                          f"hf_{family}_{'draft' if draft else 'target'}")
      _model(family, draft).save_pretrained(path)
      ref = _reference(path, prompts)
      np.savez(os.path.join(path, "reference.npz"), **ref)
      print("wrote", path, "generated:", ref["generated"].tolist())


if __name__ == "__main__":
  app.run(main)
