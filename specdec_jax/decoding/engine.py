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

import contextlib
import functools
from typing import Any, Callable

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import sampling
from specdec_jax import sharding
from specdec_jax.decoding import drafters
from specdec_jax.decoding import trees
from specdec_jax.decoding import verify
from specdec_jax.decoding.cursor import ModelCursor
from specdec_jax.decoding.cursor import Stream
from specdec_jax.decoding.cursor import new_cursor as _cursor
from specdec_jax.decoding.cursor import write_rows as _write
from specdec_jax.decoding.protocol import ModelDef
from specdec_jax.decoding.stats import DecodeStats
from specdec_jax.tokens import EOS_ID


@flax.struct.dataclass
class SpeculativeState:
  """Loop state of `speculative_generate` (every field per row but `step`).

  Attributes:
    step: int32 scalar, iterations so far (one target call each).
    stream: generated tokens, lengths, done flags.
    target: the target model's cursor.
    draft: the drafter's state (`drafters.py`, `cascades.py`): for a draft
      model its cursor, whose cache is valid up to relative index length - 1
      (or length - 2 after a fully accepted step); each step starts by
      feeding indices (length - 1, length) so both cases are covered.
    stats: dict of per-row counters, the fields of `DecodeStats` that the
      loop accumulates.
    stop_state: the draft-length rule's per-row statistics ({} without one).
  """

  step: jax.Array
  stream: Stream
  target: ModelCursor
  draft: Any
  stats: dict
  stop_state: Any


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


def _new_stream(batch: int, width: int) -> Stream:
  return Stream(tokens=jnp.zeros((batch, width), jnp.int32),
                length=jnp.zeros((batch,), jnp.int32),
                done=jnp.zeros((batch,), jnp.bool_))


# ----------------------------------------------------------------------------
# Autoregressive baseline.


def jit_with_options(fn: Callable, compiler_options: tuple) -> Callable:
  """jax.jit with XLA compiler options given as sorted (name, value) pairs
  (hashable, so the builders' caches tell programs apart by them; the cost
  timings compile theirs the same way)."""
  return jax.jit(fn, compiler_options=dict(compiler_options) or None)


class CompiledLoop:
  """A jitted loop with its numbers bound: `loop(*args)` runs it and
  `loop.lower(*args)` lowers it, the numbers (temperature, top_p, lenience:
  float32 0-d arrays; under "stop" the draft-length rule's `values()`)
  passed as its last, traced argument. Loops that differ only in these
  numbers share one compiled program."""

  def __init__(self, jitted: Callable, values: dict):
    self.jitted = jitted
    self.values = values

  def __call__(self, *args):
    return self.jitted(*args, self.values)

  def lower(self, *args):
    return self.jitted.lower(*args, self.values)


def build_generate(model: ModelDef, max_decode_len: int,
                   sampler: sampling.SamplingConfig,
                   check_finite: bool = True,
                   compiler_options: tuple = ()) -> CompiledLoop:
  """The jitted baseline: (params, input_ids, seeds, rows) -> (tokens, stats).

  With `check_finite`, stats has `target_nonfinite` (bool [B]).
  `compiler_options`: XLA options of the program, ((name, value), ...).
  Compiled once per `sampler.static()`: the temperature and top_p are
  traced inputs (top_k stays static: it is a shape of `lax.top_k`).
  """
  return CompiledLoop(
      _build_generate(model, max_decode_len, sampler.static(),
                      bool(check_finite), tuple(compiler_options)),
      sampler.values())


@functools.lru_cache(maxsize=64)
def _build_generate(model, max_decode_len, static_sampler, check_finite,
                    compiler_options):

  def run(params, input_ids, seeds, rows, values):
    sampler = static_sampler.traced(values)
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
        token = sampling.argmax(logits[:, 0])
      else:
        step_keys = jax.vmap(jax.random.fold_in, (0, None))(keys, s.step)
        token = jax.vmap(sampling.sample)(step_keys,
                                          sampler.probs(logits[:, 0]))
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

  return jit_with_options(run, compiler_options)


