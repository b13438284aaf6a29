"""Prompt lookup: a draft that copies from the input, with no draft model.

Summaries and translations repeat spans of their input. After each
iteration the drafter takes the last `ngram` generated tokens, finds their
latest occurrence in the row's input ids, and proposes the up to G tokens
that follow it there. Its q is a point mass on each proposed token, so the
verification accepts token x with probability p(x) (the target's argmax
only, when greedy) and on a rejection draws from norm(max(0, p - q)): the
output is exactly the target's, whatever the lookup finds. A row with no
match proposes one token (its last one, repeated), which costs a single
extra verified position.

  draft = sd.prompt_lookup(target, ngram=2)
  sd.speculative_generate(target, draft, ids, gamma=4, max_decode_len=64)

It uses nothing but the drafter protocol (`decoding/protocol.py`);
docs/extending.md walks through it.

Dimension letters: B batch, L input length, G most tokens per proposal,
V vocabulary.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from specdec_jax.decoding import protocol
from specdec_jax.decoding import stopping


@dataclasses.dataclass(frozen=True)
class PromptLookupDef:
  """The draft's definition: hashable and parameter-free (a jit key)."""

  vocab_size: int
  ngram: int = 2
  max_input_len = None  # any input length

  def make_drafter(self, gamma, sampler, refeed, rule):
    del sampler, refeed  # no model: nothing to sample, nothing cached
    return PromptLookup(self, gamma, rule)


class PromptLookup(protocol.DrafterBase):
  """The drafter (`protocol.Drafter`); its state is the input ids [B, L].
  `DrafterBase` declares the rest: a chain of `gamma` tokens, no model
  called (so no logits to check for NaN), a commit that keeps the state."""

  def __init__(self, definition: PromptLookupDef, gamma: int, rule):
    self.ngram, self.vocab_size = definition.ngram, definition.vocab_size
    self.gamma, self.rule = gamma, rule

  def init(self, params, input_ids, num_positions, check_finite=True):
    del params, num_positions, check_finite
    return input_ids.astype(jnp.int32)

  def propose(self, params, prompt, stream, keys, keep, limit):
    k, gamma = self.ngram, self.gamma
    batch, input_len = prompt.shape
    n = stream.length
    # The last k generated tokens; -1 (never in the input) before the k-th.
    at = n[:, None] - k + jnp.arange(k)[None, :]
    tail = jnp.where(at >= 0, jnp.take_along_axis(
        stream.tokens, jnp.maximum(at, 0), axis=1), -1)
    # Every window of k input tokens with a token after it, [B, L - k, k].
    starts = jnp.arange(max(input_len - k, 0))
    windows = prompt[:, starts[:, None] + jnp.arange(k)[None, :]]
    match = jnp.all(windows == tail[:, None, :], axis=-1)
    latest = jnp.max(jnp.where(match, starts[None, :], -1), axis=1,
                     initial=-1)
    src = latest[:, None] + k + jnp.arange(gamma)[None, :]
    tokens = jnp.take_along_axis(prompt, jnp.clip(src, 0, input_len - 1), 1)
    # Copy up to the input's end or its padding (id 0).
    found = (latest[:, None] >= 0) & (src < input_len) & (tokens > 0)
    copied = jnp.sum(jnp.cumprod(found.astype(jnp.int32), axis=1), axis=1)
    last = jnp.take_along_axis(stream.tokens, jnp.maximum(n - 1, 0)[:, None],
                               axis=1)
    tokens = jnp.where(copied[:, None] > 0, tokens, last)
    length = jnp.clip(copied, 1, limit)
    conf = jnp.ones((batch, gamma), jnp.float32)  # q(x) = 1
    if keep is not None:  # a stop rule's say, on the same terms as a model's
      length = jnp.minimum(length, stopping.proposal_length(
          keep(tokens, conf), limit))
    probs = (jax.nn.one_hot(tokens, self.vocab_size, dtype=jnp.float32)
             if self.rule.uses_q else None)
    empty = jnp.zeros((batch, 0), jnp.float32)
    levels = protocol.Levels(calls=jnp.zeros((batch, 1), jnp.int32),
                             alpha_sum=empty,
                             alpha_count=empty.astype(jnp.int32))
    return (protocol.chain_proposal(tokens, probs, conf, length), prompt,
            levels)


def prompt_lookup(target: protocol.Model, ngram: int = 2) -> protocol.Model:
  """A prompt-lookup draft for `target` (its vocabulary size and
  vocabulary), matching the last `ngram` generated tokens (>= 1)."""
  if isinstance(ngram, bool) or not isinstance(ngram, int) or ngram < 1:
    raise ValueError(f"prompt_lookup: ngram must be an int >= 1, got "
                     f"{ngram!r}.")
  return protocol.Model(PromptLookupDef(target.vocab_size, ngram), {},
                        target.vocab)
