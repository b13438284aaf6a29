"""Cascades: a draft that is itself sped up by exact speculative decoding.

- `cascade(draft, draft_of_draft, gamma=k)` builds a `Model` whose
  definition is a `CascadeDef`: a draft model M whose own proposals come
  from exact speculative decoding with a smaller drafter S (itself any
  drafter, so cascades nest and can end in the n-gram drafters). Every token
  it proposes is a sample from M's distribution q_M given the prefix
  (speculative decoding is exact), and it hands the engine q_M at each
  proposed position, which M computed while verifying S: the outer
  acceptance then keeps the target's distribution exactly.

`speculative_generate` takes it wherever it takes a draft (so does
`horizontal.horizontal`); it cannot be decoded on its own.

Refeed (see `drafters.py`). A cascade's inner drafter can fall one token
further behind than its caller's refeed (an outer iteration may accept
everything the middle model emitted, including the middle model's own last
sample), so it gets refeed + 1; the middle model refeeds `refeed` tokens
before verifying.

Dimension letters: B batch, G most tokens per proposal, g the cascade's inner
gamma, V vocabulary.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax
import jax
import jax.numpy as jnp

from specdec_jax import sampling
from specdec_jax.decoding import composite
from specdec_jax.decoding import contract
from specdec_jax.decoding import stopping
from specdec_jax.decoding import verify
from specdec_jax.decoding.cursor import ModelCursor
from specdec_jax.decoding.cursor import Stream
from specdec_jax.decoding.cursor import new_cursor
from specdec_jax.decoding.cursor import refeed_indices
from specdec_jax.decoding.cursor import write_rows
from specdec_jax.decoding import protocol
from specdec_jax.decoding.protocol import KeepFn
from specdec_jax.decoding.protocol import chain_proposal
from specdec_jax.decoding.protocol import Levels
from specdec_jax.decoding.drafters import make_drafter
from specdec_jax.decoding.drafters import level_stats
from specdec_jax.decoding.drafters import slice_rows
from specdec_jax.decoding.drafters import verified_level
from specdec_jax.decoding.protocol import Model


@dataclasses.dataclass(frozen=True)
class CascadeDef(composite.CompositeDef):
  """A draft model whose proposals are sped up by a smaller drafter.

  Hashable and parameter-free like every `ModelDef`; the parameters travel as
  {"draft": ..., "drafter": ...}. It cannot be decoded on its own (it has no
  `extend`): use it only as the `draft` of `speculative_generate`.

  Attributes:
    draft: the middle model M (its distribution is what the cascade proposes).
    drafter: M's drafter S: any drafter's definition (a model, prompt
      lookup, a horizontal drafter, another cascade, your own).
    gamma: S's draft tokens per M verification.
  """

  draft: Any
  drafter: Any
  gamma: int

  what = "a cascade"

  def parts(self) -> tuple[tuple[str, Any], ...]:
    return (("draft", self.draft), ("drafter", self.drafter))

  def make_drafter(self, gamma, sampler, refeed, rule):
    return CascadeDrafter(self, gamma, sampler, refeed, rule)


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
  if not contract.is_model(draft.definition):
    raise TypeError("cascade: the middle model must be a plain model (it "
                    "verifies its drafter, so it needs prefill and extend); "
                    "nest drafters through draft_of_draft instead, e.g. "
                    "cascade(base, cascade(small, bigram, gamma=4), gamma=3) "
                    "or cascade(base, sd.prompt_lookup(target), gamma=3).")
  composite.refuse_trees("cascade", ("draft_of_draft", draft_of_draft))
  gamma = composite.size_argument("cascade: gamma", gamma)
  if draft.vocab_size != draft_of_draft.vocab_size:
    raise ValueError(
        f"cascade: vocabularies differ in size (draft {draft.vocab_size}, "
        f"draft_of_draft {draft_of_draft.vocab_size}); every level must share "
        f"the target's vocabulary.")
  return Model(definition=CascadeDef(draft.definition,
                                     draft_of_draft.definition, int(gamma)),
               params={"draft": draft.params, "drafter": draft_of_draft.params},
               vocab=composite.shared_vocab("cascade", ("draft", draft),
                                   ("draft_of_draft", draft_of_draft)))


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
    stopped: bool [B] rows that propose no more (limit, stop rule, a stop
      id, or done before this proposal).
    eos: bool [B] M emitted a stop id (`Stream.stop_ids`: EOS by default).
    state: the `CascadeState` (M's cursor, the inner drafter's state).
    tokens, conf: int32 / float32 [B, G + g + 1], the emitted tokens and
      their confidence (room for one overshooting inner iteration).
    probs: float32 [B, G + g + 1, V], q_M of each emitted token (None
      when the acceptance rule uses no q).
    stats: per-level counters (`protocol.Levels`, depth levels).
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
  stats: Levels


class CascadeDrafter(protocol.DrafterBase):
  """Proposes up to G tokens of the middle model M, produced by speculative
  decoding of M with the inner drafter S (see the module docstring): a
  chain whose middle model verifies refeed + 1 + g tokens a call, with its
  inner drafter's models below it."""

  checks_finite = True  # the middle model's logits, and the inner ones'

  def __init__(self, definition: CascadeDef, gamma: int,
               sampler: sampling.SamplingConfig, refeed: int, rule: Any):
    self.middle = definition.draft
    self.inner_gamma = g = definition.gamma
    self.gamma = gamma
    self.sampler = sampler
    self.refeed = refeed
    self.rule = rule
    self.inner = make_drafter(definition.drafter, g, sampler, refeed + 1,
                              rule)
    self.depth = 1 + self.inner.depth
    # A proposal can overshoot G by one inner iteration (g + 1 tokens).
    self.extra_width = g + 1 + self.inner.extra_width
    self.calls = ((protocol.ModelCall(("draft",), self.middle,
                                      refeed + 1 + g),)
                  + protocol.under("drafter", self.inner.calls))

  def init(self, params, input_ids, num_positions,
           check_finite: bool = True) -> CascadeState:
    return CascadeState(
        middle=new_cursor(self.middle, params["draft"], input_ids,
                          num_positions, check_finite),
        inner=self.inner.init(params["drafter"], input_ids, num_positions,
                              check_finite))

  def __repr__(self) -> str:
    return (f"CascadeDrafter({type(self.middle).__name__}, gamma={self.gamma}"
            f", inner_gamma={self.inner_gamma}, inner={self.inner!r})")

  def nonfinite(self, state: CascadeState):
    return composite.either(state.middle.nonfinite,
                            self.inner.nonfinite(state.inner))

  def propose(self, params, state: CascadeState, stream: Stream, keys,
              keep: KeepFn | None, limit: jax.Array):
    """Same contract as `ModelDrafter.propose`; runs inner speculative
    iterations until every row has G tokens (or its stop rule fired or M
    emitted a stop id of `stream.stop_ids`).
    """
    gamma = self.gamma
    batch = stream.length.shape[0]

    def cond(c: CascadeLoop):
      return (c.it < gamma) & ~jnp.all(c.stopped)

    def body(c: CascadeLoop):
      c = self._iteration(params, c, keys[:, 0], keep is not None)
      return c.replace(stopped=c.stopped | self._stopped(c, keep, limit))

    c = jax.lax.while_loop(cond, body, self._start(state, stream))
    tokens, conf = c.tokens[:, :gamma], c.conf[:, :gamma]
    probs = None if c.probs is None else c.probs[:, :gamma]
    if keep is None:
      length = jnp.full((batch,), gamma, jnp.int32)
    else:
      length = jnp.minimum(stopping.proposal_length(keep(tokens, conf), limit),
                           jnp.maximum(c.produced, 1))
    return chain_proposal(tokens, probs, conf, length), c.state, c.stats

  def _start(self, state: CascadeState, stream: Stream) -> CascadeLoop:
    """The inner loop's carry before its first iteration."""
    batch = stream.length.shape[0]
    width = self.gamma + self.inner_gamma + 1
    zeros = jnp.zeros((batch,), jnp.int32)
    return CascadeLoop(
        it=jnp.int32(0),
        local=stream.replace(done=jnp.zeros((batch,), jnp.bool_)),
        produced=zeros,
        # Rows whose output is complete propose nothing the engine will use.
        stopped=stream.done, eos=jnp.zeros((batch,), jnp.bool_),
        state=state,
        tokens=jnp.zeros((batch, width), jnp.int32),
        conf=jnp.zeros((batch, width), jnp.float32),
        probs=None if not self.rule.uses_q else jnp.zeros(
            (batch, width, self.middle.vocab_size), jnp.float32),
        stats=level_stats(jnp.zeros((batch, self.depth), jnp.int32),
                          jnp.zeros((batch, self.depth - 1), jnp.float32),
                          jnp.zeros((batch, self.depth - 1), jnp.int32)))

  def _stopped(self, c: CascadeLoop, keep: KeepFn | None, limit):
    """bool [B]: rows that propose no more (limit, stop id, stop rule)."""
    done = (c.produced >= limit) | c.eos
    if keep is not None:
      said_stop = ~keep(c.tokens[:, :self.gamma], c.conf[:, :self.gamma])
      proposed = jnp.arange(self.gamma)[None] < c.produced[:, None]
      done |= jnp.any(said_stop & proposed, axis=1)
    return done

  def _iteration(self, params, c: CascadeLoop, base_key,
                 need_conf: bool) -> CascadeLoop:
    """One inner iteration: S proposes g tokens, M verifies them (the
    walk with the cascade's rule) and the emitted tokens, their q_M and
    confidence are appended for the rows still proposing."""
    g = self.inner_gamma
    batch = c.produced.shape[0]
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
    logits = logits[:, self.refeed:]                    # positions n .. n+g
    verdict = verify.verify_chain(self.rule, self.sampler, logits, prop,
                                  it_keys[:, g])
    new = verdict.tokens
    active = ~c.stopped
    # A stop id ends the row's proposal after it.
    first_stop = c.local.first_stop(new, verdict.count)
    count = jnp.where(active, jnp.minimum(verdict.count, first_stop + 1), 0)
    conf = self._confidence(logits, verdict, need_conf)
    # Active rows have produced < G, so g + 1 values fit at `produced`;
    # rows that stopped write nothing (their old values, at 0).
    at = jnp.where(active, c.produced, 0)

    def put(buf, vals):
      old = slice_rows(buf, at, g + 1)
      mask = active.reshape((batch,) + (1,) * (vals.ndim - 1))
      return write_rows(buf, at, jnp.where(mask, vals, old))

    # A stopped row writes nothing: its length may have overshot G by
    # g + 1, and another g + 1 tokens written there could pass the
    # buffer's end, where the write would be clamped back over the
    # tokens it emitted (which its models' caches refeed).
    local_tokens = jnp.where(active[:, None],
                             write_rows(c.local.tokens, n, new),
                             c.local.tokens)
    return c.replace(
        it=c.it + 1,
        local=c.local.replace(tokens=local_tokens, length=n + count),
        produced=c.produced + count,
        eos=c.eos | (first_stop < count),
        state=CascadeState(middle=middle, inner=inner_state),
        tokens=put(c.tokens, new), conf=put(c.conf, conf),
        probs=None if c.probs is None else put(c.probs, verdict.probs),
        stats=jax.tree.map(
            jnp.add, c.stats,
            verified_level(active, verdict.beta,
                           verify.counted_positions(count, prop.length, g),
                           inner_stats)))

  def _confidence(self, logits, verdict: verify.Verdict,
                  need_conf: bool) -> jax.Array:
    """[B, g + 1]: M's probability of each emitted token (its largest
    softmax probability when greedy), for a stop rule."""
    new = verdict.tokens
    if not self.rule.uses_q:
      # Confidence only feeds a stop rule: skip the softmax without one.
      return (jnp.max(jax.nn.softmax(logits, axis=-1), axis=-1) if need_conf
              else jnp.zeros(new.shape, jnp.float32))
    if self.sampler.greedy:
      return jnp.max(jax.nn.softmax(logits, axis=-1), axis=-1)
    return jnp.take_along_axis(verdict.probs, new[..., None], axis=-1)[..., 0]