# ----------------------------------------------------------------------------
# Speculative decoding.


def verify_widths(gamma: int) -> tuple[int, ...]:
  """Proposal lengths the adaptive loop compiles a target call for: every
  length up to 8, beyond that 1, 2, 4, ... below gamma, and gamma. Each
  iteration verifies at the smallest one covering its longest proposal (k
  tokens are verified in one target call of width k + 1)."""
  if gamma <= 8:
    return tuple(range(1, gamma + 1))
  widths, w = [], 1
  while w < gamma:
    widths.append(w)
    w *= 2
  return tuple(widths) + (gamma,)


def build_speculative(target: ModelDef, draft: Any, gamma: int,
                      max_decode_len: int, sampler: sampling.SamplingConfig,
                      lenience: float = 1.0, record_trace: bool = False,
                      draft_sample: Callable | None = None,
                      check_finite: bool = True,
                      draft_stop: Any = None,
                      compiler_options: tuple = (),
                      draft_replicated: bool = False) -> Callable:
  """The jitted speculative loop, cached by its (normalised) settings.

  Returns `run(target_params, draft_params, input_ids, seeds, rows) ->
  (tokens [B, T], stats)`; with `check_finite`, stats has
  `target_nonfinite` and `draft_nonfinite` (bool [B]). `draft` is a
  ModelDef, a `cascades.CascadeDef` or `horizontal.HorizontalDef`.
  `draft_stop` is None (every iteration proposes exactly gamma tokens: the
  paper's loop, unchanged) or a rule of `stopping.py` (gamma is then the most
  tokens per iteration; the target verifies at the smallest of
  `verify_widths(gamma)` covering the longest proposal, chosen on device);
  only the rule's `static()` keys the cache, its numbers are traced (see
  `stopping.py`), so a threshold calibration compiles once.
  `draft_sample(key, q) -> token` exists so tests can plug in a deliberately
  wrong drafter (negative controls); None (everything else) is
  `sampling.sample`, which draws from exactly q, and allows the fast greedy
  path (`verify.fast_greedy`). `compiler_options`: XLA
  options of the program, ((name, value), ...). `draft_replicated`: the
  draft's parameters are whole on every device, so its activations and
  caches are traced under `sharding.replicated_rules` (rows over `data`,
  nothing over `model`) and its steps need no collective.
  """
  values = dict(sampler.values(),
                lenience=np.float32(sampling.validate_lenience(lenience)),
                stop={} if draft_stop is None else draft_stop.values())
  return CompiledLoop(
      _build_speculative(target, draft, gamma, max_decode_len,
                         sampler.static(), bool(record_trace), draft_sample,
                         bool(check_finite),
                         None if draft_stop is None else draft_stop.static(),
                         tuple(compiler_options), bool(draft_replicated)),
      values)


