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

The run writes as it goes and resumes: each decoded batch is appended to
`<output>.partial-<shard>.jsonl` (example index -> text), and a rerun with
the same settings decodes only what is missing; a rerun with other settings
is an error (`<output>.settings.json` records them). With --shards=N, N
processes (--shard=0..N-1) share the work; whichever finishes last writes
the files. An output that does not end
within --max_decode_len tokens keeps the reference instead, and is counted.
"""

import json
import os
import time

from absl import app
from absl import flags
from absl import logging
import numpy as np

import specdec_jax as sd
from specdec_jax.data import batching
from specdec_jax.data import tasks
from specdec_jax.data import vocabularies
from specdec_jax.tokens import EOS_ID

flags.DEFINE_string("model", "demo:target", "The teacher (load_model spec).")
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


def _settings() -> dict:
  return {"model": args.model, "task": args.task, "split": args.split,
          "max_decode_len": args.max_decode_len,
          "max_examples": args.max_examples}


def _check_settings(path: str) -> None:
  """Records the settings, or refuses to resume a run made with others."""
  settings = _settings()
  if os.path.exists(path):
    with open(path) as f:
      recorded = json.load(f)
    if recorded != settings:
      raise SystemExit(
          f"{path} records another run ({recorded}); this one is "
          f"{settings}. Choose another --output, or delete that run's "
          "files to start over.")
    return
  # Written whole, then renamed: a shard starting at the same moment reads
  # either no file or the complete one, never a half-written one.
  tmp = f"{path}.tmp-{os.getpid()}"
  with open(tmp, "w") as f:
    json.dump(settings, f, indent=1)
  os.replace(tmp, path)


def _done(prefix: str) -> dict[int, str]:
  """Index -> translation, from every shard's partial file."""
  done = {}
  directory = os.path.dirname(os.path.abspath(prefix))
  stem = os.path.basename(prefix) + ".partial-"
  for name in sorted(os.listdir(directory)):
    if not (name.startswith(stem) and name.endswith(".jsonl")):
      continue
    with open(os.path.join(directory, name), encoding="utf-8") as f:
      for line in f:
        if line.strip():  # A line cut by a kill is incomplete: redo it.
          try:
            record = json.loads(line)
          except ValueError:
            continue
          done[record["index"]] = record["de"]
  return done


def main(argv):
  del argv
  os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
  _check_settings(args.output + ".settings.json")
  model = sd.load_model(args.model)
  with tasks.override_config(vocab_path=model.vocab.sentencepiece_model_file):
    examples = batching.load_examples(args.task, args.split,
                                      max_examples=args.max_examples or None)
  for e in examples:
    if not e.inputs_text.startswith(tasks.TRANSLATE_PREFIX):
      raise SystemExit(f"{args.task} is not an English-German translation "
                       f"task: input {e.inputs_text[:60]!r}")
  if not 0 <= args.shard < args.shards:
    raise SystemExit(f"--shard must be in [0, {args.shards}), got "
                     f"{args.shard}")
  partial = f"{args.output}.partial-{args.shard}.jsonl"
  done = _done(args.output)
  # Similar input lengths decode together: their outputs end together too.
  todo = sorted((i for i in range(len(examples))
                 if i not in done and i % args.shards == args.shard),
                key=lambda i: (len(examples[i].inputs), i))
  logging.info("%d examples, %d already translated, %d to go", len(examples),
               len(done), len(todo))
  max_length = tasks.feature_lengths(args.task)["inputs"]
  start, unfinished = time.time(), 0
  with open(partial, "a", encoding="utf-8") as out:
    for b in range(0, len(todo), args.batch_size):
      chunk = todo[b:b + args.batch_size]
      batch = next(batching.batches([examples[i] for i in chunk],
                                    batch_size=len(chunk),
                                    max_length=max_length))
      tokens = np.asarray(sd.generate(
          model, batch.input_ids, max_decode_len=args.max_decode_len).tokens)
      for i, row in zip(chunk, tokens):
        ended = bool((row == EOS_ID).any())
        unfinished += not ended
        text = (vocabularies.detokenize(model.vocab, row) if ended
                else examples[i].targets_text)
        out.write(json.dumps({"index": i, "de": text}, ensure_ascii=False)
                  + "\n")
      out.flush()
      finished = b + len(chunk)
      rate = finished / (time.time() - start)
      logging.info("shard %d: %d/%d translated, %.1f examples/s, %.0f s to "
                   "go", args.shard, finished, len(todo), rate,
                   (len(todo) - finished) / rate)
  done = _done(args.output)
  missing = [i for i in range(len(examples)) if i not in done]
  if missing:
    logging.info("shard %d done; %d examples of other shards to go (the "
                 "last shard to finish writes the files)", args.shard,
                 len(missing))
    return
  for side, lines in (("en", [e.inputs_text[len(tasks.TRANSLATE_PREFIX):]
                              for e in examples]),
                      ("de", [done[i] for i in range(len(examples))])):
    with open(f"{args.output}.{side}", "w", encoding="utf-8") as f:
      f.write("".join(" ".join(line.split()) + "\n" for line in lines))
  same = sum(done[i] == e.targets_text for i, e in enumerate(examples))
  logging.info("wrote %s.{en,de}: %d examples, %d equal to the reference, "
               "%d kept the reference (no EOS within %d tokens) this run",
               args.output, len(examples), same, unfinished,
               args.max_decode_len)


if __name__ == "__main__":
  app.run(main)
