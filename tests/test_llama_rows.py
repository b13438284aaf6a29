"""The rows of configs/experiments/llama3/, qwen3/ and qwen2_5/, and the
tasks they read through a tokenizer.json (`data/bpe_vocabulary.py`).

Invariants:
  - Llama 3 rows: the pretrained ones plain prompts after BOS, stopping at
    <|end_of_text|>; the Instruct ones the checkpoint's own chat template
    (its date fixed) after BOS, stopping at its three ids; Qwen 3 and 2.5
    rows: the checkpoint's chat template (Qwen 3's with thinking off), no
    BOS, stopping at <|im_end|> or <|endoftext|>;
    every row names its pair's architectures;
  - with `TaskConfig.vocab_path` a tokenizer.json, a prompt task gives
    [BOS] + the text's ids as the tokenizer encodes them (none for Qwen),
    no EOS, and targets end in the tokenizer's EOS;
  - a generated row decodes with its zeros kept: id 0 is a piece of these
    tokenizers ('!'), not padding;
  - a Qwen 3 instruction row runs end to end on tiny random checkpoints
    carrying the qwen3 fixture tokenizer, given what its header tells a
    user to override (and the tiny tokenizer's stop ids), with a target 3
    ids wider than its draft: every prompt is the chat template's ids, and
    the speculative tokens equal the target's; its prompts are what the
    checkpoint's own chat template renders (transformers' ids for the
    fixture's message).
"""

import json
import os

import gin
import jax
import numpy as np
import pytest

from specdec_jax.checkpoints import hf_llama
from specdec_jax.data import readers
from specdec_jax.data import tasks
from specdec_jax.data import vocabularies
from specdec_jax.decoding.protocol import Model
from specdec_jax.experiments import experiment
from specdec_jax.launch import gin_flags
from specdec_jax.models import registry

TESTDATA = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                        "testdata")
BPE = {family: os.path.join(TESTDATA, f"hf_bpe_{family}", "tokenizer.json")
       for family in ("llama3", "qwen3")}
INSTRUCTIONS = [
    {"instruction": "Translate to German: a man in a hat.", "context": "",
     "response": "Ein Mann mit Hut."},
    {"instruction": "Who reads the book?", "context": "A woman reads.",
     "response": "A woman."}]


def _parse(row, lines=()):
  gin_flags.parse([f"experiments/{row}.gin"], list(lines),
                  extra_search_paths=[])
  return gin.get_configurable(experiment.ExperimentConfig)()


LLAMA_DATE = {"date_string": "26 Jul 2024"}
NO_THINKING = {"enable_thinking": False}


# chat: None for plain prompts, else the chat template's arguments.
@pytest.mark.parametrize("row,task,stops,bos,chat,configs", [
    ("llama3/ende_8b_1b_t0", "wmt14_ende_prompt", (128001,), True, None,
     ("llama3_1_8b", "llama3_2_1b")),
    ("llama3/instruct_70b_8b_t1", "instructions_local",
     (128001, 128008, 128009), True, LLAMA_DATE,
     ("llama3_1_70b", "llama3_1_8b")),
    ("qwen3/cnndm_32b_1_7b_t0", "cnn_dailymail_prompt", (151645, 151643),
     False, NO_THINKING, ("qwen3_32b", "qwen3_1_7b")),
    ("qwen3/instruct_8b_0_6b_t1", "instructions_local", (151645, 151643),
     False, NO_THINKING, ("qwen3_8b", "qwen3_0_6b")),
    ("qwen2_5/ende_72b_0_5b_t1", "wmt14_ende_prompt", (151645, 151643),
     False, {}, ("qwen2_5_72b", "qwen2_5_0_5b")),
    ("qwen2_5/instruct_32b_0_5b_t0", "instructions_local", (151645, 151643),
     False, {}, ("qwen2_5_32b", "qwen2_5_0_5b"))])
def test_rows_bind_prompts_and_stop_ids(row, task, stops, bos, chat,
                                        configs):
  """Each row's task, stop ids, BOS, template and architectures (a draft
  never wider than its target: Qwen 2.5's 0.5B is 128 ids narrower)."""
  try:
    config = _parse(row)
    settings = tasks.current_config()
  finally:
    gin.clear_config()
  assert (config.task, tuple(config.stop_ids)) == (task, stops)
  assert (settings.vocab_extra_ids, settings.inputs_bos) == (0, bos)
  assert settings.vocab_path.endswith("/tokenizer.json")
  # Instruction and chat rows: the target checkpoint's own template, with
  # Llama's date fixed and Qwen 3's thinking off.
  assert settings.prompt_template == (
      tasks.PLAIN_PROMPT if chat is None else tasks.CHECKPOINT_CHAT_TEMPLATE)
  assert dict(settings.chat_template_kwargs) == (chat or {})
  assert (config.target_config, config.draft_config) == configs
  target, draft = (registry.get_config(name) for name in configs)
  assert draft.vocab_size <= target.vocab_size


