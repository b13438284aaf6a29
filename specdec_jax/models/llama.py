"""The Llama layout: Llama 3, Qwen 3 (and Qwen 2.5) decoder-only models
behind the `ModelDef` contract.

The architecture is transformers' `LlamaForCausalLM`, `Qwen3ForCausalLM`
and `Qwen2ForCausalLM` (models/llama, models/qwen3, models/qwen2,
transformers 5.24):
  * pre-norm layers: RMS norm (x / rms(x), cast to the compute dtype, times
    scale), grouped-query self-attention, RMS norm, SwiGLU MLP
    (silu(gate) * up); residual adds; no biases but Qwen 2's on the query,
    key and value projections;
  * rotary embeddings on every layer, base `rope_theta` (500k for Llama 3,
    1M for Qwen 3), with Llama 3's frequency-dependent scaling for Llama
    3.1 and 3.2 (`gemma_layers.Rotary.llama3_band`);
  * attention logits scaled by head_dim**-0.5; Qwen 3 RMS-norms queries and
    keys per head before rotating them (QK-norm);
  * a final RMS norm, and an output layer that is the embedding (tied:
    Llama 3.2, Qwen 3 up to 4B) or its own (`logits_dense`: Llama 3.1,
    Qwen 3 from 8B).
What differs from Gemma 3 is the layer (two plain norms, SwiGLU) and the
ends (no embedding scale, untied heads); the rest is Gemma 3's machinery:
its attention (`gemma_layers.Attention`, with plain RMS QK-norms), its
rotary, its causal stack over position-addressed caches
(`gemma3.run_layers`: chunks, rollback, token trees) and the decoder-only
prompt path (`gpt.DecoderOnlyDef`: a row is the checkpoint's own ids,
0-padded on the right, its prefill at positions 0..L-1, decoding from the
last real token).

The parameter tree:

  decoder/token_embedder/embedding                         [V, D]
  decoder/layers_{i}/pre_self_attention_norm/scale         [D]
  decoder/layers_{i}/self_attention/query/kernel           [D, N*H]
  decoder/layers_{i}/self_attention/{key,value}/kernel     [D, K*H]
  decoder/layers_{i}/self_attention/query/bias             [N*H] (Qwen 2)
  decoder/layers_{i}/self_attention/{key,value}/bias       [K*H] (Qwen 2)
  decoder/layers_{i}/self_attention/{query,key}_norm/scale [H] (Qwen 3)
  decoder/layers_{i}/self_attention/out/kernel             [N*H, D]
  decoder/layers_{i}/pre_mlp_norm/scale                    [D]
  decoder/layers_{i}/mlp/{wi_0 (gate), wi_1 (up)}/kernel   [D, F]
  decoder/layers_{i}/mlp/wo/kernel                         [F, D]
  decoder/decoder_norm/scale                               [D]
  decoder/logits_dense/kernel                              [D, V] (untied)

Dimension letters: B batch, L prompt length, T tokens fed now, S cache
slots, D embed, N query heads, K key/value heads, H head dim, F mlp
hidden, V vocabulary.

Logical axes as Gemma 3's: kernels (`embed`, `joined_kv`), (`joined_kv`,
`embed`), (`embed`, `mlp`), (`mlp`, `embed`), the output layer (`embed`,
`vocab`), norms (`embed`,), QK-norms (`kv`,), the embedding (`vocab`,
`embed`), Qwen 2's biases (`joined_kv`,); caches
(`gpt.cache_logical_axes`) with K as `cache_heads`.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax.numpy as jnp

from specdec_jax.models import gemma3
from specdec_jax.models import gemma_layers
from specdec_jax.models import layers
from specdec_jax.models.gemma_layers import GLOBAL
from specdec_jax.models.gpt import DecoderOnlyDef
from specdec_jax.models.gpt import DecoderOnlyTransformer


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
  """Llama-layout hyperparameters (transformers' `LlamaConfig`,
  `Qwen3Config`).

  Attributes:
    vocab_size: V (128256 for Llama 3, 151936 for Qwen 3).
    emb_dim: D.
    num_layers: depth.
    num_heads: N.
    num_kv_heads: K (N must be a multiple).
    head_dim: H.
    mlp_dim: F.
    qk_norm: RMS-norm queries and keys per head (Qwen 3).
    qkv_bias: biases on the query, key and value projections (Qwen 2 and
      2.5).
    tie_embeddings: the output layer is the embedding (no logits_dense).
    rope_theta: the rotary base.
    rope_scale: the rotary scaling factor (1: none); with rope_llama3_band
      Llama 3's, else linear.
    rope_llama3_band: None, or Llama 3's (low_freq_factor,
      high_freq_factor, original_max_position_embeddings).
    layer_norm_epsilon: RMS norm epsilon (1e-5 Llama 3, 1e-6 Qwen 3).
    dtype: compute dtype of activations.
    param_dtype: dtype of the parameters.
    max_len: longest prompt accepted (`max_input_len`).
  """

  vocab_size: int
  emb_dim: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  mlp_dim: int
  qk_norm: bool = False
  qkv_bias: bool = False
  tie_embeddings: bool = False
  rope_theta: float = 500_000.0
  rope_scale: float = 1.0
  rope_llama3_band: tuple[float, float, int] | None = None
  layer_norm_epsilon: float = 1e-5
  dtype: str = "float32"
  param_dtype: str = "float32"
  max_len: int = 131072

  def __post_init__(self):
    if self.num_heads % self.num_kv_heads:
      raise ValueError(f"num_heads={self.num_heads} is not a multiple of "
                       f"num_kv_heads={self.num_kv_heads}")
    band = self.rope_llama3_band
    if band is not None:  # gin and JSON hand over lists
      low, high, original = band
      if not 0 < low < high:
        raise ValueError(f"rope_llama3_band {tuple(band)} needs 0 < "
                         "low_freq_factor < high_freq_factor")
      object.__setattr__(self, "rope_llama3_band",
                         (float(low), float(high), int(original)))

  # Every layer is global: what `gemma3.run_layers` asks of a stack.
  sliding_window = None

  @property
  def layer_types(self) -> tuple[str, ...]:
    return (GLOBAL,) * self.num_layers

  def rotary(self) -> gemma_layers.Rotary:
    return gemma_layers.Rotary(self.rope_theta, self.rope_scale,
                               self.rope_llama3_band)


class DecoderLayer(nn.Module):
  """Norm, attention, norm, SwiGLU, each with its residual add
  (transformers' `LlamaDecoderLayer`, `Qwen3DecoderLayer`)."""

  config: LlamaConfig
  kind: str = GLOBAL

  def setup(self):
    cfg = self.config
    common = dict(dtype=cfg.dtype, param_dtype=cfg.param_dtype)
    self.pre_self_attention_norm = layers.RmsNorm(
        epsilon=cfg.layer_norm_epsilon, **common)
    self.self_attention = gemma_layers.Attention(
        num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim, out_features=cfg.emb_dim,
        query_pre_attn_scalar=cfg.head_dim, rotary=cfg.rotary(),
        qk_norm=cfg.qk_norm, norm="rms", qkv_bias=cfg.qkv_bias,
        epsilon=cfg.layer_norm_epsilon, **common)
    self.pre_mlp_norm = layers.RmsNorm(epsilon=cfg.layer_norm_epsilon,
                                       **common)
    # SwiGLU: wi_0 is transformers' gate_proj (silu), wi_1 its up_proj.
    self.mlp = layers.MlpBlock(hidden_dim=cfg.mlp_dim,
                               activations=("silu", "linear"), **common)

  def __call__(self, x, positions, slots, bias, cache, cross=None):
    """One layer, as `gemma3.DecoderLayer` (which `gemma3.run_layers`
    calls alike; `cross` must be None: the layout has no encoder).

    Args:
      x: [B, T, D].
      positions: int [B, T], what the rotary embeddings rotate by.
      slots: int [B, T], the cache slots written.
      bias: float32 [B, 1, T, S] (S = T when uncached).
      cache: KVCache of S slots, or None.
      cross: None.

    Returns:
      ([B, T, D], the updated cache or None).
    """
    assert cross is None
    h = self.pre_self_attention_norm(x)
    kv, cache = self.self_attention.self_keys(h, positions, slots, cache)
    x = x + self.self_attention(h, positions, kv, bias)
    return x + self.mlp(self.pre_mlp_norm(x)), cache


class Decoder(nn.Module):
  """Embedding, layers, final norm, output layer (tied or not)."""

  config: LlamaConfig

  def setup(self):
    cfg = self.config
    common = dict(dtype=cfg.dtype, param_dtype=cfg.param_dtype)
    self.token_embedder = layers.Embed(cfg.vocab_size, cfg.emb_dim, **common)
    self.layers = [DecoderLayer(cfg) for _ in range(cfg.num_layers)]
    self.decoder_norm = layers.RmsNorm(epsilon=cfg.layer_norm_epsilon,
                                       **common)
    if not cfg.tie_embeddings:
      self.logits_dense = layers.DenseGeneral(
          cfg.vocab_size, kernel_axes=("embed", "vocab"), dtype="float32",
          param_dtype=cfg.param_dtype)

  def __call__(self, tokens, positions, cache, return_logits=True,
               tree=None):
    """Runs the decoder on tokens int [B, T] at positions [B, T]: float32
    logits [B, T, V] (None without `return_logits`) and the updated caches
    (None without a cache), as `gpt.Decoder.__call__` says."""
    cfg = self.config
    y = self.token_embedder(tokens)
    y, new_cache = gemma3.run_layers(cfg, self.layers, y, positions, cache,
                                     tree)
    if not return_logits:
      return None, new_cache
    y = self.decoder_norm(y)
    logits = (self.token_embedder.attend(y) if cfg.tie_embeddings
              else self.logits_dense(y.astype(jnp.float32)))
    return layers.constrain(logits, "batch", "length", "vocab"), new_cache


class LlamaTransformer(DecoderOnlyTransformer):
  """The Llama layout under `decoder/`."""

  decoder_class = Decoder


@dataclasses.dataclass(frozen=True)
class LlamaDef(DecoderOnlyDef):
  """`ModelDef` for the Llama layout: a hashable definition; parameters
  travel separately.

  Attributes:
    config: the architecture.
  """

  module_class = LlamaTransformer
  config: LlamaConfig

  def kv_shape(self) -> tuple[int, int, int]:
    """(layers, key/value heads, head dim): GQA's cache."""
    cfg = self.config
    return cfg.num_layers, cfg.num_kv_heads, cfg.head_dim
