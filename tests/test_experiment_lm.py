"""Experiments with a decoder-only (GPT-like) target: n-gram drafts fitted
across the prompt, Table 3 rows on lm1b-style sentences, architectures named
in the config checked against self-describing checkpoints, and a task
vocabulary larger than the target refused before decoding."""

import json
import os

import jax
import numpy as np
import pytest

from specdec_jax import Model
from specdec_jax import checkpoints
from specdec_jax.data import tasks
from specdec_jax.data import readers
from specdec_jax.experiments import experiment
from specdec_jax.experiments import loading
from specdec_jax.tables import reproduce
from specdec_jax.models import registry


def _lines(workdir):
  with open(os.path.join(workdir, "examples.jsonl")) as f:
    return [json.loads(line) for line in f]

# Every training sentence's prompt (its first 4 words) ends in "on" and its
# continuation starts with "his", which appears nowhere else after "on": the
# bigram from the prompt's last token into the continuation exists only
# across the boundary.
_LM_WORDS = "the cat sat on a mat and his hat is red".split()


@pytest.fixture(scope="module")
def lm_setup(tmp_path_factory):
  """A 28-piece vocabulary (128 ids with the 100 extra: gpt_tiny's size) and
  lm1b_local train/test files of short sentences."""
  import io  # pylint: disable=g-import-not-at-top
  import random  # pylint: disable=g-import-not-at-top
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  root = tmp_path_factory.mktemp("lm")
  rng = random.Random(0)
  tail = ["a", "mat", "hat", "is", "red", "his"]
  lines = [" ".join(rng.choice(_LM_WORDS) for _ in range(rng.randint(3, 9)))
           for _ in range(200)]
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(lines), model_writer=model, vocab_size=28,
      model_type="bpe", pad_id=0, eos_id=1, unk_id=2, bos_id=-1,
      hard_vocab_limit=False, character_coverage=1.0, minloglevel=2)
  (root / "micro.model").write_bytes(model.getvalue())
  train = ["the cat sat on his " + " ".join(
      rng.choice(tail) for _ in range(rng.randint(1, 4))) for _ in range(20)]
  (root / "train.txt").write_text("".join(s + "\n" for s in train))
  test = ["a cat sat on the mat", "his hat is red and the cat sat", "red hat"]
  (root / "test.txt").write_text("".join(s + "\n" for s in test))
  task_config = dict(vocab_path=str(root / "micro.model"),
                     lm1b_files={"train": str(root / "train.txt"),
                                 "test": str(root / "test.txt")})
  return root, task_config


def _lm_config(**overrides):
  base = dict(task="lm1b_local", split="test", target="gpt_tiny",
              draft="bigram", ngram_split="train", gamma=2, max_decode_len=8,
              cost_repeats=1, trace_examples=1)
  base.update(overrides)
  return experiment.ExperimentConfig(**base)


def test_ngram_draft_for_decoder_only_target_learns_across_the_prompt(
    lm_setup):
  """For a GPT-like target the n-gram drafter is fit on prompt + target rows
  (decoder_only): a bigram that only occurs from the prompt's last token into
  the continuation gets most of its row's mass, where a T5-style fit on the
  targets alone (the negative control) leaves it at the smoothing floor."""
  from specdec_jax.models import ngram  # pylint: disable=g-import-not-at-top
  _, task_config = lm_setup
  target = checkpoints.load_model("gpt_tiny")
  with tasks.override_config(**task_config):
    draft = loading.fit_ngram_draft(_lm_config(), target)
    unigram = loading.fit_ngram_draft(_lm_config(draft="unigram"), target)
    examples = readers.load_examples("lm1b_local", "train")
  assert draft.definition.decoder_only and draft.definition.order == 2
  assert unigram.definition.decoder_only and unigram.definition.order == 1
  pairs = {(int(e.inputs[-1]), int(e.targets[0])) for e in examples}
  assert len(pairs) == 1  # The design above: one boundary bigram.
  prev, cur = pairs.pop()
  assert all(prev not in e.targets[:-1].tolist() for e in examples)
  p = np.exp(draft.params["log_probs"][prev, cur])
  assert p > 0.5
  control = ngram.fit_ngram([e.targets for e in examples], target.vocab_size)
  floor = 1 / target.vocab_size
  assert np.exp(control.params["log_probs"][prev, cur]) == pytest.approx(
      floor, rel=1e-5)
  # The unigram counts prompt tokens too: `prev` occurs only in prompts.
  control = ngram.fit_ngram([e.targets for e in examples], target.vocab_size,
                            order=1)
  assert (unigram.params["log_probs"][prev]
          > control.params["log_probs"][prev] + np.log(20))


