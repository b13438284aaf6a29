"""Best of N: the one timing rule for every measured number in this project.

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

import time
from typing import Any, Callable, Sequence

import jax


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
