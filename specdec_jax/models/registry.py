"""Model configs by name, and the `ModelDef` that runs each.

Real sizes are T5X's (t5x/examples/t5/t5_1_0/*.gin and t5_1_1/*.gin) and
the paper's GPT-like models; the `*_tiny` configs are for tests. Each name
also has a gin file, `configs/models/<name>.gin`, binding the same fields.

  >>> from specdec_jax.models import registry
  >>> cfg = registry.get_config("t5_1_1_small", dtype="bfloat16")
  >>> definition = registry.make_def(cfg)
"""

from __future__ import annotations

import dataclasses

from specdec_jax.models.gpt import GPTConfig, GPTDef
from specdec_jax.models.t5 import T5Config, T5Def

T5_VOCAB = 32128  # 32000 sentencepiece pieces + 100 sentinels, padded to 128.
GPT_VOCAB = 8192  # The paper's "8k" lm1b vocabulary.

NAMES = (
    "t5_tiny", "t5_1_1_tiny", "gpt_tiny",
    "t5_small", "t5_base", "t5_large", "t5_3b", "t5_11b",
    "t5_1_1_small", "t5_1_1_base", "t5_1_1_large", "t5_1_1_xl",
    "t5_1_1_xxl",
    "gpt_6m", "gpt_97m",
)


def _t5_1_0(emb, heads, layers, head_dim, mlp) -> T5Config:
  """Original T5: ReLU MLP, output layer tied to the embedding."""
  return T5Config(vocab_size=T5_VOCAB, emb_dim=emb, num_heads=heads,
                  num_encoder_layers=layers, num_decoder_layers=layers,
                  head_dim=head_dim, mlp_dim=mlp, mlp_activations=("relu",),
                  logits_via_embedding=True)


def _t5_1_1(emb, heads, layers, mlp) -> T5Config:
  """T5 v1.1: gated-GELU MLP, separate output layer."""
  return T5Config(vocab_size=T5_VOCAB, emb_dim=emb, num_heads=heads,
                  num_encoder_layers=layers, num_decoder_layers=layers,
                  head_dim=64, mlp_dim=mlp,
                  mlp_activations=("gelu", "linear"),
                  logits_via_embedding=False)


def _gpt(emb, heads, layers, mlp, vocab=GPT_VOCAB) -> GPTConfig:
  return GPTConfig(vocab_size=vocab, emb_dim=emb, num_heads=heads,
                   num_layers=layers, head_dim=emb // heads, mlp_dim=mlp)


def _base_config(name: str) -> T5Config | GPTConfig:
  match name:
    case "t5_tiny":
      return T5Config(vocab_size=128, emb_dim=32, num_heads=4,
                      num_encoder_layers=2, num_decoder_layers=2, head_dim=8,
                      mlp_dim=64, mlp_activations=("relu",),
                      logits_via_embedding=True, max_input_len=64)
    case "t5_1_1_tiny":
      return T5Config(vocab_size=128, emb_dim=32, num_heads=4,
                      num_encoder_layers=2, num_decoder_layers=2, head_dim=8,
                      mlp_dim=64, mlp_activations=("gelu", "linear"),
                      logits_via_embedding=False, max_input_len=64)
    case "gpt_tiny":
      return GPTConfig(vocab_size=128, emb_dim=32, num_heads=4, num_layers=2,
                       head_dim=8, mlp_dim=64, max_len=64)
    case "t5_small":
      return _t5_1_0(512, 8, 6, 64, 2048)
    case "t5_base":
      return _t5_1_0(768, 12, 12, 64, 3072)
    case "t5_large":
      return _t5_1_0(1024, 16, 24, 64, 4096)
    case "t5_3b":
      return _t5_1_0(1024, 32, 24, 128, 16384)
    case "t5_11b":
      return _t5_1_0(1024, 128, 24, 128, 65536)
    case "t5_1_1_small":
      return _t5_1_1(512, 6, 8, 1024)
    case "t5_1_1_base":
      return _t5_1_1(768, 12, 12, 2048)
    case "t5_1_1_large":
      return _t5_1_1(1024, 16, 24, 2816)
    case "t5_1_1_xl":
      return _t5_1_1(2048, 32, 24, 5120)
    case "t5_1_1_xxl":
      return _t5_1_1(4096, 64, 24, 10240)
    case "gpt_6m":
      return _gpt(256, 4, 2, 1024)
    case "gpt_97m":
      return _gpt(768, 12, 12, 3072)
  raise ValueError(f"unknown model config {name!r}; known: {', '.join(NAMES)}")


def get_config(name: str, **overrides) -> T5Config | GPTConfig:
  """The config called `name` (see NAMES), with fields replaced by overrides.

  Args:
    name: e.g. "t5_1_1_xxl", "t5_small", "gpt_97m", "t5_tiny".
    **overrides: config fields to change, e.g. dtype="bfloat16".

  Returns:
    A `T5Config` or `GPTConfig`.
  """
  config = _base_config(name)
  try:
    return dataclasses.replace(config, **overrides)
  except TypeError as e:
    raise ValueError(f"bad override for {name!r}: {e}") from None


def make_def(config: T5Config | GPTConfig) -> T5Def | GPTDef:
  """The `ModelDef` that runs `config`."""
  if isinstance(config, T5Config):
    return T5Def(config)
  if isinstance(config, GPTConfig):
    return GPTDef(config)
  raise TypeError(f"not a model config: {config!r}")
