"""Model configs by name, and the `ModelDef` that runs each.

Real sizes are T5X's (t5x/examples/t5/t5_1_0/*.gin and t5_1_1/*.gin), the
paper's GPT-like models and the published T5Gemma, Gemma 3, T5Gemma 2,
Llama 3, Qwen 3 and Qwen 2.5 checkpoints (see `_t5gemma`, `_gemma3`,
`_t5gemma2`, `_llama3`, `_qwen3` and `_qwen2_5` for where each number comes
from); the `*_tiny` configs are for tests. Each name also has a gin file,
`configs/models/<name>.gin`, binding the same fields.

  >>> from specdec_jax.models import registry
  >>> cfg = registry.get_config("t5_1_1_small", dtype="bfloat16")
  >>> definition = registry.make_def(cfg)
"""

from __future__ import annotations

import dataclasses

from specdec_jax.models.gemma3 import Gemma3Config, Gemma3Def
from specdec_jax.models.gemma_layers import GLOBAL, SLIDING
from specdec_jax.models.gpt import GPTConfig, GPTDef
from specdec_jax.models.llama import LlamaConfig, LlamaDef
from specdec_jax.models.t5 import T5Config, T5Def
from specdec_jax.models.t5gemma import StackConfig
from specdec_jax.models.t5gemma import T5GemmaConfig, T5GemmaDef
from specdec_jax.models.t5gemma2 import T5Gemma2Config, T5Gemma2Def

T5_VOCAB = 32128  # 32000 sentencepiece pieces + 100 sentinels, padded to 128.
GPT_VOCAB = 8192  # The paper's "8k" lm1b vocabulary.
GEMMA_VOCAB = 256000  # Gemma's SentencePiece vocabulary.
# Gemma 3's: 262144 ids (270M, 1B); from 4B up 64 more (image tokens).
GEMMA3_VOCAB, GEMMA3_VOCAB_WIDE = 262_144, 262_208
LLAMA3_VOCAB = 128_256  # Llama 3's BPE: 128000 pieces + 256 special ids.
QWEN3_VOCAB = 151_936  # Qwen's byte-level BPE (151669 ids in use), padded.
# Qwen 2.5's: the same tokenizer; 151936 rows up to 3B, 152064 from 7B up.
QWEN2_5_VOCAB, QWEN2_5_VOCAB_WIDE = 151_936, 152_064

NAMES = (
    "t5_tiny", "t5_1_1_tiny", "gpt_tiny",
    "t5_small", "t5_base", "t5_large", "t5_3b", "t5_11b",
    "t5_1_1_small", "t5_1_1_base", "t5_1_1_large", "t5_1_1_xl",
    "t5_1_1_xxl",
    "gpt_6m", "gpt_97m",
    "t5gemma_tiny", "t5gemma_tiny_draft",
    "t5gemma_s_s", "t5gemma_b_b", "t5gemma_l_l", "t5gemma_ml_ml",
    "t5gemma_xl_xl", "t5gemma_2b_2b", "t5gemma_9b_2b", "t5gemma_9b_9b",
    "gemma3_tiny", "gemma3_tiny_draft",
    "gemma3_270m", "gemma3_1b", "gemma3_4b", "gemma3_12b", "gemma3_27b",
    "t5gemma2_tiny",
    "t5gemma2_270m_270m", "t5gemma2_1b_1b", "t5gemma2_4b_4b",
    "llama3_tiny", "qwen3_tiny",
    "llama3_2_1b", "llama3_2_3b", "llama3_1_8b", "llama3_1_70b",
    "qwen3_0_6b", "qwen3_1_7b", "qwen3_4b", "qwen3_8b", "qwen3_14b",
    "qwen3_32b",
    "qwen2_5_0_5b", "qwen2_5_1_5b", "qwen2_5_3b", "qwen2_5_7b",
    "qwen2_5_14b", "qwen2_5_32b", "qwen2_5_72b",
)
ModelConfig = (T5Config | GPTConfig | T5GemmaConfig | Gemma3Config
               | T5Gemma2Config | LlamaConfig)


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


