"""Every model honours the engine's contract (`decoding/protocol.py`).

One test per clause, run on each family (T5 v1.0, T5 v1.1, GPT-like,
T5Gemma, Gemma 3 and T5Gemma 2 with sliding windows of 4 that the 8
positions below cross, and the Llama layout with Llama 3's scaled
rotary), with
logits checked against the model's own uncached, teacher-forced forward
pass:
  - cached decoding, one token at a time, equals the uncached pass;
  - a chunk of K tokens at per-row offsets equals K single steps;
  - rewriting a position with the same token changes nothing;
  - rollback is by position: slots past it are invisible, whatever they hold;
  - greedy decoding through the cache equals the argmax of a teacher-forced
    pass over its own output (MaxText's decode-consistency check).

A `Case` adapts a family: the uncached reference logits of a row's decoder
sequence (start token + continuation) and access to the self-attention
caches (the only part of a cache that rollback concerns).
"""

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.models import gpt
from specdec_jax.models import layers
from specdec_jax.models import registry

# Three rows of lengths 6, 3 and 7, each ending in EOS (1), 0-padded.
INPUTS = np.array([[5, 6, 7, 8, 9, 1, 0],
                   [10, 11, 1, 0, 0, 0, 0],
                   [3, 4, 5, 6, 7, 8, 1]], np.int32)
LENGTHS = (INPUTS != 0).sum(1)
# One cache length and one reference width for every test: the programs a
# family compiles (prefill, one-token and chunk extends, the forward pass)
# are shared by its tests.
CACHE_LENGTH = 8
REFERENCE_WIDTH = 16
CONTINUATION = np.array([[20, 21, 22, 23, 24, 25],
                         [30, 31, 32, 33, 34, 35],
                         [40, 41, 42, 43, 44, 45]], np.int32)


@dataclasses.dataclass
class Case:
  definition: Any
  params: Any
  prefill: Callable
  extend: Callable
  forward: Callable
  decoder_only: bool
  start: int = 0  # decoder start id of an encoder-decoder

  def reference(self, row: int, continuation: np.ndarray) -> np.ndarray:
    """Uncached logits [K + 1, V] at the start token and each continuation
    token of `row` (what `extend` must give at those positions)."""
    # Padded on the right to one width (a causal pass: later positions
    # change no earlier logit), so each family compiles one forward pass.
    if self.decoder_only:
      seq = np.concatenate([INPUTS[row, :LENGTHS[row]], continuation])
      end = len(seq)
      seq = np.pad(seq, (0, REFERENCE_WIDTH - end))[None].astype(np.int32)
      return np.asarray(self.forward(self.params, seq))[
          0, LENGTHS[row] - 1:end]
    decoder = np.concatenate([[self.start], continuation]).astype(np.int32)
    end = len(decoder)
    decoder = np.pad(decoder, (0, CACHE_LENGTH - end))[None]
    return np.asarray(self.forward(self.params, INPUTS[row:row + 1],
                                   decoder))[0, :end]

  def self_caches(self, cache) -> tuple:
    return cache.layers if self.decoder_only else cache.self_attention

  def with_self_caches(self, cache, kvs):
    if self.decoder_only:
      return gpt.GPTCache(layers=tuple(kvs))
    return cache.replace(self_attention=tuple(kvs))


@pytest.fixture(scope="module", params=["t5_tiny", "t5_1_1_tiny", "gpt_tiny",
                                        "t5gemma_tiny", "gemma3_tiny",
                                        "t5gemma2_tiny", "llama3_tiny"])
def case(request):
  definition = registry.make_def(registry.get_config(request.param))
  params = definition.init_params(jax.random.PRNGKey(0))
  prefill = jax.jit(definition.prefill, static_argnums=2)
  return Case(definition, params, prefill=prefill,
              extend=jax.jit(definition.extend),
              forward=jax.jit(definition.forward),
              decoder_only=isinstance(definition, gpt.DecoderOnlyDef),
              start=int(prefill(params, INPUTS, 1).start_token[0]))


def _steps(case, cache, start_token, start_pos, tokens, n):
  """Feeds start_token then tokens[:, :n-1], one per call: logits [B, n, V]."""
  out, current, pos = [], start_token, start_pos
  for step in range(n):
    logits, cache = case.extend(case.params, cache, current[:, None],
                                pos[:, None])
    out.append(logits[:, 0])
    current, pos = tokens[:, step], pos + 1
  return np.stack(out, axis=1), cache


def test_cached_decoding_equals_uncached_forward(case):
  pre = case.prefill(case.params, INPUTS, CACHE_LENGTH)
  logits, _ = _steps(case, pre.cache, pre.start_token, pre.start_pos,
                     CONTINUATION, 5)
  assert logits.dtype == np.float32
  for row in range(3):
    np.testing.assert_allclose(logits[row],
                               case.reference(row, CONTINUATION[row, :4]),
                               atol=1e-5)


