"""Tests for the shipped demo models and `make demo` (specdec_jax.tables.demo).

Invariants: the four shipped models load from the package alone and keep
speculative decoding exact (greedy output identical to the target's); their
vocabulary round-trips text; their sizes keep the promised ratios and the
repository budget; the demo's gin config parses and the demo itself runs end
to end on two sentences.
"""

import csv
import json
import os

import gin
import numpy as np
import pytest

import specdec_jax as sd
from specdec_jax import checkpoints
from specdec_jax.data import text
from specdec_jax.experiments import step_timers
from specdec_jax.experiments import experiment_config
from specdec_jax.tables import demo
from specdec_jax.tables import variants
from specdec_jax import generate
from specdec_jax.launch import gin_flags
from specdec_jax import load_model
from specdec_jax import speculative_generate
from tests import helpers

NAMES = ("target", "draft_large", "draft_base", "draft_small")


@pytest.fixture(scope="module")
def models():
  return {name: load_model(f"demo:{name}") for name in NAMES}


def _sentences(n):
  return text.demo_sentences(n)


def _encode(model, texts):
  return text.encode(model.vocab, texts)


def _paragraph():
  """The second demo paragraph: four consecutive Multi30k validation
  captions."""
  with open(os.path.join(demo.DEMO_DATA, "paragraphs.en")) as f:
    return f.read().split("\n")[1]


@pytest.fixture(scope="module")
def greedy_runs(models):
  """Greedy decodes of four demo sentences and a paragraph in ONE batch
  (rows 0-3 and 4; one compiled loop per model for both tests below): the
  target's output and each shipped draft's at gamma 4."""
  target = models["target"]
  ids = _encode(target, _sentences(4) + [_paragraph()])
  base = generate(target, ids, max_decode_len=128)
  spec = {name: speculative_generate(target, models[name], ids, gamma=4,
                                     max_decode_len=128)
          for name in NAMES[1:]}
  return base, spec


def test_shipped_models_keep_greedy_exact(models, greedy_runs):
  """Each shipped draft leaves the target's greedy translations unchanged,
  token for token, on a batch of demo sentences; the target translates."""
  base, spec = greedy_runs
  text = models["target"].vocab.decode([t for t in base.tokens[0] if t > 1])
  # "A group of men are loading cotton onto a truck" (Multi30k validation).
  assert "Gruppe" in text and "Männer" in text, text
  for name, res in spec.items():
    np.testing.assert_array_equal(res.tokens[:4], base.tokens[:4],
                                  err_msg=name)
    assert res.stats.alpha[:4].mean() > 0.3, name


def test_shipped_models_translate_a_paragraph_exactly(models, greedy_runs):
  """Fine-tuned on paragraphs, the target translates a four-sentence demo
  paragraph (the second: four consecutive Multi30k validation captions)
  into a paragraph (30+ tokens, at least three sentences; the
  sentence-only target stopped after two), and every draft leaves that
  greedy output unchanged, token for token."""
  assert _paragraph().startswith("A lady in a red coat"), _paragraph()
  base, spec = greedy_runs
  row = base.tokens[4].tolist()
  assert 1 in row, "no EOS within 128 tokens"
  text = models["target"].vocab.decode([t for t in row[:row.index(1)]
                                        if t > 1])
  assert row.index(1) >= 30 and text.count(".") >= 3, text
  assert text.startswith("Eine Dame in einem roten Mantel"), text
  for name, res in spec.items():
    np.testing.assert_array_equal(res.tokens[4], base.tokens[4], err_msg=name)


def test_vocabulary_round_trips_and_matches_the_models(models):
  """The shipped vocabulary encodes and decodes text unchanged, has T5's
  special ids and 100 extra ids, and fits every model's embedding."""
  vocab = models["target"].vocab
  text = "Ein Mann mit einem Hut angelt von einem Holzboot aus."
  assert vocab.decode(vocab.encode(text)) == text
  assert (vocab.pad_id, vocab.eos_id, vocab.unk_id) == (0, 1, 2)
  assert vocab.extra_ids == 100
  for model in models.values():
    assert model.vocab.vocab_size == vocab.vocab_size <= model.vocab_size


def test_sizes_keep_the_ratios_and_the_budget(models):
  """Each draft is the documented fraction of the target's parameters
  (`demo.DRAFT_SIZE_RATIOS`, quoted in the README and configs/demo.gin)
  within 5%; all shipped weights together <= 60 MB."""
  target = step_timers.count_params(models["target"].params)
  for name, ratio in demo.DRAFT_SIZE_RATIOS.items():
    got = target / step_timers.count_params(models[name].params)
    assert abs(got / ratio - 1) < 0.05, (name, got)
  total = sum(os.path.getsize(os.path.join(root, f))
              for root, _, files in os.walk(checkpoints.DEMO_DIR)
              for f in files)
  assert total <= 60e6, total


