"""Shared test helpers: the toy "table" models, the chi-square harness, the
compile counter, and builders of tiny models and data.

"Table" models for engine tests: next-token logits are an explicit function
of the whole prefix, so sequence probabilities are exactly computable.

The logits of the token after position t are `table[t, h_t]`, where the state
h_t = (h0 + sum_{j <= t} w_j * (token_j + 1)) mod H hashes every token of the
decoder sequence up to t. The tokens live in a position-indexed cache, so a
stale slot that leaked into attention (a broken rollback) changes h_t and the
logits. `exact_logprob` recomputes the same function in numpy, independently
of the JAX code.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import itertools
import logging
import os
import re
import runpy
import subprocess
import sys
import traceback
from typing import Sequence

from absl import flags
from absl import logging as absl_logging
import gin
import jax
from jax.experimental.compilation_cache import compilation_cache
import jax.numpy as jnp
import numpy as np
from scipy import stats

import specdec_jax as sd
from specdec_jax import sampling
from specdec_jax.decoding import acceptance
from specdec_jax.decoding import engine
from specdec_jax.models import ngram
from specdec_jax.decoding.protocol import Prefill
from specdec_jax.decoding.protocol import Model


def _weights(n):
  return np.arange(n) % 5 + 1


@dataclasses.dataclass(frozen=True)
class TableDef:
  vocab: int
  states: int = 7
  positions: int = 64
  decoder_only: bool = False
  max_input: int | None = None

  @property
  def vocab_size(self):
    return self.vocab

  @property
  def max_input_len(self):
    return self.max_input

  def prefill(self, params, input_ids, num_decode_positions):
    del params
    batch, width = input_ids.shape
    lengths = jnp.sum(input_ids != 0, axis=1).astype(jnp.int32)
    if self.decoder_only:
      slots = width + num_decode_positions + 1
      tokens = jnp.zeros((batch, slots), jnp.int32).at[:, :width].set(input_ids)
      start = jnp.take_along_axis(input_ids, (lengths - 1)[:, None], 1)[:, 0]
      return Prefill(cache={"tokens": tokens, "h0": jnp.zeros((batch,),
                                                              jnp.int32)},
                     start_token=start.astype(jnp.int32), start_pos=lengths - 1)
    h0 = jnp.sum(input_ids * (jnp.arange(width) + 1), axis=1) % self.states
    tokens = jnp.zeros((batch, num_decode_positions + 1), jnp.int32)
    return Prefill(cache={"tokens": tokens, "h0": h0.astype(jnp.int32)},
                   start_token=jnp.zeros((batch,), jnp.int32),
                   start_pos=jnp.zeros((batch,), jnp.int32))

  def extend(self, params, cache, tokens, positions, tree=None):
    batch, slots = cache["tokens"].shape
    rows = jnp.arange(batch)[:, None]
    written = positions if tree is None else tree.slots
    cached = cache["tokens"].at[rows, written].set(tokens)
    if tree is None:
      key_pos = jnp.arange(slots)[None, :]
      visible = key_pos[:, None, :] <= positions[:, :, None]
    else:
      key_pos, visible = tree.expand(slots)
    # Each visible token weighs by its position (not its slot).
    contrib = jnp.asarray(_weights(slots + 1))[
        jnp.clip(key_pos, 0, slots)] * (cached + 1)  # [B, S]
    state = (cache["h0"][:, None] + jnp.sum(
        jnp.where(visible, contrib[:, None, :], 0), axis=-1)) % self.states
    pos = jnp.minimum(positions, self.positions - 1)
    logits = params["table"][pos, state]
    return logits, dict(cache, tokens=cached)

  def copy_slots(self, cache, src, dst):
    rows = jnp.arange(src.shape[0])[:, None]
    moved = cache["tokens"][rows, src]
    return dict(cache, tokens=cache["tokens"].at[rows, dst].set(
        moved, mode="drop"))


def table_model(vocab, *, seed=0, scale=2.0, states=7, positions=64,
                decoder_only=False, eos_bias=0.0, max_input=None, base=None,
                noise=1.0):
  """A random table model; with `base`, a draft = base table + noise."""
  rng = np.random.default_rng(seed)
  table = rng.normal(size=(positions, states, vocab)) * scale
  if base is not None:
    table = np.asarray(base.params["table"]) + noise * table / scale
  else:
    table[..., 1] += eos_bias
  definition = TableDef(vocab=vocab, states=states, positions=positions,
                        decoder_only=decoder_only, max_input=max_input)
  return Model(definition=definition,
               params={"table": jnp.asarray(table, jnp.float32)})


def next_logits(model, row, sequence):
  """numpy logits after the decoder `sequence` (start token included)."""
  d = model.definition
  table = np.asarray(model.params["table"], np.float64)
  row = np.asarray(row)
  if d.decoder_only:
    length = int((row != 0).sum())
    seq = list(row[:length]) + list(sequence[1:])
    h0 = 0
  else:
    seq = list(sequence)
    h0 = int((row * (np.arange(row.size) + 1)).sum()) % d.states
  t = len(seq) - 1
  state = (h0 + int((_weights(len(seq)) * (np.array(seq) + 1)).sum())) % d.states
  return table[min(t, d.positions - 1), state]


def start_token(model, row):
  row = np.asarray(row)
  if model.definition.decoder_only:
    return int(row[(row != 0).sum() - 1])
  return 0


def _softmax(x, temperature, top_k=0, top_p=1.0):
  z = x / temperature
  if 0 < top_k < z.size:
    kth = np.sort(z)[-top_k]
    z = np.where(z >= kth, z, -np.inf)  # ties at the k-th value are kept
  z = np.exp(z - z.max())
  z = z / z.sum()
  if top_p < 1.0:
    # The smallest set of most likely tokens reaching top_p (ties kept).
    desc = np.sort(z)[::-1]
    kept = np.cumsum(desc) - desc < top_p
    z = np.where(z >= desc[kept].min(), z, 0.0)
    z = z / z.sum()
  return z


def exact_distribution(model, row, length, temperature=1.0, eos=1, top_k=0,
                       top_p=1.0):
  """{tuple of `length` tokens (0 after EOS): probability} under sampling
  (temperature, then top-k and top-p as in `sampling.SamplingConfig`)."""
  vocab = model.definition.vocab
  out = {}
  for seq in itertools.product(range(vocab), repeat=length):
    prob, prefix, emitted = 1.0, [start_token(model, row)], []
    for tok in seq:
      prob *= _softmax(next_logits(model, row, prefix), temperature,
                       top_k, top_p)[tok]
      prefix.append(tok)
      emitted.append(tok)
      if tok == eos:
        break
    key = tuple(emitted + [0] * (length - len(emitted)))
    if (len(emitted) == length or emitted[-1] == eos) and prob > 0:
      out[key] = prob  # each truncated sequence is reached exactly once
  return out


def chi_square_family():
  """The vocabulary-4 models of the adaptive and negative-control chi-square
  tests: a target, its draft, the draft's own draft (each a noisy copy of
  the one above) and a bigram drafter fitted on three short sequences."""
  target = table_model(4, seed=3, scale=1.0, eos_bias=-1.0)
  draft = table_model(4, seed=4, base=target, noise=1.5)
  small = table_model(4, seed=5, base=draft, noise=1.5)
  bigram = ngram.fit_ngram([[2, 3, 0, 1], [3, 3, 2, 1], [0, 2, 1]], 4)
  return target, draft, small, bigram


def tiny_ende(root, sentences) -> dict[str, str]:
  """A local EnDe source: `root`/mini.{en,de} holding `sentences` (both
  sides alike), and two random tiny T5 v1.1 models saved there in our
  format, a 2+2-layer "target" and a 1+1-layer "draft" (vocabulary 320,
  room for `tiny_vocab`). Returns {name: model directory}."""
  # Imported here: the table models above need neither Flax nor orbax.
  from specdec_jax import checkpoints  # pylint: disable=g-import-not-at-top
  from specdec_jax.models import registry  # pylint: disable=g-import-not-at-top
  for language in ("en", "de"):
    (root / f"mini.{language}").write_text("".join(s + "\n" for s in sentences))
  models = {}
  for name, layers, seed in [("target", 2, 0), ("draft", 1, 1)]:
    cfg = registry.get_config("t5_1_1_tiny", vocab_size=320,
                              num_encoder_layers=layers,
                              num_decoder_layers=layers)
    definition = registry.make_def(cfg)
    params = definition.init_params(jax.random.PRNGKey(seed))
    models[name] = checkpoints.save(Model(definition, params),
                                    str(root / name), config=cfg)
  return models


# ----------------------------------------------------------------------------
# Seams for negative controls: deliberately wrong pieces plugged into the
# speculative loop from the tests (the library has no hook for them).


def uncached_speculative(*args, **kwargs):
  """`engine.build_speculative(*args, **kwargs)` built afresh, outside its
  cache: traced at its first call, under whatever the test has patched
  then (a `monkeypatch` of `drafters.ModelDrafter.draw`, ...), and never
  handed to another test. (A wrong acceptance rule needs no patch: it is
  the loop's `rule=`, part of its key.)"""
  builder = engine._build_speculative  # pylint: disable=protected-access
  engine._build_speculative = builder.__wrapped__
  try:
    return engine.build_speculative(*args, **kwargs)
  finally:
    engine._build_speculative = builder


def argmax_draw(self, key, q):
  """A draft that proposes q's argmax while handing over q itself: the
  classic bug (drafting greedily, verifying as if it sampled). Patched in
  as `drafters.ModelDrafter.draw`."""
  del self, key
  return jnp.argmax(q, -1).astype(jnp.int32)


@dataclasses.dataclass(frozen=True)
class SkipResidual(acceptance.Sampled):
  """Algorithm 1 without its residual: after a rejection the next test (a
  tree's sibling) and the correction use the verifier's p itself. Wrong on
  purpose (a negative control's acceptance rule, passed as `rule=`)."""

  exact = False

  def residual(self, p, q):
    del q
    return p


# ----------------------------------------------------------------------------
# Harnesses shared by the decoding, adaptive, cascade and demo tests.


def example_inputs():
  """Four 0-padded rows of different lengths, each ending in EOS."""
  ids = np.zeros((4, 6), np.int32)
  for b, row in enumerate([[5, 7, 1], [3, 1], [9, 4, 6, 2, 8, 1], [2, 1]]):
    ids[b, :len(row)] = row
  return ids


def two_token_table(p1, p2, eos=1):
  """{(x1, x2): p1[x1] * p2[x1, x2]} of the first two tokens a model emits,
  from float64 p1 [V] and p2 [V, V] (row x1: after x1); a row that emits
  EOS first ends, (eos, 0)."""
  table = {}
  for x1 in np.flatnonzero(p1 > 0):
    if x1 == eos:
      table[(int(x1), 0)] = p1[x1]
      continue
    for x2 in np.flatnonzero(p2[x1] > 0):
      table[(int(x1), int(x2))] = p1[x1] * p2[x1, x2]
  return table


def speculative_samples(target, draft, ids, gamma, max_decode_len, setting,
                        seed, rule=None):
  """Tokens [N, max_decode_len] of speculative sampling (`setting`: the
  SamplingConfig's fields) from the rows `ids` [N, L], each with its own
  key of `seed`, with the default acceptance rule or `rule` (e.g.
  `SkipResidual()`, a negative control)."""
  return sd.speculative_generate(target, draft, ids, gamma=gamma,
                                 max_decode_len=max_decode_len, seed=seed,
                                 rule=rule, **setting).tokens


def first_two_exact(target, prompt, settings, eos=1):
  """{name: {(x1, x2): probability}} of the first two tokens `target` (a
  decoder-only Model) emits after `prompt` (int [L], 0-padded) under each
  of `settings` ({name: SamplingConfig fields}): p(x1) * p(x2 | x1), from
  one forward pass over prompt + x1 for every x1, through the same
  `SamplingConfig.probs` as the loop."""
  prompt = prompt[prompt != 0]
  vocab = target.vocab_size
  rows = np.concatenate([np.tile(prompt, (vocab, 1)),
                         np.arange(vocab)[:, None]], 1).astype(np.int32)
  logits = jax.jit(target.definition.forward)(target.params, rows)
  out = {}
  for name, setting in settings.items():
    cfg = sampling.SamplingConfig(**setting)
    p1 = np.asarray(cfg.probs(logits[0, -2]), np.float64)
    p2 = np.asarray(cfg.probs(logits[:, -1]), np.float64)
    out[name] = two_token_table(p1, p2, eos)
  return out


def check_chunked_scoring(model, prompts, sequences, max_new, atol,
                          first_id=3, seed=0):
  """Scores `sequences` [B, T] (prompts [B, L] + max_new tokens, 0-padded)
  as a speculative loop does and asserts the logits equal the full
  forward pass's within `atol`: chunks of 4 tokens at each row's own
  offset, of which only the first `keep` (1-4, varying) are the
  sequence's and the rest stand-ins (ids from `first_id` up) that the next
  chunk overwrites (a rollback). Returns the positions checked."""
  d = model.definition
  full = np.asarray(jax.jit(d.forward)(model.params, sequences))
  pre = jax.jit(d.prefill, static_argnums=2)(model.params, prompts,
                                             max_new + 4)
  extend = jax.jit(d.extend)
  start, cache = np.asarray(pre.start_pos), pre.cache
  rng = np.random.default_rng(seed)
  rows = len(prompts)
  done, checked = np.zeros(rows, int), 0
  while (done < max_new).any():
    positions = (start + done)[:, None] + np.arange(4)
    tokens = np.take_along_axis(
        sequences, np.minimum(positions, sequences.shape[1] - 1), 1)
    keep = rng.integers(1, 5, size=rows)
    stand_in = np.arange(4)[None] >= keep[:, None]
    tokens = np.where(stand_in, rng.integers(first_id, model.vocab_size,
                                             (rows, 4)), tokens)
    logits, cache = extend(model.params, cache, tokens.astype(np.int32),
                           positions.astype(np.int32))
    for b in range(rows):
      for k in range(keep[b]):
        if done[b] + k < max_new:
          np.testing.assert_allclose(logits[b, k], full[b, positions[b, k]],
                                     atol=atol)
          checked += 1
    done += keep
  return checked


def sequence_counts(tokens):
  keys, counts = np.unique(tokens, axis=0, return_counts=True)
  return {tuple(k): c for k, c in zip(keys.tolist(), counts)}


def chisquare_vs_exact(tokens, exact, min_expected=5.0):
  """p-value of Pearson's chi-square of the sampled sequences `tokens` [N, T]
  against `exact` ({sequence: probability}); cells expected fewer than
  `min_expected` times are pooled into one (the chi-square approximation
  needs it), and a sequence of probability 0 fails outright."""
  counts = sequence_counts(tokens)
  assert set(counts) <= set(exact), "sampled a sequence of probability 0"
  keys = sorted(exact)
  probs = np.array([exact[k] for k in keys])
  observed = np.array([counts.get(k, 0) for k in keys], np.float64)
  expected = probs / probs.sum() * observed.sum()
  small = expected < min_expected
  if small.any():
    observed = np.append(observed[~small], observed[small].sum())
    expected = np.append(expected[~small], expected[small].sum())
  return stats.chisquare(observed, expected).pvalue


class CompileCounter:
  """Counts XLA backend compiles while active (a `with` block); `names`
  lists the compiled functions' names (a jitted `step` as "jit(step)")."""

  def __init__(self):
    self.count = 0
    self.names = []

  def _listener(self, event, duration, **kwargs):
    del duration
    if event == "/jax/core/compile/backend_compile_duration":
      self.count += 1
      self.names.append(kwargs.get("fun_name"))

  def __enter__(self):
    jax.monitoring.register_event_duration_secs_listener(self._listener)
    return self

  def __exit__(self, *exc):
    jax.monitoring.unregister_event_duration_listener(self._listener)


# ----------------------------------------------------------------------------
# Scripts launched as processes.

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIMULATED_DEVICES_FLAG = "--xla_force_host_platform_device_count=8"


# What tests/conftest.py's `--xla_cpu_use_fusion_emitters=false` changes
# back for one compile (`lowered.compile(compiler_options=...)`): XLA:CPU's
# default, so a test of a CPU program's structure reads the program users
# get.
USERS_XLA_CPU_OPTIONS = {"xla_cpu_use_fusion_emitters": True}


def script_env(**overrides: str) -> dict[str, str]:
  """The environment of a script a test launches: this process's, the
  repository on PYTHONPATH, and XLA_FLAGS without conftest.py's 8 simulated
  devices (a script runs on the one CPU device a user's machine has) but
  with its other flags (LLVM -O0, the loop emitter and one LLVM module a
  program: compiled sooner); then `overrides`."""
  flags_ = os.environ.get("XLA_FLAGS", "").replace(SIMULATED_DEVICES_FLAG, "")
  return dict(os.environ, PYTHONPATH=REPO, XLA_FLAGS=" ".join(flags_.split()),
              **overrides)


def library_errors(stderr: str) -> list[str]:
  """The error lines libraries printed: absl/glog ERROR and FATAL lines
  (`E1206 ...`, libtpu's `E0000 ...`, gin's `resource_reader.py:55] Path
  not found`) and libtpu's "Source Location Trace" (issue 60: a run that
  works prints none)."""
  return [line for line in stderr.splitlines()
          if re.match(r"[EF]\d{4} ", line) or "Source Location Trace" in line]


# TensorFlow's and absl's notices at start-up (tensorflow_env drops them):
# one of these in a script's output means a TensorFlow import got past it.
TENSORFLOW_BANNER = ("oneDNN custom operations", "Could not find cuda drivers",
                     "This TensorFlow binary is optimized",
                     "Resetting cache at <empty>")


def launch(command: Sequence[str] | str, *, cwd: str = REPO,
           env: dict[str, str] | None = None, timeout: float = 600,
           **overrides: str) -> subprocess.CompletedProcess:
  """Runs what a user types, from the repository's root: `command` is a
  script's argv (`["scripts/train.py", "--gin_file=..."]`, Python added in
  front) or a shell string (run by bash). Output is text; stdout and
  stderr kept apart."""
  if isinstance(command, str):
    args = ["bash", "-euo", "pipefail", "-c", command]
  else:
    args = [sys.executable, *command]
  return subprocess.run(args, cwd=cwd, env=env or script_env(**overrides),
                        capture_output=True, text=True, timeout=timeout,
                        check=False)


def assert_succeeded(proc: subprocess.CompletedProcess) -> None:
  """Status 0, no error-level line from any library, and no TensorFlow or
  JAX start-up notice."""
  assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-4000:])
  output = proc.stdout + proc.stderr
  assert not library_errors(output), library_errors(output)
  banner = [line for line in output.splitlines()
            if any(b in line for b in TENSORFLOW_BANNER)]
  assert not banner, banner


