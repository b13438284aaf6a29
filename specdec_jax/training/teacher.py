"""A teacher's translations of a task split: the data of sequence-level KD.

`write_translations` decodes every example of a split with a model,
greedy, in batches of examples of similar input length, and writes aligned
`<output>.en` (the source text, task prefix removed) and `<output>.de` (the
model's translation), one example a line in the split's order: the files
`multi30k_ende_local` reads (`TaskConfig.multi30k_files`), which
`TrainConfig.train_translations` points a training run at. A draft trained
on them learns the target's own greedy outputs (sequence-level knowledge
distillation, Kim & Rush 2016), which is what greedy speculative decoding
asks of it: to guess the target's argmax on the target's own prefix.

The work is written as it goes and resumes: each decoded batch is appended
to `<output>.partial-<shard>.jsonl` (one record per example), and a rerun
with the same settings decodes only what is missing; a rerun with other
settings is refused (`<output>.settings.json` records them). With
`shards=N`, N processes (shard 0..N-1) share the work, each the examples
whose index is its shard modulo N; whichever finishes last writes the
files. An output that does not end within `max_decode_len` tokens keeps the
reference instead, and is counted.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Callable, Sequence

import numpy as np

from specdec_jax import errors
from specdec_jax.data import batching
from specdec_jax.data import tasks
from specdec_jax.data import vocabularies
from specdec_jax.decoding.api import generate
from specdec_jax.decoding.protocol import Model
from specdec_jax.tokens import EOS_ID


class OtherSettingsError(ValueError, errors.UsageError):
  """An output prefix that holds a run made with other settings."""


class NotTranslationError(ValueError, errors.UsageError):
  """A task whose examples are not English-German translations."""


def check_settings(path: str, settings: dict[str, Any]) -> None:
  """Records the settings, or refuses to resume a run made with others."""
  if os.path.exists(path):
    with open(path) as f:
      recorded = json.load(f)
    if recorded != settings:
      raise OtherSettingsError(
          f"{path} records another run ({recorded}); this one is "
          f"{settings}. Choose another output prefix, or delete that run's "
          "files to start over.")
    return
  # Written whole, then renamed: a shard starting at the same moment reads
  # either no file or the complete one, never a half-written one.
  tmp = f"{path}.tmp-{os.getpid()}"
  with open(tmp, "w") as f:
    json.dump(settings, f, indent=1)
  os.replace(tmp, path)


def read_done(prefix: str) -> dict[int, dict]:
  """Index -> record ({"index", "de", "kept_reference"}) of every example
  any shard has finished. A line cut by a kill is incomplete: its example
  is decoded again."""
  done = {}
  directory = os.path.dirname(os.path.abspath(prefix))
  stem = os.path.basename(prefix) + ".partial-"
  for name in sorted(os.listdir(directory)):
    if not (name.startswith(stem) and name.endswith(".jsonl")):
      continue
    with open(os.path.join(directory, name), encoding="utf-8") as f:
      for line in f:
        if line.strip():
          try:
            record = json.loads(line)
          except ValueError:
            continue
          done[record["index"]] = record
  return done


def _cut_torn_line(path: str) -> None:
  """Drops an incomplete last line (a kill mid-write), so that the records
  appended next start on a line of their own."""
  if not os.path.exists(path):
    return
  with open(path, "rb") as f:
    raw = f.read()
  keep = raw[:raw.rfind(b"\n") + 1]
  if len(keep) != len(raw):
    with open(path, "wb") as f:
      f.write(keep)


def write_translations(model: Model, examples: Sequence[batching.Example],
                       output: str, *, settings: dict[str, Any],
                       shard: int = 0, shards: int = 1, batch_size: int = 64,
                       max_decode_len: int = 128, max_input_len: int = 512,
                       log: Callable[..., None] = print) -> dict | None:
  """Translates this shard's share of `examples`; the last shard writes.

  Args:
    model: the teacher (an encoder-decoder with a vocabulary).
    examples: the split, inputs 'translate English to German: ...'.
    output: prefix of the files written.
    settings: what identifies the run (model, task, split, limits); a
      resumed run must give the same.
    shard, shards: this process's share, examples with index % shards ==
      shard.
    batch_size: rows per decoding batch.
    max_decode_len: most tokens per output.
    max_input_len: inputs are truncated to this many tokens.
    log: printf-style progress logger.

  Returns:
    None when other shards still have examples to go, else a summary:
    examples, equal_to_reference, kept_reference.
  """
  if not 0 <= shard < shards:
    raise OtherSettingsError(
        f"--shard must be in [0, {shards}) for --shards={shards}, got {shard}")
  for e in examples:
    if not e.inputs_text.startswith(tasks.TRANSLATE_PREFIX):
      raise NotTranslationError(
          f"not an English-German translation example: input "
          f"{e.inputs_text[:60]!r}; --task must be a translation task")
  os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
  check_settings(output + ".settings.json", settings)
  done = read_done(output)
  # Similar input lengths decode together: their outputs end together too.
  todo = sorted((i for i in range(len(examples))
                 if i not in done and i % shards == shard),
                key=lambda i: (len(examples[i].inputs), i))
  log("%d examples, %d already translated, %d to go", len(examples),
      len(done), len(todo))
  start = time.time()
  partial = f"{output}.partial-{shard}.jsonl"
  _cut_torn_line(partial)
  with open(partial, "a", encoding="utf-8") as out:
    for b in range(0, len(todo), batch_size):
      chunk = todo[b:b + batch_size]
      batch = next(batching.batches([examples[i] for i in chunk],
                                    batch_size=len(chunk),
                                    max_length=max_input_len))
      tokens = np.asarray(generate(model, batch.input_ids,
                                   max_decode_len=max_decode_len).tokens)
      for i, row in zip(chunk, tokens):
        ended = bool((row == EOS_ID).any())
        text = (vocabularies.detokenize(model.vocab, row) if ended
                else examples[i].targets_text)
        out.write(json.dumps({"index": i, "de": text,
                              "kept_reference": not ended},
                             ensure_ascii=False) + "\n")
      out.flush()
      finished = b + len(chunk)
      rate = finished / max(time.time() - start, 1e-9)
      log("shard %d: %d/%d translated, %.1f examples/s, %.0f s to go", shard,
          finished, len(todo), rate, (len(todo) - finished) / rate)
  done = read_done(output)
  missing = [i for i in range(len(examples)) if i not in done]
  if missing:
    log("shard %d done; %d examples of other shards to go (the last shard "
        "to finish writes the files)", shard, len(missing))
    return None
  sources = [e.inputs_text[len(tasks.TRANSLATE_PREFIX):] for e in examples]
  translations = [done[i]["de"] for i in range(len(examples))]
  for side, lines in (("en", sources), ("de", translations)):
    with open(f"{output}.{side}", "w", encoding="utf-8") as f:
      f.write("".join(" ".join(line.split()) + "\n" for line in lines))
  kept = sum(bool(done[i].get("kept_reference")) for i in range(len(examples)))
  same = sum(done[i]["de"] == e.targets_text and not done[i].get(
      "kept_reference") for i, e in enumerate(examples))
  log("wrote %s.{en,de}: %d examples; the teacher's output equals the "
      "reference for %d; %d keep the reference (no EOS within %d tokens)",
      output, len(examples), same, kept, max_decode_len)
  return {"examples": len(examples), "equal_to_reference": same,
          "kept_reference": kept}
