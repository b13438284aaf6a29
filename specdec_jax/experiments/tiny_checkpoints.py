"""Tiny random checkpoints shaped like a family's downloads, for a dry run.

Before downloading 9B checkpoints (or renting a slice), a row of
configs/experiments/t5gemma/ can run end to end on one CPU against tiny
random models written in the format the real ones come in: a Hugging Face
directory (config.json + model.safetensors + tokenizer.model) per model, a
SentencePiece model shaped like Gemma's (its special ids and chat pieces,
no sentinels), and a few EnDe sentences from the package. What it checks
is the road (loading, tokenizing, the row's settings, the loop, the
outputs' files), not a number: random models' alpha means nothing.

`write_t5gemma(out_dir)` writes it all plus `tiny.gin`, the bindings that
point the row's macros at it; scripts/tiny_checkpoints.py is its command
(docs/t5gemma.md, "A dry run offline").
"""

from __future__ import annotations

import io
import os
from typing import Sequence

import jax

from specdec_jax import checkpoints
from specdec_jax.checkpoints import hf_t5gemma
from specdec_jax.data import tasks
from specdec_jax.decoding.protocol import Model
from specdec_jax.models import registry

# The package's demo sentences (real Multi30k validation text).
_DEMO_DATA = tasks.resolve_package_path("package:demo_data")


def gemma_like_vocab(path: str, vocab_size: int = 600) -> str:
  """Writes a SentencePiece model shaped like Gemma's tokenizer.model.

  Gemma's special ids (pad 0, EOS 1, BOS 2, UNK 3), `<start_of_turn>` and
  `<end_of_turn>` as single pieces (ids 4 and 5 here, 106 and 107 in
  Gemma's), identity normalization without a dummy prefix (newlines and
  spaces kept) and byte fallback; trained in a fraction of a second on the
  package's demo sentences (Gemma's own is gated and 4 MB).

  Returns:
    `path`.
  """
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  lines = [f"{tasks.TRANSLATE_PREFIX} {tasks.SUMMARIZE_PREFIX}"]
  for side in ("en", "de"):
    with open(os.path.join(_DEMO_DATA, f"sentences.{side}"),
              encoding="utf-8") as f:
      lines += f.read().splitlines()
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(lines), model_writer=model,
      vocab_size=vocab_size, model_type="bpe", pad_id=0, eos_id=1, bos_id=2,
      unk_id=3, user_defined_symbols=["<start_of_turn>", "<end_of_turn>"],
      normalization_rule_name="identity", add_dummy_prefix=False,
      remove_extra_whitespaces=False, byte_fallback=True,
      hard_vocab_limit=False, character_coverage=1.0, minloglevel=2)
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "wb") as f:
    f.write(model.getvalue())
  return path


def t5gemma_architecture(vocab_size: int, layers: int) -> dict:
  """A tiny T5Gemma (fields of `T5GemmaConfig`): 32 wide, 2 query heads
  and 1 key/value head of 16, windows of 8, `layers` per stack."""
  stack = {"emb_dim": 32, "num_layers": layers, "num_heads": 2,
           "num_kv_heads": 1, "head_dim": 16, "mlp_dim": 64,
           "query_pre_attn_scalar": 16.0, "sliding_window": 8}
  return {"vocab_size": vocab_size, "encoder": dict(stack),
          "decoder": dict(stack)}


def write_t5gemma(out_dir: str, vocab: str | None = None,
                  sentences: int = 3) -> dict[str, str]:
  """A tiny T5Gemma target (2+2 layers) and draft (1+1), their tokenizer
  and `sentences` EnDe pairs, with `<out_dir>/tiny.gin` pointing the
  T5Gemma rows at them.

  Args:
    out_dir: a local folder (created).
    vocab: a Gemma-like SentencePiece model to use (None: one is trained,
      `gemma_like_vocab`).
    sentences: EnDe pairs from the package's demo sentences.

  Returns:
    The bindings tiny.gin holds (gin name -> value as gin reads it).
  """
  os.makedirs(out_dir, exist_ok=True)
  out_dir = os.path.abspath(out_dir)
  vocab = vocab or gemma_like_vocab(os.path.join(out_dir, "tokenizer.model"))
  for side in ("en", "de"):
    with open(os.path.join(_DEMO_DATA, f"sentences.{side}"),
              encoding="utf-8") as f:
      lines = f.read().splitlines()[:sentences]
    with open(os.path.join(out_dir, f"mini.{side}"), "w",
              encoding="utf-8") as f:
      f.write("".join(line + "\n" for line in lines))
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  size = spm.SentencePieceProcessor(model_file=vocab).get_piece_size()
  bindings = {
      "T5GEMMA_VOCAB": repr(vocab),
      "tasks.TaskConfig.local_data_dir": repr(out_dir),
      "tasks.TaskConfig.wmt_ende_files": "{'test': 'mini'}",
      "experiment.ExperimentConfig.task": repr(tasks.WMT14_ENDE_LOCAL),
      "experiment.ExperimentConfig.max_decode_len": "8",
      "experiment.ExperimentConfig.cost_repeats": "1",
      "experiment.ExperimentConfig.trace_examples": "0"}
  for name, layers, seed, spec, arch in (
      ("target", 2, 0, "T5GEMMA_ENDE_9B_9B", "T5GEMMA_TARGET_CONFIG"),
      ("draft", 1, 1, "T5GEMMA_ENDE_S_S", "T5GEMMA_S_S_CONFIG")):
    fields = t5gemma_architecture(size, layers)
    definition = registry.make_def(checkpoints.resolve_config(fields))
    params = definition.init_params(jax.random.PRNGKey(seed))
    directory = os.path.join(out_dir, name)
    hf_t5gemma.save_t5gemma(Model(definition, params), directory)
    with open(vocab, "rb") as src, open(
        os.path.join(directory, hf_t5gemma.TOKENIZER_FILE), "wb") as dst:
      dst.write(src.read())
    bindings[spec] = repr(f"hf:{directory}")
    bindings[arch] = repr(fields)
  _write_gin(os.path.join(out_dir, "tiny.gin"), bindings)
  return bindings


def _write_gin(path: str, bindings: dict[str, str]) -> None:
  lines: Sequence[str] = [
      "# Tiny random T5Gemma checkpoints for a dry run of a T5Gemma row",
      "# (scripts/tiny_checkpoints.py): pass after the row's gin file.",
      "from __gin__ import dynamic_registration",
      "from specdec_jax.data import tasks",
      "from specdec_jax.experiments import experiment",
      *(f"{name} = {value}" for name, value in bindings.items())]
  with open(path, "w") as f:
    f.write("\n".join(lines) + "\n")
