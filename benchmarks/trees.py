r"""Token trees against chains: tokens per target call on held-out text.

  python benchmarks/trees.py                       # draft_base, T 0 and 1
  python benchmarks/trees.py --draft=demo:draft_small --temperatures=0
  python benchmarks/trees.py --sizes=7,15,31 --out=results/trees.json

Measures, with the shipped demo models, what a token tree (`sd.tree`)
gains over the paper's chain of gamma draft tokens, in the number that does
not depend on the machine: tokens per target call (on a TPU at batch 1 a
target call costs about the same for 8 or 32 tokens). And, because this
CPU is not that regime, the walltime speedup over the target alone too.

1. Profile (no evaluation text): a wide tree, 4 children at depths 1-2 then
   a chain (--profile_shape), decodes --profile_examples Multi30k TRAIN
   sentences (--profile_text); its walks give the acceptance of the child
   of each rank at each depth (`theory.rank_acceptance`; ranks measured
   only at the wide depths are used at every depth).
2. Shapes: for each --sizes, the Sequoia-style tree of that many nodes with
   the most expected tokens under the profile (`TreeShape.best`), and the
   uniform shapes of --branchings.
3. Evaluation on Multi30k VALIDATION sentences (the demo's 40) and the 16
   validation paragraphs: every chain gamma of --gammas and one per tree
   size (the chain verifying as many tokens per call), every tree. Per row:
   tokens per call, accepted draft tokens per call, acceptance per depth
   (the walk went one deeper), the profile's prediction of tokens per call
   (`theory.tree_expected_tokens`, the chain's is Theorem 3.1), and the
   walltime speedup over the target alone (batch 1, compile excluded,
   each input decoded by the target and every row in turn, the fastest of
   --repeats rounds).

The last lines compare, per task and temperature: each tree with the chain
verifying as many tokens per call; and the tree with the most tokens per
call among those verifying at most 4x the tokens of the chain with the
best walltime speedup, against that chain.
"""

import json
import os
import time

from absl import app
from absl import flags
import numpy as np

import specdec_jax as sd
from specdec_jax import theory
from specdec_jax.data import text

FLAGS = flags.FLAGS
flags.DEFINE_string("target", "demo:target", "Target model spec.")
flags.DEFINE_string("draft", "demo:draft_base", "Draft model spec.")
flags.DEFINE_list("temperatures", ["0", "1"], "Sampling temperatures.")
flags.DEFINE_list("gammas", ["3", "4", "5", "7"], "Chain gammas.")
flags.DEFINE_list("sizes", ["7", "15", "19", "31"],
                  "Node counts of the profile's best trees.")
flags.DEFINE_string("branchings", "2,2,1,1,1,1;3,2,1,1,1,1,1",
                    "Uniform tree shapes: each a branching per depth joined "
                    "by ',', shapes separated by ';'.")
flags.DEFINE_string("profile_text", os.path.join(
    os.path.dirname(__file__), os.pardir, os.pardir, "shared", "data",
    "multi30k.train.en"), "English sentences the profile decodes (Multi30k "
    "train: never the validation text the rows report on).")
flags.DEFINE_integer("profile_examples", 64, "Profile sentences.")
flags.DEFINE_string("profile_shape", "4,4,1,1,1,1,1,1,1,1",
                    "The profile's tree, branching per depth.")
flags.DEFINE_list("tasks", ["sentences", "paragraphs"],
                  "Validation inputs: sentences and/or paragraphs.")
flags.DEFINE_integer("repeats", 2, "Timing rounds (the fastest counts).")
flags.DEFINE_string("out", "", "Also write the rows here (JSON).")

MAX_DECODE_LEN = {"sentences": 64, "paragraphs": 128}


def _branching(entry: str) -> tuple[int, ...]:
  return tuple(int(b) for b in entry.split(",") if b)


