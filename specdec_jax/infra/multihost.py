"""Multi-host runs: one program on every host, decided once, written once.

On a TPU slice of several hosts (a v4-32 is 4 hosts of 4 chips) the SAME
command runs on every host; JAX joins them into one job with
`jax.distributed.initialize`, after which `jax.devices()` lists every chip
of the slice and `jax.local_devices()` the ones this process may touch. A
jitted program over a mesh that spans hosts runs only when every process
calls it, in the same order, with the same shapes: a host that skips a
call, or makes one the others do not, hangs the job in a collective.

So a run keeps three rules, and this module holds their mechanics:

1. Every host runs the same calls. What a run decides from files (the
   examples already done, stored costs, a chosen gamma) or from timings
   (which differ from host to host) is decided on process 0 and handed to
   the others with `broadcast`; `on_primary` does the same for a step that
   may fail (taking the workdir's lock), so all hosts stop together.
2. Only addressable devices are touched: placement goes through shardings
   (`sharding.put`), never through `jax.devices()[0]`, which belongs to
   process 0.
3. Only process 0 writes (`is_primary`).

`initialize` starts the job: with explicit coordinator, process count and
index (T5X's `--coordinator_address`, `--process_count`,
`--process_index`: CPU tests, GPU clusters), or with none of them on a
Cloud TPU slice, where JAX finds them itself. CPU processes exchange their
collectives through gloo.
"""

from __future__ import annotations

import json
from typing import Any, Callable

import logging

import jax
import numpy as np

from specdec_jax import errors


class MultihostError(RuntimeError, errors.UsageError):
  """A multi-host job that cannot start, or a step process 0 failed."""


_STATE = {"initialized": False}
_LOG = logging.getLogger(__name__)


def initialize(enabled: bool = False, coordinator_address: str | None = None,
               process_count: int | None = None,
               process_index: int | None = None) -> bool:
  """Joins this process to a multi-host job (once; later calls do nothing).

  Args:
    enabled: join even without explicit settings (a Cloud TPU slice, where
      JAX detects the coordinator, process count and index itself).
    coordinator_address: "host:port" of process 0's coordinator; with it,
      `process_count` and `process_index` are required.
    process_count: processes in the job.
    process_index: this process's index, 0 .. process_count - 1.

  Returns:
    Whether this process is part of a multi-host job.

  Raises:
    MultihostError: incomplete settings, or a job JAX cannot detect.
  """
  explicit = [coordinator_address, process_count, process_index]
  if _STATE["initialized"]:
    return True
  if not enabled and all(x is None for x in explicit):
    return False
  if any(x is not None for x in explicit) and any(x is None for x in explicit):
    raise MultihostError(
        "a multi-host job needs all of --coordinator_address, "
        f"--process_count and --process_index (got {coordinator_address!r}, "
        f"{process_count!r}, {process_index!r}); on a Cloud TPU slice pass "
        "none of them and set ExperimentConfig.distributed = True.")
  if process_count is not None and not 0 <= process_index < process_count:
    raise MultihostError(
        f"--process_index={process_index} is outside 0..{process_count - 1} "
        f"(--process_count={process_count}): give each process its own "
        "index, 0 for the one at --coordinator_address.")
  # CPU devices exchange collectives through gloo; accelerators ignore it.
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  try:
    jax.distributed.initialize(coordinator_address=coordinator_address,
                               num_processes=process_count,
                               process_id=process_index)
  except (ValueError, RuntimeError) as e:
    if coordinator_address is not None:
      raise
    raise MultihostError(
        f"distributed = True, but JAX found no multi-host job to join "
        f"({type(e).__name__}: {str(e).splitlines()[0][:200]}). Off a Cloud "
        "TPU slice, pass --coordinator_address=HOST:PORT, --process_count "
        "and --process_index to every process.") from None
  _STATE["initialized"] = True
  _LOG.info("process %d of %d: %d local of %d devices",
               jax.process_index(), jax.process_count(),
               jax.local_device_count(), jax.device_count())
  return True


def is_primary() -> bool:
  """True on the process that writes results (process 0)."""
  return jax.process_index() == 0


def _bucket(n: int) -> int:
  """Broadcast sizes rounded up to a power of two: few programs compiled."""
  return 1 << max(n - 1, 1).bit_length()


def broadcast(value: Any) -> Any:
  """Process 0's `value` on every process (JSON types only).

  Single-process runs get `value` back untouched. Every process must call
  this at the same point; non-primary processes may pass anything (e.g.
  None), their value is ignored.
  """
  if jax.process_count() == 1:
    return value
  # only on multi-host runs.
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  data = json.dumps(value).encode() if is_primary() else b""
  size = int(multihost_utils.broadcast_one_to_all(
      np.array([len(data)], np.int64))[0])
  buffer = np.zeros(_bucket(size), np.uint8)
  buffer[:len(data)] = np.frombuffer(data, np.uint8)
  buffer = np.asarray(multihost_utils.broadcast_one_to_all(buffer))
  return json.loads(buffer[:size].tobytes().decode())


def gather_rows(rows: np.ndarray) -> list[np.ndarray]:
  """Every process's `rows` on every process, in process order.

  Args:
    rows: int32 [n, ...]; n may differ from process to process, the trailing
      dimensions may not.

  Returns:
    [process_count] arrays, process p's `rows` at p (one process: [rows]).
    Every process must call this at the same point.
  """
  rows = np.asarray(rows, np.int32)
  if jax.process_count() == 1:
    return [rows]
  # only on multi-host runs.
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  counts = np.asarray(multihost_utils.process_allgather(
      np.array([len(rows)], np.int32))).reshape(-1)
  padded = np.zeros((_bucket(int(counts.max())),) + rows.shape[1:], np.int32)
  padded[:len(rows)] = rows
  everyone = np.asarray(multihost_utils.process_allgather(padded))
  return [everyone[p, :n] for p, n in enumerate(counts)]


def on_primary(fn: Callable[[], Any]) -> Any:
  """Runs `fn` on process 0 only and returns its result on every process.

  If `fn` raises on process 0, it re-raises there and every other process
  raises MultihostError with its message, instead of waiting forever in
  the next collective.
  """
  result, error = None, None
  if is_primary():
    try:
      result = fn()
    except Exception as e:  # pylint: disable=broad-except  (re-raised below)
      error = e
  status = broadcast(
      None if error is None else f"{type(error).__name__}: {error}")
  if error is not None:
    raise error
  if status is not None:
    raise MultihostError(f"process 0 stopped the run: {status}")
  return broadcast(result)


def sync(name: str) -> None:
  """Waits until every process reaches this point (nothing on one)."""
  if jax.process_count() > 1:
    # only on multi-host runs.
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    multihost_utils.sync_global_devices(name)
