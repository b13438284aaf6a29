"""Autoregressive and speculative decoding, each one jitted `lax.while_loop`.

Both loops run entirely on device: no host round trip per token or per step.
Each row of the batch moves at its own pace (ragged acceptance), keeps its own
position into the model caches and stops at its own EOS.

A row's decoder sequence is its model's `start_token` (relative index 0)
followed by the generated tokens (relative indices 1, 2, ...); the model-level
position of relative index i is `start_pos + i` (see `protocol.py`). Rolling
back rejected draft tokens only means that the next step writes at the row's
current length again.

Dimension letters: B batch, L input length, T max_decode_len, G gamma,
V vocabulary.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import flax
import jax
import jax.numpy as jnp

from specdec_jax import sampling
from specdec_jax import theory
from specdec_jax.decoding.protocol import ModelDef
from specdec_jax.decoding.stats import DecodeStats
from specdec_jax.tokens import EOS_ID


@flax.struct.dataclass
class Stream:
  """The per-row decoding position shared by all models of one loop.

  Attributes:
    tokens: int32 [B, T + G + 1] generated tokens; entries at or past
      `length` are scratch (overwritten later, zeroed in the result).
    length: int32 [B] number of tokens generated so far.
    done: bool [B] the row emitted EOS or reached T tokens.
  """

  tokens: jax.Array
  length: jax.Array
  done: jax.Array


@flax.struct.dataclass
class ModelCursor:
  """One model's cache and where its decoder sequence starts.

  Attributes:
    cache: the model's cache pytree (see `ModelDef.extend`).
    start_token: int32 [B] token at relative index 0.
    start_pos: int32 [B] model position of relative index 0.
    nonfinite: bool [B], True once any logit this model produced for the
      row was NaN or inf; None when the loop was built without the check.
  """

  cache: Any
  start_token: jax.Array
  start_pos: jax.Array
  nonfinite: jax.Array | None = None

  def token_at(self, stream: Stream, index: jax.Array) -> jax.Array:
    """Tokens at relative indices `index` [B, K] of each row ([B, K])."""
    gathered = jnp.take_along_axis(stream.tokens, jnp.maximum(index - 1, 0),
                                   axis=1)
    return jnp.where(index == 0, self.start_token[:, None], gathered)

  def extend(self, model: ModelDef, params, stream: Stream,
             index: jax.Array) -> tuple[jax.Array, "ModelCursor"]:
    """Feeds the tokens at relative indices `index` [B, K]; logits [B, K, V]."""
    tokens = self.token_at(stream, index)
    return self.extend_tokens(model, params, tokens, index)

  def extend_tokens(self, model: ModelDef, params, tokens: jax.Array,
                    index: jax.Array) -> tuple[jax.Array, "ModelCursor"]:
    positions = self.start_pos[:, None] + index
    logits, cache = model.extend(params, self.cache, tokens, positions)
    logits = logits.astype(jnp.float32)
    nonfinite = self.nonfinite
    if nonfinite is not None:
      # NaN or inf would otherwise turn into an arbitrary argmax or NaN
      # probabilities without a word. A sum is NaN or inf iff a term is (or
      # the finite terms overflow float32, which no sane logits do): one
      # add-reduction over logits that exist anyway (cost, measured:
      # docs/reliability.md).
      nonfinite = nonfinite | ~jnp.isfinite(jnp.sum(logits, axis=(1, 2)))
    return logits, self.replace(cache=cache, nonfinite=nonfinite)


@flax.struct.dataclass
class SpeculativeState:
  """Loop state of `speculative_generate` (every field per row but `step`).

  Attributes:
    step: int32 scalar, iterations so far (one target call each).
    stream: generated tokens, lengths, done flags.
    target: the target model's cursor.
    draft: the draft model's cursor. Its cache is valid up to relative index
      length - 1 (or length - 2 after a fully accepted step); each step starts
      by feeding indices (length - 1, length) so both cases are covered.
    stats: dict of per-row counters, the fields of `DecodeStats` that the
      loop accumulates.
  """

  step: jax.Array
  stream: Stream
  target: ModelCursor
  draft: ModelCursor
  stats: dict


@flax.struct.dataclass
class AutoregressiveState:
  """Loop state of `generate`: step, stream, the model's cursor, stats."""

  step: jax.Array
  stream: Stream
  model: ModelCursor
  stats: dict


