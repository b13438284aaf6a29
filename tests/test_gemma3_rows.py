"""The rows of configs/experiments/gemma3/ and the tasks they read.

Invariants:
  - the prompt tasks (`*_prompt`) are the paper's tasks for a decoder-only
    model: [BOS] + the task text's ids, no EOS (the model continues it);
    targets as before;
  - `instructions_local` reads databricks-dolly-15k's JSONL: the
    instruction, a blank line and the context when there is one; a row
    without an instruction is an error naming the file and line;
  - the pretrained rows bind plain prompts and stop at EOS, the -it rows
    the chat template and stop at EOS or <end_of_turn> (106);
  - an instruction row runs end to end on tiny random Gemma 3 checkpoints,
    given only what its header tells a user to override, with a target
    wider than its draft (the draft's vocabulary is the tokenizer's, the
    target's 8 ids more, as 27B's 262208 beside 1B's 262144): every
    prompt is [BOS] + the chat template's ids, and the speculative tokens
    equal the target's.

The tokenizer is `gemma_vocab` (conftest.py: Gemma's special ids and
chat pieces, trained from the package's demo sentences).
"""

import json

import gin
import jax
import pytest
import sentencepiece as spm

from specdec_jax.checkpoints import hf_gemma3
from specdec_jax.data import readers
from specdec_jax.data import tasks
from specdec_jax.decoding.protocol import Model
from specdec_jax.experiments import experiment
from specdec_jax.launch import gin_flags
from specdec_jax.models import gemma3
from specdec_jax.models import registry

ROWS = "experiments/gemma3"
INSTRUCTIONS = [
    {"instruction": "Translate to German: a man in a hat.", "context": "",
     "response": "Ein Mann mit Hut."},
    {"instruction": "Who reads the book?", "context": "A woman reads.",
     "response": "A woman."},
    {"instruction": "Name two dogs.", "id": "dogs"}]


def _parse(row, lines=()):
  gin_flags.parse([f"{ROWS}/{row}.gin"], list(lines), extra_search_paths=[])
  return gin.get_configurable(experiment.ExperimentConfig)()


@pytest.mark.parametrize("row,task,stops,template", [
    ("ende_270m_t0", "wmt14_ende_prompt", (1,), tasks.PLAIN_PROMPT),
    ("cnndm_4b_t1", "cnn_dailymail_prompt", (1,), tasks.PLAIN_PROMPT),
    ("instruct_1b_t0", "instructions_local", (1, 106),
     tasks.GEMMA_CHAT_TEMPLATE)])
def test_rows_bind_prompts_and_stop_ids(row, task, stops, template):
  """Pretrained rows: the task's prompt form, plain text, EOS alone; -it
  rows: the chat template and (1, 106); all: Gemma's tokenizer settings
  and the 27B target."""
  try:
    config = _parse(row)
    settings = tasks.current_config()
  finally:
    gin.clear_config()
  assert (config.task, tuple(config.stop_ids)) == (task, stops)
  assert (settings.prompt_template, settings.vocab_extra_ids,
          settings.inputs_bos) == (template, 0, True)
  assert config.target_config == "gemma3_27b"
  assert gemma3.END_OF_TURN_ID == 106


def test_prompt_tasks_end_without_eos(tmp_path, gemma_vocab):
  """wmt14_ende_local_prompt gives [BOS] + the task text's ids, no EOS,
  where wmt14_ende_local ends in EOS; the targets are the same."""
  (tmp_path / "mini.en").write_text("A man in a hat.\n")
  (tmp_path / "mini.de").write_text("Ein Mann mit Hut.\n")
  sp = spm.SentencePieceProcessor(model_file=gemma_vocab)
  with tasks.override_config(vocab_path=gemma_vocab, vocab_extra_ids=0,
                             inputs_bos=True, local_data_dir=str(tmp_path),
                             wmt_ende_files={"test": "mini"}):
    (prompt,) = readers.load_examples("wmt14_ende_local_prompt", "test")
    (encoder,) = readers.load_examples(tasks.WMT14_ENDE_LOCAL, "test")
  ids = sp.encode(tasks.TRANSLATE_PREFIX + "A man in a hat.")
  assert prompt.inputs.tolist() == [sp.bos_id()] + ids
  assert encoder.inputs.tolist() == [sp.bos_id()] + ids + [sp.eos_id()]
  assert prompt.targets.tolist() == encoder.targets.tolist()