def profile(target, draft, temperature: float, depth_cap: int):
  """Per-rank acceptance [D, k] from the wide profile tree on train text,
  ranks past the wide depths filled with their measured mean."""
  if not os.path.exists(FLAGS.profile_text):
    raise FileNotFoundError(
        f"{FLAGS.profile_text} not found: the profile decodes Multi30k train "
        f"sentences (../shared/data in this project); pass --profile_text.")
  with open(FLAGS.profile_text) as f:
    lines = [line.strip() for line in f if line.strip()]
  ids = text.encode(target.vocab, lines[:FLAGS.profile_examples])
  shape = sd.TreeShape.from_branching(_branching(FLAGS.profile_shape))
  res = sd.speculative_generate(target, sd.tree(draft, shape), ids,
                                gamma=shape.depth, max_decode_len=64,
                                temperature=temperature, seed=1)
  children = [int(shape.num_children[level].max())
              for level in shape.levels[:-1]]
  rates = theory.rank_acceptance(res.stats.rank_histogram, children)
  for j in range(1, rates.shape[1]):
    column = rates[:, j]
    column[np.isnan(column)] = np.nanmean(column)
  return np.nan_to_num(rates[:depth_cap])


def _inputs(task: str, vocab):
  return [text.encode(vocab, [s]) for s in text.demo_sentences(name=task)]


def evaluate(target, rows, inputs, temperature, max_decode_len):
  """Each row's stats over `inputs` (batch 1 each), timed side by side with
  the target alone; {name: {...}}."""
  decoders = {name: sd.SpeculativeDecoder(
      target, draft, gamma=gamma, max_decode_len=max_decode_len,
      sampling=sd.sampling.SamplingConfig(temperature))
              for name, (draft, gamma, _) in rows.items()}
  base = next(iter(decoders.values()))
  width = max(ids.shape[1] for ids in inputs)
  inputs = [np.pad(ids, ((0, 0), (0, width - ids.shape[1]))) for ids in inputs]
  for decoder in decoders.values():  # compile
    decoder(inputs[0])
  base.baseline(inputs[0])
  times = {name: np.full((FLAGS.repeats, len(inputs)), np.inf)
           for name in ["target", *decoders]}
  stats = {name: [] for name in decoders}
  for r in range(FLAGS.repeats):
    for i, ids in enumerate(inputs):
      start = time.perf_counter()
      base.baseline(ids, seed=i)
      times["target"][r, i] = time.perf_counter() - start
      for name, decoder in decoders.items():
        start = time.perf_counter()
        res = decoder(ids, seed=i)
        times[name][r, i] = time.perf_counter() - start
        if r == 0:
          stats[name].append(res.stats)
  best = {name: t.min(axis=0).sum() for name, t in times.items()}
  out = {}
  for name, (draft, gamma, predicted) in rows.items():
    st = stats[name]
    length = sum(int(s.length[0]) for s in st)
    calls = sum(int(s.target_calls[0]) for s in st)
    hist = np.sum([s.accepted_histogram[0] for s in st], axis=0)
    reached = np.cumsum(hist[::-1])[::-1]  # iterations accepting >= d
    per_depth = [float(reached[d + 1] / reached[d]) if reached[d] else None
                 for d in range(len(hist) - 1)]
    shape = getattr(draft.definition, "tree_shape", None)
    out[name] = {
        "tree": None if shape is None else shape.describe(),
        "parents": None if shape is None else list(shape.parents),
        "gamma": gamma,
        "verified": gamma + 1 if shape is None else shape.verified,
        "tokens_per_call": length / calls,
        "accepted_per_call": float(np.dot(hist, np.arange(len(hist)))
                                   / hist.sum()),
        "predicted_accepted_plus_one": predicted,
        "acceptance_per_depth": per_depth,
        "alpha": theory.pooled_alpha([s.alpha_sum[0] for s in st],
                                     [s.alpha_count[0] for s in st]),
        "speedup": float(best["target"] / best[name]),
    }
  return out


