"""Drafters: what proposes the draft tokens of one speculative iteration.

The engine (`engine.py`) asks a drafter for a `Proposal`: draft tokens
placed on a static `TreeShape` (a chain of up to G tokens, the paper's
setup, or a token tree, `drafts/trees.py`), with the probabilities q they
were sampled from. The verifier scores every proposed node in one call and
one walk (`verify.walk`) decides. Every drafter has the interface of the
`Drafter` protocol (`protocol.py`, beside the model contract), which
declares what the host's checks, the memory model and the planner need;
`make_drafter` builds one per compiled loop and `contract.py` checks it.

This module has the plain one, `ModelDrafter` (one draft model run
autoregressively, the paper's setup), and the counters every drafter
shares; `drafts/` composes drafters (cascades, horizontal drafters), expands
trees and looks tokens up in the prompt. `docs/extending.md` writes a new
one through the protocol alone.

Cache validity ("refeed"). A drafter keeps its models' caches between
iterations. Its caller guarantees that the entries of relative indices below
length - refeed are still valid, so each propose starts by feeding the
refeed + 1 tokens at length - refeed .. length. The top-level drafter has
refeed 1 (after a fully accepted iteration the last draft token was never
fed); composite drafters hand their parts larger refeeds (see
`cascades.py`).

Dimension letters: B batch, G most tokens per proposal (a tree's depth), M
proposed nodes (G for a chain), I nodes with children, V vocabulary.
"""

from __future__ import annotations

from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp

from specdec_jax import sampling
from specdec_jax.decoding import acceptance
from specdec_jax.decoding import contract
from specdec_jax.decoding import stopping
from specdec_jax.decoding.cursor import ModelCursor
from specdec_jax.decoding.cursor import Stream
from specdec_jax.decoding.cursor import new_cursor
from specdec_jax.decoding.cursor import refeed_indices
from specdec_jax.decoding.protocol import chain_proposal
from specdec_jax.decoding.protocol import Drafter
from specdec_jax.decoding.protocol import DrafterBase
from specdec_jax.decoding.protocol import KeepFn
from specdec_jax.decoding.protocol import Levels
from specdec_jax.decoding.protocol import Model
from specdec_jax.decoding.protocol import ModelCall
from specdec_jax.decoding.protocol import ModelDef
from specdec_jax.decoding.protocol import Proposal  # noqa: F401  (public)

def level_stats(calls, alpha_sum=None, alpha_count=None) -> Levels:
  """`Levels` of calls [B, D]; alpha_sum / alpha_count [B, D - 1] (none
  when omitted: a single level)."""
  batch = calls.shape[0]
  empty = jnp.zeros((batch, 0), jnp.float32)
  return Levels(calls=calls.astype(jnp.int32),
                alpha_sum=empty if alpha_sum is None else alpha_sum,
                alpha_count=(empty.astype(jnp.int32) if alpha_count is None
                             else alpha_count.astype(jnp.int32)))


def verified_level(active, beta, counted, inner: Levels) -> Levels:
  """One verification's level counters, on top of its drafter's.

  The verifier (the target, or a cascade's middle model) ran once for each
  active row [B] and its alpha takes beta [B, G] at the `counted` [B, G]
  positions; `inner` are the counters of the drafter that proposed
  (`level_stats`, depth D). Returns calls [B, D + 1] and alpha_sum /
  alpha_count [B, D], the verifier's level first, zero for inactive rows.
  """
  act = active.astype(jnp.int32)[:, None]
  own_sum = jnp.sum(jnp.where(counted, beta, 0.0), axis=1)[:, None]
  own_count = jnp.sum(counted, axis=1)[:, None]
  return Levels(
      calls=act * jnp.concatenate([jnp.ones_like(act), inner.calls], axis=1),
      alpha_sum=act * jnp.concatenate([own_sum, inner.alpha_sum], axis=1),
      alpha_count=act * jnp.concatenate([own_count, inner.alpha_count],
                                        axis=1))


