"""experiments/records.py: what a line of examples.jsonl holds.

Invariant: a record survives the JSON round trip exactly (what a resumed run
reads back equals what the killed run wrote), and the file layout keys
gamma by string as it always has, so older workdirs keep reading."""

import json

from specdec_jax.experiments import records

import pytest

pytestmark = pytest.mark.quick  # `make test-quick`


def _example():
  spec = records.DecodeRecord(
      tokens=[5, 6, 1], time_s=0.25, text="ein Haus", target_calls=2,
      draft_calls=8, accepted_histogram=[0, 1, 0, 0, 1], alpha=0.75,
      alpha_sum=3.0, alpha_count=4, proposal_histogram=[0, 0, 0, 0, 2],
      level_calls=[8], level_alpha=[0.75])
  base = records.DecodeRecord(tokens=[5, 6, 1], time_s=0.5, text="ein Haus",
                              target_calls=3)
  return records.ExampleRecord(id="17", input_length=9,
                               target_text="ein Haus", baseline=base,
                               speculative={4: spec})


def test_round_trip_through_a_json_line():
  example = _example()
  line = json.dumps(example.to_json())
  assert records.ExampleRecord.from_json(json.loads(line)) == example


def test_layout_keys_gamma_by_string_and_omits_unset_fields():
  data = _example().to_json()
  assert list(data["speculative"]) == ["4"]
  assert "draft_calls" not in data["baseline"]
  assert data["speculative"]["4"]["alpha_count"] == 4
