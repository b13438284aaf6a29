"""Resuming a training run: the newest checkpoint that restores (damaged
ones skipped and moved aside) and metrics.jsonl cut back to where it
resumes, so each step keeps one row."""

from __future__ import annotations

import gc
import inspect
import json
import logging as py_logging
import os
import time
from typing import Any, Callable

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from specdec_jax.infra import paths
from specdec_jax.training import steps


class _QuietOrbaxErrors(py_logging.Filter):
  """Drops orbax's own log records (a traceback per file it fails to read)
  while a checkpoint is tried: its failure is reported in one line."""

  def filter(self, record):
    path = record.pathname or ""
    return "orbax" not in path and "tensorstore" not in path


def _close_abandoned_reads() -> None:
  """A failed restore leaves orbax's other reading coroutines unfinished;
  collected later, each reports "Exception ignored in ..." with a
  traceback on stderr (tens a checkpoint), besides the one line the failure
  gets. They are closed here, their errors dropped: every suspended
  coroutine of orbax (reads and the deserializations awaiting them; nothing
  else of orbax runs while training starts)."""
  gc.collect()
  for obj in gc.get_objects():
    if (inspect.iscoroutine(obj) and obj.cr_frame is not None
        and f"{os.sep}orbax{os.sep}" in obj.cr_code.co_filename):
      try:
        obj.close()
      except Exception:  # pylint: disable=broad-except  (the read's error)
        pass


def restore_latest_intact(make_manager: Callable[[], Any],
                          init: Callable[[], steps.TrainState], workdir: str,
                          sharding: jax.sharding.Sharding):
  """The newest checkpoint that restores, skipping (and moving aside) any
  newer damaged one.

  A checkpoint can be damaged after it was committed (a disk filled up, a
  copy cut short): instead of failing on it (orbax buries the cause under
  hundreds of lines, which are kept out of the log), resume from the newest
  intact one and say which steps were skipped. A checkpoint holding
  non-finite parameters (saved before training stopped at them) counts as
  damaged. Damaged steps move to `<workdir>/damaged_checkpoints/`
  so that saving those step numbers again works.

  Args:
    make_manager: returns the run's orbax CheckpointManager.
    init: returns a fresh steps.TrainState (its shapes are the restore target).
    workdir: the training workdir.
    sharding: where the restored arrays go (the devices training runs on
      now, not the ones the checkpoint recorded: a run resumes on another
      machine or topology): one sharding for every leaf, or a tree of them
      shaped like the state (a mesh's, `placement.Placement`).

  Returns:
    (restored Composite or None when no checkpoint exists, the manager to
    keep using).

  Raises:
    RuntimeError: checkpoints exist but none restores.
  """
  manager = make_manager()
  directory = str(manager.directory)
  shapes = jax.eval_shape(init)
  if isinstance(sharding, jax.sharding.Sharding):
    sharding = jax.tree.map(lambda _: sharding, shapes)
  target = jax.tree.map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
      shapes, sharding)
  saved = sorted(manager.all_steps(), reverse=True)
  skipped = []
  absl_logger, quiet = logging.get_absl_logger(), _QuietOrbaxErrors()
  for step in saved:
    absl_logger.addFilter(quiet)
    try:
      restored = manager.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(target),
          meta=ocp.args.JsonRestore()))
    except Exception as e:  # pylint: disable=broad-except  (orbax, tensorstore)
      first = (str(e).strip().splitlines() or [""])[0][:200]
      skipped.append(f"step {step} ({type(e).__name__}: {first})")
      del e
      _close_abandoned_reads()
      continue
    finally:
      absl_logger.removeFilter(quiet)
    # Reduced on the devices: no process holds all of a sharded leaf.
    if not all(np.asarray(jnp.isfinite(x).all().addressable_data(0))
               for x in jax.tree.leaves(restored.state.params)):
      # Saved before training checked every step (steps.make_train_step).
      skipped.append(f"step {step} (non-finite parameters)")
      continue
    if skipped:
      aside = paths.join(workdir, "damaged_checkpoints")
      if jax.process_index() == 0:  # the one writer of the workdir
        for bad in saved[:len(skipped)]:
          _move(paths.join(directory, str(bad)),
                paths.join(aside, f"{bad}.{int(time.time())}"))
      manager.close()
      manager = make_manager()  # forgets the steps moved aside
      logging.warning(
          "skipped damaged checkpoint(s) %s; resumed from step %d, the "
          "newest intact one (the damaged ones are in %s).",
          "; ".join(skipped), step, aside)
    return restored, manager
  if skipped:
    raise RuntimeError(
        f"no checkpoint under {directory} restores: "
        f"{'; '.join(skipped)}. Move that directory away to train from "
        "scratch, or restore it from a copy.")
  return None, manager


def _move(source: str, target: str) -> None:
  """Moves a directory, local (a rename) or gs:// (each object copied, then
  deleted: a bucket has no rename; a multi-host run's checkpoints)."""
  if not paths.is_remote(source):
    os.makedirs(os.path.dirname(target), exist_ok=True)
    os.replace(source, target)
    return
  names = paths.list_files(source)
  for name in names:
    paths.write_bytes(paths.join(target, name),
                      paths.read_bytes(paths.join(source, name)))
  for name in names:
    paths.remove(paths.join(source, name))


def forget_metrics_after(path: str, step: int) -> None:
  """Drops metrics.jsonl rows of steps after `step`, where training resumes.

  A killed run logged steps after its last checkpoint; the resumed run
  trains them again and logs them anew, so each step keeps one row. A torn
  last line (killed mid-write) goes too.
  """
  if not os.path.exists(path):
    return
  with open(path, "rb") as f:
    lines = f.read().split(b"\n")
  keep = []
  for line in lines[:-1]:  # the part after the last newline is torn or empty
    try:
      row = json.loads(line)
    except ValueError:
      continue
    if row.get("step", 0) <= step:
      keep.append(line + b"\n")
  if len(keep) != len(lines) - 1 or lines[-1]:
    logging.info("metrics.jsonl: dropped %d row(s) after step %d, where "
                 "training resumes", len(lines) - 1 - len(keep), step)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
      f.write(b"".join(keep))
    os.replace(tmp, path)