# T5Gemma stacks. No config.json could be downloaded here; the numbers are
# these (transformers 5.24 docs and T5GemmaModuleConfig defaults, the paper
# arXiv 2504.06225, Gemma 2's report arXiv 2408.00118):
#  * T5 sizes (S, B, L, XL): T5 v1.1's widths, depths and MLP widths (the
#    paper: "following T5 configuration") with 64-wide heads, as many key/
#    value heads as query heads, query_pre_attn_scalar = 64.
#  * ML ("medium large, ~2B in total, between T5 Large and XL", transformers'
#    docs): Gemma 3 1B's width (1152), depth (26) and MLP (6912), attention
#    1024 wide. keras-hub's published count (2,200,345,344) pins the width
#    and depth (no other width and depth with this structure gives it) but
#    not how the attention splits into heads: 4 heads of 256, as Gemma 3 1B,
#    is our choice (8 of 128 or 16 of 64 count the same; a run that names
#    t5gemma_ml_ml refuses a checkpoint whose config.json differs).
#  * Every size gives exactly keras-hub's published parameter count for its
#    t5gemma_*_prefixlm preset (tests/test_t5gemma.py).
#  * 2B and 9B: Gemma 2 2B and 9B (T5GemmaModuleConfig's defaults are 2B's):
#    widths 2304 / 3584, MLP 9216 / 14336, 26 / 42 layers, 8 / 16 heads
#    with 4 / 8 key/value heads of 256, query_pre_attn_scalar 256.
#  * All: vocabulary 256000, sliding window 4096 on even layers, soft-caps
#    50 (attention) and 30 (logits), rotary base 10000, 8192 positions.
_GEMMA2_2B = StackConfig(emb_dim=2304, num_layers=26, num_heads=8,
                         num_kv_heads=4, head_dim=256, mlp_dim=9216)
_GEMMA2_9B = StackConfig(emb_dim=3584, num_layers=42, num_heads=16,
                         num_kv_heads=8, head_dim=256, mlp_dim=14336)


def _t5_sized(emb, layers, mlp) -> StackConfig:
  heads = emb // 64
  return StackConfig(emb_dim=emb, num_layers=layers, num_heads=heads,
                     num_kv_heads=heads, head_dim=64, mlp_dim=mlp,
                     query_pre_attn_scalar=64.0)


def _t5gemma(encoder: StackConfig, decoder: StackConfig | None = None
             ) -> T5GemmaConfig:
  return T5GemmaConfig(vocab_size=GEMMA_VOCAB, encoder=encoder,
                       decoder=decoder or encoder)


def _t5gemma_tiny(emb, heads, kv_heads) -> StackConfig:
  # A window of 4 so that the contract tests' 8 positions cross it.
  return StackConfig(emb_dim=emb, num_layers=2, num_heads=heads,
                     num_kv_heads=kv_heads, head_dim=8, mlp_dim=2 * emb,
                     query_pre_attn_scalar=8.0, sliding_window=4)


# Gemma 3 text models, from their config.json files on the Hub (the text
# config of the 4B, 12B and 27B multimodal checkpoints), as transformers
# 5.24's Gemma3TextConfig reads them: rotary base 1M (global) and 10k
# (local), five local layers to one global, vocabularies as above. Every
# size gives keras-hub's published text-only parameter count, which counts
# 262144 embedding rows (tests/test_gemma3.py).
def _gemma3(emb, layers, heads, kv_heads, mlp, *, head_dim=256, window=1024,
            scalar=256.0, wide=True) -> Gemma3Config:
  return Gemma3Config(
      vocab_size=GEMMA3_VOCAB_WIDE if wide else GEMMA3_VOCAB, emb_dim=emb,
      num_layers=layers, num_heads=heads, num_kv_heads=kv_heads,
      head_dim=head_dim, mlp_dim=mlp, query_pre_attn_scalar=scalar,
      sliding_window=window, rope_scale=8.0 if wide else 1.0,
      max_len=131072 if wide else 32768)


# T5Gemma 2 (google/t5gemma-2-270m-270m's config.json, transformers 5):
# encoder and decoder are the Gemma 3 stack of that size, over one
# 262,144-id embedding, with the global layers' rotary scaled x8 (linear)
# at every size and 32,768 positions. The 1B-1B and 4B-4B stacks are Gemma
# 3 1B's and 4B's with the same conventions; their config.json files were
# not read here (`load_model("hf:DIR")` reads the architecture from the
# file either way).
def _t5gemma2(stack: Gemma3Config) -> T5Gemma2Config:
  stack = dataclasses.replace(stack, vocab_size=GEMMA3_VOCAB, rope_scale=8.0,
                              max_len=32768)
  return T5Gemma2Config(vocab_size=GEMMA3_VOCAB, encoder=stack,
                        decoder=stack, max_input_len=32768)


def _gemma3_tiny(vocab, emb, heads, kv_heads) -> Gemma3Config:
  # A window of 4 that the contract tests' 8 positions cross, local and
  # global layers, scaled global rotary, query_pre_attn_scalar != head_dim.
  return Gemma3Config(vocab_size=vocab, emb_dim=emb, num_layers=3,
                      num_heads=heads, num_kv_heads=kv_heads, head_dim=8,
                      mlp_dim=2 * emb, query_pre_attn_scalar=12.0,
                      sliding_window=4, rope_scale=8.0,
                      layer_types=(SLIDING, SLIDING, GLOBAL), max_len=64)


