"""TensorBoard summaries of a run, under its workdir (local or gs://).

Where T5X users look first: `tensorboard --logdir <workdir>` shows, per
speculative row (`gamma_<g>/`), each example's α, the running (pooled) α,
the speedup and tokens per target call, the final α, speedup and quality
(BLEU or ROUGE), and the run's gin config as text (`write_run`). Training
writes its losses, accuracy and learning rate the same way (`Writer`).

Events are written with `tf.summary` into a local directory and copied into
the workdir through `specdec_jax.infra.paths` on `flush`/close (each copy replaces
the object whole): TensorFlow's own gs:// client would bypass the I/O
layer's endpoint, credentials and bounded waits. Only process 0 writes.
TensorFlow is imported when a writer is made, so the core imports without it.
"""

from __future__ import annotations

import shutil
import tempfile
from typing import Any

import jax

from specdec_jax.infra import paths

SUBDIR = "tensorboard"


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


def write_run(workdir: str, summary: dict, records, config_text: str) -> None:
  """Per-example and final summaries of an experiment (see module doc)."""
  with Writer(workdir) as writer:
    writer.text("config", "```\n" + config_text + "\n```")
    for row in summary["rows"]:
      gamma = row.get("gamma")
      prefix = f"gamma_{gamma}"
      alpha_sum = alpha_count = 0.0
      for step, record in enumerate(records):
        spec = record.speculative.get(gamma) or record.speculative.get(
            str(gamma))
        if spec is None:
          continue
        writer.scalar(f"{prefix}/alpha", spec.alpha, step)
        if spec.alpha_sum is not None and spec.alpha_count:
          alpha_sum += spec.alpha_sum
          alpha_count += spec.alpha_count
          writer.scalar(f"{prefix}/running_alpha", alpha_sum / alpha_count,
                        step)
        if spec.time_s:
          writer.scalar(f"{prefix}/speedup",
                        record.baseline.time_s / spec.time_s, step)
        writer.scalar(f"{prefix}/tokens_per_target_call",
                      len(spec.tokens) / max(spec.target_calls, 1), step)
      final = len(records)
      for key in ("alpha", "speedup", "predicted_speedup", "tokens_per_call",
                  "quality_baseline", "quality_speculative"):
        if isinstance(row.get(key), (int, float)):
          name = key if not key.startswith("quality") else (
              f"{key}_{row.get('quality_metric')}")
          writer.scalar(f"{prefix}/final/{name}", row[key], final)