def test_instructions_local_reads_dolly_rows(tmp_path, gemma_vocab):
  """An instruction with context becomes 'instruction\\n\\ncontext'; one
  without stays as it is; a missing response is an empty target; ids come
  from 'id' or the row's position. A row without an instruction names the
  file and the line."""
  path = tmp_path / "dolly.jsonl"
  path.write_text("".join(json.dumps(r) + "\n" for r in INSTRUCTIONS))
  with tasks.override_config(vocab_path=gemma_vocab, vocab_extra_ids=0,
                             instruction_files={"test": str(path)}):
    examples = readers.load_examples(tasks.INSTRUCTIONS_LOCAL, "test")
    assert [e.inputs_text for e in examples] == [
        INSTRUCTIONS[0]["instruction"],
        "Who reads the book?\n\nA woman reads.", "Name two dogs."]
    assert [e.targets_text for e in examples] == [
        "Ein Mann mit Hut.", "A woman.", ""]
    assert [e.id for e in examples] == ["0", "1", "dogs"]
    assert all(e.inputs[-1] != 1 for e in examples)  # no EOS
    path.write_text('{"instruction": "a"}\n{"context": "b"}\n')
    with pytest.raises(ValueError, match=r"dolly.jsonl line 2 .*'instruction'"):
      readers.load_examples(tasks.INSTRUCTIONS_LOCAL, "test")


@pytest.fixture(scope="module")
def row_bindings(tmp_path_factory, gemma_vocab):
  """Tiny random Gemma 3 checkpoints (a 2-layer target of the tokenizer's
  size + 8 ids, a 1-layer draft of its size) as Hugging Face directories
  with tokenizer.model, the instructions file, and the bindings a user
  would pass for them."""
  root = tmp_path_factory.mktemp("gemma3_row")
  (root / "dolly.jsonl").write_text(
      "".join(json.dumps(r) + "\n" for r in INSTRUCTIONS))
  size = spm.SentencePieceProcessor(model_file=gemma_vocab).get_piece_size()
  bindings = {"GEMMA3_VOCAB": repr(gemma_vocab),
              "GEMMA3_INSTRUCTIONS": repr(str(root / "dolly.jsonl")),
              "experiment.ExperimentConfig.max_decode_len": "8",
              "experiment.ExperimentConfig.cost_repeats": "1",
              "experiment.ExperimentConfig.trace_examples": "0"}
  for name, vocab, layers, seed, spec, arch in (
      ("target", size + 8, 2, 0, "GEMMA3_27B_IT", "GEMMA3_TARGET_CONFIG"),
      ("draft", size, 1, 1, "GEMMA3_1B_IT", "GEMMA3_1B_CONFIG")):
    config = registry.get_config("gemma3_tiny", vocab_size=vocab,
                                 num_layers=layers, layer_types=None,
                                 sliding_window=8, max_len=512)
    definition = registry.make_def(config)
    params = definition.init_params(jax.random.PRNGKey(seed))
    directory = root / name
    hf_gemma3.save_gemma3(Model(definition, params), str(directory))
    (directory / hf_gemma3.TOKENIZER_FILE).write_bytes(
        open(gemma_vocab, "rb").read())
    bindings[spec] = repr(f"hf:{directory}")
    bindings[arch] = repr({f: getattr(config, f) for f in (
        "vocab_size", "emb_dim", "num_layers", "num_heads", "num_kv_heads",
        "head_dim", "mlp_dim", "query_pre_attn_scalar", "sliding_window",
        "rope_scale", "max_len")})
  return bindings


def test_an_instruction_row_runs_end_to_end(row_bindings, gemma_vocab,
                                            tmp_path):
  """instruct_1b_t0 decodes every instruction with the target alone and
  speculatively (a draft 8 ids narrower), greedy outputs identical; each
  prompt is [BOS] + the chat template's ids, without EOS."""
  lines = [f"{k} = {v}" for k, v in row_bindings.items()]
  try:
    config = _parse("instruct_1b_t0", lines)
    assert (config.gamma, config.dtype) == (5, "bfloat16")
    summary = experiment.run(config, str(tmp_path / "run"))
  finally:
    gin.clear_config()
  (row,) = summary["rows"]
  assert row["identical"] is True and 0.0 <= row["alpha"] <= 1.0
  with open(tmp_path / "run" / "examples.jsonl") as f:
    records = [json.loads(line) for line in f]
  sp = spm.SentencePieceProcessor(model_file=gemma_vocab)
  prompts = [tasks.GEMMA_CHAT_TEMPLATE.replace("{input}", e["instruction"] + (
      "\n\n" + e["context"] if e.get("context") else ""))
             for e in INSTRUCTIONS]
  assert [r["input_length"] for r in records] == [
      len(sp.encode(p)) + 1 for p in prompts]
  for r in records:
    assert r["speculative"]["5"]["tokens"] == r["baseline"]["tokens"]