@functools.lru_cache(maxsize=64)
def _build_speculative(target, draft, gamma, max_decode_len, static_sampler,
                       record_trace, draft_sample, check_finite,
                       static_rule, compiler_options, draft_replicated):
  offsets = jnp.arange(gamma + 1)  # of the verified tokens, from n

  fast = verify.fast_greedy(static_sampler, draft_sample)
  tree = trees.shape_of(draft)
  # Its sizes; `run` builds it again around the traced numbers.
  drafter = drafters.make_drafter(draft, gamma, static_sampler, 1,
                                  draft_sample, fast)

  def draft_rules():
    """Where the draft runs: a replicated draft's constraints must not name
    the model axis, or each of its steps would split its activations and
    gather them back (all-reduces in the inner loop)."""
    if draft_replicated:
      return nn.logical_axis_rules(sharding.replicated_rules())
    return contextlib.nullcontext()

  width = max_decode_len + gamma + 1 + drafter.extra_width
  widths = (gamma,) if static_rule is None else verify_widths(gamma)

  def target_call(cursor: ModelCursor, target_params, tokens, index,
                  longest):
    """Target logits [B, G+1, V] of the verified tokens [B, G+1], at the
    smallest compiled width covering `longest` proposed tokens."""
    if len(widths) == 1:
      return cursor.extend_tokens(target, target_params, tokens, index)

    def branch(w):
      def call(cursor):
        logits, cursor = cursor.extend_tokens(target, target_params,
                                              tokens[:, :w + 1],
                                              index[:, :w + 1])
        return jnp.pad(logits, ((0, 0), (0, gamma - w), (0, 0))), cursor
      return call

    choice = jnp.sum(jnp.asarray(widths) < longest)
    return jax.lax.switch(choice, [branch(w) for w in widths], cursor)

  def _tree_step(s: SpeculativeState, drafter, target_params, draft_params,
                 step_keys, sampler):
    """One iteration's drafting and verification with a token tree
    (`trees.py`): the draft proposes the tree, the target scores all its
    nodes in one call, the walk decides, and both caches keep the accepted
    path. Returns what the chain's code has at the same point: the walked
    path as a chain proposal of `gamma` (the depth) tokens, the target's
    and the draft's new states, the verdict, the rank accepted at each
    depth and the draft's level stats."""
    n = s.stream.length
    tree_prop, draft_state, level = _in(
        draft_rules(), drafter.propose, draft_params, s.draft, s.stream,
        step_keys[:, :gamma])
    tokens = tree_prop.tokens.at[:, 0].set(
        s.target.token_at(s.stream, n[:, None])[:, 0])
    logits, target_cursor = trees.feed(s.target, target, target_params,
                                       tokens, n, tree,
                                       np.arange(tree.verified))
    verdict, path, rank, tested = verify.verify_tree(
        logits, tree_prop, tree, step_keys[:, gamma], sampler, fast=fast,
        verifier=drafter.verifier)
    target_cursor = trees.keep_path(target_cursor, target, n, path)
    draft_state = _in(draft_rules(), drafter.keep, draft_state, n, path)
    batch = n.shape[0]
    # The walked path as a chain proposal (for the counters and traces):
    # its accepted tokens, then the first candidate the walk rejected.
    depth = jnp.arange(gamma)[None, :]
    stop = jnp.take_along_axis(
        jnp.concatenate([jnp.zeros_like(path[:, :1]), path], axis=1),
        verdict.accepted[:, None], axis=1)
    first = jnp.take_along_axis(tree_prop.tokens, jnp.asarray(
        tree.children[:, 0])[stop], axis=1)
    tokens = jnp.where(depth < verdict.accepted[:, None],
                       verdict.tokens[:, :gamma],
                       jnp.where(depth == verdict.accepted[:, None], first, 0))
    prop = drafters.Proposal(
        tokens=tokens, probs=None,
        conf=jnp.zeros((batch, gamma), jnp.float32),
        length=jnp.full((batch,), gamma, jnp.int32))
    return prop, target_cursor, draft_state, verdict, rank, tested, level

  def run(target_params, draft_params, input_ids, seeds, rows, values):
    sampler = static_sampler.traced(values)
    lenience = values["lenience"]
    rule = (None if static_rule is None
            else static_rule.traced(values["stop"]))
    drafter = drafters.make_drafter(draft, gamma, sampler, 1, draft_sample,
                                    fast)
    batch = input_ids.shape[0]
    keys = row_keys(seeds, rows)
    stats = _initial_stats(batch, gamma, drafter.depth, max_decode_len,
                           record_trace,
                           None if tree is None else tree.max_children)
    state = SpeculativeState(
        step=jnp.int32(0), stream=_new_stream(batch, width),
        target=_cursor(target, target_params, input_ids, width, check_finite),
        draft=_in(draft_rules(), drafter.init, draft_params, input_ids,
                  width, check_finite),
        stats=stats, stop_state={} if rule is None else rule.init(batch))

    def cond(s: SpeculativeState):
      return (s.step < max_decode_len) & ~jnp.all(s.stream.done)

    def body(s: SpeculativeState):
      step_keys = jax.vmap(
          lambda k: jax.random.split(jax.random.fold_in(k, s.step), gamma + 1)
      )(keys)
      n = s.stream.length
      if rule is None:
        keep, limit = None, jnp.full((batch,), gamma, jnp.int32)
      else:
        keep = lambda t, c: rule.keep_going(t, c, s.stop_state)
        # A proposal past the row's last token is wasted; done rows stop at 1.
        limit = jnp.clip(max_decode_len - n - 1, 1, gamma)
        limit = jnp.where(s.stream.done, 1, limit)
      if tree is None:
        prop, draft_state, level = _in(
            draft_rules(), drafter.propose, draft_params, s.draft, s.stream,
            step_keys[:, :gamma], keep, limit)
        # One target run scores the pending token and the proposed tokens.
        verify_tokens = jnp.concatenate(
            [s.target.token_at(s.stream, n[:, None]), prop.tokens], axis=1)
        longest = jnp.max(jnp.where(s.stream.done, 1, prop.length))
        logits, target_cursor = target_call(s.target, target_params,
                                            verify_tokens,
                                            n[:, None] + offsets, longest)
        verdict = verify.verify(logits, prop, step_keys[:, gamma], sampler,
                                lenience=lenience, fast=fast)
        rank = tested = None
      else:
        (prop, target_cursor, draft_state, verdict, rank, tested,
         level) = _tree_step(s, drafter, target_params, draft_params,
                             step_keys, sampler)
      stream, emitted = _advance(s.stream, verdict.tokens, verdict.count,
                                 max_decode_len)
      active = ~s.stream.done
      # alpha and the counters: beta at every verified position emitted.
      counted = verify.counted_positions(emitted, prop.length, gamma)
      if tested is not None:  # a tree's walk that ended above its depth
        counted = counted & tested
      st = _count_iteration(s.stats, s.step, active, prop, verdict, emitted,
                            counted, level, rank)
      stop_state = s.stop_state
      if rule is not None:
        stop_state = rule.update(stop_state, prop.conf, verdict.accept_prob,
                                 counted)
      return SpeculativeState(step=s.step + 1, stream=stream,
                              target=target_cursor, draft=draft_state,
                              stats=st, stop_state=stop_state)

    state = jax.lax.while_loop(cond, body, state)
    st = state.stats
    stats = DecodeStats(
        length=state.stream.length,
        alpha=st["alpha_sum"] / jnp.maximum(st["alpha_count"], 1),
        level_alpha=jnp.where(
            st["level_alpha_count"] > 0,
            st["level_alpha_sum"] / jnp.maximum(st["level_alpha_count"], 1),
            jnp.nan),
        tokens_per_target_call=state.stream.length / jnp.maximum(
            st["target_calls"], 1),
        target_nonfinite=state.target.nonfinite,
        draft_nonfinite=drafter.nonfinite(state.draft),
        stop_state=state.stop_state or None,
        **st)
    return _finish(state.stream, max_decode_len), stats

  return jit_with_options(run, compiler_options)


