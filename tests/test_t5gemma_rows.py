"""A row of configs/experiments/t5gemma/ runs end to end, on tiny models.

The row file is parsed as scripts/run_experiment.py parses it, and after it
only what its header tells a user to override: the checkpoints, Gemma's
tokenizer.model and the architectures, plus (no TFDS here) the local EnDe
task with short decodes. The row's own settings hold: Gemma's tokenizer
without sentinel ids, BOS first, plain prompts, bfloat16, gamma 7. The
vocabulary is `gemma_vocab` (Gemma's special ids and chat pieces, trained
from the package's demo sentences), and the tiny random T5Gemma models have
exactly its size as vocab_size, as T5Gemma's 256,000 is the size of Gemma's
tokenizer.model; each checkpoint directory holds it as tokenizer.model, as
a `huggingface-cli download` does.
"""

import json
import os

import gin
import jax
import pytest
import sentencepiece as spm

from specdec_jax import checkpoints
from specdec_jax.data import tasks
from specdec_jax.experiments import experiment
from specdec_jax.experiments import loading
from specdec_jax.experiments import tiny_checkpoints
from specdec_jax.launch import gin_flags

ROW = "experiments/t5gemma/ende_s_s_t0.gin"


@pytest.fixture(scope="module")
def setup(tmp_path_factory, gemma_vocab):
  """What scripts/tiny_checkpoints.py writes for a dry run: the first three
  demo sentence pairs as local EnDe files, and a 2+2-layer target and a
  1+1-layer draft saved as Hugging Face T5Gemma directories with the
  vocabulary in them; returns the bindings of its tiny.gin, the
  vocabulary's size and the sentence pairs."""
  root = tmp_path_factory.mktemp("t5gemma_row")
  bindings = tiny_checkpoints.write_t5gemma(str(root), vocab=gemma_vocab)
  size = spm.SentencePieceProcessor(model_file=gemma_vocab).get_piece_size()
  pairs = [(root / f"mini.{side}").read_text().splitlines()
           for side in ("en", "de")]
  return bindings, size, pairs


def _run_row(bindings: dict, workdir: str, **extra: str) -> dict:
  """The row with `bindings` and `extra` (gin NAME -> value) after it, run
  as scripts/run_experiment.py runs it."""
  lines = [f"{k} = {v}" for k, v in {**bindings, **extra}.items()]
  try:
    gin_flags.parse([ROW], lines, extra_search_paths=[])
    config = gin.get_configurable(experiment.ExperimentConfig)()
    assert (config.gamma, config.temperature, config.dtype) == (7, 0.0,
                                                                "bfloat16")
    assert tasks.current_config().inputs_bos
    return experiment.run(config, workdir)
  finally:
    gin.clear_config()


@pytest.fixture(scope="module")
def default_run(setup, tmp_path_factory):
  """The row as its header sets it up: (summary, examples.jsonl records)."""
  bindings = setup[0]
  workdir = tmp_path_factory.mktemp("t5gemma_row_run") / "run"
  summary = _run_row(bindings, str(workdir))
  with open(workdir / "examples.jsonl") as f:
    records = [json.loads(line) for line in f]
  assert os.path.getsize(workdir / "table.md") > 0
  return summary, records


def test_a_t5gemma_row_runs_end_to_end(default_run, setup, gemma_vocab):
  """ende_s_s_t0 decodes every example with the target alone and
  speculatively, with identical greedy outputs; each encoder input is
  [BOS] + the tokenizer's ids + [EOS] (its recorded length counts both),
  and the text comes back through the checkpoint's tokenizer.model."""
  summary, records = default_run
  (row,) = summary["rows"]
  assert row["gamma"] == 7 and row["identical"] is True
  assert 0.0 <= row["alpha"] <= 1.0
  sp = spm.SentencePieceProcessor(model_file=gemma_vocab)
  english, german = setup[2]
  assert [r["input_length"] for r in records] == [
      len(sp.encode(tasks.TRANSLATE_PREFIX + s)) + 2 for s in english]
  assert [r["target_text"] for r in records] == german
  for r in records:
    assert r["speculative"]["7"]["tokens"] == r["baseline"]["tokens"]
    assert r["baseline"]["text"] == sp.decode(
        [t for t in r["baseline"]["tokens"] if t != sp.eos_id()])