def main(argv):
  del argv
  target = sd.load_model(FLAGS.target)
  draft = sd.load_model(FLAGS.draft)
  sizes = [int(s) for s in FLAGS.sizes]
  branchings = [_branching(b) for b in FLAGS.branchings.split(";") if b]
  results = []
  for temperature in map(float, FLAGS.temperatures):
    started = time.perf_counter()
    rates = profile(target, draft, temperature, depth_cap=16)
    print(f"T={temperature:g} profile (rank acceptance by depth, train "
          f"text): {np.round(rates[:4], 3).tolist()} ... "
          f"({time.perf_counter() - started:.0f} s)", flush=True)
    shapes = [sd.TreeShape.best(rates, n) for n in sizes]
    shapes += [sd.TreeShape.from_branching(b) for b in branchings]
    rows = {}
    gammas = sorted({int(g) for g in FLAGS.gammas}
                    | {s.num_nodes for s in shapes})
    for g in gammas:
      chain = sd.TreeShape.chain(g)
      rows[f"chain{g}"] = (draft, g, theory.tree_expected_tokens(
          chain.parents, rates))
    for s in shapes:
      label = s.describe().replace(" ", "").replace(",", "_")
      rows[f"tree[{label}]"] = (sd.tree(draft, s), s.depth,
                                theory.tree_expected_tokens(s.parents, rates))
    for task in FLAGS.tasks:
      started = time.perf_counter()
      measured = evaluate(target, rows, _inputs(task, target.vocab),
                          temperature, MAX_DECODE_LEN[task])
      print(f"\n{task}, T={temperature:g} (Multi30k validation, "
            f"{time.perf_counter() - started:.0f} s)")
      print(f"{'row':>26} {'verified':>8} {'tok/call':>8} {'predicted':>9} "
            f"{'speedup':>7}  acceptance per depth")
      for name, m in measured.items():
        depth = " ".join("-" if a is None else f"{a:.2f}"
                         for a in m["acceptance_per_depth"][:10])
        print(f"{name:>26} {m['verified']:>8} {m['tokens_per_call']:>8.3f} "
              f"{m['predicted_accepted_plus_one']:>9.3f} "
              f"{m['speedup']:>7.2f}x  {depth}")
        results.append(dict(m, task=task, temperature=temperature, row=name))
      _write(results)
      chains = {n: m for n, m in measured.items() if m["tree"] is None}
      trees_ = {n: m for n, m in measured.items() if m["tree"] is not None}
      for name, m in trees_.items():
        same = chains.get(f"chain{m['verified'] - 1}")
        if same:
          print(f"  {name} vs the chain verifying as many ({m['verified']}):"
                f" {m['tokens_per_call'] / same['tokens_per_call']:.2f}x "
                f"tokens per call")
      best_chain = max(chains, key=lambda n: chains[n]["speedup"])
      limit = 4 * chains[best_chain]["verified"]
      within = {n: m for n, m in trees_.items() if m["verified"] <= limit}
      if within:
        best_tree = max(within, key=lambda n: within[n]["tokens_per_call"])
        ratio = (within[best_tree]["tokens_per_call"]
                 / chains[best_chain]["tokens_per_call"])
        print(f"  best chain by speedup here: {best_chain} "
              f"({chains[best_chain]['tokens_per_call']:.3f} tokens/call, "
              f"{chains[best_chain]['verified']} verified); best tree within "
              f"4x its verified tokens ({limit}): {best_tree} "
              f"({within[best_tree]['tokens_per_call']:.3f}, "
              f"{within[best_tree]['verified']} verified): {ratio:.2f}x "
              f"tokens per call")


def _write(results):
  """The rows so far to --out (after every task: a long run keeps them)."""
  if FLAGS.out:
    os.makedirs(os.path.dirname(os.path.abspath(FLAGS.out)), exist_ok=True)
    with open(FLAGS.out, "w") as f:
      json.dump(results, f, indent=1)


if __name__ == "__main__":
  app.run(main)