class ModelDrafter(DrafterBase):
  """One draft model run autoregressively for up to G tokens per row: a
  chain (`DrafterBase`) whose one model scores refeed + 1 tokens in its
  first call of an iteration and one in each next."""

  checks_finite = True

  def __init__(self, definition: ModelDef, gamma: int,
               sampler: sampling.SamplingConfig, refeed: int, rule: Any):
    self.definition = definition
    self.gamma = gamma
    self.sampler = sampler
    self.refeed = refeed
    self.rule = rule
    self.calls = (ModelCall((), definition, refeed + 1),)

  def __repr__(self) -> str:
    return (f"ModelDrafter({type(self.definition).__name__}, "
            f"gamma={self.gamma}, refeed={self.refeed})")

  def draw(self, key: jax.Array, q: jax.Array) -> jax.Array:
    """A token [] of q [V]: exactly the q the verification is handed."""
    return sampling.sample(key, q)

  def init(self, params, input_ids, num_positions,
           check_finite: bool = True) -> ModelCursor:
    return new_cursor(self.definition, params, input_ids, num_positions,
                      check_finite)

  def nonfinite(self, cursor: ModelCursor):
    """bool [B]: a logit of the draft was NaN or inf (None: not checked)."""
    return cursor.nonfinite

  def _sample(self, logits, key, need_conf):
    """One token [B] from logits [B, V], its q [B, V] (or None), conf [B].

    The logits and q are pinned to the draft's own layout (under the
    replicated rules of a replicated draft, whole on every device): else
    the partitioner may split q over `model` like the target's p that it
    meets in the verification, and every draft step would sample with
    collectives (seen in the TPU compiler's HLO for top-p).
    """
    logits = nn.with_logical_constraint(logits, ("batch", "vocab"))
    if not self.rule.uses_q:
      x = sampling.argmax(logits)
      conf = (jnp.max(jax.nn.softmax(logits, axis=-1), axis=-1) if need_conf
              else jnp.zeros(x.shape, jnp.float32))
      return x, None, conf
    q = nn.with_logical_constraint(self.sampler.probs(logits),
                                   ("batch", "vocab"))
    # The token too: else the partitioner may hand the draft's next step a
    # token still summed across the target's model axis (an all-reduce per
    # draft step, seen in the TPU compiler's HLO for top-p).
    x = nn.with_logical_constraint(jax.vmap(self.draw)(key, q), ("batch",))
    if self.sampler.greedy:
      conf = jnp.max(jax.nn.softmax(logits, axis=-1), axis=-1)
    else:
      conf = jnp.take_along_axis(q, x[:, None], axis=1)[:, 0]
    return x, q, conf

  def propose(self, params, cursor: ModelCursor, stream: Stream, keys,
              keep: KeepFn | None, limit: jax.Array):
    """Drafts for every row.

    Args:
      params: the draft's parameters.
      cursor: its cursor (cache valid below length - refeed).
      stream: the committed tokens and lengths.
      keys: [B, G] PRNG keys, one per draft position.
      keep: None drafts exactly G tokens (the paper's fixed gamma, the loop
        unchanged); else the stop rule's causal keep_going(tokens, conf).
      limit: int32 [B] in [1, G], the most tokens a row may propose.

    Returns:
      (Proposal, the new cursor, level stats).
    """
    d, gamma = self.definition, self.gamma
    n = stream.length
    logits, cursor = cursor.extend(d, params, stream,
                                   refeed_indices(n, self.refeed))
    need_conf = keep is not None
    x, q, conf = self._sample(logits[:, -1], keys[:, 0], need_conf)
    if keep is None:
      def one(carry, j):
        cursor, x_prev = carry
        logits, cursor = cursor.extend_tokens(d, params, x_prev[:, None],
                                              (n + j)[:, None])
        x, q, conf = self._sample(logits[:, 0], keys[:, j], need_conf)
        return (cursor, x), (x, q, conf)

      (cursor, _), (xs, qs, confs) = jax.lax.scan(one, (cursor, x),
                                                  jnp.arange(1, gamma))
      tokens = jnp.concatenate([x[:, None], jnp.moveaxis(xs, 0, 1)], axis=1)
      confs = jnp.concatenate([conf[:, None], jnp.moveaxis(confs, 0, 1)], 1)
      if q is not None:
        q = jnp.concatenate([q[:, None], jnp.moveaxis(qs, 0, 1)], axis=1)
      length = jnp.full(n.shape, gamma, jnp.int32)
    else:
      tokens, q, confs, cursor = self._adaptive(params, cursor, n, keys, keep,
                                                limit, x, q, conf)
      length = stopping.proposal_length(keep(tokens, confs), limit)
    return (chain_proposal(tokens, q, confs, length), cursor,
            level_stats(length[:, None]))

  def _adaptive(self, params, cursor, n, keys, keep, limit, x, q, conf):
    """Draft steps until every row stopped (a while_loop, not a scan)."""
    d, gamma = self.definition, self.gamma
    batch = n.shape[0]
    idx = jnp.arange(gamma)[None, :]
    tokens = jnp.zeros((batch, gamma), jnp.int32).at[:, 0].set(x)
    confs = jnp.zeros((batch, gamma), jnp.float32).at[:, 0].set(conf)
    if q is not None:
      q = jnp.zeros((batch, gamma) + q.shape[-1:], jnp.float32).at[:, 0].set(q)

    def running(j, tokens, confs):
      """Rows whose first j tokens all said keep going, below their limit."""
      go = keep(tokens, confs) | (idx >= j)
      return jnp.all(go, axis=1) & (j < limit)

    def cond(c):
      j, tokens, confs, _, _ = c
      return (j < gamma) & jnp.any(running(j, tokens, confs))

    def body(c):
      j, tokens, confs, q, cursor = c
      x_prev = jax.lax.dynamic_index_in_dim(tokens, j - 1, 1, keepdims=True)
      logits, cursor = cursor.extend_tokens(d, params, x_prev,
                                            (n + j)[:, None])
      key = jax.lax.dynamic_index_in_dim(keys, j, 1, keepdims=False)
      x, q_j, conf = self._sample(logits[:, 0], key, True)
      tokens = jax.lax.dynamic_update_index_in_dim(tokens, x, j, 1)
      confs = jax.lax.dynamic_update_index_in_dim(confs, conf, j, 1)
      if q is not None:
        q = jax.lax.dynamic_update_index_in_dim(q, q_j, j, 1)
      return j + 1, tokens, confs, q, cursor

    _, tokens, confs, q, cursor = jax.lax.while_loop(
        cond, body, (jnp.int32(1), tokens, confs, q, cursor))
    return tokens, q, confs, cursor


