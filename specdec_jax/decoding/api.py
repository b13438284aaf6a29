"""Public entry points: `generate` and `speculative_generate`.

They check every argument a user can get wrong BEFORE anything is traced or
compiled, then call the cached jitted loops of `engine.py`. Repeated calls
with the same shapes and settings reuse the compiled loop.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import Any, Iterator

import flax.linen as nn
import jax
import numpy as np

from specdec_jax import sampling as sampling_lib
from specdec_jax import sharding
from specdec_jax.decoding import checks
from specdec_jax.decoding import contract
from specdec_jax.decoding import drafters
from specdec_jax.decoding.checks import compiler_options_key  # noqa: F401  (public)
from specdec_jax.decoding import engine
from specdec_jax.decoding import iterate as iterate_lib
from specdec_jax.decoding import stats as stats_lib
from specdec_jax.decoding import stopping
from specdec_jax.decoding import widths
from specdec_jax.decoding.protocol import Model
from specdec_jax.decoding.stats import DecodeStats

# XLA:CPU runs a matmul of one row (a decoding step) itself and, by default,
# hands those of two or more rows (a verification, an encoder) to YNNPACK.
# These options of a program send the latter to Eigen instead. Which is
# faster depends on the CPU and the number of rows: on one 2-core AMD EPYC
# Eigen verified 9 tokens in 1.9 target steps against YNNPACK's 2.9, but 2-5
# tokens more slowly; on another it was slower at 4 and 8. Time both
# (`step_timers.time_extends(..., compiler_options=...)`, docs/log/benchmarks_history.md).
CPU_EIGEN_MATMULS = {"xla_cpu_experimental_ynn_fusion_type": ""}


@dataclasses.dataclass
class DecodeResult:
  """What the decoders return.

  Attributes:
    tokens: int32 [B, max_decode_len] generated tokens (the stop id that
      ended the row included), 0 after each row's end.
    stats: the per-row `DecodeStats` (numpy): lengths, target and draft
      calls, accepted tokens, alpha and its parts, proposal lengths, calls
      and alpha per level, traces.
      With the non-finite check (unless `on_nonfinite='ignore'`),
      `target_nonfinite` (and `draft_nonfinite`) flag each row.
  """

  tokens: np.ndarray
  stats: DecodeStats

  def __repr__(self) -> str:
    # Shapes and per-row summaries, never the padded arrays themselves.
    tokens = np.asarray(self.tokens)
    parts = [f"tokens={tokens.dtype}{list(tokens.shape)}"]
    for name in ("length", "target_calls", "alpha"):
      value = getattr(self.stats, name, None)
      if value is not None:
        row = np.asarray(value).reshape(-1)
        shown = ", ".join(f"{v:.3g}" if row.dtype.kind == "f" else str(v)
                          for v in row[:8])
        parts.append(f"{name}=[{shown}{', ...' if row.size > 8 else ''}]")
    return f"DecodeResult({', '.join(parts)})"


def _placed(arrays: list[np.ndarray], mesh: jax.sharding.Mesh | None):
  """(the per-row inputs, placed over `data` of `mesh` when given, and a
  function making the context to trace and run a loop under).

  With a mesh, the inputs are replicated when the batch does not divide,
  and tracing happens under the logical axis rules, so the models'
  activation and cache constraints take effect. Parameters are used where
  they already live (see `load_model(mesh=...)`).
  """
  if mesh is None:
    return arrays, contextlib.nullcontext
  rows = sharding.batch_sharding(mesh, arrays[0].shape[0])

  def context():
    stack = contextlib.ExitStack()
    stack.enter_context(jax.set_mesh(mesh))
    stack.enter_context(nn.logical_axis_rules(sharding.logical_axis_rules()))
    return stack

  return [sharding.put(a, rows) for a in arrays], context


def _run(fn, params: list[Any], arrays: list[np.ndarray],
         mesh: jax.sharding.Mesh | None) -> DecodeResult:
  """Calls a jitted loop, on `mesh` when given (`_placed`), and fetches
  the result."""
  arrays, context = _placed(arrays, mesh)
  with context():
    tokens, stats = fn(*params, *arrays)
  tokens, stats = sharding.gather((tokens, stats))
  return DecodeResult(tokens=tokens, stats=stats)


def _replicated(params: Any, mesh: jax.sharding.Mesh | None) -> bool:
  """Whether every parameter is whole on each device of `mesh` (a draft
  placed with `replicate=True`): its steps then run without collectives."""
  if mesh is None or mesh.size == 1:
    return False
  return all(isinstance(getattr(leaf, "sharding", None), jax.sharding.Sharding)
             and leaf.sharding.is_fully_replicated
             for leaf in jax.tree.leaves(params))


def generate(model: Model, input_ids: Any, *, max_decode_len: int,
             temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
             seed: Any = 0,
             mesh: jax.sharding.Mesh | None = None,
             on_nonfinite: str = "error",
             compiler_options: Any = None,
             stop_ids: Any = None) -> DecodeResult:
  """Plain autoregressive decoding: one target call per token.

  Args:
    model: the model to decode with.
    input_ids: int [batch, length], 0-padded, each row ending in EOS (1).
      For a decoder-only model the row is the prompt.
    max_decode_len: the most tokens generated per row.
    temperature, top_k, top_p: see `sampling.SamplingConfig`.
    seed: int, or one int per row (see `DecodeResult` and `checks.seeds`).
    mesh: run sharded on this mesh (see `specdec_jax.sharding`).
    on_nonfinite: a NaN or inf logit raises FloatingPointError naming the
      model ("error", default), warns ("warn"; see `target_nonfinite` in
      the stats), or is not checked ("ignore").
    compiler_options: XLA options of the compiled loop, e.g.
      `CPU_EIGEN_MATMULS` (None: XLA's defaults).
    stop_ids: a row ends after the first of these ids it emits; (1, 107)
      also ends it at T5Gemma -it's <end_of_turn>. Ints in [1,
      vocab_size); part of the compiled loop's key. None (default): the
      model vocabulary's own (a tokenizer.json's generation_config.json
      ids, `checks.default_stop_ids`), else EOS (1).

  Returns:
    A `DecodeResult`.
  """
  model = checks.check_model("model", model)
  if stop_ids is None:
    stop_ids = checks.default_stop_ids(model)
  stop_ids = checks.check_stop_ids(stop_ids, model.vocab_size)
  options = checks.compiler_options_key(compiler_options)
  on_nonfinite = checks.check_on_nonfinite(on_nonfinite)
  max_decode_len = checks.check_positive_int("max_decode_len", max_decode_len,
                                       "It bounds the generated tokens.")
  sampler = sampling_lib.SamplingConfig(temperature, top_k, top_p)
  ids = checks.check_inputs(input_ids, [("target", model)])
  seeds, rows = checks.seeds(seed, ids.shape[0])
  checks.check_memory([(model, 1)], ids.shape, 0, max_decode_len, False,
                f"max_decode_len={max_decode_len}")
  check = on_nonfinite != "ignore"
  fn = engine.build_generate(model.definition, max_decode_len, sampler, check,
                             options, stop_ids)
  result = _run(fn, [model.params], [ids, seeds, rows], mesh)
  result.stats = result.stats.replace(exact=True)
  checks.check_nonfinite(result.stats, on_nonfinite, [("target_nonfinite", "target")])
  return result


def speculative_generate(target: Model, draft: Model, input_ids: Any, *,
                         gamma: int | None = None, max_decode_len: int,
                         temperature: float = 0.0, top_k: int = 0,
                         top_p: float = 1.0, seed: Any = 0,
                         lenience: float = 1.0,
                         rule: Any = None,
                         draft_stop: Any = None,
                         record_trace: bool = False,
                         mesh: jax.sharding.Mesh | None = None,
                         on_nonfinite: str = "error",
                         compiler_options: Any = None,
                         stop_ids: Any = None) -> DecodeResult:
  """Speculative decoding (Algorithm 1): exact samples from the target.

  Args:
    target: the model whose output distribution is kept.
    draft: what proposes: a draft model (its vocabulary the target's or
      narrower: its ids the target's first ones, `widths`), or any drafter
      of the `Drafter` protocol: prompt lookup (`sd.prompt_lookup(target)`,
      copying from the input), an n-gram model (`models.ngram.fit_ngram`),
      a cascade
      (`sd.cascade(draft, draft_of_draft, gamma=k)`), a horizontal drafter
      (`sd.horizontal(...)`), a token tree (`sd.tree(draft, (3, 2, 1, 1))`,
      gamma its depth), or a drafter of your own (docs/extending.md).
    input_ids: int [batch, length], 0-padded, each row ending in EOS (1).
    gamma: draft tokens per iteration (static; >= 1); with a `draft_stop`
      rule, the most draft tokens per iteration; with a token tree, its
      depth (the default there).
    max_decode_len: the most tokens generated per row.
    temperature, top_k, top_p: applied identically to target and draft.
    seed: int, or one int per row.
    lenience: in (0, 1]; 1 (default) is exact, smaller is the paper's lossy
      variant.
    rule: the acceptance rule: None (Algorithm 1, `acceptance.rule_for`)
      or any hashable object with the members of
      `acceptance.AcceptanceRule` (e.g. `sd.TypicalAcceptance()`, lossy;
      docs/extending.md). Part of the compiled loop's key. A lossy rule's
      results say so (`stats.exact` False).
    draft_stop: None (exactly gamma draft tokens per iteration, the paper's
      loop), `sd.ConfidenceStop(threshold)` or `sd.ExpectedGainStop(...)`:
      each row stops proposing when the rule says so (see
      `decoding/stopping.py`); the output stays exact.
    record_trace: also return per-iteration draft tokens, accepted counts and
      target tokens (`DecodeStats.trace_*`, [B, max_decode_len, ...]) for
      plots.
    mesh: run sharded on this mesh (see `specdec_jax.sharding`).
    on_nonfinite: a NaN or inf logit of either model raises
      FloatingPointError naming the model ("error", default), warns
      ("warn"; see `target_nonfinite`, `draft_nonfinite`), or is not
      checked ("ignore").
    compiler_options: XLA options of the compiled loop, e.g.
      `CPU_EIGEN_MATMULS` (None: XLA's defaults).
    stop_ids: a row ends after the first of these ids it emits (None: the
      target vocabulary's own, else EOS, 1; see `generate`). The loop and its drafters (a cascade's
      inner loop, a stop rule's proposals) all stop there, so greedy output
      equals `generate(..., stop_ids=...)`'s.

  Returns:
    A `DecodeResult`.
  """
  decoder = SpeculativeDecoder(
      target, draft, gamma=gamma, max_decode_len=max_decode_len,
      sampling=sampling_lib.SamplingConfig(temperature, top_k, top_p),
      lenience=lenience, rule=rule, draft_stop=draft_stop, mesh=mesh,
      on_nonfinite=on_nonfinite, compiler_options=compiler_options,
      stop_ids=stop_ids)
  return decoder(input_ids, seed=seed, record_trace=record_trace)


@dataclasses.dataclass(frozen=True)
class SpeculativeDecoder:
  """Speculative decoding (Algorithm 1) as one object: what to decode with.

  Holds everything but the inputs: the target and its draft (a model, a
  cascade or a horizontal drafter), gamma, the length limit, sampling, the
  stop rule and where and how to compile. Every setting is checked when the
  object is made, before anything is traced; calling it decodes:

    decoder = SpeculativeDecoder(target, draft, gamma=4, max_decode_len=64,
                                 sampling=sd.sampling.SamplingConfig(0.7))
    result = decoder(input_ids, seed=0)      # exact samples of the target
    baseline = decoder.baseline(input_ids)   # the target alone, same settings
    longer = decoder.replace(gamma=7)

  `speculative_generate` takes the same settings as keywords.

  Attributes:
    target: the model whose output distribution is kept.
    draft: the cheaper approximation; same vocabulary (a model, a cascade,
      a horizontal drafter or a token tree, `sd.tree`).
    gamma: draft tokens per iteration (the most, with a `draft_stop`; a
      tree's depth, its default: None takes it from the tree).
    max_decode_len: the most tokens generated per row.
    sampling: temperature, top-k, top-p, applied to target and draft alike.
    lenience: 1 (default) is exact; below 1 the paper's lossy variant.
    rule: None (Algorithm 1) or an acceptance rule (`speculative_generate`).
    draft_stop: None or a stop rule (`ConfidenceStop`, `ExpectedGainStop`,
      or any `stopping.StopRule`).
    mesh: run sharded on this mesh.
    on_nonfinite: "error", "warn" or "ignore" (see `speculative_generate`).
    compiler_options: XLA options of the compiled loop.
    stop_ids: the ids that end a row (None: the target vocabulary's own,
      else EOS; `generate`).
  """

  target: Model
  draft: Model
  gamma: int | None = None
  max_decode_len: int = dataclasses.field(kw_only=True)
  sampling: sampling_lib.SamplingConfig = sampling_lib.SamplingConfig()
  lenience: float = 1.0
  rule: Any = None
  draft_stop: Any = None
  mesh: jax.sharding.Mesh | None = None
  on_nonfinite: str = "error"
  compiler_options: Any = None
  stop_ids: Any = None

  def __post_init__(self):
    put = functools.partial(object.__setattr__, self)
    put("target", checks.check_model("target", self.target))
    if self.stop_ids is None:
      put("stop_ids", checks.default_stop_ids(self.target))
    put("stop_ids", checks.check_stop_ids(self.stop_ids,
                                          self.target.vocab_size))
    put("draft", checks.check_model("draft", self.draft, cascade_ok=True))
    checks.compiler_options_key(self.compiler_options)
    stopping.check_rule(self.draft_stop)
    put("on_nonfinite", checks.check_on_nonfinite(self.on_nonfinite))
    if self.gamma is None:
      probe = drafters.declared(self.draft, 1)
      if probe.shape.max_children == 1:
        raise ValueError(
            "gamma is required: pass the number of draft tokens per "
            "iteration, e.g. gamma=4 (only a token tree, sd.tree, fixes it: "
            "its depth).")
      put("gamma", probe.gamma)
    put("gamma", checks.check_positive_int(
        "gamma", self.gamma, "It is the number of draft tokens per step."))
    put("max_decode_len", checks.check_positive_int(
        "max_decode_len", self.max_decode_len,
        "It bounds the generated tokens."))
    put("lenience", sampling_lib.validate_lenience(self.lenience))
    contract.check_rule(self.rule, self.lenience)
    if not isinstance(self.sampling, sampling_lib.SamplingConfig):
      raise TypeError(
          f"sampling must be a SamplingConfig(temperature, top_k, top_p), "
          f"got {self.sampling!r}.")
    # What the checks, the memory model and the engine read of the draft,
    # as its drafter declares it: first as given (each model's vocabulary
    # no wider than the target's), then widened to the target's ids (what
    # the loop runs, `widths`).
    drafter = drafters.declared(self.draft, self.gamma, self.sampling,
                                self.rule)
    checks.check_compatible(self.target, self.draft, drafter)
    widened = widths.widen_model(self.draft, self.target.vocab_size)
    if widened is not self.draft:
      put("draft", widened)
      drafter = drafters.declared(self.draft, self.gamma, self.sampling,
                                  self.rule)
    put("_drafter", drafter)
    if drafter.shape.max_children > 1:
      checks.check_tree(drafter.shape, self.target, self.gamma,
                        self.max_decode_len, self.lenience, self.draft_stop)
    elif drafter.gamma != self.gamma:
      raise ValueError(
          f"gamma={self.gamma} but the draft's drafter proposes up to "
          f"{drafter.gamma} tokens per iteration: pass gamma="
          f"{drafter.gamma}.")

  def __repr__(self) -> str:
    """Settings only (the models by their definitions, no arrays)."""
    s = self.sampling
    mesh = None if self.mesh is None else dict(self.mesh.shape)
    return (f"SpeculativeDecoder(target={_short(self.target)}, "
            f"draft={_short(self.draft)}, gamma={self.gamma}, "
            f"max_decode_len={self.max_decode_len}, "
            f"sampling=(temperature={s.temperature}, top_k={s.top_k}, "
            f"top_p={s.top_p}), lenience={self.lenience}, rule={self.rule!r}, "
            f"draft_stop={self.draft_stop!r}, mesh={mesh}, "
            f"on_nonfinite={self.on_nonfinite!r}, "
            f"compiler_options={self.compiler_options!r}, "
            f"stop_ids={self.stop_ids!r})")

  @property
  def exact(self) -> bool:
    """Whether the output is distributed exactly as the target's (False
    for a lossy rule or lenience < 1)."""
    if self.rule is not None:
      return bool(self.rule.exact)
    return self.lenience == 1.0

  def replace(self, **changes: Any) -> "SpeculativeDecoder":
    """The same decoder with some settings changed (checked again)."""
    return dataclasses.replace(self, **changes)

  def decode_kwargs(self) -> dict[str, Any]:
    """The settings `generate` shares (length, sampling, mesh, options,
    stop ids)."""
    return dict(max_decode_len=self.max_decode_len,
                temperature=self.sampling.temperature,
                top_k=self.sampling.top_k, top_p=self.sampling.top_p,
                mesh=self.mesh, on_nonfinite=self.on_nonfinite,
                compiler_options=self.compiler_options,
                stop_ids=self.stop_ids)

  def baseline(self, input_ids: Any, *, seed: Any = 0) -> DecodeResult:
    """The target alone (`generate`), with this decoder's settings."""
    return generate(self.target, input_ids, seed=seed, **self.decode_kwargs())

  def __call__(self, input_ids: Any, *, seed: Any = 0,
               record_trace: bool = False) -> DecodeResult:
    """Decodes `input_ids` (int [batch, length], 0-padded, rows ending in
    EOS); `seed` is an int or one per row; `record_trace` also returns the
    per-iteration trace (see `speculative_generate`)."""
    arrays, loop = self._prepare(input_ids, seed, record_trace)
    result = _run(engine.build_speculative(**loop),
                  [self.target.params, self.draft.params], arrays, self.mesh)
    return self._checked(result)

  def iterate(self, input_ids: Any, *,
              seed: Any = 0) -> Iterator[stats_lib.Iteration]:
    """Decodes `input_ids` one iteration at a time, yielding what each did.

    Steps the same compiled iteration as `__call__`'s loop from Python
    (`decoding/iterate.py`): each `stats.Iteration` (numpy) holds the
    proposal, the accepted draft tokens per row, the tokens each row
    emitted (`new_tokens(row)`) and the counters so far. A row's emitted
    tokens, concatenated over the iterations, are its tokens in
    `decoder(input_ids, seed=seed)`. One host round trip per iteration:
    for watching a rule or a drafter work, not for speed.
    """
    arrays, loop = self._prepare(input_ids, seed, False)
    steps = iterate_lib.build_steps(**loop)
    params = (self.target.params, self.draft.params)
    arrays, context = _placed(arrays, self.mesh)
    with context():
      state, keys = steps.start(*params, *arrays)
    for _ in range(self.max_decode_len):
      with context():
        state, record = steps.next(*params, keys, state)
      record, done = sharding.gather((record, state.stream.done))
      yield record
      if np.all(done):
        break
    with context():
      tokens, stats = steps.finish(state)
    self._checked(DecodeResult(*sharding.gather((tokens, stats))))

  def _prepare(self, input_ids: Any, seed: Any,
               record_trace: bool) -> tuple[list[np.ndarray], dict]:
    """The checked inputs [ids, seeds, rows] and the keywords of the loop
    (`engine.build_speculative`); refuses inputs and sizes that cannot
    decode, before anything compiles."""
    target, draft, gamma = self.target, self.draft, self.gamma
    max_decode_len = self.max_decode_len
    ids = checks.check_inputs(input_ids, [("target", target),
                                          ("draft", draft)])
    seeds, rows = checks.seeds(seed, ids.shape[0])
    drafter = self._drafter
    extra_width, shape = drafter.extra_width, drafter.shape
    checks.check_width(max_decode_len + gamma + 1 + extra_width,
                       f"max_decode_len + gamma + 1 (+ {extra_width} for "
                       f"a cascade's inner gammas or a tree's nodes)")
    checks.check_memory(
        [(target, shape.verified)]
        + [(m, call.tokens)
           for call, m in drafters.called_models(draft, drafter)],
        ids.shape, gamma, max_decode_len, bool(record_trace),
        f"gamma={gamma}, max_decode_len={max_decode_len}"
        + ("" if shape.max_children == 1 else
           f", a tree of {shape.num_nodes} nodes"), extra_width)
    loop = dict(
        target=target.definition, draft=draft.definition, gamma=gamma,
        max_decode_len=max_decode_len, sampler=self.sampling,
        lenience=self.lenience, record_trace=bool(record_trace),
        check_finite=self.on_nonfinite != "ignore",
        draft_stop=self.draft_stop,
        compiler_options=checks.compiler_options_key(self.compiler_options),
        draft_replicated=_replicated(draft.params, self.mesh),
        stop_ids=self.stop_ids, rule=self.rule)
    return [ids, seeds, rows], loop

  def _checked(self, result: DecodeResult) -> DecodeResult:
    """The result marked exact or lossy, its non-finite flags acted on."""
    result.stats = result.stats.replace(exact=self.exact)
    checks.check_nonfinite(result.stats, self.on_nonfinite,
                           [("target_nonfinite", "target"),
                            ("draft_nonfinite", "draft")])
    return result


def _short(model: Model) -> str:
  """A model by its definition's kind and size, for reprs."""
  d = model.definition
  config = getattr(d, "config", None)
  name = getattr(config, "name", None) or type(d).__name__
  parts = getattr(d, "parts", None)
  if callable(parts):
    name += "(" + ", ".join(f"{k}={type(v).__name__}" for k, v in parts()) + ")"
  return f"<{name}, vocab {d.vocab_size}>"
