"""Composite drafters: cascades and horizontal drafters.

- `cascade(draft, draft_of_draft, gamma=k)` builds a `Model` whose
  definition is a `CascadeDef`: a draft model M whose own proposals come
  from exact speculative decoding with a smaller drafter S (itself any
  drafter, so cascades nest and can end in the n-gram drafters). Every token
  it proposes is a sample from M's distribution q_M given the prefix
  (speculative decoding is exact), and it hands the engine q_M at each
  proposed position, which M computed while verifying S: the outer
  acceptance then keeps the target's distribution exactly.
- `horizontal(early, late, split=j)`: the first j tokens of each proposal
  from one drafter, the rest from another.

`speculative_generate` takes either wherever it takes a draft; they cannot
be decoded on their own.

Refeed (see `drafters.py`). A cascade's inner drafter can fall one token
further behind than its caller's refeed (an outer iteration may accept
everything the middle model emitted, including the middle model's own last
sample), so it gets refeed + 1; the middle model refeeds `refeed` tokens
before verifying. A horizontal drafter's parts: see `HorizontalDrafter`.

Dimension letters: B batch, G most tokens per proposal, g the cascade's inner
gamma, V vocabulary.
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any, Callable

import flax
import jax
import jax.numpy as jnp

from specdec_jax import sampling
from specdec_jax.decoding import stopping
from specdec_jax.decoding import verify
from specdec_jax.decoding.cursor import ModelCursor
from specdec_jax.decoding.cursor import Stream
from specdec_jax.decoding.cursor import new_cursor
from specdec_jax.decoding.cursor import refeed_indices
from specdec_jax.decoding.cursor import write_rows
from specdec_jax.decoding.drafters import KeepFn
from specdec_jax.decoding.drafters import make_drafter
from specdec_jax.decoding.drafters import Proposal
from specdec_jax.decoding.drafters import level_stats
from specdec_jax.decoding.drafters import slice_rows
from specdec_jax.decoding.drafters import verified_level
from specdec_jax.decoding.protocol import Model
from specdec_jax.decoding.protocol import vocab_fingerprint
from specdec_jax.tokens import EOS_ID


_INT32_MAX = 2**31 - 1


def size_argument(name: str, value: Any) -> int:
  """int(value) for an integer (Python or numpy) in [1, 2**31 - 1]; else a
  ValueError naming the argument (sizes index int32 buffers on device)."""
  if (isinstance(value, bool) or not isinstance(value, numbers.Integral)
      or value < 1):
    raise ValueError(f"{name} must be an integer >= 1, got {value!r}.")
  if value > _INT32_MAX:
    raise ValueError(f"{name}={value} is beyond int32 ({_INT32_MAX}): "
                     f"decoding sizes index int32 buffers; use a value "
                     f"thousands of times smaller.")
  return int(value)


def call_sizes(definition: Any) -> tuple[list[tuple[Any, int]], int]:
  """([(definition, tokens per call)] of every plain model a draft runs,
  top first, and the extra positions its buffers need). A plain draft
  extends 2 tokens per call; a cascade's middle model verifies g + 1 plus
  its refeed (about g + 3), and each cascade needs g + 1 scratch positions
  (`CascadeDrafter.extra_width`)."""
  if isinstance(definition, CascadeDef):
    inner, extra = call_sizes(definition.drafter)
    g = definition.gamma
    return [(definition.draft, g + 3)] + inner, extra + g + 1
  if isinstance(definition, HorizontalDef):
    early, e_extra = call_sizes(definition.early)
    late, l_extra = call_sizes(definition.late)
    return early + late, max(e_extra, l_extra)
  return [(definition, 2)], 0


@dataclasses.dataclass(frozen=True)
class CascadeDef:
  """A draft model whose proposals are sped up by a smaller drafter.

  Hashable and parameter-free like every `ModelDef`; the parameters travel as
  {"draft": ..., "drafter": ...}. It cannot be decoded on its own (it has no
  `extend`): use it only as the `draft` of `speculative_generate`.

  Attributes:
    draft: the middle model M (its distribution is what the cascade proposes).
    drafter: M's drafter S: a plain ModelDef or another CascadeDef.
    gamma: S's draft tokens per M verification.
  """

  draft: Any
  drafter: Any
  gamma: int

  @property
  def vocab_size(self) -> int:
    return self.draft.vocab_size

  @property
  def max_input_len(self) -> int | None:
    limits = [m.max_input_len for m in (self.draft, self.drafter)
              if m.max_input_len is not None]
    return min(limits) if limits else None

  def make_drafter(self, gamma, sampler, refeed, draft_sample, fast_greedy):
    return CascadeDrafter(self, gamma, sampler, refeed, draft_sample,
                          fast_greedy)

  def prefill(self, params, input_ids, num_decode_positions):
    raise TypeError("a cascade is a drafter, not a model: pass it as the "
                    "draft of speculative_generate.")

  def extend(self, params, cache, tokens, positions):
    raise TypeError("a cascade is a drafter, not a model: pass it as the "
                    "draft of speculative_generate.")


def cascade(draft: Model, draft_of_draft: Model, *, gamma: int) -> Model:
  """A draft whose proposals come from exact speculative decoding.

  Args:
    draft: the draft model M whose distribution the proposals follow.
    draft_of_draft: M's own (smaller) drafter: a model, an n-gram drafter or
      another cascade.
    gamma: draft_of_draft's tokens per M call (>= 1).

  Returns:
    A `Model` usable as the `draft` of `speculative_generate` (and of the
    experiments and the demo); its params are {"draft", "drafter"}.
  """
  for name, m in (("draft", draft), ("draft_of_draft", draft_of_draft)):
    if not isinstance(m, Model):
      raise TypeError(f"cascade: {name} must be a specdec_jax.Model (from "
                      f"sd.load_model, ngram.fit_ngram or sd.cascade), got "
                      f"{type(m).__name__}.")
  if isinstance(draft.definition, CascadeDef):
    raise TypeError("cascade: the middle model must be a plain model (it "
                    "verifies its drafter); nest cascades through "
                    "draft_of_draft instead, e.g. cascade(base, "
                    "cascade(small, bigram, gamma=4), gamma=3).")
  gamma = size_argument("cascade: gamma", gamma)
  if draft.vocab_size != draft_of_draft.vocab_size:
    raise ValueError(
        f"cascade: vocabularies differ in size (draft {draft.vocab_size}, "
        f"draft_of_draft {draft_of_draft.vocab_size}); every level must share "
        f"the target's vocabulary.")
  return Model(definition=CascadeDef(draft.definition,
                                     draft_of_draft.definition, int(gamma)),
               params={"draft": draft.params, "drafter": draft_of_draft.params},
               vocab=_shared_vocab("cascade", ("draft", draft),
                                   ("draft_of_draft", draft_of_draft)))


def _shared_vocab(what: str, *parts: tuple[str, Model]) -> Any:
  """The vocabulary the named parts share (the first one carried; None if
  none carries one); a ValueError naming both parts when two carry
  different ones (the target is compared with the result, so every part's
  vocabulary is checked against it)."""
  known = [(n, m) for n, m in parts if vocab_fingerprint(m) is not None]
  for n, m in known[1:]:
    if vocab_fingerprint(m) != vocab_fingerprint(known[0][1]):
      raise ValueError(
          f"{what}: {known[0][0]} and {n} carry different vocabularies of "
          f"the same size (SentencePiece model sha256 "
          f"{vocab_fingerprint(known[0][1])[0]} vs {vocab_fingerprint(m)[0]}"
          f"): every level must share the target's vocabulary.")
  return known[0][1].vocab if known else next(
      (m.vocab for _, m in parts if m.vocab is not None), None)


@dataclasses.dataclass(frozen=True)
class HorizontalDef:
  """Different drafters for the early and the late positions of a proposal.

  The first `split` draft tokens of every iteration come from `early`, the
  rest (up to gamma) from `late`, which continues from the early tokens.
  Like `CascadeDef` it is only usable as a draft; its parameters travel as
  {"early": ..., "late": ...}.

  Attributes:
    early, late: ModelDefs or CascadeDefs (or further HorizontalDefs).
    split: how many positions the early drafter proposes (>= 1).
  """

  early: Any
  late: Any
  split: int

  @property
  def vocab_size(self) -> int:
    return self.early.vocab_size

  @property
  def max_input_len(self) -> int | None:
    limits = [m.max_input_len for m in (self.early, self.late)
              if m.max_input_len is not None]
    return min(limits) if limits else None

  def make_drafter(self, gamma, sampler, refeed, draft_sample, fast_greedy):
    return HorizontalDrafter(self, gamma, sampler, refeed, draft_sample,
                             fast_greedy)

  def prefill(self, params, input_ids, num_decode_positions):
    raise TypeError("a horizontal drafter is not a model: pass it as the "
                    "draft of speculative_generate.")

  def extend(self, params, cache, tokens, positions):
    raise TypeError("a horizontal drafter is not a model: pass it as the "
                    "draft of speculative_generate.")


def horizontal(early: Model, late: Model, *, split: int) -> Model:
  """A draft whose first `split` tokens per iteration come from `early` and
  the rest from `late` (e.g. a strong draft where acceptance matters most,
  then a cheap one). Every token is still a sample from the q of the model
  that proposed it, and that q enters the acceptance, so output is exact.

  Args:
    early: the drafter of positions 1..split (a model or a cascade).
    late: the drafter of the later positions.
    split: >= 1; speculative_generate's gamma must exceed it for `late` to
      be used.

  Returns:
    A `Model` usable as the draft of `speculative_generate`.
  """
  for name, m in (("early", early), ("late", late)):
    if not isinstance(m, Model):
      raise TypeError(f"horizontal: {name} must be a specdec_jax.Model, got "
                      f"{type(m).__name__}.")
  split = size_argument("horizontal: split", split)
  if early.vocab_size != late.vocab_size:
    raise ValueError(f"horizontal: vocabularies differ in size (early "
                     f"{early.vocab_size}, late {late.vocab_size}).")
  return Model(definition=HorizontalDef(early.definition, late.definition,
                                        int(split)),
               params={"early": early.params, "late": late.params},
               vocab=_shared_vocab("horizontal", ("early", early),
                                   ("late", late)))


@flax.struct.dataclass
class CascadeState:
  """A cascade's carried state: the middle model's cursor, its drafter's."""

  middle: ModelCursor
  inner: Any