def test_demo_gin_config_parses():
  """configs/demo.gin binds every row of the demo."""
  gin.clear_config()
  gin_flags.parse(["demo.gin"], [])
  config = gin.get_configurable(demo.DemoConfig)()
  gin.clear_config()
  assert [d for d, _ in config.drafts] == [f"demo:{n}" for n in NAMES[1:]]
  assert tuple(config.temperatures) == (0.0, 1.0)
  for draft, gammas in config.drafts:  # every row has its gamma
    for temperature in config.temperatures:
      assert variants.gamma_for(gammas, temperature, draft) >= 1


def test_demo_gamma_per_temperature_must_cover_every_row():
  """A {temperature: gamma} mapping without one of the demo's temperatures
  is refused with a message naming the draft and the missing temperature."""
  assert variants.gamma_for({0.0: 7, 1.0: 4}, 1.0, "d") == 4
  assert variants.gamma_for(3, 1.0, "d") == 3
  with pytest.raises(ValueError, match="demo:x.*not for 1.0"):
    variants.gamma_for({0.0: 7}, 1.0, "demo:x")


def test_demo_script_on_one_sentence_and_one_paragraph(tmp_path):
  """scripts/demo.py (what `make demo` runs) as a process, its defaults
  (configs/demo.gin) cut to one sentence, one paragraph and one draft:
  it writes its table with both tasks (greedy rows identical to the
  target, sampled rows, the paragraph's gammas and a paragraph output
  several times longer), plots and traces, counts each group's
  compilation within its time, and prints the summary's rows and the best
  greedy row of each task; no error-level line."""
  demo_flags = {
      "drafts": "(('demo:draft_small', {0.0: 3, 1.0: 2}),)",
      "paragraph_drafts": "(('demo:draft_small', 4),)",
      "sweep_draft": "None", "max_examples": "1",
      "paragraph_max_examples": "1", "repeats": "1", "cost_repeats": "1",
      "trace_examples": "1", "trace_drafts": "None",
      # A traced loop is one more compile a row.
      "trace_temperatures": "(0.0,)", "variant": "None"}
  proc = helpers.launch(["scripts/demo.py", f"--workdir={tmp_path}", *(
      f"--gin.demo.DemoConfig.{k}={v}" for k, v in demo_flags.items())])
  helpers.assert_succeeded(proc)
  with open(tmp_path / "table.csv") as f:
    rows = list(csv.DictReader(f))
  assert [(r["task"], r["draft"], float(r["temperature"]), int(r["gamma"]))
          for r in rows] == [
              ("ende_sentences", "draft_small", 0.0, 3),
              ("ende_sentences", "draft_small", 1.0, 2),
              ("ende_paragraphs", "draft_small", 0.0, 4),
              ("ende_paragraphs", "draft_small", 1.0, 4)]
  assert rows[0]["identical"] == "True" and rows[2]["identical"] == "True"
  summary = json.loads((tmp_path / "paragraphs_draft_small_t0" /
                        "summary.json").read_text())
  sentence = json.loads((tmp_path / "draft_small_t0" /
                         "summary.json").read_text())
  assert (summary["rows"][0]["mean_output_length"]
          > 3 * sentence["rows"][0]["mean_output_length"])
  for name in ["table.md", "table.csv", "speedup.png",
               "draft_small_t0/trace.html",
               "paragraphs_draft_small_t0/trace.html"]:
    assert os.path.getsize(tmp_path / name) > 0
  assert not os.path.exists(tmp_path / "draft_small_t1" / "trace.html")
  timing = json.loads((tmp_path / "timing.json").read_text())
  assert [(g["task"], g["temperature"]) for g in timing["groups"]] == [
      (r["task"], float(r["temperature"])) for r in rows]
  assert 0 < timing["compile_seconds"] <= timing["seconds"]
  for g in timing["groups"]:
    assert 0 < g["compile_seconds"] <= g["seconds"] and g["programs"] > 0, g
  lines = proc.stdout.splitlines()
  assert [line.split()[:4] for line in lines[1:5]] == [
      ["sentences", "draft_small", "0", "3"],
      ["sentences", "draft_small", "1", "2"],
      ["paragraphs", "draft_small", "0", "4"],
      ["paragraphs", "draft_small", "1", "4"]]
  assert any(line.startswith("Best greedy: sentences ") for line in lines)


