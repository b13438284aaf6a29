"""One drafter contract, declared once by the drafter (issue 67).

Invariants:
- what the host reads of a draft (its shape and gamma, scratch positions,
  the models it calls with their tokens per call, its NaN check) is what
  its drafter declares, for every shipped drafter and their nestings;
- the API's width and memory checks read that declaration: a drafter that
  needs scratch positions is refused by the width check when they cannot
  fit (before, the checks saw 0 and only the engine used them);
- a definition or a drafter that breaks the protocol is refused before
  anything compiles, the message naming the member and what it must be:
  a definition without make_drafter or max_input_len, a drafter without a
  member, a proposal whose probs have the wrong rank (caught at trace time,
  which precedes compiling: no XLA compile happens).
"""

import dataclasses

import jax.numpy as jnp
import pytest

import specdec_jax as sd
from specdec_jax.decoding import drafters
from specdec_jax.decoding import engine
from specdec_jax.decoding import protocol
from specdec_jax.errors import ContractError
from tests import helpers

VOCAB = 12


@pytest.fixture(scope="module")
def models():
  target = helpers.table_model(VOCAB, seed=3, eos_bias=0.5)
  return target, helpers.table_model(VOCAB, seed=4, base=target, noise=1.5)


def test_every_drafter_declares_what_the_host_reads(models):
  target, draft = models
  small = helpers.table_model(VOCAB, seed=5, base=draft, noise=1.5)
  d, s = draft.definition, small.definition
  casc = drafters.declared(sd.cascade(draft, small, gamma=2), 4)
  # The middle model verifies refeed 1 + 1 + g tokens; its drafter refeeds
  # one token more than a top-level one (refeed 2: 3 tokens).
  assert casc.calls == (protocol.ModelCall(("draft",), d, 4),
                        protocol.ModelCall(("drafter",), s, 3))
  assert (casc.extra_width, casc.depth, casc.gamma) == (3, 2, 4)
  horiz = drafters.declared(sd.horizontal(sd.prompt_lookup(target), draft,
                                          split=1), 3)
  assert horiz.calls == (protocol.ModelCall(("late",), d, 3),)
  assert horiz.checks_finite and horiz.depth == 2
  tree = drafters.declared(sd.tree(draft, (3, 2)), 1)
  assert (tree.gamma, tree.extra_width) == (2, 9 - 2)
  assert tree.calls == (protocol.ModelCall(("draft",), d, 3),)
  lookup = drafters.declared(sd.prompt_lookup(target), 3)
  assert lookup.calls == () and not lookup.checks_finite


@dataclasses.dataclass(frozen=True)
class WideDef:
  """A drafter's definition whose drafter asks for many scratch positions."""

  vocab_size: int
  width: int
  max_input_len = None

  def make_drafter(self, gamma, sampler, refeed, rule):
    del sampler, refeed, rule
    return Wide(gamma, self.width)


class Wide(protocol.DrafterBase):
  def __init__(self, gamma, width):
    self.gamma, self.extra_width = gamma, width

  def init(self, params, input_ids, num_positions, check_finite=True):
    return input_ids

  def propose(self, params, state, stream, keys, keep, limit):
    raise AssertionError("never traced: the width check refuses first")


def test_the_width_check_reads_the_drafters_scratch_positions(models):
  target, _ = models
  before = engine.build_speculative.cache_info().misses
  with pytest.raises(ValueError, match=r"\+ 3000000000 for"):
    sd.speculative_generate(target, sd.Model(WideDef(VOCAB, 3 * 10**9), {}),
                            helpers.example_inputs(), gamma=2,
                            max_decode_len=4)
  assert engine.build_speculative.cache_info().misses == before


@dataclasses.dataclass(frozen=True)
class NoMakeDrafter:
  vocab_size: int
  max_input_len = None


@dataclasses.dataclass(frozen=True)
class NoMaxInputLen:
  vocab_size: int

  def make_drafter(self, gamma, sampler, refeed, rule):
    raise AssertionError("never built")


@dataclasses.dataclass(frozen=True)
class NoCalls(WideDef):
  def make_drafter(self, gamma, sampler, refeed, rule):
    drafter = Wide(gamma, 0)
    drafter.calls = None
    return drafter


@pytest.mark.parametrize("definition,match", [
    (NoMakeDrafter(VOCAB), "has no make_drafter"),
    (NoMaxInputLen(VOCAB), "has no max_input_len"),
    (NoCalls(VOCAB, 0), r"calls must be a tuple of protocol.ModelCall"),
])
def test_broken_definitions_are_refused_naming_the_member(models, definition,
                                                          match):
  target, _ = models
  before = engine.build_speculative.cache_info().misses
  with pytest.raises(ContractError, match=match):
    sd.SpeculativeDecoder(target, sd.Model(definition, {}), gamma=2,
                          max_decode_len=4)
  assert engine.build_speculative.cache_info().misses == before


@dataclasses.dataclass(frozen=True)
class FlatProbsDef:
  """Hands over q as [B, V] instead of [B, G, V]."""

  vocab_size: int
  max_input_len = None

  def make_drafter(self, gamma, sampler, refeed, rule):
    del sampler, refeed, rule
    return FlatProbs(gamma, self.vocab_size)


class FlatProbs(protocol.DrafterBase):
  def __init__(self, gamma, vocab):
    self.gamma, self.vocab = gamma, vocab

  def init(self, params, input_ids, num_positions, check_finite=True):
    return input_ids

  def propose(self, params, state, stream, keys, keep, limit):
    batch = stream.length.shape[0]
    tokens = jnp.ones((batch, self.gamma), jnp.int32)
    prop = protocol.chain_proposal(
        tokens, jnp.ones((batch, self.vocab), jnp.float32) / self.vocab,
        jnp.ones((batch, self.gamma), jnp.float32), limit)
    zeros = jnp.zeros((batch, 0))
    return prop, state, protocol.Levels(
        calls=jnp.zeros((batch, 1), jnp.int32), alpha_sum=zeros,
        alpha_count=zeros.astype(jnp.int32))


def test_a_proposal_of_the_wrong_rank_is_refused_before_compiling(models):
  target, _ = models
  with helpers.CompileCounter() as compiles:
    with pytest.raises(ContractError, match=(
        r"returned Proposal.probs \(4, 12\) float32; it must be float32 "
        r"\[B, I, V\] = \[4, 2, 12\]")):
      sd.speculative_generate(target, sd.Model(FlatProbsDef(VOCAB), {}),
                              helpers.example_inputs(), gamma=2,
                              max_decode_len=4, temperature=1.0)
  assert compiles.count == 0, compiles.names