def test_gpt_table3_row_runs_and_assembles_under_the_gpt_key(lm_setup,
                                                             tmp_path):
  """A whole lm1b row on a random gpt_tiny target with a bigram draft writes
  every output; prompts decode without EOS; greedy speculative == greedy
  target; no quality columns (lm1b has no metric); and assembly puts it in
  Table 3 as ('gpt_97m', 'bigram') with the paper's 0.05 / 0.05 beside it, a
  GPT-like 6M draft known by its path as ('gpt_97m', 'gpt_6m'), while an
  EnDe row keeps its T5-XXL numbers."""
  _, task_config = lm_setup
  tables_dir = tmp_path / "tables"
  workdir = str(tables_dir / "lm1b_bigram_t0")
  with tasks.override_config(**task_config):
    summary = experiment.run(_lm_config(), workdir)
    prompts = [tasks.get_vocabulary().encode(" ".join(s.split()[:4]))
               for s in ["a cat sat on the mat",
                         "his hat is red and the cat sat", "red hat"]]
  for name in ["examples.jsonl", "summary.json", "table.md", "table.csv",
               "costs.json", "acceptance.png", "trace.html"]:
    assert os.path.getsize(os.path.join(workdir, name)) > 0, name
  lines = _lines(workdir)
  assert [r["input_length"] for r in lines] == [len(p) for p in prompts]
  row = summary["rows"][0]
  assert 0.0 <= row["alpha"] <= 1.0 and row["identical"] is True
  assert "quality_metric" not in row and "quality_baseline" not in row
  with open(os.path.join(workdir, "table.csv")) as f:
    header, values = [line.split(",") for line in f.read().splitlines()]
  assert values[header.index("quality_baseline")] == ""

  gpt_6m = json.loads(json.dumps(summary))
  gpt_6m["config"].update(draft="workdir/lm1b/gpt_6m/model", temperature=1.0)
  ende = json.loads(json.dumps(summary))
  ende["config"].update(task="wmt14_ende_local", draft="x",
                        draft_config="t5_1_1_small")
  tables = reproduce.assemble(str(tables_dir), [summary, gpt_6m, ende])
  table3 = {(r["target"], r["draft"]): r for r in tables["table3"]}
  bigram = table3[("target (lm1b)", "bigram")]
  assert bigram["alpha_t0"] == summary["alpha"]
  assert (bigram["paper_alpha_t0"], bigram["paper_alpha_t1"]) == (0.05, 0.05)
  small = table3[("target (lm1b)", "gpt_6m")]
  assert small["alpha_t1"] == summary["alpha"] and "alpha_t0" not in small
  assert (small["paper_alpha_t0"], small["paper_alpha_t1"]) == (0.88, 0.89)
  t5 = table3[("target (ende)", "t5_small")]
  assert (t5["paper_alpha_t0"], t5["paper_alpha_t1"]) == (0.75, 0.62)
  md = (tables_dir / "table3.md").read_text()
  assert "| target (lm1b) | bigram |" in md and "0.880" in md


def test_named_architecture_is_checked_for_self_describing_checkpoints(
    tmp_path):
  """target_config/draft_config name the architecture: a t5x: checkpoint
  needs it, and a checkpoint that records its own is checked against it, so
  a row naming 'gpt_97m' cannot silently run another model."""
  cfg = registry.get_config("gpt_tiny")
  definition = registry.make_def(cfg)
  path = checkpoints.save(
      Model(definition, definition.init_params(jax.random.PRNGKey(0))),
      str(tmp_path / "gpt"), config=cfg)
  model = loading._load_model("target", path, "gpt_tiny", None, None)
  assert model.definition.config.num_layers == cfg.num_layers
  with pytest.raises(experiment.ConfigError, match="differs in .*emb_dim"):
    loading._load_model("draft", path, "gpt_6m", None, None)


def test_task_vocabulary_larger_than_the_target_is_refused(lm_setup,
                                                           tiny_vocab,
                                                           tmp_path):
  """Token ids past the target's embedding would decode as garbage: a task
  vocabulary (300 ids) bigger than gpt_tiny's 128 fails before decoding,
  naming TaskConfig.vocab_path."""
  _, task_config = lm_setup
  with tasks.override_config(**dict(task_config, vocab_path=tiny_vocab)):
    with pytest.raises(experiment.ConfigError, match="TaskConfig.vocab_path"):
      experiment.run(_lm_config(draft="gpt_tiny"), str(tmp_path / "w"))
