r"""Side by side with Hugging Face transformers on the same T5 weights.

Needs the `hf` extra (pip install -e '.[hf]'):

  python benchmarks/vs_hf.py                          # random T5-small shapes
  python benchmarks/vs_hf.py --target=demo:target --draft=demo:draft_base
  python benchmarks/vs_hf.py --target_hf=DIR --draft_hf=DIR

Both libraries load the SAME checkpoints, as Hugging Face directories:
  --target=SPEC / --draft=SPEC: any of our model specs (`load_model`: e.g.
    the trained demo models `demo:target`, `demo:draft_base`, or a config
    name for random weights), exported to a temporary directory with
    `checkpoints.hf.save_t5`;
  --target_hf=DIR / --draft_hf=DIR: existing HF T5 directories;
  neither: a random T5 v1.1-small-shaped target, 77M parameters, and a
    random 2-layer draft written here with `save_pretrained`.
When --target has a vocabulary (the demo models do), the inputs are the
first --examples lines of specdec_jax/demo_data/sentences.en as
"translate English to German: {en}" + EOS; otherwise random ids (20 + EOS).
Greedy outputs can part where the top two logits are within float32
round-off of each other: often on random weights, rarely on trained ones
(the demo models' smallest top-2 margin on these sentences is ~5e-5, in
demo:draft_small). For batch 1 and each input, it times (the fastest of
--repeats, `best_of.best_time`; warm-up/compile excluded):

  plain: our `generate` vs HF `generate` (greedy, then sampled);
  speculative: our `speculative_generate` vs HF assisted generation with the
    same draft and a constant gamma (`num_assistant_tokens`, schedule
    "constant", confidence threshold off).

It prints per-token latency of each and the ratio HF/ours (above 1: ours is
faster), and checks that greedy outputs are identical token for token
(naming the example and step where they first differ, if any).

Each library is timed in its own subprocess, one after the other: JAX's and
PyTorch's CPU thread pools slow each other down badly when both live in one
process (HF's greedy decoding ran 13x slower next to an idle JAX runtime).
The export (--target/--draft) runs in a third subprocess before them, so
the parent process never starts JAX.
"""

import functools
import json
import os
import subprocess
import sys
import tempfile

from absl import app
from absl import flags
import numpy as np

flags.DEFINE_string("target", None, "Our model spec, exported with save_t5 "
                    "(e.g. demo:target).")
flags.DEFINE_string("draft", None, "Our model spec, exported with save_t5 "
                    "(e.g. demo:draft_base).")
flags.DEFINE_string("target_hf", None, "A Hugging Face T5 directory.")
flags.DEFINE_string("draft_hf", None, "A Hugging Face T5 directory.")
flags.DEFINE_integer("gamma", 4, "Draft tokens per iteration (both sides).")
flags.DEFINE_integer("max_new_tokens", 64, "Tokens generated per input.")
flags.DEFINE_integer("examples", 4, "Inputs (batch 1 each).")
flags.DEFINE_integer("repeats", 3, "Timed repeats (the fastest is kept).")
flags.DEFINE_enum("worker", None, ["hf", "ours", "export"],
                  "Internal: run one side in this subprocess.")
flags.DEFINE_string("io", None, "Internal: the workers' exchange directory.")
args = flags.FLAGS

MODES = ("plain_greedy", "plain_sampled", "speculative_greedy",
         "speculative_sampled")