def _summary_row(task, draft, temperature, speedup, identical):
  return dict(task=task, draft=draft, temperature=temperature, gamma=3,
              alpha=0.8, speedup=speedup,
              predicted_at_lengths_with_verify_cost=2.0,
              quality_baseline=30.0, quality_speculative=None,
              identical=identical)


def test_summary_names_each_tasks_fastest_greedy_row():
  """The printed summary: one line per row, a greedy output that differs
  from the target's is shouted (NO), and "best greedy" per task ignores
  faster sampled rows."""
  rows = [_summary_row("ende_sentences", "draft_a", 0.0, 1.5, True),
          _summary_row("ende_sentences", "draft_b", 0.0, 1.7, False),
          _summary_row("ende_sentences", "draft_b", 1.0, 2.5, None),
          _summary_row("ende_paragraphs", "draft_a", 0.0, 1.9, True),
          _summary_row("ende_paragraphs", "draft_b", 0.0, 1.2, True)]
  lines = demo.summary(rows, "eigen").splitlines()
  assert len(lines) == 1 + len(rows) + 3
  assert lines[2].split()[-1] == "NO" and lines[1].split()[-1] == "yes"
  assert "0.85" in lines[2].split()  # ratio 1.7 / 2.0
  assert "30.0 / —" in lines[1]
  assert lines[-2] == ("Best greedy: sentences 1.70x (draft_b, γ 3, α 0.80); "
                       "paragraphs 1.90x (draft_a, γ 3, α 0.80).")
  assert lines[-1] == "Variant run: eigen."


def test_traces_only_for_the_listed_drafts_and_never_the_sweep():
  """trace_drafts and trace_temperatures pick the rows that pay a compile
  for traces; the sweep never does (its trace would repeat a row's); None
  traces every row."""
  drafts = (("demo:draft_large", 3), ("demo:draft_base", 4))
  listed = demo.DemoConfig(drafts=drafts, sweep_draft="demo:draft_base",
                           trace_drafts=("demo:draft_base",))
  traced = {name: row.trace_examples for _, name, row in demo._rows(listed)}
  assert traced == {"draft_large_t0": 0, "draft_large_t1": 0,
                    "draft_base_t0": 3, "draft_base_t1": 3,
                    "paragraphs_draft_large_t0": 0,
                    "paragraphs_draft_large_t1": 0,
                    "paragraphs_draft_base_t0": 3,
                    "paragraphs_draft_base_t1": 3, "gamma_sweep": 0}
  greedy = demo.DemoConfig(drafts=drafts, sweep_draft="demo:draft_base",
                           trace_drafts=("demo:draft_base",),
                           trace_temperatures=(0,))
  assert {name for _, name, row in demo._rows(greedy)
          if row.trace_examples} == {"draft_base_t0",
                                     "paragraphs_draft_base_t0"}
  every = demo.DemoConfig(drafts=drafts, sweep_draft="demo:draft_base")
  assert {name: row.trace_examples for _, name, row in demo._rows(every)
          if name != "gamma_sweep"} == {name: 3 for name in traced
                                        if name != "gamma_sweep"}


@pytest.mark.parametrize("gin_file", ["demo_adaptive.gin",
                                      "demo_cascade.gin", "demo_trees.gin"])
def test_demo_gin_options_parse(gin_file):
  """The demo's adaptive-length, cascade and token-tree options bind a rule,
  cascade rows or tree rows on top of configs/demo.gin."""
  gin.clear_config()
  gin_flags.parse([gin_file], [])
  config = gin.get_configurable(demo.DemoConfig)()
  gin.clear_config()
  assert config.draft_stop is not None or config.cascades or config.trees
  for _, name, row in demo._rows(config):
    assert not experiment_config.config_problems(row), name


def test_tree_rows_come_with_the_chain_verifying_as_many():
  """Each DemoConfig.trees entry gives, at every temperature, a tree row
  (gamma its depth) and a chain row of the same draft verifying as many
  tokens per call (gamma = the tree's nodes), sentences only."""
  config = demo.DemoConfig(
      drafts=(("demo:draft_small", 3),), paragraphs=None, sweep_draft=None,
      trees=(("demo:draft_base", (2, 1)),
             ("demo:draft_base", {"parents": (0, 0, 0, 1, 2)})))
  rows = {name: row for _, name, row in demo._rows(config)}
  assert rows["draft_base_tree2x1_t0"].tree == (2, 1)
  assert rows["draft_base_tree2x1_t0"].gamma == 2
  assert rows["draft_base_chain4_t1"].gamma == 4
  assert rows["draft_base_chain4_t1"].tree is None
  assert rows["draft_base_tree5n2d_t0"].tree_parents == (0, 0, 0, 1, 2)
  assert rows["draft_base_chain5_t0"].gamma == 5