def assert_one_line_error(proc: subprocess.CompletedProcess,
                          *expected: str) -> str:
  """A user's mistake: status 1, no traceback, and the last line of stderr
  is `TypeName: message`, naming each of `expected`. Returns that line."""
  assert proc.returncode == 1, (proc.returncode, proc.stderr[-3000:])
  assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
  last = proc.stderr.strip().splitlines()[-1]
  assert re.match(r"^[A-Za-z]+Error: ", last), last
  for text in expected:
    assert text in last, (text, last)
  return last


# ----------------------------------------------------------------------------
# Scripts run in this process.


@dataclasses.dataclass(frozen=True)
class ScriptResult:
  """What `python scripts/NAME.py ARGS` would leave: its exit status, its
  stdout, and its stderr (its log lines included)."""
  returncode: int
  stdout: str
  stderr: str


def run_script(name: str, *args: str) -> ScriptResult:
  """Runs scripts/`name`.py in this process, as `python scripts/NAME.py
  ARGS` runs it (its `__main__` block, absl flags parsed from `args`).

  Saves the interpreter start and the imports (8-10 s a launch) and reuses
  the programs this process has compiled; each script keeps one real
  launch in the suite (run_experiment, reproduce_tables, convert_checkpoint,
  teacher_outputs, plan_run), which checks what only a process shows.
  A `SystemExit` with a message ends it as Python would (the message on
  stderr, status 1), an exception as a traceback and status 1. The
  script's flags are removed and absl's flags, gin's config and JAX's
  compilation cache restored afterwards, so runs do not see each other.
  """
  path = os.path.join(os.path.dirname(os.path.dirname(
      os.path.abspath(__file__))), "scripts", f"{name}.py")
  out, err = io.StringIO(), io.StringIO()
  # app.run puts absl's handler on the root logger: its lines go to `err`.
  handler = absl_logging.get_absl_handler().python_handler
  stream, level = handler.stream, logging.getLogger().level
  cache = {key: getattr(jax.config, key) for key in (
      "jax_compilation_cache_dir",
      "jax_persistent_cache_min_compile_time_secs")}
  argv, code = sys.argv, 0
  sys.argv = [path, *args]
  handler.stream = err
  # Verbosity INFO, as in a fresh process (app.run raises absl's default -1
  # to 0 in its first run only).
  verbosity = flags.FLAGS["verbosity"].default
  flags.FLAGS.set_default("verbosity", 0)
  try:
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
      try:
        runpy.run_path(path, run_name="__main__")
      except SystemExit as e:
        code = e.code
      except Exception:  # pylint: disable=broad-except
        traceback.print_exc()
        code = 1
  finally:
    handler.stream = stream
    flags.FLAGS.set_default("verbosity", verbosity)
    logging.getLogger().setLevel(level)
    # absl names the module defining a __main__ flag by sys.argv[0].
    defined = flags.FLAGS.flags_by_module_dict().pop(path, ())
    for flag_name in {flag.name for flag in defined}:
      if flag_name in flags.FLAGS:
        delattr(flags.FLAGS, flag_name)
    sys.argv = argv
    flags.FLAGS.unparse_flags()
    gin.clear_config()
    for key, value in cache.items():
      jax.config.update(key, value)
    compilation_cache.reset_cache()
  if isinstance(code, str):
    err.write(code + "\n")
    code = 1
  return ScriptResult(int(code or 0), out.getvalue(), err.getvalue())


# ----------------------------------------------------------------------------
# TensorBoard events, as TensorBoard would read them.


def tensorboard_scalars(read, names) -> dict[str, dict[int, float]]:
  """{tag: {step: value}} of the scalars in the event files `names`, whose
  bytes `read(name)` returns (local or gs://), in the order given."""
  import os  # pylint: disable=g-import-not-at-top
  import tempfile  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  out: dict[str, dict[int, float]] = {}
  with tempfile.TemporaryDirectory() as local:
    for i, name in enumerate(names):
      path = os.path.join(local, f"{i}.events")
      with open(path, "wb") as f:
        f.write(read(name))
      for event in tf.compat.v1.train.summary_iterator(path):
        for value in event.summary.value:
          if value.metadata.plugin_data.plugin_name == "scalars":
            out.setdefault(value.tag, {})[event.step] = float(
                tf.make_ndarray(value.tensor))
  return out