@flax.struct.dataclass
class CascadeLoop:
  """Carry of a cascade's inner loop (every field per row but `it`).

  Attributes:
    it: int32 scalar, inner iterations so far (one middle-model call each).
    local: the committed tokens followed by what M emitted so far (a
      `Stream`; `length` counts both).
    produced: int32 [B] tokens emitted so far (in `tokens`).
    stopped: bool [B] rows that propose no more (limit, stop rule, EOS,
      or done before this proposal).
    eos: bool [B] M emitted an EOS.
    state: the `CascadeState` (M's cursor, the inner drafter's state).
    tokens, conf: int32 / float32 [B, G + g + 1], the emitted tokens and
      their confidence (room for one overshooting inner iteration).
    probs: float32 [B, G + g + 1, V], q_M of each emitted token (None on
      the fast greedy path).
    stats: per-level counters (`drafters.level_stats`, depth levels).
  """

  it: jax.Array
  local: Stream
  produced: jax.Array
  stopped: jax.Array
  eos: jax.Array
  state: CascadeState
  tokens: jax.Array
  conf: jax.Array
  probs: Any
  stats: dict


class CascadeDrafter:
  """Proposes up to G tokens of the middle model M, produced by speculative
  decoding of M with the inner drafter S (see the module docstring)."""

  def __init__(self, definition: CascadeDef, gamma: int,
               sampler: sampling.SamplingConfig, refeed: int,
               draft_sample: Callable, fast_greedy: bool):
    self.middle = definition.draft
    self.inner_gamma = definition.gamma
    self.gamma = gamma
    self.sampler = sampler
    self.refeed = refeed
    self.fast_greedy = fast_greedy
    self.inner = make_drafter(definition.drafter, definition.gamma, sampler,
                              refeed + 1, draft_sample, fast_greedy)
    self.depth = 1 + self.inner.depth
    # A proposal can overshoot G by one inner iteration (g + 1 tokens).
    self.extra_width = definition.gamma + 1 + self.inner.extra_width

  def init(self, params, input_ids, num_positions,
           check_finite: bool = True) -> CascadeState:
    return CascadeState(
        middle=new_cursor(self.middle, params["draft"], input_ids,
                          num_positions, check_finite),
        inner=self.inner.init(params["drafter"], input_ids, num_positions,
                              check_finite))

  def nonfinite(self, state: CascadeState):
    return _either(state.middle.nonfinite, self.inner.nonfinite(state.inner))

  def propose(self, params, state: CascadeState, stream: Stream, keys,
              keep: KeepFn | None, limit: jax.Array):
    """Same contract as `ModelDrafter.propose`; runs inner speculative
    iterations until every row has G tokens (or its stop rule or EOS fired).
    """
    gamma, g = self.gamma, self.inner_gamma
    batch = stream.length.shape[0]
    width = gamma + g + 1
    pos = jnp.arange(g + 1)[None, :]
    base_key = keys[:, 0]

    def stopped_rows(c: CascadeLoop):
      done = (c.produced >= limit) | c.eos
      if keep is not None:
        said_stop = ~keep(c.tokens[:, :gamma], c.conf[:, :gamma])
        proposed = jnp.arange(gamma)[None] < c.produced[:, None]
        done |= jnp.any(said_stop & proposed, axis=1)
      return done

    def cond(c: CascadeLoop):
      return (c.it < gamma) & ~jnp.all(c.stopped)

    def body(c: CascadeLoop):
      it_keys = jax.vmap(lambda k: jax.random.split(
          jax.random.fold_in(k, c.it), g + 1))(base_key)
      prop, inner_state, inner_stats = self.inner.propose(
          params["drafter"], c.state.inner, c.local, it_keys[:, :g], None,
          jnp.full((batch,), g, jnp.int32))
      n = c.local.length
      first = refeed_indices(n, self.refeed)
      tokens = jnp.concatenate([c.state.middle.token_at(c.local, first),
                                prop.tokens], axis=1)
      index = jnp.concatenate([first, n[:, None] + 1 + jnp.arange(g)[None]],
                              axis=1)
      logits, middle = c.state.middle.extend_tokens(self.middle,
                                                    params["draft"], tokens,
                                                    index)
      logits = logits[:, self.refeed:]                  # positions n .. n+g
      verdict = verify.verify(logits, prop, it_keys[:, g], self.sampler,
                              fast=self.fast_greedy)
      new = verdict.tokens
      active = ~c.stopped
      count = jnp.where(active, verdict.count, 0)       # EOS ends it
      if self.fast_greedy:
        # Confidence only feeds a stop rule: skip the softmax without one.
        conf = (jnp.max(jax.nn.softmax(logits, axis=-1), axis=-1)
                if keep is not None else jnp.zeros(new.shape, jnp.float32))
      else:
        conf = jnp.take_along_axis(verdict.probs, new[..., None],
                                   axis=-1)[..., 0]
        if self.sampler.greedy:
          conf = jnp.max(jax.nn.softmax(logits, axis=-1), axis=-1)
      # Active rows have produced < G, so g + 1 values fit at `produced`;
      # rows that stopped write nothing (their old values, at 0).
      at = jnp.where(active, c.produced, 0)

      def put(buf, vals):
        old = slice_rows(buf, at, g + 1)
        mask = active.reshape((batch,) + (1,) * (vals.ndim - 1))
        return write_rows(buf, at, jnp.where(mask, vals, old))

      valid = pos < count[:, None]
      # A stopped row writes nothing: its length may have overshot G by
      # g + 1, and another g + 1 tokens written there could pass the
      # buffer's end, where the write would be clamped back over the
      # tokens it emitted (which its models' caches refeed).
      local_tokens = jnp.where(active[:, None],
                               write_rows(c.local.tokens, n, new),
                               c.local.tokens)
      c = c.replace(
          it=c.it + 1,
          local=c.local.replace(tokens=local_tokens, length=n + count),
          produced=c.produced + count,
          eos=c.eos | jnp.any(valid & (new == EOS_ID), axis=1),
          state=CascadeState(middle=middle, inner=inner_state),
          tokens=put(c.tokens, new), conf=put(c.conf, conf),
          probs=None if c.probs is None else put(c.probs, verdict.probs),
          stats=jax.tree.map(
              jnp.add, c.stats,
              verified_level(active, verdict.beta,
                             verify.counted_positions(count, prop.length, g),
                             inner_stats)))
      return c.replace(stopped=c.stopped | stopped_rows(c))

    zeros = jnp.zeros((batch,), jnp.int32)
    carry = CascadeLoop(
        it=jnp.int32(0),
        local=stream.replace(done=jnp.zeros((batch,), jnp.bool_)),
        produced=zeros,
        # Rows whose output is complete propose nothing the engine will use.
        stopped=stream.done, eos=jnp.zeros((batch,), jnp.bool_),
        state=state,
        tokens=jnp.zeros((batch, width), jnp.int32),
        conf=jnp.zeros((batch, width), jnp.float32),
        probs=None if self.fast_greedy else jnp.zeros(
            (batch, width, self.middle.vocab_size), jnp.float32),
        stats=level_stats(jnp.zeros((batch, self.depth), jnp.int32),
                          jnp.zeros((batch, self.depth - 1), jnp.float32),
                          jnp.zeros((batch, self.depth - 1), jnp.int32)))
    c = jax.lax.while_loop(cond, body, carry)
    tokens, conf = c.tokens[:, :gamma], c.conf[:, :gamma]
    probs = None if c.probs is None else c.probs[:, :gamma]
    if keep is None:
      length = jnp.full((batch,), gamma, jnp.int32)
    else:
      length = jnp.minimum(stopping.proposal_length(keep(tokens, conf), limit),
                           jnp.maximum(c.produced, 1))
    return Proposal(tokens=tokens, probs=probs, conf=conf, length=length), \
        c.state, c.stats