def test_the_it_flags_stop_at_end_of_turn(setup):
  """The two -it flags of checkpoints.gin set the chat template and
  stop_ids (1, 107); without them the row stops at EOS alone."""
  bindings = setup[0]
  lines = [f"{k} = {v}" for k, v in bindings.items()]
  bound = {}
  for name, flags in (("plain", []), ("it", [
      "T5GEMMA_PROMPT_TEMPLATE = %T5GEMMA_CHAT_TEMPLATE",
      "T5GEMMA_STOP_IDS = %T5GEMMA_IT_STOP_IDS"])):
    try:
      gin_flags.parse([ROW], lines + flags, extra_search_paths=[])
      config = gin.get_configurable(experiment.ExperimentConfig)()
      bound[name] = (tuple(config.stop_ids),
                     tasks.current_config().prompt_template)
    finally:
      gin.clear_config()
  assert bound["plain"] == ((1,), "{input}")
  assert bound["it"] == ((1, 107), tasks.GEMMA_CHAT_TEMPLATE)


def test_stop_ids_cut_the_decodes_and_the_recorded_text(
    default_run, setup, gemma_vocab, tmp_path):
  """With T5GEMMA_STOP_IDS = (1, X), X a token the default run emits
  after its first, every example's baseline is the default one cut right
  after its first X (or EOS), the speculative tokens equal it, and the
  recorded text is the decoded tokens before that stop id."""
  _, default = default_run
  first = default[0]["baseline"]["tokens"]
  stop = next((t for k, t in enumerate(first)
               if k and t != 1 and t not in first[:k]), first[0])
  bindings = setup[0]
  summary = _run_row(bindings, str(tmp_path / "run"),
                     T5GEMMA_STOP_IDS=f"(1, {stop})")
  assert summary["rows"][0]["identical"] is True
  with open(tmp_path / "run" / "examples.jsonl") as f:
    records = [json.loads(line) for line in f]
  sp = spm.SentencePieceProcessor(model_file=gemma_vocab)
  cut_any = False
  for r, d in zip(records, default):
    tokens = d["baseline"]["tokens"]
    ends = [k for k, t in enumerate(tokens) if t in (1, stop)]
    expected = tokens[:ends[0] + 1] if ends else tokens
    cut_any |= len(expected) < len(tokens)
    assert r["baseline"]["tokens"] == expected
    assert r["speculative"]["7"]["tokens"] == expected
    text = expected[:-1] if ends else expected
    assert r["baseline"]["text"] == sp.decode(text)
    assert r["speculative"]["7"]["text"] == r["baseline"]["text"]
  assert cut_any


@pytest.mark.parametrize("architecture", ["named", "none"])
def test_t5s_sentinels_are_refused(setup, tmp_path, monkeypatch,
                                   architecture):
  """The negative control: the same row with T5's 100 sentinel ids has 100
  ids more than the target's embedding and is refused by
  `check_vocabulary_fits`, naming the setting, before any checkpoint is
  read where the row names the target's architecture (as every T5Gemma
  row does), and after the models load, before any decode, where it names
  none."""
  bindings, size, _ = setup
  if architecture == "none":
    bindings = {**bindings, "T5GEMMA_TARGET_CONFIG": "None",
                "T5GEMMA_S_S_CONFIG": "None"}
  loaded = []
  load_model = checkpoints.load_model
  monkeypatch.setattr(checkpoints, "load_model", lambda spec, **kw: (
      loaded.append(spec) or load_model(spec, **kw)))
  decoded = []
  monkeypatch.setattr(experiment, "_decode_missing_examples",
                      lambda *a: decoded.append(1))
  checked = []
  check = loading.check_vocabulary_fits
  monkeypatch.setattr(loading, "check_vocabulary_fits", lambda *a: (
      checked.append(len(a)) or check(*a)))
  with pytest.raises(experiment.ConfigError) as info:
    _run_row(bindings, str(tmp_path / "run"),
             **{"tasks.TaskConfig.vocab_extra_ids": "100"})
  assert (f"({size + 100} ids: {size} pieces + TaskConfig.vocab_extra_ids="
          f"100 sentinel ids) but the target has vocab_size {size}"
          ) in str(info.value)
  assert "vocab_extra_ids to the sentinels it has" in str(info.value)
  assert not decoded
  if architecture == "named":
    assert loaded == [] and checked == [1]
  else:
    assert len(loaded) == 2 and checked == [1, 2]