def make_drafter(definition, gamma: int, sampler: sampling.SamplingConfig,
                 refeed: int, rule: Any) -> Drafter:
  """The drafter of a draft definition: a model's `ModelDrafter`, or what
  a definition's `make_drafter(gamma, sampler, refeed, rule)` builds
  (`cascades.CascadeDef`, `HorizontalDef`, `TreeDef`, prompt lookup, or a
  drafter of your own, docs/extending.md); checked against the protocol
  (`contract.check_drafter`) before anything is traced."""
  if contract.is_model(definition):
    return ModelDrafter(definition, gamma, sampler, refeed, rule)
  contract.check_definition("draft", definition)
  return contract.check_drafter(
      definition.make_drafter(gamma, sampler, refeed, rule), definition)


def declared(draft: Model, gamma: int, sampler: Any = None,
             rule: Any = None) -> Drafter:
  """The top-level drafter of `draft` at `gamma`, built on the host for
  what it declares (shape, extra width, the models it calls); the default
  sampler and its rule unless given."""
  sampler = sampling.SamplingConfig() if sampler is None else sampler
  rule = acceptance.rule_for(sampler) if rule is None else rule
  return make_drafter(draft.definition, gamma, sampler, 1, rule)


def called_models(draft: Model, drafter: Drafter) -> list[tuple[ModelCall,
                                                                 Model]]:
  """Each `ModelCall` the drafter declares with its `Model` (the
  parameters at its path in the draft's, the draft's vocabulary), top
  first."""
  out = []
  for call in drafter.calls:
    params = draft.params
    for key in call.path:
      params = params[key]
    out.append((call, Model(call.definition, params, draft.vocab)))
  return out


def top_model(draft: Model, gamma: int) -> Model:
  """The model a draft mostly runs (the first it declares: a cascade's
  top model, a horizontal drafter's early one), or the draft itself when
  it runs none (prompt lookup)."""
  called = called_models(draft, declared(draft, gamma))
  return called[0][1] if called else draft


def slice_rows(buffer, start, size):
  """buffer[b, start_b : start_b + size] for each row."""
  return jax.vmap(lambda buf, s: jax.lax.dynamic_slice_in_dim(
      buf, s, size, 0))(buffer, start)