@flax.struct.dataclass
class HorizontalState:
  """A horizontal drafter's carried state: each part's drafter state."""

  early: Any
  late: Any


class HorizontalDrafter:
  """Positions 1..split from the early drafter, the rest from the late one.

  Refeed: the late drafter is fed every iteration from length - refeed up to
  the early proposal's end (refeed + split tokens back), so it stays in sync
  even on iterations where its own tokens were not used. The early drafter
  can fall gamma - split tokens further behind than a plain drafter (an
  iteration may accept late tokens it never saw), so its refeed grows by
  that much.
  """

  def __init__(self, definition: HorizontalDef, gamma: int,
               sampler: sampling.SamplingConfig, refeed: int,
               draft_sample: Callable, fast_greedy: bool):
    self.split = min(definition.split, gamma)
    self.gamma = gamma
    late_gamma = max(gamma - self.split, 1)
    self.early = make_drafter(definition.early, self.split, sampler,
                              refeed + gamma - self.split, draft_sample,
                              fast_greedy)
    self.late = make_drafter(definition.late, late_gamma, sampler,
                             refeed + self.split, draft_sample, fast_greedy)
    self.depth = self.early.depth + self.late.depth
    self.extra_width = max(self.early.extra_width, self.late.extra_width)

  def init(self, params, input_ids, num_positions,
           check_finite: bool = True) -> HorizontalState:
    return HorizontalState(
        early=self.early.init(params["early"], input_ids, num_positions,
                              check_finite),
        late=self.late.init(params["late"], input_ids, num_positions,
                            check_finite))

  def nonfinite(self, state: HorizontalState):
    return _either(self.early.nonfinite(state.early),
                   self.late.nonfinite(state.late))

  def propose(self, params, state: HorizontalState, stream: Stream, keys,
              keep: KeepFn | None, limit: jax.Array):
    """Same contract as `ModelDrafter.propose`."""
    split, gamma = self.split, self.gamma
    batch = stream.length.shape[0]
    early_keep = None
    if keep is not None:
      early_keep = lambda t, c: keep(
          jnp.pad(t, ((0, 0), (0, gamma - split))),
          jnp.pad(c, ((0, 0), (0, gamma - split)), constant_values=1.0)
      )[:, :split]
    e_limit = jnp.minimum(limit, split) if keep is not None else jnp.full(
        (batch,), split, jnp.int32)
    early, e_state, e_stats = self.early.propose(
        params["early"], state.early, stream, keys[:, :split], early_keep,
        e_limit)
    # The late drafter continues after the early tokens.
    local = stream.replace(
        tokens=write_rows(stream.tokens, stream.length, early.tokens),
        length=stream.length + split)
    late_keep = None
    if keep is not None:
      late_keep = lambda t, c: keep(
          jnp.concatenate([early.tokens, t], 1)[:, :gamma],
          jnp.concatenate([early.conf, c], 1)[:, :gamma])[:, split:]
    l_limit = jnp.clip(limit - split, 1, self.late.gamma)
    late_keys = keys[:, split:] if gamma > split else keys[:, :1]
    late, l_state, l_stats = self.late.propose(
        params["late"], state.late, local, late_keys, late_keep, l_limit)
    n_late = gamma - split
    tokens = jnp.concatenate([early.tokens, late.tokens[:, :n_late]], 1)
    conf = jnp.concatenate([early.conf, late.conf[:, :n_late]], 1)
    probs = None
    if early.probs is not None:
      probs = jnp.concatenate([early.probs, late.probs[:, :n_late]], 1)
    went_on = (early.length >= split) & (n_late > 0)
    if keep is not None:
      went_on &= keep(tokens, conf)[:, split - 1] & (limit > split)
    length = jnp.where(went_on, split + late.length, early.length)
    length = jnp.minimum(length, gamma)
    used = went_on.astype(jnp.int32)[:, None]
    zero = jnp.zeros((batch, 1), jnp.float32)
    stats = {
        "calls": jnp.concatenate([e_stats["calls"],
                                  used * l_stats["calls"]], 1),
        # No alpha between the two parts (they do not verify each other).
        "alpha_sum": jnp.concatenate([e_stats["alpha_sum"], zero,
                                      used * l_stats["alpha_sum"]], 1),
        "alpha_count": jnp.concatenate(
            [e_stats["alpha_count"], zero.astype(jnp.int32),
             used * l_stats["alpha_count"]], 1),
    }
    return (Proposal(tokens=tokens, probs=probs, conf=conf, length=length),
            HorizontalState(early=e_state, late=l_state), stats)


