"""experiments/cost_checks.py: costs that contradict themselves are flagged.

Issue 60: `make demo` on a busy machine printed "predicted 3.00x" with a
ratio of 0.42, from a verification timed cheaper than one target step, and
said nothing. Invariants: the rule names exactly the impossible measurements
(v < 1 on a CPU, c >= 1 for a smaller draft, rounds of one step spread over
2x) and passes every consistent one, including those that are only
unusual (v < 1 on an accelerator, c >= 1 for a draft as large as the
target, a spread of exactly 2x, a spread not measured); a warning that
survived the second measurement reaches the arm's row, its table and the
demo's printed line and summary. (The re-measurement itself runs in every
experiment whose timings contradict; a busy machine cannot be summoned on
demand, so its trigger is this pure rule, tested here.)
"""

import pytest

from specdec_jax.experiments import cost_checks
from specdec_jax.experiments import experiment_config
from specdec_jax.experiments import records
from specdec_jax.experiments import report
from specdec_jax.tables import demo

pytestmark = pytest.mark.quick  # `make test-quick`

# A sound CPU measurement: the draft a fifth of the target's step, the
# verification of 5 tokens 1.3 steps, rounds within 1.4x of each other.
SOUND = {"c": 0.2, "c_hat": 0.05, "verify_cost": 1.3, "round_spread": 1.4,
         "target_step_s": 0.01}


def _judge(platform="cpu", **changes):
  return cost_checks.contradictions(dict(SOUND, **changes), platform)


def test_a_sound_measurement_passes_and_each_contradiction_is_named():
  assert _judge() == []
  assert _judge(verify_cost=0.76) == [
      "verification timed at 0.76 target steps (< 1 on a CPU)"]
  assert _judge(c=1.05) == ["c = 1.05 >= 1 for a draft of c_hat = 0.05"]
  assert _judge(round_spread=2.6) == [
      "a timed step's rounds spread 2.6x (> 2x)"]
  assert len(_judge(verify_cost=0.9, c=1.2, round_spread=3.0)) == 3


def test_unusual_but_possible_measurements_pass():
  assert _judge("tpu", verify_cost=0.97) == []  # a wide call, one step
  assert _judge("gpu", verify_cost=0.97) == []
  assert _judge(c=1.0, c_hat=1.0) == []  # the target as its own draft
  assert _judge(c=1.3, c_hat=float("nan")) == []  # n-gram target: no c_hat
  assert _judge(round_spread=2.0) == []
  assert _judge(round_spread=None) == []  # costs.json of an older run
  assert _judge(verify_cost=1.0) == []


def test_flagged_adds_the_warning_only_where_the_costs_contradict():
  bad = cost_checks.flagged(dict(SOUND, verify_cost=0.76), "cpu")
  assert bad[cost_checks.WARNING].endswith(
      "second measurement: verification timed at 0.76 target steps "
      "(< 1 on a CPU)")
  # A second measurement that came out sound drops the first's warning.
  assert cost_checks.flagged(dict(SOUND, **{cost_checks.WARNING: "x"}),
                             "cpu") == SOUND


def _record(gamma):
  spec = records.DecodeRecord(
      tokens=[5, 6, 7, 1], time_s=0.2, text="ein Haus", target_calls=2,
      draft_calls=2 * gamma, accepted_histogram=[0, 0, 1, 0, 1],
      alpha=0.75, alpha_sum=3.0, alpha_count=4)
  base = records.DecodeRecord(tokens=[5, 6, 7, 1], time_s=0.5,
                              text="ein Haus", target_calls=4)
  return records.ExampleRecord(id="1", input_length=9, target_text="ein Haus",
                               baseline=base, speculative={gamma: spec})


def test_the_warning_reaches_the_row_its_table_and_the_printed_summary(
    tmp_path):
  config = experiment_config.ExperimentConfig(
      target="demo:target", draft="demo:draft_small", gamma=4)
  costs = cost_checks.flagged(dict(SOUND, verify_cost=0.76), "cpu")
  summary = report.summarize(config, [_record(4)], {4: costs}, [4], None)
  row = dict(summary["rows"][0], task=demo.PARAGRAPHS, draft="draft_small")
  assert row["cost_warning"] == costs[cost_checks.WARNING]
  report.write_table(str(tmp_path / "table"), [row], demo.TABLE_COLUMNS)
  assert "(< 1 on a CPU)" in (tmp_path / "table.md").read_text()
  sound = dict(report.summarize(config, [_record(4)], {4: SOUND}, [4],
                                None)["rows"][0],
               task=demo.SENTENCES, draft="draft_small")
  assert sound["cost_warning"] is None
  lines = demo.summary([sound, row]).splitlines()
  cells = lines[2].split()
  assert cells[:2] == ["paragraphs", "draft_small"]
  predicted = row["predicted_at_lengths_with_verify_cost"]
  assert f"{predicted:.2f}x!" in cells
  assert f"{row['speedup'] / predicted:.2f}!" in cells
  assert not any(c.endswith("!") for c in lines[1].split())
  assert lines[-2] == f"! paragraphs draft_small T=0: {row['cost_warning']}."
  assert lines[-1].startswith("Best greedy: sentences ")