def test_chunk_at_per_row_offsets_equals_single_steps(case):
  """Rows at different offsets (1, 2, 3 tokens already fed) take a chunk of
  3 tokens at once: the logits equal the uncached ones at those positions."""
  pre = case.prefill(case.params, INPUTS, CACHE_LENGTH)
  seqs = np.concatenate([np.asarray(pre.start_token)[:, None], CONTINUATION],
                        axis=1)
  done = np.array([1, 2, 3])
  cache = pre.cache
  for t in range(3):  # row b feeds relative indices 0..done_b-1 (repeats ok)
    index = np.minimum(t, done - 1)[:, None]
    _, cache = case.extend(case.params, cache,
                           np.take_along_axis(seqs, index, 1),
                           (np.asarray(pre.start_pos)[:, None] + index
                            ).astype(np.int32))
  index = done[:, None] + np.arange(3)
  logits, _ = case.extend(case.params, cache,
                          np.take_along_axis(seqs, index, 1),
                          (np.asarray(pre.start_pos)[:, None] + index
                           ).astype(np.int32))
  for row in range(3):
    expected = case.reference(row, CONTINUATION[row, :6])
    np.testing.assert_allclose(logits[row], expected[index[row]], atol=1e-5)


def test_repeated_position_changes_nothing(case):
  """Feeding relative indices (0, 0, 1, 2) equals (0, 1, 2): the engine
  re-feeds a row's last token at the start of each iteration.

  Equal up to float32 rounding: a chunk of 4 tokens instead of 3 gives the
  matmuls other shapes, and XLA:CPU may tile and sum them in another order
  on another CPU (an AVX2-only AMD EPYC: logits near 9 differed by 5.7e-6,
  a cache entry by 1.3e-6; 2026-12-07). A wrong cache write or position
  moves them by far more than 1e-5."""
  pre = case.prefill(case.params, INPUTS, CACHE_LENGTH)
  start = np.asarray(pre.start_pos)[:, None]
  tokens = np.concatenate([np.asarray(pre.start_token)[:, None],
                           CONTINUATION[:, :2]], 1)
  plain, plain_cache = case.extend(case.params, pre.cache, tokens,
                                   (start + np.arange(3)).astype(np.int32))
  twice, twice_cache = case.extend(
      case.params, pre.cache, np.concatenate([tokens[:, :1], tokens], 1),
      (start + np.array([0, 0, 1, 2])).astype(np.int32))
  tol = dict(rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(twice[:, 1:], plain, **tol)
  np.testing.assert_allclose(twice[:, 0], plain[:, 0], **tol)
  for a, b in zip(jax.tree.leaves(plain_cache), jax.tree.leaves(twice_cache)):
    np.testing.assert_allclose(a, b, **tol)


def test_stale_slots_do_not_affect_logits(case):
  """After a 5-token draft, roll back to relative index 2 and scribble over
  every later slot: the next token's logits are those of the fresh
  sequence."""
  pre = case.prefill(case.params, INPUTS, CACHE_LENGTH)
  start = np.asarray(pre.start_pos)
  draft = np.concatenate([np.asarray(pre.start_token)[:, None],
                          CONTINUATION[:, :4]], 1)
  _, cache = case.extend(case.params, pre.cache, draft,
                         (start[:, None] + np.arange(5)).astype(np.int32))
  keep = start + 2  # slots <= start + 1 stay valid
  kvs = case.self_caches(cache)
  stale = np.arange(kvs[0].length)[None] >= keep[:, None]  # [B, S]
  cache = case.with_self_caches(cache, [
      layers.KVCache(jnp.where(stale[:, None, None, :], 1e3, kv.key),
                     jnp.where(stale[:, None, :, None], -5.0, kv.value))
      for kv in kvs])
  new = np.array([[60], [61], [62]], np.int32)
  logits, _ = case.extend(case.params, cache, new,
                          keep[:, None].astype(np.int32))
  for row in range(3):
    fresh = np.array([CONTINUATION[row, 0], 60 + row])
    np.testing.assert_allclose(logits[row, 0], case.reference(row, fresh)[2],
                               atol=1e-5)


def test_greedy_decode_equals_argmax_of_teacher_forced_pass(case):
  pre = case.prefill(case.params, INPUTS, CACHE_LENGTH)
  cache, tokens, pos = pre.cache, pre.start_token, pre.start_pos
  generated = []
  for _ in range(8):
    logits, cache = case.extend(case.params, cache, tokens[:, None],
                                pos[:, None])
    tokens, pos = jnp.argmax(logits[:, 0], -1).astype(jnp.int32), pos + 1
    generated.append(np.asarray(tokens))
  generated = np.stack(generated, axis=1)
  for row in range(3):
    teacher = case.reference(row, generated[row, :-1])
    np.testing.assert_array_equal(np.argmax(teacher, -1), generated[row])


def test_the_checks_see_a_corrupted_valid_slot(case):
  """Negative control: the same scribbling as in the stale-slot test, on a
  slot that IS visible (the start token's), changes the logits by far more
  than the tolerance, so the tests above can fail."""
  pre = case.prefill(case.params, INPUTS, CACHE_LENGTH)
  start = np.asarray(pre.start_pos)
  _, cache = case.extend(case.params, pre.cache,
                         np.asarray(pre.start_token)[:, None],
                         start[:, None].astype(np.int32))
  kvs = case.self_caches(cache)
  hit = np.arange(kvs[0].length)[None] == start[:, None]  # [B, S]
  cache = case.with_self_caches(cache, [
      layers.KVCache(jnp.where(hit[:, None, None, :], 1e3, kv.key),
                     jnp.where(hit[:, None, :, None], -5.0, kv.value))
      for kv in kvs])
  logits, _ = case.extend(case.params, cache, CONTINUATION[:, :1],
                          (start + 1)[:, None].astype(np.int32))
  expected = case.reference(0, CONTINUATION[0, :1])[1]
  assert np.abs(np.asarray(logits[0, 0]) - expected).max() > 1e-2