def _random_hf(path, *, layers, d_model, d_ff, heads, seed):
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  torch.manual_seed(seed)
  cfg = transformers.T5Config(
      vocab_size=32128, d_model=d_model, d_kv=64, d_ff=d_ff, num_layers=layers,
      num_decoder_layers=layers, num_heads=heads,
      feed_forward_proj="gated-gelu", tie_word_embeddings=False,
      decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
  model = transformers.T5ForConditionalGeneration(cfg).eval()
  # Louder layers than the initialiser's so greedy outputs vary by input.
  with torch.no_grad():
    for p in model.parameters():
      p.mul_(3.0)
  model.save_pretrained(path)
  return path


def _sentence_rows(vocab, examples):
  """Token ids of "translate English to German: {en}" + EOS, one per line."""
  from specdec_jax.data import text  # pylint: disable=g-import-not-at-top
  return [text.encode(vocab, [line])[0]
          for line in text.demo_sentences(examples)]


def _random_rows(vocab_size, examples):
  rng = np.random.default_rng(0)
  return [np.append(rng.integers(3, min(32000, vocab_size), 20), 1)
          .astype(np.int32) for _ in range(examples)]


def _save_rows(io, rows):
  np.savez(os.path.join(io, "inputs.npz"), *rows)


def _load_rows(io):
  with np.load(os.path.join(io, "inputs.npz")) as f:
    return [f[f"arr_{i}"] for i in range(len(f.files))]


def _worker_export(args):
  """Exports --target/--draft as HF directories; sentence inputs if a vocab."""
  import specdec_jax as sd  # pylint: disable=g-import-not-at-top
  from specdec_jax.checkpoints import hf  # pylint: disable=g-import-not-at-top
  for role in ("target", "draft"):
    spec = getattr(args, role)
    if spec:
      model = sd.load_model(spec)
      hf.save_t5(model, os.path.join(args.io, role))
      if role == "target" and model.vocab is not None:
        _save_rows(args.io, _sentence_rows(model.vocab, args.examples))


def _timed(fn, repeats):
  # Imported here: the HF worker must not import JAX before torch runs.
  from specdec_jax.experiments import best_of  # pylint: disable=g-import-not-at-top
  fn()  # warm-up (compilation for ours)
  return best_of.best_time(fn, repeats)


def _strip(tokens):
  tokens = [int(t) for t in tokens]
  return tokens[:tokens.index(1) + 1] if 1 in tokens else tokens


def _worker_hf(args, rows):
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  load = transformers.T5ForConditionalGeneration.from_pretrained
  target, draft = load(args.target_hf).eval(), load(args.draft_hf).eval()
  draft.generation_config.num_assistant_tokens = args.gamma
  draft.generation_config.num_assistant_tokens_schedule = "constant"
  draft.generation_config.assistant_confidence_threshold = 0.0
  out = {"version": f"torch {torch.__version__} ({torch.get_num_threads()} "
                    f"threads), transformers {transformers.__version__}"}
  for mode in MODES:
    kw = dict(max_new_tokens=args.max_new_tokens,
              do_sample=mode.endswith("sampled"), top_k=0, top_p=1.0)
    if mode.startswith("speculative"):
      kw["assistant_model"] = draft
    results = []
    for ids in rows:
      def run():
        # A fresh cache without a config: transformers 5 sizes the cache it
        # builds itself from T5's `num_layers` (the ENCODER depth), which
        # breaks targets with more decoder than encoder layers (ours: 3+8).
        cache = transformers.EncoderDecoderCache(transformers.DynamicCache(),
                                                 transformers.DynamicCache())
        return target.generate(torch.from_numpy(ids),  # pylint: disable=cell-var-from-loop
                               past_key_values=cache, **kw)  # pylint: disable=cell-var-from-loop
      with torch.no_grad():
        seq, t = _timed(run, args.repeats)
      results.append((_strip(seq[0, 1:].tolist()), t))  # drop decoder start
    out[mode] = results
  return out


def _worker_ours(args, rows):
  import specdec_jax as sd  # pylint: disable=g-import-not-at-top
  target = sd.load_model(f"hf:{args.target_hf}")
  draft = sd.load_model(f"hf:{args.draft_hf}")
  out = {}
  for mode in MODES:
    decoder = sd.SpeculativeDecoder(
        target, draft, gamma=args.gamma, max_decode_len=args.max_new_tokens,
        sampling=sd.sampling.SamplingConfig(
            1.0 if mode.endswith("sampled") else 0.0))
    results = []
    for ids in rows:
      if mode.startswith("plain"):
        fn = functools.partial(decoder.baseline, ids)
      else:
        fn = functools.partial(decoder, ids)
      res, t = _timed(fn, args.repeats)
      results.append((_strip(res.tokens[0][:int(res.stats.length[0])]), t))
    out[mode] = results
  return out


def main(argv):
  del argv
  for role in ("target", "draft"):
    if getattr(args, role) and getattr(args, f"{role}_hf"):
      raise app.UsageError(f"give --{role} or --{role}_hf, not both")
  if args.worker == "export":
    _worker_export(args)
    return
  if args.worker:
    rows = [r[None] for r in _load_rows(args.io)]
    fn = _worker_hf if args.worker == "hf" else _worker_ours
    with open(os.path.join(args.io, f"{args.worker}.json"), "w") as f:
      json.dump(fn(args, rows), f)
    return
  tmp = tempfile.mkdtemp()
  if args.target or args.draft:
    subprocess.run([sys.executable, __file__, "--worker=export",
                    f"--io={tmp}", f"--target={args.target or ''}",
                    f"--draft={args.draft or ''}",
                    f"--examples={args.examples}"], check=True)
  for role in ("target", "draft"):
    if getattr(args, role):
      setattr(args, f"{role}_hf", os.path.join(tmp, role))
  args.target_hf = args.target_hf or _random_hf(
      os.path.join(tmp, "target"), layers=8, d_model=512, d_ff=1024, heads=6,
      seed=0)
  args.draft_hf = args.draft_hf or _random_hf(
      os.path.join(tmp, "draft"), layers=2, d_model=256, d_ff=512, heads=4,
      seed=1)
  inputs = "sentences.en"  # written by the export if the target has a vocab
  if not os.path.exists(os.path.join(tmp, "inputs.npz")):
    inputs = "random ids"
    vocab_sizes = []
    for path in (args.target_hf, args.draft_hf):
      with open(os.path.join(path, "config.json")) as f:
        vocab_sizes.append(json.load(f).get("vocab_size", 32128))
    _save_rows(tmp, _random_rows(min(vocab_sizes), args.examples))
  for worker in ("hf", "ours"):
    subprocess.run([sys.executable, __file__, f"--worker={worker}",
                    f"--io={tmp}", f"--target_hf={args.target_hf}",
                    f"--draft_hf={args.draft_hf}", f"--gamma={args.gamma}",
                    f"--max_new_tokens={args.max_new_tokens}",
                    f"--repeats={args.repeats}"], check=True)
  with open(os.path.join(tmp, "hf.json")) as f:
    hf = json.load(f)
  with open(os.path.join(tmp, "ours.json")) as f:
    ours = json.load(f)
  print(hf["version"], f"| target={args.target or args.target_hf} "
        f"draft={args.draft or args.draft_hf} inputs={inputs}")
  print(f"gamma={args.gamma} examples={len(_load_rows(tmp))} "
        f"max_new_tokens={args.max_new_tokens} repeats={args.repeats}")
  for mode in MODES:
    per_token = {}
    for name, res in (("ours", ours[mode]), ("hf", hf[mode])):
      per_token[name] = (sum(t for _, t in res)
                         / sum(len(s) for s, _ in res) * 1e3)
    same = all(a[0] == b[0] for a, b in zip(ours[mode], hf[mode]))
    check = "sampled" if mode.endswith("sampled") else (
        "identical outputs" if same else "OUTPUTS DIFFER")
    print(f"{mode:20s} ours {per_token['ours']:7.2f} ms/token  "
          f"HF {per_token['hf']:7.2f} ms/token  "
          f"HF/ours {per_token['hf'] / per_token['ours']:5.2f}x  ({check})",
          flush=True)
    if check == "OUTPUTS DIFFER":
      for i, (a, b) in enumerate(zip(ours[mode], hf[mode])):
        a, b = a[0], b[0]
        if a != b:
          step = next((t for t, (x, y) in enumerate(zip(a, b)) if x != y),
                      min(len(a), len(b)))
          print(f"  example {i}: first difference at output step {step}: "
                f"ours {a[step:step + 1]} HF {b[step:step + 1]} "
                f"(lengths {len(a)}, {len(b)})")


if __name__ == "__main__":
  app.run(main)