# Llama 3.1 and 3.2 (the Hub's config.json of meta-llama/Llama-3.2-1B, -3B,
# Llama-3.1-8B, -70B): vocabulary 128256, 8 key/value heads, rotary base
# 500k with Llama 3's scaling (factor 32 for 3.2, 8 for 3.1; frequency
# factors 1 and 4 around 8192 positions), 131072 positions, RMS epsilon
# 1e-5; 3.2's output layer tied, 3.1's not. Each gives the published
# parameter count (tests/test_llama_checkpoints.py).
def _llama3(emb, layers, heads, head_dim, mlp, *, factor) -> LlamaConfig:
  return LlamaConfig(
      vocab_size=LLAMA3_VOCAB, emb_dim=emb, num_layers=layers,
      num_heads=heads, num_kv_heads=8, head_dim=head_dim, mlp_dim=mlp,
      tie_embeddings=factor == 32.0, rope_theta=500_000.0,
      rope_scale=factor, rope_llama3_band=(1.0, 4.0, 8192),
      layer_norm_epsilon=1e-5, max_len=131072)


# Qwen 3 (the Hub's config.json of Qwen/Qwen3-0.6B ... -32B): vocabulary
# 151936, heads of 128 with 8 key/value heads and QK-norm, rotary base 1M
# unscaled, 40960 positions, RMS epsilon 1e-6; tied output layer up to 4B.
def _qwen3(emb, layers, heads, mlp, *, tied) -> LlamaConfig:
  return LlamaConfig(
      vocab_size=QWEN3_VOCAB, emb_dim=emb, num_layers=layers,
      num_heads=heads, num_kv_heads=8, head_dim=128, mlp_dim=mlp,
      qk_norm=True, tie_embeddings=tied, rope_theta=1_000_000.0,
      layer_norm_epsilon=1e-6, max_len=40960)


# Qwen 2.5 (the Hub's config.json of Qwen/Qwen2.5-0.5B ... -72B): biases on
# the query, key and value projections, no QK-norm, heads of 128 (64 for
# 0.5B), rotary base 1M unscaled, 32768 positions, RMS epsilon 1e-6; tied
# output layer and 151936 rows up to 3B, untied and 152064 from 7B up.
def _qwen2_5(emb, layers, heads, kv_heads, mlp, *, tied) -> LlamaConfig:
  return LlamaConfig(
      vocab_size=QWEN2_5_VOCAB if tied else QWEN2_5_VOCAB_WIDE, emb_dim=emb,
      num_layers=layers, num_heads=heads, num_kv_heads=kv_heads,
      head_dim=emb // heads, mlp_dim=mlp, qkv_bias=True, tie_embeddings=tied,
      rope_theta=1_000_000.0, layer_norm_epsilon=1e-6, max_len=32768)


def _llama_tiny(**options) -> LlamaConfig:
  return LlamaConfig(vocab_size=128, emb_dim=32, num_layers=2, num_heads=4,
                     num_kv_heads=2, head_dim=8, mlp_dim=64, max_len=64,
                     **options)


