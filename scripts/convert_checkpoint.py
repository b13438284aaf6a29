r"""Converts a Hugging Face or T5X checkpoint into our format.

  python scripts/convert_checkpoint.py --input=hf:/ckpt/t5-v1_1-small \
      --output=/models/t5_1_1_small
  python scripts/convert_checkpoint.py --config=t5_1_1_xxl \
      --input=t5x:gs://BUCKET/t5_1_1_xxl/checkpoint_1000000 \
      --param_dtype=bfloat16 --output=/models/t5_1_1_xxl

  python scripts/convert_checkpoint.py --input=demo:target --format=hf \
      --output=/tmp/demo_target_hf   # for Hugging Face transformers
  python scripts/convert_checkpoint.py \
      --input=hf:gs://BUCKET/t5gemma-2b-2b-prefixlm \
      --param_dtype=bfloat16 --output=gs://BUCKET/t5gemma_2b_2b  # T5Gemma
  python scripts/convert_checkpoint.py \
      --input=hf:gs://BUCKET/gemma-3-27b-it --param_dtype=bfloat16 \
      --output=gs://BUCKET/gemma3_27b_it  # Gemma 3 (the text model)
  python scripts/convert_checkpoint.py --input=hf:gs://BUCKET/Qwen3-0.6B \
      --format=hf --output=gs://BUCKET/qwen3_copy  # Llama 3, Qwen 3, 2.5

--output may be gs://BUCKET/DIR: written locally, then uploaded with
progress logged; an unreachable bucket fails within SPECDEC_IO_TIMEOUT_S
(default 120 s) naming the bucket and the likely causes.

Expected: it prints the output directory, which then loads with
`specdec_jax.load_model(DIR)` (config.json + orbax params), or with
--format=hf, as a Hugging Face directory of the model's family (T5,
T5Gemma, Gemma 3's Gemma3ForCausalLM, the Llama layout's LlamaForCausalLM,
Qwen3ForCausalLM or Qwen2ForCausalLM with its tokenizer files;
config.json + model.safetensors)
that transformers' `from_pretrained(DIR)` and `load_model("hf:DIR")` both
read. T5X checkpoints
need --config (a config name or a gin file under configs/models), since
they do not record their architecture.
"""

import sys

from absl import app
from absl import flags
from absl import logging

from specdec_jax.launch import cli
from specdec_jax import checkpoints
from specdec_jax.infra import paths
from specdec_jax.infra import locks

_INPUT = flags.DEFINE_string(
    "input", None, "hf:DIR or t5x:PATH (a checkpoint_<step> directory).",
    required=True)
_OUTPUT = flags.DEFINE_string("output", None, "Directory to write.",
                              required=True)
_CONFIG = flags.DEFINE_string(
    "config", None, "t5x only: a config name (e.g. t5_1_1_xxl) or gin file.")
_PARAM_DTYPE = flags.DEFINE_string(
    "param_dtype", None, "Store the parameters in this dtype (e.g. bfloat16).")
_VOCAB = flags.DEFINE_string(
    "vocab", None, "SentencePiece model file to copy next to the params.")
_FORMAT = flags.DEFINE_enum(
    "format", "specdec", ["specdec", "hf"],
    "specdec: our orbax format; hf: a Hugging Face T5, T5Gemma, Gemma 3, "
    "Llama or Qwen directory (safetensors).")
_OVERWRITE = flags.DEFINE_bool("overwrite", False,
                               "Replace an existing output directory.")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  try:  # before the (possibly long) load
    locks.check_directory_path(_OUTPUT.value, "--output")
  except locks.WorkdirError as e:
    raise app.UsageError(str(e)) from None
  try:
    _convert()
  except paths.RemoteStorageError as e:
    sys.exit(f"convert_checkpoint: {e}")


def _convert():
  if paths.is_remote(_OUTPUT.value):
    # Before minutes of loading: is the bucket there and reachable?
    logging.info("checking %s", _OUTPUT.value)
    paths.exists(paths.join(_OUTPUT.value, "config.json"))
  if _FORMAT.value == "hf":
    if _VOCAB.value:
      raise app.UsageError("--vocab is for --format=specdec; a Hugging Face "
                           "export holds the weights and config only.")
    model = checkpoints.load_model(_INPUT.value, config=_CONFIG.value,
                                   param_dtype=_PARAM_DTYPE.value)
    output = checkpoints.save_hf(model, _OUTPUT.value,
                                 overwrite=_OVERWRITE.value)
  else:
    output = checkpoints.convert(
        _INPUT.value, _OUTPUT.value, config=_CONFIG.value,
        param_dtype=_PARAM_DTYPE.value, vocab=_VOCAB.value,
        overwrite=_OVERWRITE.value)
  print(output)


if __name__ == "__main__":
  cli.run(main)
