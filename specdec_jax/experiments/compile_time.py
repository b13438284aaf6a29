"""How long a run spends making programs: JAX's compile events, counted.

`compile_clock()` is a block that counts the seconds JAX spends tracing,
lowering and compiling inside it, and the programs XLA compiled, so a run
reports its compilation apart from its decoding (which `best_of` times).
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from typing import Iterator

from jax import monitoring

# What JAX reports for each new program (jax/_src/dispatch.py): tracing to a
# jaxpr, lowering to StableHLO, XLA's compile. Their sum is the time a run
# spends making programs rather than running them.
COMPILE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration",
                  "/jax/core/compile/jaxpr_to_mlir_module_duration",
                  "/jax/core/compile/backend_compile_duration")


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

    with compile_time.compile_clock() as clock:
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
