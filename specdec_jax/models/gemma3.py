"""Gemma 3 (arXiv 2503.19786), the decoder-only text model, behind the
`ModelDef` contract.

The architecture is transformers' `Gemma3ForCausalLM` (models/gemma3,
transformers 5.24), the text tower of `Gemma3ForConditionalGeneration`:
  * layers of local (sliding window) and global attention, five local to
    one global from the first layer on (the config's `layer_types`; the
    last layer may be local);
  * rotary embeddings with base 10k on local layers and 1M on global ones,
    the global ones linearly scaled (x8 from 4B up);
  * grouped-query attention whose queries and keys are RMS-normed per head
    (QK-norm), logits scaled by query_pre_attn_scalar**-0.5, no soft-cap;
  * four Gemma norms a layer, x / rms(x) * (1 + scale) in float32, before
    and after attention and the MLP; a GeGLU MLP (tanh GELU gate);
  * token embeddings times sqrt(d), the factor rounded to the parameters'
    dtype as transformers rounds it; the output layer tied to them.
Ids: pad 0, EOS 1, BOS 2; the -it checkpoints end a turn with
<end_of_turn> (106).

Prompts and positions are the GPT-like model's (`gpt.DecoderOnlyDef`): a
row is the checkpoint's own ids, BOS first, 0-padded on the right;
`prefill` writes the prompt's keys and values at positions 0..L-1 and
decoding starts at the last real token. Sliding windows are one more mask
on positions (`gemma_layers.window_bias`: a query at t sees keys at t - W <
j <= t), so every layer keeps all S slots and chunks, rollback and token
trees stay exact; the cache does not shrink to W.

The parameter tree:

  decoder/token_embedder/embedding                         [V, D]
  decoder/layers_{i}/pre_self_attention_norm/scale         [D]
  decoder/layers_{i}/self_attention/query/kernel           [D, N*H]
  decoder/layers_{i}/self_attention/{key,value}/kernel     [D, K*H]
  decoder/layers_{i}/self_attention/{query,key}_norm/scale [H]
  decoder/layers_{i}/self_attention/out/kernel             [N*H, D]
  decoder/layers_{i}/post_self_attention_norm/scale        [D]
  decoder/layers_{i}/{pre,post}_mlp_norm/scale             [D]
  decoder/layers_{i}/mlp/{wi_0 (gate), wi_1 (up)}/kernel   [D, F]
  decoder/layers_{i}/mlp/wo/kernel                         [F, D]
  decoder/decoder_norm/scale                               [D]

Dimension letters: B batch, L prompt length, T tokens fed now, S cache
slots, D embed, N query heads, K key/value heads, H head dim, F mlp
hidden, V vocabulary.

Logical axes as for the other families (`layers`): kernels (`embed`,
`joined_kv`) and (`joined_kv`, `embed`), (`embed`, `mlp`), norms
(`embed`,), QK-norms (`kv`,), the embedding (`vocab`, `embed`); caches
(`gpt.cache_logical_axes`) with K as `cache_heads`.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax

from specdec_jax.models import gemma_layers
from specdec_jax.models import layers
from specdec_jax.models.gemma_layers import GLOBAL, SLIDING
from specdec_jax.models.gpt import DecoderOnlyDef
from specdec_jax.models.gpt import DecoderOnlyTransformer

PAD_ID, EOS_ID, BOS_ID = 0, 1, 2
END_OF_TURN_ID = 106  # <end_of_turn>, where an -it model's answer ends
PATTERN = 6  # five local layers, then one global


def default_layer_types(num_layers: int) -> tuple[str, ...]:
  """Gemma 3's pattern: every sixth layer global, the others local."""
  return tuple(GLOBAL if (i + 1) % PATTERN == 0 else SLIDING
               for i in range(num_layers))


