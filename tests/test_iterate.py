"""`SpeculativeDecoder.iterate` steps the loop's own iteration (issue 67).

Invariants: a row's tokens emitted iteration by iteration, concatenated,
are its tokens from decoding with the whole loop (greedy, and sampled with
the same seed: the same keys and numbers); each record's proposal,
accepted lengths and counters add up to the whole loop's statistics; and
the iterations end when every row is done.
"""

import numpy as np
import pytest

import specdec_jax as sd
from tests import helpers


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_iterations_concatenate_to_the_decoders_tokens(temperature):
  target = helpers.table_model(12, seed=3, eos_bias=0.5)
  draft = helpers.table_model(12, seed=4, base=target, noise=1.0)
  decoder = sd.SpeculativeDecoder(
      target, draft, gamma=3, max_decode_len=10,
      sampling=sd.sampling.SamplingConfig(temperature))
  ids = helpers.example_inputs()
  whole = decoder(ids, seed=7)
  records = list(decoder.iterate(ids, seed=7))
  for row in range(ids.shape[0]):
    tokens = np.concatenate([r.new_tokens(row) for r in records])
    length = int(whole.stats.length[row])
    np.testing.assert_array_equal(tokens, whole.tokens[row, :length])
  last = records[-1].counters
  np.testing.assert_array_equal(last.target_calls, whole.stats.target_calls)
  np.testing.assert_array_equal(last.accepted_tokens,
                                whole.stats.accepted_tokens)
  assert len(records) == int(np.max(whole.stats.target_calls))
  # A record's accepted length is what its proposal had accepted, and
  # the proposals' lengths sum to what the loop counts as proposed.
  active = [r.emitted > 0 for r in records]
  assert all(np.all(r.accepted <= r.proposal.length) for r in records)
  proposed = sum(np.where(a, r.proposal.length, 0)
                 for r, a in zip(records, active))
  np.testing.assert_array_equal(proposed, whole.stats.proposed_tokens)
