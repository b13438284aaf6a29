"""The contracts of the decoding engine: `ModelDef` for a model, `Drafter`
for what proposes draft tokens (with its `Proposal`), and `Model`.

The engine (`specdec_jax.decoding.engine`) drives any model that implements
`ModelDef`: Flax T5 (encoder-decoder), the GPT-like decoder-only model, the
n-gram drafters and the explicit "table" models used in tests. It asks any
`Drafter` for proposals: a draft model (`drafters.ModelDrafter`), a cascade,
a horizontal drafter, a token tree, prompt lookup (`drafts/`), or your own
(docs/extending.md).

Positions, caches and rollback
------------------------------
A model's decoder cache is a pytree of arrays laid out by absolute decoder
position: slot `j` holds the keys/values of the token at position `j`. The
cache itself carries no length. `extend` writes the keys/values of the K new
tokens at the positions it is given (a scatter, so each row writes at its own
offset) and then lets a query at position `t` attend to every slot `j <= t`.
Slots past a row's current position are therefore invisible, whatever stale
values they hold; rolling back after a rejected draft token only means the
engine moves that row's position back, and the next `extend` overwrites the
stale slots before anything can see them.

The decoder sequence of a row is `start_token` at `start_pos` followed by the
generated tokens at `start_pos + 1, start_pos + 2, ...`. For T5 the start
token is the decoder start id 0 at position 0 and the encoder output lives in
the cache; for a decoder-only model the start token is the last prompt token
and every earlier prompt position is already in the cache after `prefill`.

Token trees. `extend` may also take a `TreeMask` (`drafts/trees.py`): the
K tokens are then nodes of a tree, each written at its own cache slot and
attending to the committed slots and to its ancestors only, at the
position of its depth (not of its slot). Models that take trees also have
`copy_slots(cache, src, dst)`, with which the engine moves the accepted
path of a tree into the slots of its positions.

`Model` bundles a `ModelDef` with its parameters and vocabulary: what
`load_model` returns and the decoders take.

Dimension letters: B batch, L input length, K new tokens, V vocabulary,
S cache length (decoder positions); for drafters G most tokens per proposal
(a tree's depth), M proposed nodes (G for a chain), I nodes with children.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any, Callable, Protocol, runtime_checkable
import weakref

import flax
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.decoding.tree_shape import TreeShape


@flax.struct.dataclass
class Prefill:
  """What `ModelDef.prefill` returns for a batch of inputs.

  Attributes:
    cache: model-specific pytree (decoder KV cache, encoder outputs, ...),
      every leaf with batch as its leading axis.
    start_token: int32 [B], the decoder token whose logits predict the first
      generated token. It is NOT yet in the cache.
    start_pos: int32 [B], the decoder position of `start_token`. Every
      position below it is already in the cache.
  """

  cache: Any
  start_token: jax.Array
  start_pos: jax.Array


@flax.struct.dataclass
class TreeMask:
  """Where the K nodes of a token-tree chunk go and what each of them sees.

  The tree's nodes 0..M (0 the root; `tree_shape.TreeShape` numbers them
  breadth first) own the cache slots root..root + M; the slots below the
  root hold the committed sequence (slot s at position s), which every node
  sees; of the tree, a node sees itself and its ancestors only. A node of
  depth d sits at position root + d.

  Attributes:
    root: int32 [B], the root's cache slot.
    slots: int32 [B, K], the slot each fed node is written to.
    sees: bool [K, M + 1], fed node k sees tree node i.
    depth: int32 [M + 1], each tree node's depth.
  """

  root: jax.Array
  slots: jax.Array
  sees: jax.Array
  depth: jax.Array

  def expand(self, num_slots: int) -> tuple[jax.Array, jax.Array]:
    """(key positions int32 [B, S], visible bool [B, K, S]) over a cache of
    S = `num_slots` slots."""
    size = self.depth.shape[0]
    rel = jnp.arange(num_slots)[None, :] - self.root[:, None]   # [B, S]
    in_tree = (rel >= 0) & (rel < size)
    node = jnp.clip(rel, 0, size - 1)
    key_positions = jnp.where(in_tree, self.root[:, None] + self.depth[node],
                              jnp.arange(num_slots)[None, :])
    sees = jnp.moveaxis(self.sees[:, node], 0, 1)             # [B, K, S]
    visible = (rel < 0)[:, None, :] | (in_tree[:, None, :] & sees)
    return key_positions.astype(jnp.int32), visible


# A definition declares its family in a class attribute `family` (optional:
# the decoder then skips the checks that need it). The decoder tells models
# apart by this alone, never by their classes.
ENCODER_DECODER = "encoder-decoder"  # inputs are encoded; rows end in EOS
DECODER_ONLY = "decoder-only"  # inputs are a prompt the decoder continues


def family(definition: Any) -> str | None:
  """ENCODER_DECODER, DECODER_ONLY, or None for a definition that does not
  declare its `family`."""
  return getattr(definition, "family", None)


@runtime_checkable
class ModelDef(Protocol):
  """A hashable, parameter-free model definition the engine can drive.

  Implementations are frozen dataclasses (hashable, so they can be static
  arguments of `jax.jit`); the parameters travel separately as a pytree.
  They should also declare `family` (ENCODER_DECODER or DECODER_ONLY).
  """

  @property
  def vocab_size(self) -> int:
    """Width V of the logits."""

  @property
  def max_input_len(self) -> int | None:
    """Longest input row the model accepts (None: no limit)."""

  def prefill(self, params: Any, input_ids: jax.Array,
              num_decode_positions: int) -> Prefill:
    """Prepares per-example state once per call.

    Args:
      params: the parameter pytree.
      input_ids: int32 [B, L], 0-padded on the right, each row ending in EOS.
      num_decode_positions: how many decoder positions after `start_pos` the
        engine may write (max_decode_len + gamma + 1); the cache must hold
        `start_pos + num_decode_positions + 1` slots for every row.

    Returns:
      A `Prefill`.
    """

  def extend(self, params: Any, cache: Any, tokens: jax.Array,
             positions: jax.Array,
             tree: TreeMask | None = None) -> tuple[jax.Array, Any]:
    """Feeds K tokens per row at the given decoder positions.

    Args:
      params: the parameter pytree.
      cache: the cache from `prefill` or a previous `extend`.
      tokens: int32 [B, K].
      positions: int32 [B, K], the decoder position of each token;
        non-decreasing along K (a repeated position rewrites the same slot
        with the same token, which the engine uses at the start of a row).
      tree: None (a chain: written at `positions`, causal), or where the
        nodes of a token tree are written and what they see (optional:
        only models that take token trees accept it).

    Returns:
      (logits float32 [B, K, V], the updated cache). logits[:, k] is the
      distribution of the token at positions[:, k] + 1.
    """


@dataclasses.dataclass(frozen=True, eq=False)
class Model:
  """What `load_model` returns and `generate`/`speculative_generate` take.

  Attributes:
    definition: the hashable, parameter-free `ModelDef` (static under jit).
    params: the parameter pytree (numpy or jax arrays, possibly sharded).
    vocab: a seqio vocabulary when one is known, else None.
  """

  definition: ModelDef
  params: Any
  vocab: Any = None

  @property
  def config(self) -> Any:
    """The architecture config of the definition (None for table models)."""
    return getattr(self.definition, "config", None)

  @property
  def vocab_size(self) -> int:
    return self.definition.vocab_size

  @property
  def max_input_len(self) -> int | None:
    return self.definition.max_input_len

  def __repr__(self) -> str:
    """The definition, the parameters' size and dtypes, the vocabulary's
    kind: no arrays (a T5's repr would print every weight)."""
    leaves = jax.tree.leaves(self.params)
    count = sum(int(np.prod(getattr(x, "shape", ()))) for x in leaves)
    dtypes = ", ".join(sorted({str(getattr(x, "dtype", type(x).__name__))
                               for x in leaves}))
    definition = repr(self.definition)
    if len(definition) > 600:
      definition = definition[:600] + "...)"
    vocab = None if self.vocab is None else type(self.vocab).__name__
    return (f"Model({definition}, params={count:,} values in {len(leaves)} "
            f"arrays ({dtypes}), vocab={vocab})")


# Fingerprints by Model (weakly: a dropped Model drops its entry).
_VOCAB_FINGERPRINTS: "weakref.WeakKeyDictionary[Model, Any]" = (
    weakref.WeakKeyDictionary())


def vocab_fingerprint(model: Model) -> tuple[str, int] | None:
  """(sha256 of the SentencePiece model, extra ids) of `model.vocab`, or
  (its `pieces_digest`, 0) for a tokenizer.json vocabulary
  (`bpe.BpeVocabulary`), or None without one: two models whose
  fingerprints differ number different pieces alike."""
  if model not in _VOCAB_FINGERPRINTS:
    proto = getattr(model.vocab, "sp_model", None)
    digest = getattr(model.vocab, "pieces_digest", None)
    _VOCAB_FINGERPRINTS[model] = (
        (digest, 0) if isinstance(digest, str) else None
        if not isinstance(proto, bytes) else
        (hashlib.sha256(proto).hexdigest()[:16],
         int(getattr(model.vocab, "extra_ids", 0) or 0)))
  return _VOCAB_FINGERPRINTS[model]


# ----------------------------------------------------------------------------
# The drafter contract (`drafters.ModelDrafter` is the plain drafter; drafts/
# has the others; docs/extending.md writes one).


KeepFn = Callable[[jax.Array, jax.Array], jax.Array]


@flax.struct.dataclass
class Proposal:
  """What a drafter proposes for one iteration: tokens on its `shape`.

  Attributes:
    tokens: int32 [B, M], the token of nodes 1..M of the drafter's
      `TreeShape` (node 0, the root, is the pending token); for a chain,
      the G draft tokens in order.
    probs: float32 [B, I, V], the q that the children of nodes 0..I-1 were
      sampled from (for a chain, q of each token: [B, G, V]); None when
      the acceptance rule uses no q (`acceptance.Greedy`).
    conf: float32 [B, G], the draft's probability of each chain token (q(x);
      the largest softmax probability when greedy), for stop rules; zeros
      for a tree.
    length: int32 [B] in [1, G], depths proposed (a chain's tokens at or
      past it are padding; a tree's is its depth).
    valid: bool [B, M], nodes that hold a proposal (a chain: below
      `length`; a tree: nodes whose parent's q had enough tokens).
  """

  tokens: jax.Array
  probs: Any
  conf: jax.Array
  length: jax.Array
  valid: jax.Array


def chain_proposal(tokens, probs, conf, length) -> Proposal:
  """The Proposal of a chain: tokens [B, G], `length` [B] of them valid."""
  gamma = tokens.shape[1]
  return Proposal(tokens=tokens, probs=probs, conf=conf, length=length,
                  valid=jnp.arange(gamma)[None, :] < length[:, None])


@flax.struct.dataclass
class Levels:
  """Per-row counters of a drafter's levels (cascades have several).

  Attributes:
    calls: int32 [B, D], model runs of each level (0 the drafter's own).
    alpha_sum: float32 [B, D - 1], summed beta of level i + 1's tokens
      verified by level i (as the engine's `alpha`).
    alpha_count: int32 [B, D - 1], the positions summed.
  """

  calls: jax.Array
  alpha_sum: jax.Array
  alpha_count: jax.Array


@dataclasses.dataclass(frozen=True)
class ModelCall:
  """One model a drafter runs, as the host's checks, the memory model and
  the planner see it.

  Attributes:
    path: where its parameters sit in the draft's params (() for the
      draft's own; ("draft", "drafter") for a cascade's inner model).
    definition: its `ModelDef`.
    tokens: the most tokens it scores in one call (its refeed + 1 for a
      plain draft step; a cascade's middle model verifies more).
  """

  path: tuple
  definition: Any
  tokens: int


def under(key: str, calls: tuple) -> tuple:
  """`calls` of a part whose parameters sit under params[key]."""
  return tuple(dataclasses.replace(c, path=(key,) + tuple(c.path))
               for c in calls)


class Drafter(Protocol):
  """What the engine asks of a drafter (`ModelDrafter` is the plain one).

  A drafter is built once per compiled loop by its definition's
  `make_drafter(gamma, sampler, refeed, rule)`; the definition (hashable,
  the loop's key) also has `vocab_size` and `max_input_len`. What the
  host's checks, the memory model and the planner read of a drafter is
  declared here, once, by the drafter itself; `DrafterBase` gives the
  defaults, and `contract.check_drafter` refuses a drafter without them
  before anything compiles.

  Attributes:
    shape: the static `TreeShape` of every proposal (`TreeShape.chain(G)`
      for a chain of up to G tokens).
    gamma: G, the most tokens a proposal holds (`shape.depth`).
    depth: models in its chain of levels (1 for a plain model; a cascade
      adds its inner drafter's).
    extra_width: scratch positions it needs beyond max_decode_len + G + 1
      in the cache buffers (a tree's side nodes, a cascade's overshoot).
    calls: a `ModelCall` for each model it runs, top first (empty for
      prompt lookup): the models checked against the target and counted in
      memory.
    checks_finite: whether `nonfinite` flags NaN or inf logits (False:
      it returns None; a drafter without models has nothing to check).
  """

  shape: TreeShape
  gamma: int
  depth: int
  extra_width: int
  calls: tuple
  checks_finite: bool

  def init(self, params: Any, input_ids: jax.Array, num_positions: int,
           check_finite: bool = True) -> Any:
    """Its state (a pytree) after reading input_ids [B, L]: its models'
    caches of `num_positions` decoder positions."""

  def nonfinite(self, state: Any) -> jax.Array | None:
    """bool [B]: a logit of its models was NaN or inf (None when it checks
    nothing, or the loop was built without the check)."""

  def propose(self, params: Any, state: Any, stream: Any, keys: jax.Array,
              keep: KeepFn | None, limit: jax.Array
              ) -> tuple[Proposal, Any, Levels]:
    """Drafts for every row.

    Args:
      params: its parameters.
      state: its state (caches valid below stream.length - refeed).
      stream: the `cursor.Stream`: committed tokens [B, T'], lengths [B],
        done flags [B] and the loop's static `stop_ids` (a row ends after
        the first it emits).
      keys: [B, G] PRNG keys, one per depth.
      keep: None proposes exactly G tokens (the paper's fixed gamma); else
        a stop rule's causal keep_going(tokens [B, G], conf [B, G]) -> bool
        [B, G] (chains only).
      limit: int32 [B] in [1, G], the most tokens a row may propose.

    Returns:
      (the Proposal, the new state, its Levels counters: calls [B, depth],
      alpha_sum and alpha_count [B, depth - 1]). The Proposal's tokens are
      int32 [B, M] (M = shape.num_nodes), probs float32 [B, I, V] for the
      I nodes with children (a chain: [B, G, V]) or None when the rule's
      `uses_q` is False, conf float32 [B, G], length int32 [B], valid bool
      [B, M]; the new state has the structure of `init`'s.
    """

  def commit(self, state: Any, length: jax.Array, path: jax.Array) -> Any:
    """The state after verification accepted `path` int32 [B, G] (node
    indices of `shape` below the root at relative index `length` [B]): a
    chain keeps its state as is (rollback is the next write position)."""


class DrafterBase:
  """The defaults of a drafter (subclass it and set `gamma`): a chain of
  `gamma` tokens, one level, no scratch positions, no model of its own and
  so nothing to check for NaN, and a `commit` that keeps the state (a
  chain's rollback is the next write position)."""

  gamma: int
  depth = 1
  extra_width = 0
  calls: tuple = ()
  checks_finite = False

  @property
  def shape(self) -> TreeShape:
    return TreeShape.chain(self.gamma)

  def nonfinite(self, state: Any) -> jax.Array | None:
    del state
    return None

  def commit(self, state: Any, length: jax.Array, path: jax.Array) -> Any:
    del length, path
    return state