@dataclasses.dataclass(frozen=True)
class Gemma3Config:
  """Gemma 3 text hyperparameters (transformers' `Gemma3TextConfig`).

  Attributes:
    vocab_size: V (262144 for 270M and 1B, 262208 from 4B up).
    emb_dim: D.
    num_layers: depth.
    num_heads: N.
    num_kv_heads: K (N must be a multiple).
    head_dim: H.
    mlp_dim: F.
    query_pre_attn_scalar: attention logits are scaled by its -1/2 power.
    sliding_window: W of the local layers (None: every layer global).
    layer_types: per layer SLIDING or GLOBAL; None: five local, one global.
    rope_theta: rotary base of the global layers.
    rope_scale: linear scaling factor of the global layers' rotary.
    rope_local_theta: rotary base of the local layers (never scaled).
    attn_logit_softcapping: c of tanh(x / c) * c on attention logits, or
      None (Gemma 3's).
    final_logit_softcapping: the same on the output logits, or None.
    layer_norm_epsilon: RMS norm epsilon.
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
  query_pre_attn_scalar: float = 256.0
  sliding_window: int | None = 512
  layer_types: tuple[str, ...] | None = None
  rope_theta: float = 1_000_000.0
  rope_scale: float = 1.0
  rope_local_theta: float = 10_000.0
  attn_logit_softcapping: float | None = None
  final_logit_softcapping: float | None = None
  layer_norm_epsilon: float = 1e-6
  dtype: str = "float32"
  param_dtype: str = "float32"
  max_len: int = 32768

  def __post_init__(self):
    types = self.layer_types
    if types is None:
      types = default_layer_types(self.num_layers)
    types = gemma_layers.check_layer_types(types, self.num_layers,
                                           self.sliding_window)
    if self.num_heads % self.num_kv_heads:
      raise ValueError(f"num_heads={self.num_heads} is not a multiple of "
                       f"num_kv_heads={self.num_kv_heads}")
    object.__setattr__(self, "layer_types", types)

  def rotary(self, kind: str) -> gemma_layers.Rotary:
    """The rotary settings of a layer of `kind` (SLIDING or GLOBAL)."""
    if kind == SLIDING:
      return gemma_layers.Rotary(self.rope_local_theta)
    return gemma_layers.Rotary(self.rope_theta, self.rope_scale)


class DecoderLayer(nn.Module):
  """Attention and MLP, each between two norms (transformers'
  `Gemma3DecoderLayer`)."""

  config: Gemma3Config
  kind: str  # SLIDING or GLOBAL

  def setup(self):
    cfg = self.config
    common = dict(dtype=cfg.dtype, param_dtype=cfg.param_dtype)
    norm = lambda: gemma_layers.GemmaNorm(epsilon=cfg.layer_norm_epsilon,
                                          **common)
    self.pre_self_attention_norm = norm()
    self.self_attention = gemma_layers.Attention(
        num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim, out_features=cfg.emb_dim,
        query_pre_attn_scalar=cfg.query_pre_attn_scalar,
        softcap=cfg.attn_logit_softcapping, rotary=cfg.rotary(self.kind),
        qk_norm=True, epsilon=cfg.layer_norm_epsilon, **common)
    self.post_self_attention_norm = norm()
    self.pre_mlp_norm = norm()
    # GeGLU: wi_0 is transformers' gate_proj (tanh GELU), wi_1 its up_proj.
    self.mlp = layers.MlpBlock(hidden_dim=cfg.mlp_dim,
                               activations=("gelu", "linear"), **common)
    self.post_mlp_norm = norm()

  def cross_kv(self, encoded: jax.Array) -> layers.KVCache:
    """encoded [B, L, D] -> keys/values of the same projections, normed,
    not rotated (T5Gemma 2's cross-attention keys), in cache layout."""
    return layers.KVCache.from_projection(
        *self.self_attention.project_kv(encoded, None))

  def __call__(self, x, positions, slots, bias, cache, cross=None):
    """One layer.

    Args:
      x: [B, T, D].
      positions: int [B, T], the positions of the T tokens (what rotary
        embeddings rotate by).
      slots: int [B, T], their cache slots (the positions, except for the
        nodes of a token tree).
      bias: float32 [B, 1, T, S] (S = T when uncached): causal, windowed
        on local layers.
      cache: KVCache of S slots, or None to attend to the T tokens only.
      cross: None, or (`cross_kv` of an encoder output, its float32 bias
        [B, 1, 1, L]): T5Gemma 2's merged attention, one softmax over the
        S keys and these L.

    Returns:
      ([B, T, D], the updated cache or None).
    """
    h = self.pre_self_attention_norm(x)
    attention = self.self_attention
    kv, cache = attention.self_keys(h, positions, slots, cache)
    groups = [(kv, bias)] + ([] if cross is None else [cross])
    x = x + self.post_self_attention_norm(
        attention.attend(attention.queries(h, positions), groups))
    return x + self.post_mlp_norm(self.mlp(self.pre_mlp_norm(x))), cache


def run_layers(cfg: Gemma3Config, decoder_layers, y, positions, cache, tree,
               cross=None, cross_bias=None):
  """The causal layers of a Gemma 3 decoder on y [B, T, D].

  Args:
    cfg: the stack's config (windows, layer kinds).
    decoder_layers: its `DecoderLayer`s.
    y: [B, T, D], the embedded tokens.
    positions: int [B, T], their positions.
    cache: per layer KVCache of S slots, or None for a plain causal pass.
    tree: None, or a `protocol.TreeMask` (the T tokens are tree nodes).
    cross: None, or per layer the `cross_kv` of an encoder output (T5Gemma
      2's merged attention), with cross_bias float32 [B, 1, 1, L].

  Returns:
    ([B, T, D], the updated caches or None).
  """
  uncached = cache is None
  key_pos, mask = layers.attention_bias(
      positions, None if uncached else cache[0].length, tree)
  sliding = (mask if cfg.sliding_window is None else mask +
             gemma_layers.window_bias(positions, key_pos, cfg.sliding_window,
                                      True))
  caches = (None,) * cfg.num_layers if uncached else cache
  crosses = (None,) * cfg.num_layers if cross is None else cross
  slots = positions if tree is None else tree.slots
  new_cache = []
  for layer, kind, layer_cache, layer_cross in zip(
      decoder_layers, cfg.layer_types, caches, crosses):
    y, layer_cache = layer(
        y, positions, slots, sliding if kind == SLIDING else mask,
        layer_cache, None if layer_cross is None else (layer_cross,
                                                       cross_bias))
    new_cache.append(layer_cache)
  return y, None if uncached else tuple(new_cache)


class Decoder(nn.Module):
  """Embedding (times sqrt(D)), layers, final norm, tied output layer."""

  config: Gemma3Config

  def setup(self):
    cfg = self.config
    # The embedding is scaled by sqrt(D) on the way in and is the output
    # layer too: a unit normal (T5X's initialiser, for T5, which does
    # neither) would start a model trained from scratch with logits of
    # standard deviation sqrt(D) (a loss near 90 nats for the tiny pair of
    # configs/training/gemma3_tiny_*.gin); 1/sqrt(D) starts them near 1.
    self.token_embedder = layers.Embed(
        cfg.vocab_size, cfg.emb_dim, dtype=cfg.dtype,
        param_dtype=cfg.param_dtype,
        embedding_init=nn.initializers.normal(stddev=cfg.emb_dim ** -0.5))
    self.layers = [DecoderLayer(cfg, kind) for kind in cfg.layer_types]
    self.decoder_norm = gemma_layers.GemmaNorm(
        epsilon=cfg.layer_norm_epsilon, dtype=cfg.dtype,
        param_dtype=cfg.param_dtype)

  def __call__(self, tokens, positions, cache, return_logits=True,
               tree=None):
    """Runs the decoder on T tokens per row.

    Args:
      tokens: int [B, T].
      positions: int [B, T], their positions.
      cache: per layer KVCache of S slots, or None for a plain causal
        pass over the T tokens.
      return_logits: False skips the output layer (prefill needs none).
      tree: None, or a `protocol.TreeMask`: the T tokens are tree nodes
        written at its slots, seeing what it says.

    Returns:
      (float32 logits [B, T, V] or None, the updated caches or None).
    """
    cfg = self.config
    y = gemma_layers.embed(self.token_embedder, tokens, cfg.emb_dim,
                           cfg.dtype, round_to=cfg.param_dtype)
    y, new_cache = run_layers(cfg, self.layers, y, positions, cache, tree)
    if not return_logits:
      return None, new_cache
    logits = gemma_layers.softcap(
        self.token_embedder.attend(self.decoder_norm(y)),
        cfg.final_logit_softcapping)
    return layers.constrain(logits, "batch", "length", "vocab"), new_cache


class Gemma3Transformer(DecoderOnlyTransformer):
  """Gemma 3 under `decoder/`, as the GPT-like model."""

  decoder_class = Decoder


@dataclasses.dataclass(frozen=True)
class Gemma3Def(DecoderOnlyDef):
  """`ModelDef` for Gemma 3: a hashable definition; parameters travel
  separately.

  Attributes:
    config: the architecture.
  """

  module_class = Gemma3Transformer
  config: Gemma3Config

  def kv_shape(self) -> tuple[int, int, int]:
    """(layers, key/value heads, head dim): GQA's cache."""
    cfg = self.config
    return cfg.num_layers, cfg.num_kv_heads, cfg.head_dim