def _in(context, fn, *args):
  """fn(*args) inside `context`."""
  with context:
    return fn(*args)


def _initial_stats(batch: int, gamma: int, depth: int, max_decode_len: int,
                   record_trace: bool,
                   tree_width: int | None = None) -> dict[str, jax.Array]:
  """The per-row counters of the speculative loop, at zero: the fields of
  `DecodeStats` it accumulates (depth: draft levels below the target), and
  with `record_trace` the per-iteration trace (-1: no iteration); with a
  token tree of at most `tree_width` children a node, its rank
  histogram."""
  zeros = jnp.zeros((batch,), jnp.int32)
  stats = {
      "target_calls": zeros, "draft_calls": zeros,
      "accepted_tokens": zeros, "target_tokens": zeros,
      "accepted_histogram": jnp.zeros((batch, gamma + 1), jnp.int32),
      "proposal_histogram": jnp.zeros((batch, gamma + 1), jnp.int32),
      "alpha_sum": jnp.zeros((batch,), jnp.float32),
      "alpha_count": zeros,
      "level_calls": jnp.zeros((batch, depth + 1), jnp.int32),
      "level_alpha_sum": jnp.zeros((batch, depth), jnp.float32),
      "level_alpha_count": jnp.zeros((batch, depth), jnp.int32),
  }
  if tree_width is not None:
    stats["rank_histogram"] = jnp.zeros((batch, gamma, tree_width + 1),
                                        jnp.int32)
  if record_trace:
    stats["trace_draft"] = jnp.zeros((batch, max_decode_len, gamma),
                                     jnp.int32)
    stats["trace_accepted"] = jnp.full((batch, max_decode_len), -1, jnp.int32)
    stats["trace_next"] = jnp.zeros((batch, max_decode_len), jnp.int32)
    stats["trace_proposed"] = jnp.zeros((batch, max_decode_len), jnp.int32)
  return stats


