"""Adaptive draft lengths and cascades against the best fixed gamma, side by
side in one run (`benchmarks/adaptive_cascade.py` is the entry point).

Every variant (a draft, or a cascade, with a gamma and a stop rule) decodes
the same sentences at batch size 1, and so does the target alone. Timing is
interleaved: for each sentence, every variant runs once per repeat in turn,
and each keeps its fastest repeat (the rule of `timing.best_time`, applied
across variants in turn rather than one variant at a time), so load from
other processes on a shared
machine spreads over all variants instead of landing on whichever ran at
that moment. Compilation is excluded (one warm-up call per variant; all
inputs are padded to one width so nothing recompiles).

Dimension letters: B batch (1 here), L input width.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Sequence

import numpy as np

from specdec_jax.checkpoints import load_model
from specdec_jax.data import batching
from specdec_jax.data import tasks
from specdec_jax.data import readers
from specdec_jax.decoding import cascades
from specdec_jax.decoding import ngram
from specdec_jax.decoding import stopping
from specdec_jax.decoding.api import generate
from specdec_jax.decoding.api import speculative_generate
from specdec_jax.decoding.protocol import Model
from specdec_jax.experiments import costs
from specdec_jax.experiments import report

# What the literature reports for the same ideas (other models, hardware and
# tasks: context, not a target this CPU demo can be held to).
PUBLISHED = {
    "ConfidenceStop": "HF dynamic lookahead: 1.18x -> 1.31x over the target "
                      "(flan-t5-xl), i.e. 1.11x over fixed lookahead",
    "ExpectedGainStop": "SpecDec++ (trained stop head): +7-11% over the best "
                        "fixed gamma; DISCO (classifier): ~+10%",
    "cascade": "cascaded drafts (Chen et al. 2023, cascade SD): up to "
               "1.7-1.8x over plain speculative decoding",
}


@dataclasses.dataclass(frozen=True)
class Variant:
  """One way to draft.

  Attributes:
    name: the row's label.
    chain: model specs from the draft down ('bigram'/'unigram' allowed
      below the first), e.g. ('demo:draft_base', 'demo:draft_small').
    inner_gammas: gamma of each level below the draft (len(chain) - 1).
    gamma: the outer gamma (the most tokens per iteration with a rule).
    draft_stop: None or a rule of `decoding.stopping`.
  """

  name: str
  chain: tuple[str, ...]
  gamma: int
  inner_gammas: tuple[int, ...] = ()
  draft_stop: Any = None

  @property
  def kind(self) -> str:
    if len(self.chain) > 1:
      return "cascade"
    return type(self.draft_stop).__name__ if self.draft_stop else "fixed"


def rule_label(rule) -> str:
  """A short table label for a stop rule."""
  if isinstance(rule, stopping.ConfidenceStop):
    return f"ConfidenceStop({rule.threshold:g})"
  if isinstance(rule, stopping.ExpectedGainStop):
    return (f"ExpectedGainStop(c={rule.cost:g}, g={rule.verify_growth:g}"
            f"{', calibrated' if rule.prior is not None else ''})")
  return ""


def fit_bigram(target: Model, max_examples: int = 5000) -> Model:
  """A bigram drafter from Multi30k training references (German)."""
  with tasks.override_config(
      vocab_path=target.vocab.sentencepiece_model_file):
    examples = readers.load_examples("multi30k_ende_local", "train",
                                      max_examples=max_examples)
  return ngram.fit_ngram([e.targets for e in examples], target.vocab_size)


class _Models:
  """Loads each spec once."""

  def __init__(self, target: Model):
    self.target = target
    self._cache: dict[str, Model] = {}

  def get(self, spec: str) -> Model:
    if spec not in self._cache:
      self._cache[spec] = (fit_bigram(self.target) if spec == "bigram"
                           else load_model(spec))
    return self._cache[spec]

  def draft(self, variant: Variant) -> Model:
    models = [self.get(s) for s in variant.chain]
    draft = models[-1]
    for model, gamma in zip(models[-2::-1], variant.inner_gammas[::-1]):
      draft = cascades.cascade(model, draft, gamma=gamma)
    return draft


def expected_gain_rule(target: Model, draft: Model, input_ids: np.ndarray,
                       max_gamma: int, max_decode_len: int,
                       probe: Sequence[np.ndarray] = (),
                       temperature: float = 0.0,
                       verify_growth: float | None = None
                       ) -> stopping.ExpectedGainStop:
  """ExpectedGainStop with this machine's c and verification growth g (the
  least-squares slope of v(k), k = 1..max_gamma, from `costs`; or the given
  `verify_growth`), and
  its per-bin acceptance prior calibrated on `probe` inputs ([N, L], other
  sentences than the timed ones) with `stopping.calibration`."""
  positions = max_decode_len + max_gamma + 1
  ks = np.arange(1, max_gamma + 1)
  # Every width's timing in the same rounds as the steps c divides.
  timings = {}
  if verify_growth is None:
    costs.time_extends(
        costs.cost_requests(target, draft, 1, positions)
        + [(target, int(k) + 1, positions) for k in ks], input_ids,
        timings=timings)
  one = costs.measure_costs(target, draft, input_ids, gamma=1,
                            cache_positions=positions, timings=timings)
  if verify_growth is None:
    # Slope of v(k) over every width, least squares (less noisy than two).
    v = [costs.measure_costs(target, draft, input_ids, gamma=int(k),
                             cache_positions=positions,
                             timings=timings)["verify_cost"] for k in ks]
    verify_growth = float(np.clip(np.polyfit(ks, v, 1)[0], 0.0, None))
  growth = verify_growth
  rule = stopping.ExpectedGainStop(cost=round(float(one["c"]), 4),
                                   verify_growth=round(float(growth), 4))
  if len(probe):
    res = speculative_generate(target, draft, np.asarray(probe),
                               gamma=max_gamma, max_decode_len=max_decode_len,
                               temperature=temperature, draft_stop=rule)
    rule = dataclasses.replace(rule, prior=stopping.calibration(rule,
                                                                res.stats),
                               prior_weight=4.0)
  return rule


def run_comparison(target: Model, variants: Sequence[Variant],
                   input_ids: Sequence[np.ndarray], *, temperature: float,
                   max_decode_len: int, repeats: int,
                   models: _Models | None = None,
                   log=print) -> tuple[dict, list[dict]]:
  """Decodes every input with the target alone and with every variant.

  Args:
    target: the target model.
    variants: the drafting variants.
    input_ids: one int32 [1, L] array per sentence (all the same L).
    temperature: 0 (greedy) or a sampling temperature (same seeds).
    max_decode_len: the most tokens per output.
    repeats: timed calls per (sentence, variant); the fastest counts.
    models: a model cache (loaded on demand when None).
    log: progress printer.

  Returns:
    (baseline {time_s, tokens}, one row dict per variant in order: name,
    kind, gamma, time_s, speedup, alpha, level_alpha, tokens_per_call,
    mean_proposed, proposal_histogram, level_calls_per_target_call,
    identical (greedy only)).
  """
  models = models or _Models(target)
  drafts = [models.draft(v) for v in variants]
  kw = dict(max_decode_len=max_decode_len, temperature=temperature, seed=0)

  def base_call(ids):
    return generate(target, ids, **kw)

  def spec_call(i, ids):
    v = variants[i]
    return speculative_generate(target, drafts[i], ids, gamma=v.gamma,
                                draft_stop=v.draft_stop, **kw)

  started = time.perf_counter()
  base_call(input_ids[0])
  for i in range(len(variants)):
    spec_call(i, input_ids[0])
  log(f"compiled {len(variants) + 1} decoders in "
      f"{time.perf_counter() - started:.0f}s")
  base_t = 0.0
  base_tokens = []
  times = np.zeros(len(variants))
  results: list[list[Any]] = [[] for _ in variants]
  for s, ids in enumerate(input_ids):
    best = np.full(len(variants) + 1, np.inf)
    for rep in range(repeats):
      for i in range(-1, len(variants)):
        t0 = time.perf_counter()
        res = base_call(ids) if i < 0 else spec_call(i, ids)
        best[i + 1] = min(best[i + 1], time.perf_counter() - t0)
        if rep == 0:  # same seed: every repeat returns the same result
          (base_tokens if i < 0 else results[i]).append(res)
    base_t += best[0]
    times += best[1:]
    if (s + 1) % 16 == 0:
      log(f"  {s + 1}/{len(input_ids)} sentences")
  rows = []
  for v, t, res in zip(variants, times, results):
    st = {k: np.concatenate([getattr(r.stats, k) for r in res]) for k in
          ("alpha_sum", "alpha_count", "level_alpha_sum", "level_alpha_count",
           "target_calls", "length", "accepted_histogram",
           "proposal_histogram", "level_calls")}
    hist = st["proposal_histogram"].sum(0)
    calls = st["level_calls"].sum(0)
    accepted = st["accepted_histogram"].sum(0)
    row = {
        "name": v.name, "kind": v.kind, "chain": "<-".join(
            c.split(":")[-1] for c in v.chain),
        "gamma": v.gamma, "inner_gammas": list(v.inner_gammas),
        "draft_stop": rule_label(v.draft_stop),
        "draft_stop_repr": repr(v.draft_stop) if v.draft_stop else "",
        "time_s": float(t), "speedup": float(base_t / t),
        "alpha": float(st["alpha_sum"].sum()
                       / max(st["alpha_count"].sum(), 1)),
        "level_alpha": (st["level_alpha_sum"].sum(0) / np.maximum(
            st["level_alpha_count"].sum(0), 1)).round(4).tolist(),
        "tokens_per_call": float(st["length"].sum() / calls[0]),
        "accepted_plus_one_per_call": float(
            accepted @ np.arange(len(accepted)) / calls[0] + 1),
        "mean_proposed": float(hist @ np.arange(len(hist)) / hist.sum()),
        "proposal_histogram": hist.tolist(),
        "level_calls_per_target_call": (calls / calls[0]).round(3).tolist(),
    }
    if temperature == 0:
      row["identical"] = all(
          np.array_equal(a.tokens, b.tokens)
          for a, b in zip(res, base_tokens))
    rows.append(row)
  return {"time_s": float(base_t)}, rows


def compare_to_best(rows: list[dict]) -> list[dict]:
  """Adds `vs_best_fixed` (per draft: best fixed-gamma time / this time) and
  `vs_best_single` (best time of any single draft / this time)."""
  fixed = [r for r in rows if r["kind"] == "fixed"]
  single_best = min((r["time_s"] for r in fixed), default=np.nan)
  out = []
  for r in rows:
    same = [f["time_s"] for f in fixed if f["chain"] == r["chain"]]
    best = min(same) if same else np.nan
    out.append(dict(r, vs_best_fixed=best / r["time_s"],
                    vs_best_single=single_best / r["time_s"]))
  return out


def markdown(rows: list[dict], baseline: dict) -> str:
  """The side-by-side table."""
  head = ("| draft | rule | γ (max) | α per level | mean k | tokens / call | "
          "speedup | vs best fixed γ, same draft | vs best single draft | "
          "identical |")
  lines = [head, "|" + "---|" * 10]
  for r in rows:
    lines.append(
        f"| {r['chain']}"
        + (f" ({','.join(map(str, r['inner_gammas']))})"
           if r['inner_gammas'] else "")
        + f" | {r['draft_stop'] or 'fixed'} | {r['gamma']} | "
        f"{', '.join(f'{a:.3f}' for a in r['level_alpha'])} | "
        f"{r['mean_proposed']:.2f} | {r['tokens_per_call']:.2f} | "
        f"{r['speedup']:.2f}x | {r['vs_best_fixed']:.3f} | "
        f"{r['vs_best_single']:.3f} | "
        f"{report.identical_mark(r.get('identical'))} |")
  lines.append(f"\nTarget alone: {baseline['time_s']:.2f} s.")
  return "\n".join(lines)


def parse_cascade(spec: str) -> tuple[tuple[str, ...], tuple[int, ...]]:
  """'demo:draft_base<demo:draft_small@3<bigram@4' -> (chain, inner gammas)."""
  parts = spec.split("<")
  chain, gammas = [parts[0]], []
  for part in parts[1:]:
    name, sep, gamma = part.rpartition("@")
    if not sep or not gamma.isdigit() or int(gamma) < 1:
      raise ValueError(f"cascade level {part!r} of {spec!r}: write "
                       f"MODEL@GAMMA, e.g. demo:draft_small@3")
    chain.append(name)
    gammas.append(int(gamma))
  return tuple(chain), tuple(gammas)


def load_inputs(target: Model, examples: int, width: int,
                probe: int = 0) -> tuple[list[np.ndarray], np.ndarray]:
  """Multi30k validation inputs, each [1, width] (truncated/padded), and
  `probe` further ones as one [probe, width] batch (for calibration)."""
  with tasks.override_config(
      vocab_path=target.vocab.sentencepiece_model_file):
    exs = readers.load_examples("multi30k_ende_local", "validation",
                                 max_examples=examples + probe)
  rows = [b.input_ids for b in batching.batches(exs, batch_size=1,
                                                buckets=(width,),
                                                max_length=width)]
  probe_ids = (np.concatenate(rows[examples:]) if probe
               else np.zeros((0, width), np.int32))
  return rows[:examples], probe_ids


def run_benchmark(*, target: str, drafts: Sequence[str],
                  fixed_gammas: Sequence[int], max_gamma: int,
                  thresholds: Sequence[float], cascades: Sequence[str],
                  cascade_gammas: Sequence[int], examples: int,
                  input_width: int, temperature: float, max_decode_len: int,
                  repeats: int, probe_examples: int = 32,
                  verify_growth: float | None = None,
                  log=print) -> tuple[str, dict, list[dict]]:
  """Builds the variants (per draft: every fixed gamma, ConfidenceStop at
  each threshold and ExpectedGainStop with measured costs and a prior
  calibrated on `probe_examples` other sentences, both with gamma =
  max_gamma; every cascade at each outer gamma), runs them side by side
  and returns (markdown table, baseline, rows)."""
  target_model = load_model(target)
  models = _Models(target_model)
  inputs, probe = load_inputs(target_model, examples, input_width,
                              probe=probe_examples)
  variants = []
  for spec in drafts:
    short = spec.split(":")[-1]
    for g in fixed_gammas:
      variants.append(Variant(f"{short} γ={g}", (spec,), int(g)))
    for th in thresholds:
      variants.append(Variant(f"{short} conf {th}", (spec,), max_gamma,
                              draft_stop=stopping.ConfidenceStop(th)))
    rule = expected_gain_rule(target_model, models.get(spec), inputs[0],
                              max_gamma, max_decode_len, probe, temperature,
                              verify_growth)
    log(f"{spec}: {rule}")
    variants.append(Variant(f"{short} gain", (spec,), max_gamma,
                            draft_stop=rule))
  for spec in cascades:
    chain, inner = parse_cascade(spec)
    for g in cascade_gammas:
      variants.append(Variant(f"{spec} γ={g}", chain, int(g), inner))
  baseline, rows = run_comparison(target_model, variants, inputs,
                                  temperature=temperature,
                                  max_decode_len=max_decode_len,
                                  repeats=repeats, models=models, log=log)
  rows = compare_to_best(rows)
  return markdown(rows, baseline), baseline, rows