@pytest.mark.parametrize("family", ["llama3", "qwen3"])
def test_prompt_tasks_read_a_tokenizer_json(tmp_path, family):
  """wmt14_ende_local_prompt with a tokenizer.json: [BOS] + the task
  text's ids for Llama 3, the ids alone for Qwen; no EOS after the
  prompt, the tokenizer's EOS after the target."""
  (tmp_path / "mini.en").write_text("A man in a hat!\n")
  (tmp_path / "mini.de").write_text("Ein Mann mit Hut.\n")
  vocab = hf_llama.read_vocabulary(os.path.dirname(BPE[family]))
  with tasks.override_config(vocab_path=BPE[family], vocab_extra_ids=0,
                             inputs_bos=family == "llama3",
                             local_data_dir=str(tmp_path),
                             wmt_ende_files={"test": "mini"}):
    (example,) = readers.load_examples("wmt14_ende_local_prompt", "test")
  bos = [vocab.bos_id] if family == "llama3" else []
  ids = vocab.encode(tasks.TRANSLATE_PREFIX + "A man in a hat!")
  assert example.inputs.tolist() == bos + ids
  assert example.targets.tolist() == vocab.encode("Ein Mann mit Hut.") + [
      vocab.eos_id]


def test_a_generated_row_keeps_its_zeros():
  """detokenize cuts at the stop id but keeps id 0, which these
  tokenizers use for '!' (a SentencePiece vocabulary drops it as
  padding)."""
  vocab = hf_llama.read_vocabulary(os.path.dirname(BPE["llama3"]))
  assert vocab.encode("!") == [0]
  ids = vocab.encode("A hat") + [0, vocab.eos_id, 0, 0]
  assert vocabularies.detokenize(vocab, ids, (vocab.eos_id,)) == "A hat!"


@pytest.fixture(scope="module")
def row_bindings(tmp_path_factory):
  """Tiny random Qwen 3 checkpoints (a 2-layer target of the tokenizer's
  size + 3 ids, a 1-layer draft of its size) as Hugging Face directories
  with the qwen3 fixture tokenizer, the instructions file, and the
  bindings a user would pass for them."""
  root = tmp_path_factory.mktemp("qwen3_row")
  (root / "dolly.jsonl").write_text(
      "".join(json.dumps(r) + "\n" for r in INSTRUCTIONS))
  vocab = hf_llama.read_vocabulary(os.path.dirname(BPE["qwen3"]))
  bindings = {"QWEN3_TOKENIZER": repr(BPE["qwen3"]),
              "QWEN3_INSTRUCTIONS": repr(str(root / "dolly.jsonl")),
              # the tiny tokenizer's <|im_end|> and <|endoftext|>
              "QWEN3_STOP_IDS": repr(vocab.stop_ids),
              "experiment.ExperimentConfig.max_decode_len": "8",
              "experiment.ExperimentConfig.cost_repeats": "1",
              "experiment.ExperimentConfig.trace_examples": "0"}
  for name, width, layers, seed, spec, arch in (
      ("target", vocab.vocab_size + 3, 2, 0, "QWEN3_32B", "QWEN3_32B_CONFIG"),
      ("draft", vocab.vocab_size, 1, 1, "QWEN3_0_6B", "QWEN3_0_6B_CONFIG")):
    config = registry.get_config("qwen3_tiny", vocab_size=width,
                                 num_layers=layers, max_len=512)
    definition = registry.make_def(config)
    params = definition.init_params(jax.random.PRNGKey(seed))
    directory = root / name
    hf_llama.save_llama(Model(definition, params, vocab), str(directory))
    bindings[spec] = repr(f"hf:{directory}")
    bindings[arch] = repr({f: getattr(config, f) for f in (
        "vocab_size", "emb_dim", "num_layers", "num_heads", "num_kv_heads",
        "head_dim", "mlp_dim", "qk_norm", "tie_embeddings",
        "layer_norm_epsilon", "rope_theta", "max_len")})
  return bindings


def test_an_instruction_row_runs_end_to_end(row_bindings, tmp_path):
  """instruct_32b_0_6b_t0 decodes every instruction with the target alone
  and speculatively (a draft 3 ids narrower), greedy outputs identical;
  each prompt is the chat template's ids (no BOS, no EOS)."""
  lines = [f"{k} = {v}" for k, v in row_bindings.items()]
  try:
    config = _parse("qwen3/instruct_32b_0_6b_t0", lines)
    assert (config.gamma, config.dtype) == (7, "bfloat16")
    assert tasks.current_config().prompt_template == "checkpoint"
    template = tasks.prompt_text()
    summary = experiment.run(config, str(tmp_path / "run"))
  finally:
    gin.clear_config()
  (row,) = summary["rows"]
  assert row["identical"] is True and 0.0 <= row["alpha"] <= 1.0
  with open(tmp_path / "run" / "examples.jsonl") as f:
    records = [json.loads(line) for line in f]
  vocab = hf_llama.read_vocabulary(os.path.dirname(BPE["qwen3"]))
  prompts = [template.replace("{input}", e["instruction"] + (
      "\n\n" + e["context"] if e.get("context") else ""))
             for e in INSTRUCTIONS]
  assert [r["input_length"] for r in records] == [
      len(vocab.encode(p)) for p in prompts]
  # The first instruction is the fixture's message: transformers' ids.
  with open(os.path.join(os.path.dirname(BPE["qwen3"]),
                         "reference.json")) as f:
    reference = json.load(f)
  assert INSTRUCTIONS[0]["instruction"] == reference["message"]
  assert vocab.encode(prompts[0]) == reference["chat_ids"]
  for r in records:
    assert r["speculative"]["7"]["tokens"] == r["baseline"]["tokens"]
  assert np.all([len(r["baseline"]["tokens"]) <= 8 for r in records])