def test_fastest_variant_is_the_one_theorem_3_8_predicts_faster(monkeypatch):
  """choose_variant times the probe row's c and v under each variant's
  compiler options (each number keeping its fastest round) and picks the
  larger E[tokens] / (gamma c + v) at the probe's alpha; here the variant's
  cheaper verification at gamma 8 beats the default's gamma 3, and with its
  verification made dear, the default wins."""
  eigen = {"xla_cpu_experimental_ynn_fusion_type": ""}
  config = demo.DemoConfig(
      drafts=(("demo:draft_base", 3),),
      variants={"eigen": {"compiler_options": eigen,
                          "drafts": (("demo:draft_base", 8),)}},
      variant="fastest", variant_probe=("demo:draft_base", 0.8))
  verify = {3: 2.2, 8: 1.8}  # target steps, by gamma
  calls = []

  def fake_costs(target, draft, ids, *, gamma, compiler_options, **kwargs):
    del target, draft, ids, kwargs
    calls.append((gamma, compiler_options))
    slow = 1.5 if len(calls) <= 2 else 1.0  # the first round is slow
    return {"target_step_s": 0.005 * slow, "draft_step_s": 0.0001 * slow,
            "verify_step_s": 0.005 * verify[gamma] * slow}

  monkeypatch.setattr(variants.step_timers, "measure_costs", fake_costs)
  monkeypatch.setattr(variants.checkpoints, "load_model", lambda spec: spec)
  name, numbers = variants.choose_variant(config, np.ones((1, 4), np.int32))
  assert calls == [(3, None), (8, eigen)] * 2
  assert name == "eigen"
  for variant, gamma in (("default", 3), ("eigen", 8)):
    got = numbers[variant]
    assert got["c"] == pytest.approx(0.02)
    assert got["verify_cost"] == pytest.approx(verify[gamma])
    assert got["predicted"] == pytest.approx(
        float(sd.theory.expected_tokens(0.8, gamma))
        / (gamma * 0.02 + verify[gamma]))
  verify[8] = 3.5
  calls.clear()
  assert variants.choose_variant(config, np.ones((1, 4), np.int32))[0] == "default"


def test_variants_must_name_demo_fields_and_exist():
  config = demo.DemoConfig(variants={"typo": {"gama": 3}})
  with pytest.raises(ValueError, match="not one of"):
    variants.variant(config, "eigen")
  with pytest.raises(ValueError, match="gama"):
    variants.variant(config, "typo")
  assert variants.variant(config, "default").drafts == config.drafts


def test_demo_gin_variants_cover_every_row():
  """Every variant of configs/demo.gin sets DemoConfig fields only and gives
  each of its drafts a gamma for every temperature, on both tasks."""
  gin.clear_config()
  gin_flags.parse(["demo.gin"], [])
  config = gin.get_configurable(demo.DemoConfig)()
  gin.clear_config()
  assert config.variant == "fastest" and config.variants
  for name in config.variants:
    variant = variants.variant(config, name)
    assert variant.variant is None
    for task, _, row in demo._rows(variant):
      assert row.gamma, (name, task)
    assert dict(variant.drafts)[config.variant_probe[0]]


def test_a_rerun_keeps_the_recorded_variant(tmp_path, monkeypatch):
  """variant='fastest' records its choice in variant.json; a rerun in the
  same workdir runs that variant without timing again (its finished rows
  then resume), and times again when the variants changed."""
  config = demo.DemoConfig(
      drafts=(("demo:draft_base", 3),),
      variants={"eigen": {"drafts": (("demo:draft_base", 8),)}},
      variant="fastest")
  (tmp_path / "variant.json").write_text(json.dumps(
      {"chosen": "eigen", "probe": list(config.variant_probe),
       "candidates": {"default": {}, "eigen": {}}}))

  def no_timing(*args, **kwargs):
    raise AssertionError("timed again")

  monkeypatch.setattr(variants, "choose_variant", no_timing)
  chosen = demo.resolve_variant(config, str(tmp_path))
  assert chosen.drafts == (("demo:draft_base", 8),)
  changed = demo.DemoConfig(
      drafts=config.drafts, variant="fastest",
      variants={"other": {"drafts": (("demo:draft_base", 5),)}})
  with pytest.raises(AssertionError, match="timed again"):
    demo.resolve_variant(changed, str(tmp_path))