def _either(a, b):
  """Elementwise or of two optional flags."""
  return None if a is None else a | b


# Definitions that only work as drafts (they have no prefill/extend).
DRAFT_ONLY = (CascadeDef, HorizontalDef)


def top_model(draft: Model) -> Model:
  """The model a draft mostly runs: itself, a cascade's top model, a
  horizontal drafter's early part (recursively)."""
  definition, params = draft.definition, draft.params
  while isinstance(definition, DRAFT_ONLY):
    if isinstance(definition, CascadeDef):
      definition, params = definition.draft, params["draft"]
    else:
      definition, params = definition.early, params["early"]
  return Model(definition, params, draft.vocab)


def levels_of(draft: Model) -> list[tuple[tuple[str, ...], Model]]:
  """(path into the draft's params, model) of every plain model a draft
  runs (itself, or each level of a cascade or part of a horizontal
  drafter), top first; each carries the draft's vocabulary."""
  definition, params = draft.definition, draft.params
  if isinstance(definition, CascadeDef):
    parts = [("draft", definition.draft), ("drafter", definition.drafter)]
  elif isinstance(definition, HorizontalDef):
    parts = [("early", definition.early), ("late", definition.late)]
  else:
    return [((), draft)]
  return [((key,) + path, m) for key, d in parts
          for path, m in levels_of(Model(d, params[key], draft.vocab))]


def models_of(draft: Model) -> list[Model]:
  """Every plain model a draft runs (`levels_of` without the paths)."""
  return [m for _, m in levels_of(draft)]
