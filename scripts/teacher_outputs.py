r"""Translates a task split with a teacher model: data for sequence-level KD.

  .venv/bin/python scripts/teacher_outputs.py --model=demo:target \
      --task=multi30k_ende_mix_local --split=train \
      --output=workdir/demo/teacher/mix_train

Decodes every example of the split with the model, greedy, in batches of
examples of similar input length, and writes aligned `<output>.en` (the
source text, task prefix removed) and `<output>.de` (the model's
translation), one example a line in the split's order: the files
`multi30k_ende_local` reads (`TaskConfig.multi30k_files`). A draft trained
on them learns the target's own greedy outputs (sequence-level knowledge
distillation, Kim & Rush 2016), which is what greedy speculative decoding
asks of it: to guess the target's argmax on the target's own prefix
(docs/demo_models.md).

The run writes as it goes and resumes (`specdec_jax.training.teacher`):
each decoded batch is appended to `<output>.partial-<shard>.jsonl`, and a
rerun with the same settings decodes only what is missing; a rerun with
other settings is an error (`<output>.settings.json` records them). With
--shards=N, N processes (--shard=0..N-1) share the work; whichever finishes
last writes the files. An output that does not end within --max_decode_len
tokens keeps the reference instead, and is counted.
"""

from absl import flags
from absl import logging

import specdec_jax as sd
from specdec_jax.launch import cli
from specdec_jax.data import tasks
from specdec_jax.data import readers
from specdec_jax.training import teacher

flags.DEFINE_string("model", "demo:target", "The teacher (load_model spec).")
flags.DEFINE_string("model_config", None, "The teacher's architecture when "
                    "--model is a T5X checkpoint (t5x:PATH), e.g. t5_1_1_xxl.")
flags.DEFINE_string("task", tasks.MULTI30K_ENDE_MIX_LOCAL,
                    "A translation task (inputs 'translate English to "
                    "German: ...').")
flags.DEFINE_string("split", "train", "The split to translate.")
flags.DEFINE_string("output", None, "Prefix of the .en/.de files written.")
flags.DEFINE_integer("batch_size", 64, "Rows per decoding batch.")
flags.DEFINE_integer("max_decode_len", 128, "Most tokens per output.")
flags.DEFINE_integer("max_examples", 0, "Only the first this many (0: all).")
flags.DEFINE_integer("shards", 1, "Split the work among this many processes "
                     "(XLA keeps about one core busy with these small "
                     "models: run one process a core).")
flags.DEFINE_integer("shard", 0, "This process's share: the examples whose "
                     "index is `shard` modulo `shards`.")
flags.mark_flag_as_required("output")
args = flags.FLAGS


def main(argv):
  del argv
  settings = {"model": args.model, "task": args.task, "split": args.split,
              "max_decode_len": args.max_decode_len,
              "max_examples": args.max_examples}
  model = sd.load_model(args.model, config=args.model_config)
  # The model's own vocabulary, with the sentinel ids it was saved with.
  with tasks.override_config(
      vocab_path=model.vocab.sentencepiece_model_file,
      vocab_extra_ids=int(model.vocab.extra_ids or 0)):
    examples = readers.load_examples(args.task, args.split,
                                      max_examples=args.max_examples or None)
  # Another run's output prefix: OtherSettingsError, one line (cli.run).
  teacher.write_translations(
      model, examples, args.output, settings=settings, shard=args.shard,
      shards=args.shards, batch_size=args.batch_size,
      max_decode_len=args.max_decode_len,
      max_input_len=tasks.feature_lengths(args.task)["inputs"],
      log=logging.info)


if __name__ == "__main__":
  cli.run(main)
