"""Timing device work: one rule for every measured number in this project.

`best_time(fn, repeats)` calls `fn` `repeats` times, waits for each result
(`jax.block_until_ready`; results fetched to the host are ready already) and
returns the last result with the SHORTEST time. Why the minimum, not the
median: on a shared machine interference (other processes, the OS, page
faults) only ever adds time to a run, so the fastest of a few repeats is the
estimate of the program's own cost that noise disturbs least, and measuring
both sides of a speedup the same way keeps their ratio honest. The caller
compiles first (one untimed call), so compilation is never timed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from typing import Any, Callable, Iterator, Sequence

import jax
from jax import monitoring

# What JAX reports for each new program (jax/_src/dispatch.py): tracing to a
# jaxpr, lowering to StableHLO, XLA's compile. Their sum is the time a run
# spends making programs rather than running them.
COMPILE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration",
                  "/jax/core/compile/jaxpr_to_mlir_module_duration",
                  "/jax/core/compile/backend_compile_duration")


def best_time(fn: Callable[[], Any], repeats: int = 3) -> tuple[Any, float]:
  """(fn's last result, the minimum seconds of `repeats` calls)."""
  if repeats < 1:
    raise ValueError(f"repeats must be >= 1, got {repeats}")
  best, out = float("inf"), None
  for _ in range(repeats):
    start = time.perf_counter()
    out = jax.block_until_ready(fn())
    best = min(best, time.perf_counter() - start)
  return out, best


def best_times(fns: Sequence[Callable[[], Any]],
               repeats: int = 3) -> list[float]:
  """The minimum seconds of each of `fns` over `repeats` interleaved rounds.

  Each round calls every function once, in order. Use it for numbers that
  are divided by one another (c and v are ratios of step times; a speedup is
  a ratio of decode times): timed one after the other, each number's repeats
  can all fall into one slow stretch of a shared machine (memory bandwidth
  taken by a neighbour comes and goes over seconds) and skew the ratio;
  interleaved, a slow stretch touches every number alike and each keeps its
  fastest round.
  """
  return [seconds for _, seconds in best_runs(fns, repeats)]


def best_runs(fns: Sequence[Callable[[], Any]], repeats: int = 3,
              between: Callable[[], None] | None = None
              ) -> list[tuple[Any, float]]:
  """`best_times`, with each function's last result: [(result, seconds)].

  `between`, if given, is called once after each round, untimed: other
  measurements that should share the rounds' stretches of the machine
  (`step_timers.RoundRobinTimer.tick`).
  """
  if repeats < 1:
    raise ValueError(f"repeats must be >= 1, got {repeats}")
  best = [float("inf")] * len(fns)
  results = [None] * len(fns)
  for _ in range(repeats):
    for i, fn in enumerate(fns):
      start = time.perf_counter()
      results[i] = jax.block_until_ready(fn())
      best[i] = min(best[i], time.perf_counter() - start)
    if between is not None:
      between()
  return list(zip(results, best))


@dataclasses.dataclass(eq=False)  # Clocks are told apart by identity.
class CompileClock:
  """Seconds in which JAX was tracing, lowering or compiling, and how many
  programs XLA compiled (see `compile_clock`).

  `seconds` is wall time covered by at least one compile event since the
  clock started, not the sum of the events' durations: events that overlap
  (compiles in other threads, e.g. a library's) count once, so `seconds`
  never exceeds the block's own time.
  """

  seconds: float = 0.0
  programs: int = 0
  started: float = dataclasses.field(default_factory=time.perf_counter)
  # Disjoint (start, end) intervals already counted, in order.
  _spans: list[tuple[float, float]] = dataclasses.field(default_factory=list)

  def add(self, start: float, end: float) -> None:
    """Counts the part of [start, end) that no earlier event covered."""
    start = max(start, self.started)
    if end <= start:
      return
    kept, merged = [], 0.0
    for a, b in self._spans:
      if b < start or a > end:
        kept.append((a, b))
      else:  # Overlaps or touches [start, end): one span now.
        merged += b - a
        start, end = min(start, a), max(end, b)
    self.seconds += (end - start) - merged
    self._spans = sorted(kept + [(start, end)])


_listening = threading.RLock()
_clocks: list[CompileClock] = []


def _on_duration(event: str, seconds: float, **_) -> None:
  if event in COMPILE_EVENTS:
    end = time.perf_counter()
    with _listening:  # Events may come from any thread.
      for clock in _clocks:
        clock.add(end - seconds, end)
        clock.programs += event == COMPILE_EVENTS[-1]


@contextlib.contextmanager
def compile_clock() -> Iterator[CompileClock]:
  """Counts the compilation done inside the block (nestable).

    with best_of.compile_clock() as clock:
      ...
    print(clock.seconds, clock.programs)

  It reads JAX's own compile events (`jax.monitoring`), so it sees every
  jitted program, ours and library ones alike. A program JAX already holds
  in memory is not counted; one loaded from the persistent compilation
  cache (`gin_flags.use_compilation_cache`) is, with the time it took to
  trace, lower and load.
  """
  with _listening:
    if not getattr(compile_clock, "registered", False):
      monitoring.register_event_duration_secs_listener(_on_duration)
      compile_clock.registered = True
    clock = CompileClock()
    _clocks.append(clock)
  try:
    yield clock
  finally:
    with _listening:
      _clocks.remove(clock)