def row_keys(seeds: jax.Array, rows: jax.Array) -> jax.Array:
  """One PRNG key per row: fold_in(key(seed_b), row_b) ([B] typed keys)."""
  return jax.vmap(lambda s, r: jax.random.fold_in(jax.random.key(s), r))(
      seeds, rows)


def _cursor(model: ModelDef, params, input_ids, num_positions,
            check_finite: bool = True) -> ModelCursor:
  prefill = model.prefill(params, input_ids, num_positions)
  nonfinite = None
  if check_finite:
    nonfinite = jnp.zeros((input_ids.shape[0],), jnp.bool_)
  return ModelCursor(cache=prefill.cache,
                     start_token=prefill.start_token.astype(jnp.int32),
                     start_pos=prefill.start_pos.astype(jnp.int32),
                     nonfinite=nonfinite)


def _write(buffer: jax.Array, start: jax.Array, values: jax.Array):
  """buffer[b, start_b : start_b + K] = values[b] for each row."""
  return jax.vmap(lambda buf, s, v: jax.lax.dynamic_update_slice(buf, v, (s,)))(
      buffer, start, values)


def _advance(stream: Stream, new_tokens: jax.Array, num_new: jax.Array,
             max_decode_len: int) -> tuple[Stream, jax.Array]:
  """Appends the first `num_new` [B] of `new_tokens` [B, K] to active rows.

  Truncates at the first EOS and at `max_decode_len`. Returns the new stream
  and the number of tokens each row really emitted.
  """
  k = new_tokens.shape[1]
  idx = jnp.arange(k)[None, :]
  is_eos = (new_tokens == EOS_ID) & (idx < num_new[:, None])
  first_eos = jnp.min(jnp.where(is_eos, idx, k), axis=1)
  emitted = jnp.minimum(num_new, first_eos + 1)
  emitted = jnp.minimum(emitted, max_decode_len - stream.length)
  emitted = jnp.where(stream.done, 0, emitted)
  length = stream.length + emitted
  done = stream.done | (first_eos < emitted) | (length >= max_decode_len)
  tokens = _write(stream.tokens, stream.length, new_tokens)
  # Rows already done keep their buffer as it was.
  tokens = jnp.where(stream.done[:, None], stream.tokens, tokens)
  return Stream(tokens=tokens, length=length, done=done), emitted


def _finish(stream: Stream, max_decode_len: int) -> jax.Array:
  """[B, T] tokens with 0 at and past each row's length."""
  tokens = stream.tokens[:, :max_decode_len]
  keep = jnp.arange(max_decode_len)[None, :] < stream.length[:, None]
  return jnp.where(keep, tokens, 0)


def _greedy_token(logits: jax.Array) -> jax.Array:
  """argmax (ties to the lowest id): what sampling a one-hot p returns."""
  return sampling.argmax(logits)


def _new_stream(batch: int, width: int) -> Stream:
  return Stream(tokens=jnp.zeros((batch, width), jnp.int32),
                length=jnp.zeros((batch,), jnp.int32),
                done=jnp.zeros((batch,), jnp.bool_))


# ----------------------------------------------------------------------------
# Autoregressive baseline.


@functools.lru_cache(maxsize=64)
def build_generate(model: ModelDef, max_decode_len: int,
                   sampler: sampling.SamplingConfig,
                   check_finite: bool = True) -> Callable:
  """The jitted baseline: (params, input_ids, seeds, rows) -> (tokens, stats).

  With `check_finite`, stats has `target_nonfinite` (bool [B]).
  """

  def run(params, input_ids, seeds, rows):
    batch = input_ids.shape[0]
    keys = row_keys(seeds, rows)
    state = AutoregressiveState(
        step=jnp.int32(0),
        stream=_new_stream(batch, max_decode_len + 1),
        model=_cursor(model, params, input_ids, max_decode_len + 1,
                      check_finite),
        stats={"target_calls": jnp.zeros((batch,), jnp.int32)})

    def cond(s: AutoregressiveState):
      return (s.step < max_decode_len) & ~jnp.all(s.stream.done)

    def body(s: AutoregressiveState):
      index = s.stream.length[:, None]
      logits, cursor = s.model.extend(model, params, s.stream, index)
      if sampler.greedy:
        token = _greedy_token(logits[:, 0])
      else:
        step_keys = jax.vmap(jax.random.fold_in, (0, None))(keys, s.step)
        token = jax.vmap(sampling.sample)(step_keys, sampler.probs(logits[:, 0]))
      active = ~s.stream.done
      stream, _ = _advance(s.stream, token[:, None], jnp.ones_like(token),
                           max_decode_len)
      stats = {"target_calls": s.stats["target_calls"] + active}
      return AutoregressiveState(step=s.step + 1, stream=stream, model=cursor,
                                 stats=stats)

    state = jax.lax.while_loop(cond, body, state)
    stats = DecodeStats(length=state.stream.length,
                        target_nonfinite=state.model.nonfinite, **state.stats)
    return _finish(state.stream, max_decode_len), stats

  return jax.jit(run)