def _base_config(name: str) -> ModelConfig:
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
    case "t5gemma_tiny":
      return T5GemmaConfig(vocab_size=128, encoder=_t5gemma_tiny(32, 4, 2),
                           decoder=_t5gemma_tiny(32, 4, 2), max_input_len=64)
    case "t5gemma_tiny_draft":  # 9B-2B-like: a narrower decoder, one kv head
      return T5GemmaConfig(vocab_size=128, encoder=_t5gemma_tiny(32, 4, 2),
                           decoder=_t5gemma_tiny(16, 2, 1), max_input_len=64)
    case "t5gemma_s_s":
      return _t5gemma(_t5_sized(512, 8, 1024))
    case "t5gemma_b_b":
      return _t5gemma(_t5_sized(768, 12, 2048))
    case "t5gemma_l_l":
      return _t5gemma(_t5_sized(1024, 24, 2816))
    case "t5gemma_ml_ml":
      return _t5gemma(StackConfig(emb_dim=1152, num_layers=26, num_heads=4,
                                  num_kv_heads=4, head_dim=256, mlp_dim=6912))
    case "t5gemma_xl_xl":
      return _t5gemma(_t5_sized(2048, 24, 5120))
    case "t5gemma_2b_2b":
      return _t5gemma(_GEMMA2_2B)
    case "t5gemma_9b_2b":
      return _t5gemma(_GEMMA2_9B, _GEMMA2_2B)
    case "t5gemma_9b_9b":
      return _t5gemma(_GEMMA2_9B)
    case "gemma3_tiny":
      return _gemma3_tiny(128, 32, 4, 2)
    case "gemma3_tiny_draft":  # narrower vocabulary, as 1B next to 27B
      return _gemma3_tiny(120, 16, 2, 1)
    case "t5gemma2_tiny":  # both stacks gemma3_tiny's, eoi id in range
      stack = _gemma3_tiny(128, 32, 4, 2)
      return T5Gemma2Config(vocab_size=128, encoder=stack, decoder=stack,
                            eoi_token_id=100, max_input_len=64)
    case "t5gemma2_270m_270m":
      return _t5gemma2(_base_config("gemma3_270m"))
    case "t5gemma2_1b_1b":
      return _t5gemma2(_base_config("gemma3_1b"))
    case "t5gemma2_4b_4b":
      return _t5gemma2(_base_config("gemma3_4b"))
    case "gemma3_270m":
      return _gemma3(640, 18, 4, 1, 2048, window=512, wide=False)
    case "gemma3_1b":
      return _gemma3(1152, 26, 4, 1, 6912, window=512, wide=False)
    case "gemma3_4b":
      return _gemma3(2560, 34, 8, 4, 10240)
    case "gemma3_12b":
      return _gemma3(3840, 48, 16, 8, 15360)
    case "gemma3_27b":
      return _gemma3(5376, 62, 32, 16, 21504, head_dim=128, scalar=168.0)
    case "llama3_tiny":  # Llama 3's scaled rotary, its band inside H = 8
      return _llama_tiny(rope_theta=10_000.0, rope_scale=8.0,
                         rope_llama3_band=(1.0, 4.0, 64))
    case "qwen3_tiny":
      return _llama_tiny(qk_norm=True, tie_embeddings=True,
                         layer_norm_epsilon=1e-6)
    case "llama3_2_1b":
      return _llama3(2048, 16, 32, 64, 8192, factor=32.0)
    case "llama3_2_3b":
      return _llama3(3072, 28, 24, 128, 8192, factor=32.0)
    case "llama3_1_8b":
      return _llama3(4096, 32, 32, 128, 14336, factor=8.0)
    case "llama3_1_70b":
      return _llama3(8192, 80, 64, 128, 28672, factor=8.0)
    case "qwen3_0_6b":
      return _qwen3(1024, 28, 16, 3072, tied=True)
    case "qwen3_1_7b":
      return _qwen3(2048, 28, 16, 6144, tied=True)
    case "qwen3_4b":
      return _qwen3(2560, 36, 32, 9728, tied=True)
    case "qwen3_8b":
      return _qwen3(4096, 36, 32, 12288, tied=False)
    case "qwen3_14b":
      return _qwen3(5120, 40, 40, 17408, tied=False)
    case "qwen3_32b":
      return _qwen3(5120, 64, 64, 25600, tied=False)
    case "qwen2_5_0_5b":
      return _qwen2_5(896, 24, 14, 2, 4864, tied=True)
    case "qwen2_5_1_5b":
      return _qwen2_5(1536, 28, 12, 2, 8960, tied=True)
    case "qwen2_5_3b":
      return _qwen2_5(2048, 36, 16, 2, 11008, tied=True)
    case "qwen2_5_7b":
      return _qwen2_5(3584, 28, 28, 4, 18944, tied=False)
    case "qwen2_5_14b":
      return _qwen2_5(5120, 48, 40, 8, 13824, tied=False)
    case "qwen2_5_32b":
      return _qwen2_5(5120, 64, 40, 8, 27648, tied=False)
    case "qwen2_5_72b":
      return _qwen2_5(8192, 80, 64, 8, 29568, tied=False)
  raise ValueError(f"unknown model config {name!r}; known: {', '.join(NAMES)}")


def get_config(name: str, **overrides) -> ModelConfig:
  """The config called `name` (see NAMES), with fields replaced by overrides.

  Args:
    name: e.g. "t5_1_1_xxl", "t5_small", "gpt_97m", "t5_tiny".
    **overrides: config fields to change, e.g. dtype="bfloat16".

  Returns:
    A `T5Config`, `GPTConfig`, `T5GemmaConfig`, `Gemma3Config`,
    `T5Gemma2Config` or `LlamaConfig`.
  """
  config = _base_config(name)
  try:
    return dataclasses.replace(config, **overrides)
  except TypeError as e:
    raise ValueError(f"bad override for {name!r}: {e}") from None


def make_def(config: ModelConfig):
  """The `ModelDef` that runs `config` (T5Def, GPTDef, T5GemmaDef,
  Gemma3Def, T5Gemma2Def or LlamaDef)."""
  if isinstance(config, LlamaConfig):
    return LlamaDef(config)
  if isinstance(config, T5Gemma2Config):
    return T5Gemma2Def(config)
  if isinstance(config, Gemma3Config):
    return Gemma3Def(config)
  if isinstance(config, T5Config):
    return T5Def(config)
  if isinstance(config, T5GemmaConfig):
    return T5GemmaDef(config)
  if isinstance(config, GPTConfig):
    return GPTDef(config)
  raise TypeError(f"not a model config: {config!r}")