def _count_iteration(stats: dict[str, jax.Array], step: jax.Array,
                     active: jax.Array, prop: drafters.Proposal,
                     verdict: verify.Verdict, emitted: jax.Array,
                     counted: jax.Array,
                     level: dict[str, jax.Array],
                     rank: jax.Array | None = None) -> dict[str, jax.Array]:
  """`stats` after one iteration, counted for the rows still decoding.

  Args:
    stats: the counters so far (`_initial_stats`).
    step: int32 scalar, this iteration's index.
    active: bool [B], rows not done before this iteration.
    prop: the draft's proposal (tokens [B, G], length [B]).
    verdict: the verification (`verify.verify`).
    emitted: int [B], tokens the row's output grew by (fewer than
      accepted + 1 where it reached EOS or the length limit).
    counted: bool [B, G], positions whose beta enters alpha
      (`verify.counted_positions`: only emitted ones).
    level: the drafter's per-level "calls", "alpha_sum" and "alpha_count"
      (cascades; [B, depth]).
    rank: int32 [B, G] with a token tree: the rank of the child accepted at
      each depth walked (the tree's widest k where none was), counted at
      the `counted` depths.
  """
  accepted, nxt, beta = verdict.accepted, verdict.next, verdict.beta
  # Draft tokens that reached the output (none after an accepted EOS).
  used = jnp.minimum(accepted, emitted)
  gamma = prop.tokens.shape[1]
  act = active.astype(jnp.int32)
  levels = drafters.verified_level(active, beta, counted, level)
  increments = {
      "target_calls": act,
      "draft_calls": levels["calls"][:, 1],
      "accepted_tokens": act * used,
      "target_tokens": act * (emitted > accepted).astype(jnp.int32),
      "accepted_histogram": act[:, None] * jax.nn.one_hot(
          used, gamma + 1, dtype=jnp.int32),
      "proposal_histogram": act[:, None] * jax.nn.one_hot(
          prop.length, gamma + 1, dtype=jnp.int32),
      "alpha_sum": levels["alpha_sum"][:, 0],
      "alpha_count": levels["alpha_count"][:, 0],
      "level_calls": levels["calls"],
      "level_alpha_sum": levels["alpha_sum"],
      "level_alpha_count": levels["alpha_count"],
  }
  if rank is not None:
    width = stats["rank_histogram"].shape[-1]
    increments["rank_histogram"] = (
        counted[..., None] * jax.nn.one_hot(rank, width, dtype=jnp.int32))
  stats = dict(stats)
  for name, increment in increments.items():
    stats[name] = stats[name] + increment
  if "trace_draft" in stats:
    max_decode_len = stats["trace_next"].shape[1]
    at = jnp.where(active, step, max_decode_len)  # Out of bounds: dropped.
    rows = jnp.arange(act.shape[0])
    for name, value in (("trace_draft", prop.tokens),
                        ("trace_accepted", accepted), ("trace_next", nxt),
                        ("trace_proposed", prop.length)):
      stats[name] = stats[name].at[rows, at].set(value, mode="drop")
  return stats


build_speculative.cache_info = _build_speculative.cache_info
build_generate.cache_info = _build_generate.cache_info
