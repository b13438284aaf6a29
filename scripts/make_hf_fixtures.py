r"""Writes tiny random HF T5 checkpoints and HF's outputs on them, for tests.

Needs torch and transformers (`pip install -e '.[hf]'`):

  python scripts/make_hf_fixtures.py --out_dir=tests/testdata

Writes four directories, each a checkpoint as `from_pretrained` reads it
(config.json, model.safetensors) plus reference.npz with HF's encoder output,
teacher-forced logits and greedy generations on fixed inputs:
  hf_t5_v1_0      original T5: ReLU, tied, Hub-style config (no tie key)
  hf_t5_v1_0_tf5  the same weights, config as transformers 5 writes it
  hf_t5_v1_1      T5 v1.1: gated GELU, separate lm_head, tie_word_embeddings
                  false (Hub style)
  hf_t5_v1_1_tf5  the same weights, transformers-5 config (tie true,
                  scale_decoder_outputs false, both weights present)
"""

import json
import os

from absl import app
from absl import flags
import numpy as np
import torch
import transformers

_OUT_DIR = flags.DEFINE_string("out_dir", "tests/testdata", "Output folder.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of weights and inputs.")

VOCAB, MAX_NEW_TOKENS = 160, 12


def _model(v1_1: bool) -> transformers.T5ForConditionalGeneration:
  config = transformers.T5Config(
      vocab_size=VOCAB, d_model=32, d_kv=8, num_heads=4, d_ff=64,
      num_layers=2, num_decoder_layers=2, decoder_start_token_id=0,
      feed_forward_proj="gated-gelu" if v1_1 else "relu",
      tie_word_embeddings=not v1_1,
      # v1.1 uses few buckets so short sequences reach the log-spaced ones.
      relative_attention_num_buckets=8 if v1_1 else 32,
      relative_attention_max_distance=20 if v1_1 else 128)
  model = transformers.T5ForConditionalGeneration(config)
  if v1_1:  # transformers 5 ties at init; v1.1 has its own output layer.
    model.lm_head.weight = torch.nn.Parameter(torch.randn(VOCAB, 32))
  # At init the residual stream is mostly the input embedding, so greedy
  # decoding just repeats the start token. Louder sub-layers, a quieter
  # start token and a heavier EOS row make the generations vary and stop.
  with torch.no_grad():
    for name, weight in model.named_parameters():
      if name.endswith((".o.weight", ".wo.weight")):
        weight.mul_(4.0 if v1_1 else 30.0)
    if not v1_1:
      model.shared.weight[0].mul_(0.1)
    model.lm_head.weight[1].mul_(1.5 if v1_1 else 2.0)
  return model.eval()


def _inputs(rng: np.random.Generator):
  input_ids = np.zeros((3, 12), np.int64)
  for row, length in enumerate((12, 7, 3)):
    input_ids[row, :length - 1] = rng.integers(2, VOCAB, length - 1)
    input_ids[row, length - 1] = 1  # EOS
  decoder_input_ids = rng.integers(2, VOCAB, (3, 8))
  decoder_input_ids[:, 0] = 0  # decoder start id
  return input_ids, decoder_input_ids


def _reference(path: str, input_ids, decoder_input_ids) -> dict:
  """HF's own outputs on the checkpoint as `from_pretrained` reads it."""
  model = transformers.T5ForConditionalGeneration.from_pretrained(path).eval()
  ids = torch.tensor(input_ids)
  mask = ids != 0
  with torch.no_grad():
    out = model(input_ids=ids, attention_mask=mask,
                decoder_input_ids=torch.tensor(decoder_input_ids))
    generated = model.generate(
        ids, attention_mask=mask, max_new_tokens=MAX_NEW_TOKENS,
        do_sample=False, num_beams=1, decoder_start_token_id=0,
        eos_token_id=1, pad_token_id=0)
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


def _hub_style(path: str, v1_1: bool) -> None:
  """Rewrites config.json the way Hub T5 checkpoints (transformers 4) are."""
  config_file = os.path.join(path, "config.json")
  with open(config_file) as f:
    config = json.load(f)
  del config["scale_decoder_outputs"]
  if v1_1:
    config["tie_word_embeddings"] = False
  else:
    del config["tie_word_embeddings"]
  with open(config_file, "w") as f:
    json.dump(config, f, indent=2, sort_keys=True)


def main(_):
  torch.manual_seed(_SEED.value)
  rng = np.random.default_rng(_SEED.value)
  input_ids, decoder_input_ids = _inputs(rng)
  for v1_1, name in ((False, "hf_t5_v1_0"), (True, "hf_t5_v1_1")):
    model = _model(v1_1)
    for suffix in ("", "_tf5"):
      path = os.path.join(_OUT_DIR.value, name + suffix)
      model.save_pretrained(path)
      if not suffix:
        _hub_style(path, v1_1)
      np.savez(os.path.join(path, "reference.npz"),
               **_reference(path, input_ids, decoder_input_ids))
      print("wrote", path)


if __name__ == "__main__":
  app.run(main)
