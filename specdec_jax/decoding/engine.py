"""Autoregressive and speculative decoding, each one jitted `lax.while_loop`.

The speculative loop's body is one `step`, read top to bottom:
`propose` (the drafter), `score` (one target call over every proposed
token), `accept` (one walk with the acceptance rule, `verify.walk`),
`commit` (caches keep the accepted path), `advance` (the output grows) and
`count` (the counters of `stats.Counters`). Each is a module-level
function of the typed loop state; what a loop is compiled for is one
frozen `LoopConfig`.

Both loops run entirely on device: no host round trip per token or per step.
Each row of the batch moves at its own pace (ragged acceptance), keeps its own
position into the model caches and stops at its own first stop id (EOS
by default; `LoopConfig.stop_ids`).

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
import dataclasses
import functools
from typing import Any, Callable

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import sampling
from specdec_jax import sharding
from specdec_jax.decoding import acceptance
from specdec_jax.decoding import contract
from specdec_jax.decoding import drafters
from specdec_jax.decoding import stopping
from specdec_jax.decoding import verify
from specdec_jax.decoding import widths
from specdec_jax.decoding.cursor import ModelCursor
from specdec_jax.decoding.cursor import Stream
from specdec_jax.decoding.cursor import new_cursor as _cursor
from specdec_jax.decoding.protocol import Drafter
from specdec_jax.decoding.protocol import Levels
from specdec_jax.decoding.protocol import ModelDef
from specdec_jax.decoding.protocol import Proposal
from specdec_jax.decoding.stats import Counters
from specdec_jax.decoding.stats import DecodeStats
from specdec_jax.decoding.stats import Iteration
from specdec_jax.tokens import DEFAULT_STOP_IDS
from specdec_jax.tokens import is_stop


@flax.struct.dataclass
class SpeculativeState:
  """Loop state of the speculative loop (every field per row but `step`).

  Attributes:
    step: int32 scalar, iterations so far (one target call each).
    stream: generated tokens [B, T'], lengths [B], done flags [B].
    target: the target model's cursor (its cache and per-row start).
    draft: the drafter's state (`Drafter`): for a draft model its
      cursor, whose cache is valid up to relative index length - 1 (or
      length - 2 after a fully accepted step); each step starts by feeding
      indices (length - 1, length) so both cases are covered.
    counters: the `stats.Counters` so far.
    stop_state: the draft-length rule's per-row statistics (a pytree of
      [B, ...] arrays; empty without a rule).
  """

  step: jax.Array
  stream: Stream
  target: ModelCursor
  draft: Any
  counters: Counters
  stop_state: Any


@flax.struct.dataclass
class AutoregressiveState:
  """Loop state of `generate`.

  Attributes:
    step: int32 scalar, tokens generated so far (one model call each).
    stream: generated tokens [B, T + 1], lengths [B], done flags [B].
    model: the model's cursor.
    target_calls: int32 [B], calls while the row was not done.
  """

  step: jax.Array
  stream: Stream
  model: ModelCursor
  target_calls: jax.Array


def row_keys(seeds: jax.Array, rows: jax.Array) -> jax.Array:
  """One PRNG key per row: fold_in(key(seed_b), row_b) ([B] typed keys)."""
  return jax.vmap(lambda s, r: jax.random.fold_in(jax.random.key(s), r))(
      seeds, rows)


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
                   compiler_options: tuple = (),
                   stop_ids: tuple = DEFAULT_STOP_IDS) -> CompiledLoop:
  """The jitted baseline: (params, input_ids, seeds, rows) -> (tokens, stats).

  With `check_finite`, stats has `target_nonfinite` (bool [B]).
  `compiler_options`: XLA options of the program, ((name, value), ...).
  `stop_ids`: a row ends after the first of these ids it emits (static;
  `checks.check_stop_ids` validates them).
  Compiled once per `sampler.static()`: the temperature and top_p are
  traced inputs (top_k stays static: it is a shape of `lax.top_k`).
  """
  return CompiledLoop(
      _build_generate(model, max_decode_len, sampler.static(),
                      bool(check_finite), tuple(compiler_options),
                      tuple(stop_ids)),
      sampler.values())


@functools.lru_cache(maxsize=64)
def _build_generate(model, max_decode_len, static_sampler, check_finite,
                    compiler_options, stop_ids):

  def run(params, input_ids, seeds, rows, values):
    sampler = static_sampler.traced(values)
    batch = input_ids.shape[0]
    keys = row_keys(seeds, rows)
    state = AutoregressiveState(
        step=jnp.int32(0),
        stream=Stream.empty(batch, max_decode_len + 1, stop_ids),
        model=_cursor(model, params, input_ids, max_decode_len + 1,
                      check_finite),
        target_calls=jnp.zeros((batch,), jnp.int32))

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
      stream, _ = s.stream.advance(token[:, None], jnp.ones_like(token),
                                   max_decode_len)
      return AutoregressiveState(step=s.step + 1, stream=stream, model=cursor,
                                 target_calls=s.target_calls + active)

    state = jax.lax.while_loop(cond, body, state)
    stats = DecodeStats(length=state.stream.length,
                        target_calls=state.target_calls,
                        target_nonfinite=state.model.nonfinite)
    return state.stream.finished(max_decode_len), stats

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


@dataclasses.dataclass(frozen=True)
class LoopConfig:
  """What one compiled speculative loop is compiled for (its cache key).

  Attributes:
    target: the target's `ModelDef`.
    draft: the draft's definition (a ModelDef, `cascades.CascadeDef`,
      `horizontal.HorizontalDef`, `trees.TreeDef`, prompt lookup, or any
      definition with a `make_drafter` method, docs/extending.md).
    gamma: the most draft tokens per iteration (a tree's depth).
    max_decode_len: T, the most tokens generated per row.
    sampler: `SamplingConfig.static()`: its numbers are traced.
    rule: the acceptance rule (`acceptance.AcceptanceRule`), or None for
      `acceptance.rule_for`'s default (whose lenience is traced).
    stop: a draft-length rule's key (`stopping.split`), or None.
    record_trace: also record the per-iteration `stats.Trace`.
    check_finite: flag NaN or inf logits per row.
    compiler_options: XLA options, sorted ((name, value), ...).
    draft_replicated: the draft's parameters are whole on every device, so
      its activations and caches are traced under
      `sharding.replicated_rules` (no collective per draft step).
    stop_ids: a row ends after the first of these ids it emits (the
      stream's `stop_ids`; drafters read them there); a stop rule's
      proposal also ends after one.
  """

  target: Any
  draft: Any
  gamma: int
  max_decode_len: int
  sampler: sampling.SamplingConfig
  rule: Any = None
  stop: Any = None
  record_trace: bool = False
  check_finite: bool = True
  compiler_options: tuple = ()
  draft_replicated: bool = False
  stop_ids: tuple = DEFAULT_STOP_IDS

  def drafter(self, sampler: Any = None,
              rule: Any = None) -> Drafter:
    """The top-level drafter (sampler and rule: traced ones in a loop)."""
    sampler = self.sampler if sampler is None else sampler
    if rule is None:
      rule = self.rule if self.rule is not None else acceptance.rule_for(
          sampler)
    return drafters.make_drafter(self.draft, self.gamma, sampler, 1, rule)

  def draft_rules(self):
    """Where the draft runs: a replicated draft's constraints must not name
    the model axis, or each of its steps would split its activations and
    gather them back (all-reduces in the inner loop)."""
    if self.draft_replicated:
      return nn.logical_axis_rules(sharding.replicated_rules())
    return contextlib.nullcontext()


@dataclasses.dataclass(frozen=True)
class Loop:
  """One traced loop's settings: its config, with the numbers of this call
  (traced) in the sampler, the acceptance rule and the stop rule, and the
  drafter built from them."""

  config: LoopConfig
  sampler: Any
  rule: Any
  stop: Any
  drafter: Drafter

  @classmethod
  def trace(cls, config: LoopConfig, values: dict) -> "Loop":
    sampler = config.sampler.traced(values)
    rule = config.rule
    if rule is None:
      rule = acceptance.rule_for(sampler, values["lenience"])
    stop = None if config.stop is None else stopping.bind(config.stop,
                                                          values["stop"])
    return cls(config, sampler, rule, stop, config.drafter(sampler, rule))

  @property
  def width(self) -> int:
    """Positions of the stream and cache buffers."""
    c = self.config
    return c.max_decode_len + c.gamma + 1 + self.drafter.extra_width


def build_speculative(target: ModelDef, draft: Any, gamma: int,
                      max_decode_len: int, sampler: sampling.SamplingConfig,
                      lenience: float = 1.0, record_trace: bool = False,
                      check_finite: bool = True,
                      draft_stop: Any = None,
                      compiler_options: tuple = (),
                      draft_replicated: bool = False,
                      stop_ids: tuple = DEFAULT_STOP_IDS,
                      rule: Any = None) -> CompiledLoop:
  """The jitted speculative loop, cached by its `LoopConfig`.

  Returns `run(target_params, draft_params, input_ids, seeds, rows) ->
  (tokens [B, T], stats)`; with `check_finite`, stats has
  `target_nonfinite` and `draft_nonfinite` (bool [B]). `draft_stop` is None
  (every iteration proposes exactly gamma tokens: the paper's loop) or a
  rule of `stopping.py` (gamma is then the most tokens per iteration; the
  target verifies at the smallest of `verify_widths(gamma)` covering the
  longest proposal, chosen on device); only the rule's `static()` keys the
  cache, its numbers are traced, so a threshold calibration compiles once.
  `rule`: an acceptance rule (`acceptance.AcceptanceRule`, part of the
  key), or None for the default (`acceptance.rule_for`, with `lenience`
  traced). A draft narrower than the target is widened to its ids
  (`widths.widen`). See `LoopConfig` for the rest.
  """
  return CompiledLoop(*loop_config(
      target, draft, gamma, max_decode_len, sampler, lenience, record_trace,
      check_finite, draft_stop, compiler_options, draft_replicated, stop_ids,
      rule, build=_build_speculative))


def loop_config(target: ModelDef, draft: Any, gamma: int,
                max_decode_len: int, sampler: sampling.SamplingConfig,
                lenience: float = 1.0, record_trace: bool = False,
                check_finite: bool = True, draft_stop: Any = None,
                compiler_options: tuple = (), draft_replicated: bool = False,
                stop_ids: tuple = DEFAULT_STOP_IDS, rule: Any = None, *,
                build: Callable) -> tuple[Any, dict]:
  """(build(the `LoopConfig`), the traced numbers) of `build_speculative`'s
  arguments: the key and the values every compiled form of the loop (the
  whole loop, `iterate.build_steps`) shares."""
  stop, stop_values = (None, {}) if draft_stop is None else stopping.split(
      draft_stop)
  values = dict(sampler.values(),
                lenience=np.float32(sampling.validate_lenience(lenience)),
                stop=stop_values)
  config = LoopConfig(
      target=target, draft=widths.widen(draft, target.vocab_size),
      gamma=gamma, max_decode_len=max_decode_len,
      sampler=sampler.static(), rule=rule, stop=stop,
      record_trace=bool(record_trace), check_finite=bool(check_finite),
      compiler_options=tuple(compiler_options),
      draft_replicated=bool(draft_replicated), stop_ids=tuple(stop_ids))
  return build(config), values


@functools.lru_cache(maxsize=64)
def _build_speculative(config: LoopConfig) -> Callable:
  return jit_with_options(functools.partial(run_speculative, config),
                          config.compiler_options)


def run_speculative(config: LoopConfig, target_params, draft_params,
                    input_ids, seeds, rows, values):
  """The speculative loop (traced): (tokens [B, T], `DecodeStats`)."""
  loop = Loop.trace(config, values)
  keys = row_keys(seeds, rows)
  state = init_state(loop, target_params, draft_params, input_ids)

  def cond(s: SpeculativeState):
    return (s.step < config.max_decode_len) & ~jnp.all(s.stream.done)

  state = jax.lax.while_loop(
      cond, lambda s: step(loop, target_params, draft_params, keys, s)[0],
      state)
  return finish(loop, state)


def finish(loop: Loop, state: SpeculativeState):
  """(tokens [B, T], `DecodeStats`) of a loop's final state."""
  batch = state.stream.length.shape[0]
  stats = state.counters.decode_stats(
      state.stream.length, target_nonfinite=state.target.nonfinite,
      draft_nonfinite=draft_nonfinite(loop, state.draft, batch),
      stop_state=state.stop_state or None)
  return state.stream.finished(loop.config.max_decode_len), stats


def draft_nonfinite(loop: Loop, draft_state, batch: int) -> jax.Array | None:
  """bool [B], a NaN or inf logit of the drafter's models; None when it
  checks nothing (it declares `checks_finite` False) or the loop does not
  check."""
  if not (loop.drafter.checks_finite and loop.config.check_finite):
    return None
  flags = loop.drafter.nonfinite(draft_state)
  if getattr(flags, "shape", None) != (batch,):
    raise contract.ContractError(
        f"the drafter {type(loop.drafter).__name__} declares checks_finite "
        f"but its nonfinite returned {flags!r:.80}; it must return bool [B] "
        f"(or declare checks_finite = False).")
  return flags


def init_state(loop: Loop, target_params, draft_params,
               input_ids) -> SpeculativeState:
  """The state before the first iteration: both models have read the
  inputs, nothing is generated, every counter is zero."""
  c, batch = loop.config, input_ids.shape[0]
  shape = loop.drafter.shape
  draft = _in(c.draft_rules(), loop.drafter.init, draft_params, input_ids,
              loop.width, c.check_finite)
  draft_nonfinite(loop, draft, batch)  # its declaration, at trace time
  return SpeculativeState(
      step=jnp.int32(0),
      stream=Stream.empty(batch, loop.width, c.stop_ids),
      target=_cursor(c.target, target_params, input_ids, loop.width,
                     c.check_finite),
      draft=draft,
      counters=Counters.zeros(
          batch, c.gamma, loop.drafter.depth, c.max_decode_len,
          c.record_trace,
          None if shape.max_children == 1 else shape.max_children),
      stop_state={} if loop.stop is None else loop.stop.init(batch))


def step(loop: Loop, target_params, draft_params, keys,
         s: SpeculativeState) -> tuple[SpeculativeState, Iteration]:
  """One iteration: propose, score, accept, commit, advance, count; the
  new state and what the iteration did (the loop keeps the state only)."""
  gamma = loop.config.gamma
  step_keys = jax.vmap(
      lambda k: jax.random.split(jax.random.fold_in(k, s.step), gamma + 1)
  )(keys)
  prop, draft_state, levels = propose(loop, draft_params, s,
                                      step_keys[:, :gamma])
  logits, target = score(loop, target_params, s, prop)
  verdict = accept(loop, logits, prop, step_keys[:, gamma])
  target, draft_state = commit(loop, s, target, draft_state, verdict)
  stream, emitted = s.stream.advance(verdict.tokens, verdict.count,
                                     loop.config.max_decode_len)
  counters, stop_state = count(loop, s, prop, verdict, emitted, levels)
  return SpeculativeState(
      step=s.step + 1, stream=stream, target=target, draft=draft_state,
      counters=counters, stop_state=stop_state), Iteration(
          proposal=prop, accepted=verdict.accepted, tokens=verdict.tokens,
          emitted=emitted, counters=counters)


def propose(loop: Loop, draft_params, s: SpeculativeState, keys):
  """The drafter's (Proposal, new state, Levels), with the stop rule's
  causal keep_going and each row's limit (a proposal past the row's last
  token is wasted; done rows stop at 1)."""
  c, n = loop.config, s.stream.length
  if loop.stop is None:
    keep, limit = None, jnp.full(n.shape, c.gamma, jnp.int32)
  else:
    # Whatever the rule says, a proposal ends after a stop id.
    keep = lambda t, conf: (loop.stop.keep_going(t, conf, s.stop_state)
                            & ~is_stop(t, c.stop_ids))
    limit = jnp.clip(c.max_decode_len - n - 1, 1, c.gamma)
    limit = jnp.where(s.stream.done, 1, limit)
  prop, state, levels = _in(c.draft_rules(), loop.drafter.propose,
                            draft_params, s.draft, s.stream, keys, keep,
                            limit)
  # At trace time: a drafter that breaks the protocol says so here, not
  # deep inside the walk or the while_loop.
  contract.check_proposal(loop.drafter, prop, levels, n.shape[0],
                          c.target.vocab_size, loop.rule.uses_q)
  contract.check_state(loop.drafter, s.draft, state, "propose")
  return prop, state, levels


def score(loop: Loop, target_params, s: SpeculativeState,
          prop: Proposal) -> tuple[jax.Array, ModelCursor]:
  """The target's logits [B, M + 1, V] at the pending token and every
  proposed node, in one call: at consecutive positions for a chain (at the
  smallest compiled width covering the longest proposal under a stop
  rule), with the tree's mask for a token tree."""
  c, shape, n = loop.config, loop.drafter.shape, s.stream.length
  tokens = jnp.concatenate([s.target.token_at(s.stream, n[:, None]),
                            prop.tokens], axis=1)
  if shape.max_children > 1:
    return s.target.extend_tree(c.target, target_params, tokens, n, shape,
                                np.arange(shape.verified))
  index = n[:, None] + jnp.arange(c.gamma + 1)
  widths = (c.gamma,) if c.stop is None else verify_widths(c.gamma)
  if len(widths) == 1:
    return s.target.extend_tokens(c.target, target_params, tokens, index)

  def at_width(w):
    def call(cursor):
      logits, cursor = cursor.extend_tokens(c.target, target_params,
                                            tokens[:, :w + 1],
                                            index[:, :w + 1])
      return jnp.pad(logits, ((0, 0), (0, c.gamma - w), (0, 0))), cursor
    return call

  longest = jnp.max(jnp.where(s.stream.done, 1, prop.length))
  choice = jnp.sum(jnp.asarray(widths) < longest)
  return jax.lax.switch(choice, [at_width(w) for w in widths], s.target)


def accept(loop: Loop, logits: jax.Array, prop: Proposal,
           key: jax.Array) -> verify.Verdict:
  """One walk over the proposal with the loop's acceptance rule."""
  p = loop.rule.target(loop.sampler, logits)
  return verify.walk(loop.rule, p, prop, loop.drafter.shape, key)


def commit(loop: Loop, s: SpeculativeState, target: ModelCursor, draft_state,
           verdict: verify.Verdict):
  """Both models keep the accepted path: a tree's nodes move to the slots
  of their positions; a chain's rollback is just the next write index."""
  n = s.stream.length
  if loop.drafter.shape.max_children > 1:
    target = target.keep_path(loop.config.target, n, verdict.path)
  committed = _in(loop.config.draft_rules(), loop.drafter.commit,
                  draft_state, n, verdict.path)
  contract.check_state(loop.drafter, draft_state, committed, "commit")
  return target, committed


def count(loop: Loop, s: SpeculativeState, prop: Proposal,
          verdict: verify.Verdict, emitted: jax.Array,
          levels: Levels) -> tuple[Counters, Any]:
  """The counters and the stop rule's statistics after one iteration,
  counted for the rows still decoding: alpha takes beta at every verified
  position emitted (`verify.counted_positions`) that the walk tested."""
  gamma, c = loop.config.gamma, s.counters
  active = ~s.stream.done
  counted = (verify.counted_positions(emitted, prop.length, gamma)
             & verdict.tested)
  accepted, act = verdict.accepted, active.astype(jnp.int32)
  # Draft tokens that reached the output (none after an accepted stop id).
  used = jnp.minimum(accepted, emitted)
  lv = drafters.verified_level(active, verdict.beta, counted, levels)
  hist = lambda x: act[:, None] * jax.nn.one_hot(x, gamma + 1,
                                                 dtype=jnp.int32)
  new = c.replace(
      target_calls=c.target_calls + act,
      draft_calls=c.draft_calls + lv.calls[:, 1],
      accepted_tokens=c.accepted_tokens + act * used,
      target_tokens=c.target_tokens + act * (emitted > accepted),
      accepted_histogram=c.accepted_histogram + hist(used),
      proposal_histogram=c.proposal_histogram + hist(prop.length),
      alpha_sum=c.alpha_sum + lv.alpha_sum[:, 0],
      alpha_count=c.alpha_count + lv.alpha_count[:, 0],
      level_calls=c.level_calls + lv.calls,
      level_alpha_sum=c.level_alpha_sum + lv.alpha_sum,
      level_alpha_count=c.level_alpha_count + lv.alpha_count)
  if c.rank_histogram is not None:
    width = c.rank_histogram.shape[-1]
    new = new.replace(rank_histogram=c.rank_histogram + counted[..., None]
                      * jax.nn.one_hot(verdict.rank, width, dtype=jnp.int32))
  if c.trace is not None:
    # Rows already done write out of bounds: dropped.
    at = jnp.where(active, s.step, loop.config.max_decode_len)
    rows = jnp.arange(act.shape[0])
    put = lambda buf, v: buf.at[rows, at].set(v, mode="drop")
    t = c.trace
    new = new.replace(trace=t.replace(
        draft=put(t.draft, verdict.drafted),
        accepted=put(t.accepted, accepted), next=put(t.next, verdict.next),
        proposed=put(t.proposed, prop.length)))
  stop_state = s.stop_state
  if loop.stop is not None:
    stop_state = loop.stop.update(stop_state, prop.conf, verdict.accept_prob,
                                  counted)
  return new, stop_state


def _in(context, fn, *args):
  """fn(*args) inside `context`."""
  with context:
    return fn(*args)


build_speculative.cache_info = _build_speculative.cache_info
build_speculative.cache_clear = _build_speculative.cache_clear
build_generate.cache_info = _build_generate.cache_info
