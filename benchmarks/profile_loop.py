r"""Where the time of one speculative decode goes, op by op (XLA on CPU).

  python benchmarks/profile_loop.py [--target=demo:target]
      [--draft=demo:draft_base] [--gamma=4] [--sentence=3] [--calls=20]
      [--inputs=paragraphs] [--extend_tokens=1,4,8]

Compiles the speculative loop for one demo sentence (batch 1, greedy), runs
it --calls times under `jax.profiler.trace`, then reads the trace and prints
the time per call of each kind of XLA op (ynn_fusion: the weight matmuls
XLA hands to YNNPACK; dot: matmuls XLA runs itself; copy*: layout and
buffer copies; while: loop control), largest first. Use it to see whether a
change to the models or the engine moved work into or out of the loop.

With --extend_tokens, it profiles the target's cached steps instead (the
timed loop behind c and v, `step_timers.time_extend`) at each number of tokens
per call, side by side: where a verification of gamma + 1 tokens spends
the time a one-token step does not (docs/log/benchmarks_history.md, "Where
the verification cost goes").
"""

import collections
import glob
import gzip
import json
import os
import re
import tempfile

from absl import app
from absl import flags
import jax
import numpy as np

import specdec_jax as sd
from specdec_jax import sampling
from specdec_jax.data import text
from specdec_jax.decoding import engine
from specdec_jax.experiments import step_timers

flags.DEFINE_string("target", "demo:target", "Target model spec.")
flags.DEFINE_string("draft", "demo:draft_base", "Draft model spec.")
flags.DEFINE_integer("gamma", 4, "Draft tokens per iteration.")
flags.DEFINE_integer("sentence", 3, "Which demo sentence to decode.")
flags.DEFINE_integer("calls", 20, "Profiled decodes.")
flags.DEFINE_integer("max_decode_len", 64, "Most tokens per output.")
flags.DEFINE_integer("top", 15, "Op kinds printed.")
flags.DEFINE_enum("inputs", "sentences", ["sentences", "paragraphs"],
                  "Which shipped demo texts to decode.")
flags.DEFINE_list("extend_tokens", [], "Profile the target's cached steps "
                  "at these numbers of tokens per call instead.")
args = flags.FLAGS

_HOST_EVENTS = ("Execute", "Pjit", "Await", "Parse", "Handle")


def _op_times(run, calls: int) -> collections.Counter:
  """Microseconds per call of each kind of XLA op over `calls` runs."""
  with tempfile.TemporaryDirectory() as trace_dir:
    with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
      for _ in range(calls):
        run()
    path = sorted(glob.glob(os.path.join(trace_dir, "**", "*.trace.json.gz"),
                            recursive=True))[-1]
    with gzip.open(path) as f:
      trace = json.load(f)
  events = trace["traceEvents"] if isinstance(trace, dict) else trace
  per_kind = collections.Counter()
  for e in events:
    name = e.get("name", "")
    if e.get("ph") != "X" or name.startswith("$") or any(
        h in name for h in _HOST_EVENTS):
      continue
    per_kind[re.sub(r"\.\d+$", "", name)] += e.get("dur", 0) / calls
  return per_kind


def _profile_extend(target, ids):
  """Per-op time of one cached target call at each --extend_tokens."""
  positions = args.max_decode_len + 8
  steps = 8
  columns = {}
  for k in [int(t) for t in args.extend_tokens]:
    prefill = step_timers._build_prefill(  # pylint: disable=protected-access
        target.definition, step_timers.padded_positions(positions))
    loop = step_timers._build_timed_loop(target.definition, k, steps)  # pylint: disable=protected-access
    cache, start = jax.block_until_ready(prefill(target.params, ids))
    run = lambda: jax.block_until_ready(loop(target.params, cache, start))  # pylint: disable=cell-var-from-loop
    run()  # compile
    columns[k] = _op_times(run, args.calls)
  kinds = sorted(set().union(*columns.values()),
                 key=lambda kind: -max(c[kind] for c in columns.values()))
  print(f"{args.target}, input of {ids.shape[1]} tokens: ms per call of "
        f"{', '.join(map(str, columns))} tokens")
  print("  " + "".join(f"{k:>9d}" for k in columns) + "  op kind")
  for kind in kinds[:args.top]:
    print("  " + "".join(f"{c[kind] / steps / 1e3:9.3f}"
                         for c in columns.values()) + f"  {kind}")
  print("  " + "".join(f"{sum(c.values()) / steps / 1e3:9.3f}"
                       for c in columns.values()) + "  all ops")


def main(argv):
  del argv
  target, draft = sd.load_model(args.target), sd.load_model(args.draft)
  line = text.demo_sentences(name=args.inputs)[args.sentence]
  ids = text.encode(target.vocab, [line])
  if args.extend_tokens:
    _profile_extend(target, ids)
    return
  fn = engine.build_speculative(target.definition, draft.definition,
                                args.gamma, args.max_decode_len,
                                sampling.SamplingConfig())
  seeds = rows = np.zeros((1,), np.int32)
  run = lambda: jax.block_until_ready(
      fn(target.params, draft.params, ids, seeds, rows))
  _, stats = run()  # compile
  per_kind = _op_times(run, args.calls)
  print(f"{args.target} + {args.draft}, gamma {args.gamma}, sentence "
        f"{args.sentence}: {int(stats.length[0])} tokens in "
        f"{int(stats.target_calls[0])} iterations; ms per decode:")
  for kind, micros in per_kind.most_common(args.top):
    print(f"  {micros / 1e3:8.3f}  {kind}")


if __name__ == "__main__":
  app.run(main)