# ----------------------------------------------------------------------------
# Speculative decoding.


@functools.lru_cache(maxsize=64)
def build_speculative(target: ModelDef, draft: ModelDef, gamma: int,
                      max_decode_len: int, sampler: sampling.SamplingConfig,
                      lenience: float = 1.0, record_trace: bool = False,
                      draft_sample: Callable = sampling.sample,
                      check_finite: bool = True) -> Callable:
  """The jitted speculative loop.

  Returns `run(target_params, draft_params, input_ids, seeds, rows) ->
  (tokens [B, T], stats)`; with `check_finite`, stats has
  `target_nonfinite` and `draft_nonfinite` (bool [B]).
  `draft_sample(key, q) -> token` exists so tests can plug in a deliberately
  wrong drafter (negative controls); everything else must use
  `sampling.sample`, which draws from exactly q.
  """
  width = max_decode_len + gamma + 1
  positions = jnp.arange(gamma + 1)

  # Greedy decoding needs no probabilities: with one-hot p and q, Algorithm 1
  # accepts a draft token iff it is the target's argmax and otherwise emits
  # that argmax, so argmax and a comparison give the same tokens without any
  # [V]-sized sampling work (the general path below is tested against this).
  fast_greedy = sampler.greedy and draft_sample is sampling.sample

  def propose(logits, key):
    """One draft token [B] from draft logits [B, V], and its q (or None)."""
    if fast_greedy:
      return _greedy_token(logits), None
    q = sampler.probs(logits)
    return jax.vmap(draft_sample)(key, q), q

  def draft_tokens(s: SpeculativeState, draft_params, step_keys):
    """Runs gamma draft steps: tokens [B, G], q [B, G, V] (or None), cursor."""
    n = s.stream.length
    first = jnp.stack([jnp.maximum(n - 1, 0), n], axis=1)
    logits, cursor = s.draft.extend(draft, draft_params, s.stream, first)
    x, q = propose(logits[:, -1], step_keys[:, 0])

    def one(carry, j):
      cursor, x_prev = carry
      logits, cursor = cursor.extend_tokens(draft, draft_params,
                                            x_prev[:, None], (n + j)[:, None])
      x, q = propose(logits[:, 0], step_keys[:, j])
      return (cursor, x), (x, q)

    (cursor, _), (xs, qs) = jax.lax.scan(one, (cursor, x),
                                         jnp.arange(1, gamma))
    xs = jnp.concatenate([x[:, None], jnp.moveaxis(xs, 0, 1)], axis=1)
    if not fast_greedy:
      q = jnp.concatenate([q[:, None], jnp.moveaxis(qs, 0, 1)], axis=1)
    return xs, q, cursor

  def verify(logits, xs, q, key):
    """Algorithm 1 on target logits [B, G+1, V]: (accepted [B], next [B],
    beta [B, G] = sum_x min(p, q) at each draft position)."""
    if fast_greedy:
      best = _greedy_token(logits)                     # [B, G+1]
      match = best[:, :gamma] == xs
      # Leading matches: the first mismatch's index (gamma if none).
      accepted = jnp.min(jnp.where(match, gamma, positions[None, :gamma]), 1)
      nxt = jnp.take_along_axis(best, accepted[:, None], axis=1)[:, 0]
      return accepted, nxt, match.astype(jnp.float32)
    p = sampler.probs(logits)
    accepted, nxt = sampling.speculative_accept(key, xs, q, p, lenience)
    return accepted, nxt, theory.acceptance_rate(p[:, :gamma], q)

  def run(target_params, draft_params, input_ids, seeds, rows):
    batch = input_ids.shape[0]
    keys = row_keys(seeds, rows)
    zeros = jnp.zeros((batch,), jnp.int32)
    stats = {
        "target_calls": zeros, "draft_calls": zeros,
        "accepted_tokens": zeros, "target_tokens": zeros,
        "accepted_histogram": jnp.zeros((batch, gamma + 1), jnp.int32),
        "alpha_sum": jnp.zeros((batch,), jnp.float32),
        "alpha_count": zeros,
    }
    if record_trace:
      stats["trace_draft"] = jnp.zeros((batch, max_decode_len, gamma),
                                       jnp.int32)
      stats["trace_accepted"] = jnp.full((batch, max_decode_len), -1,
                                         jnp.int32)
      stats["trace_next"] = jnp.zeros((batch, max_decode_len), jnp.int32)
    state = SpeculativeState(
        step=jnp.int32(0), stream=_new_stream(batch, width),
        target=_cursor(target, target_params, input_ids, width, check_finite),
        draft=_cursor(draft, draft_params, input_ids, width, check_finite),
        stats=stats)

    def cond(s: SpeculativeState):
      return (s.step < max_decode_len) & ~jnp.all(s.stream.done)

    def body(s: SpeculativeState):
      step_keys = jax.vmap(
          lambda k: jax.random.split(jax.random.fold_in(k, s.step), gamma + 1)
      )(keys)
      xs, q, draft_cursor = draft_tokens(s, draft_params, step_keys)
      n = s.stream.length
      # One target run scores the pending token and all gamma draft tokens.
      verify_tokens = jnp.concatenate(
          [s.target.token_at(s.stream, n[:, None]), xs], axis=1)
      logits, target_cursor = s.target.extend_tokens(
          target, target_params, verify_tokens, n[:, None] + positions)
      accepted, nxt, beta = verify(logits, xs, q, step_keys[:, gamma])
      new = jnp.concatenate([xs, jnp.zeros((batch, 1), jnp.int32)], axis=1)
      new = jnp.where(positions[None] == accepted[:, None], nxt[:, None], new)
      stream, emitted = _advance(s.stream, new, accepted + 1, max_decode_len)

      active = (~s.stream.done).astype(jnp.int32)
      # alpha: beta at every verified position whose prefix was accepted.
      counted = positions[None, :gamma] < jnp.minimum(accepted + 1,
                                                      gamma)[:, None]
      st = dict(s.stats)
      st["target_calls"] += active
      st["draft_calls"] += gamma * active
      st["accepted_tokens"] += jnp.minimum(accepted, emitted)
      st["target_tokens"] += (emitted > accepted).astype(jnp.int32)
      st["accepted_histogram"] += active[:, None] * jax.nn.one_hot(
          accepted, gamma + 1, dtype=jnp.int32)
      st["alpha_sum"] += active * jnp.sum(jnp.where(counted, beta, 0.0), 1)
      st["alpha_count"] += active * jnp.sum(counted, axis=1)
      if record_trace:
        at = jnp.where(active > 0, s.step, max_decode_len)  # OOB: dropped.
        rows_ = jnp.arange(batch)
        st["trace_draft"] = st["trace_draft"].at[rows_, at].set(
            xs, mode="drop")
        st["trace_accepted"] = st["trace_accepted"].at[rows_, at].set(
            accepted, mode="drop")
        st["trace_next"] = st["trace_next"].at[rows_, at].set(
            nxt, mode="drop")
      return SpeculativeState(step=s.step + 1, stream=stream,
                              target=target_cursor, draft=draft_cursor,
                              stats=st)

    state = jax.lax.while_loop(cond, body, state)
    st = state.stats
    stats = DecodeStats(
        length=state.stream.length,
        alpha=st["alpha_sum"] / jnp.maximum(st["alpha_count"], 1),
        tokens_per_target_call=state.stream.length / jnp.maximum(
            st["target_calls"], 1),
        target_nonfinite=state.target.nonfinite,
        draft_nonfinite=state.draft.nonfinite,
        **st)
    return _finish(state.stream, max_decode_len), stats

  return jax.jit(run)
