"""TensorBoard summaries of a run, under its workdir (local or gs://).

Where T5X users look first: `tensorboard --logdir <workdir>` shows, per
speculative row (`gamma_<g>/`), each example's α, the running (pooled) α,
the speedup and tokens per target call while the run goes
(`ExampleSummaries`), then the final α, speedup and quality (BLEU or
ROUGE) and the run's gin config as text (`write_run`). Training writes its
losses, accuracy and learning rate the same way (`Writer`).

Events are written with `tf.summary` into a local directory and copied into
the workdir through `specdec_jax.infra.paths` on `flush`/close (each copy
replaces the object whole): TensorFlow's own gs:// client would bypass the
I/O layer's endpoint, credentials and bounded waits. A run's per-example
events go to a new events object at each flush (GCS objects cannot be
appended), so a killed run keeps every flush it made. Only process 0
writes. TensorFlow is imported when a writer is made, so the core imports
without it.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from typing import Any, Sequence

import jax

from specdec_jax.infra import paths

SUBDIR = "tensorboard"
_LOG = logging.getLogger(__name__)


class Writer:
  """Scalars and text into `<workdir>/tensorboard/` (process 0 only)."""

  def __init__(self, workdir: str, subdir: str = SUBDIR):
    self.destination = paths.join(workdir, subdir)
    self._active = jax.process_index() == 0
    if not self._active:
      return
    # TensorFlow only when summaries are written.
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    self._tf = tf
    self._local = tempfile.mkdtemp(prefix="specdec_jax_tb.")
    # Earlier runs' event files (a resumed run) stay: TensorBoard reads all.
    self._writer = tf.summary.create_file_writer(self._local)

  def _write(self, name: str, tensor: Any, plugin: str, step: int) -> None:
    # tf.summary.scalar/text need the tensorboard package; the raw write
    # with the plugin's metadata makes the same events without it.
    from tensorflow.core.framework import summary_pb2  # pylint: disable=g-import-not-at-top
    metadata = summary_pb2.SummaryMetadata(
        plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name=plugin))
    with self._writer.as_default():
      self._tf.summary.write(name, tensor, step=int(step),
                             metadata=metadata)

  def scalar(self, name: str, value: Any, step: int) -> None:
    if self._active and value is not None:
      self._write(name, self._tf.constant(float(value), self._tf.float32),
                  "scalars", step)

  def scalars(self, prefix: str, row: dict, step: int) -> None:
    """Every number in `row` as `<prefix>/<key>`."""
    for key, value in row.items():
      if isinstance(value, (int, float)) and key != "step":
        self.scalar(f"{prefix}/{key}", value, step)

  def text(self, name: str, text: str, step: int = 0) -> None:
    if self._active:
      self._write(name, self._tf.constant(text), "text", step)

  def flush(self) -> None:
    """Copies the events written so far into the workdir."""
    if self._active:
      self._writer.flush()
      paths.copy_tree(self._local, self.destination)

  def close(self) -> None:
    if self._active:
      self.flush()
      self._writer.close()
      shutil.rmtree(self._local, ignore_errors=True)

  def __enter__(self) -> "Writer":
    return self

  def __exit__(self, *exc) -> None:
    self.close()


def _spec_of(record, gamma):
  return record.speculative.get(gamma) or record.speculative.get(str(gamma))


class ExampleSummaries:
  """Each example's scalars as a run decodes it, per gamma: α, running α,
  speedup, tokens per target call (`<workdir>/tensorboard/gamma_<g>/...`).

  Steps are the examples' places in the run, continuing after the ones a
  resumed run finds done (their running α too). The events reach the
  workdir every `every_examples` new examples or `every_seconds` seconds,
  whichever comes first, and at `close`, each time as a new events object.
  """

  def __init__(self, workdir: str, gammas: Sequence[Any], done: Sequence,
               every_examples: int = 10, every_seconds: float = 60.0):
    self._workdir = workdir
    self._gammas = list(gammas)
    self._every = (int(every_examples), float(every_seconds))
    self._step = len(done)
    self._sums = {g: [0.0, 0.0] for g in self._gammas}
    for record in done:
      self._accumulate(record)
    self._writer = None
    self._pending, self._flushed_at = 0, time.monotonic()

  def _accumulate(self, record) -> None:
    for gamma in self._gammas:
      spec = _spec_of(record, gamma)
      if spec is not None and spec.alpha_sum is not None and spec.alpha_count:
        self._sums[gamma][0] += spec.alpha_sum
        self._sums[gamma][1] += spec.alpha_count

  def add(self, record) -> None:
    """Writes `record`'s scalars at the next step; flushes when due."""
    self._accumulate(record)
    if self._writer is None:
      self._writer = Writer(self._workdir)
    for gamma in self._gammas:
      spec = _spec_of(record, gamma)
      if spec is None:
        continue
      prefix, step = f"gamma_{gamma}", self._step
      self._writer.scalar(f"{prefix}/alpha", spec.alpha, step)
      alpha_sum, alpha_count = self._sums[gamma]
      if alpha_count:
        self._writer.scalar(f"{prefix}/running_alpha",
                            alpha_sum / alpha_count, step)
      if spec.time_s:
        self._writer.scalar(f"{prefix}/speedup",
                            record.baseline.time_s / spec.time_s, step)
      self._writer.scalar(f"{prefix}/tokens_per_target_call",
                          len(spec.tokens) / max(spec.target_calls, 1), step)
    self._step += 1
    self._pending += 1
    if (self._pending >= self._every[0]
        or time.monotonic() - self._flushed_at >= self._every[1]):
      self.flush()

  def flush(self) -> None:
    """Uploads what was written since the last flush as a new object. A
    failed upload is logged, not raised: TensorBoard is a view of the run,
    whose results are in examples.jsonl."""
    if self._writer is not None:
      writer, self._writer = self._writer, None
      try:
        writer.close()
      except OSError as e:
        _LOG.warning("TensorBoard events not uploaded to %s (%s); the "
                     "run goes on", writer.destination, e)
    self._pending, self._flushed_at = 0, time.monotonic()

  close = flush


def write_run(workdir: str, summary: dict, config_text: str,
              num_examples: int) -> None:
  """The final summaries of an experiment (the per-example ones were
  written as it ran, `ExampleSummaries`) and its gin config."""
  with Writer(workdir) as writer:
    writer.text("config", "```\n" + config_text + "\n```")
    for row in summary["rows"]:
      prefix = f"gamma_{row.get('gamma')}"
      for key in ("alpha", "speedup", "predicted_speedup", "tokens_per_call",
                  "quality_baseline", "quality_speculative"):
        if isinstance(row.get(key), (int, float)):
          name = key if not key.startswith("quality") else (
              f"{key}_{row.get('quality_metric')}")
          writer.scalar(f"{prefix}/final/{name}", row[key], num_examples)
