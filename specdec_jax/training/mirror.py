"""A gs:// training workdir, trained in a local mirror and uploaded.

Orbax's `CheckpointManager` writes through its own storage client, which
neither our bounded waits (`specdec_jax.infra.paths`) nor the GCS emulator of the
tests reach. So a training run whose workdir is `gs://bucket/dir` trains in
a local directory and keeps the bucket a copy of it:

  * on entry it takes the workdir's lock object (`.lock`, as experiment
    workdirs do: a second run stops, naming the holder) and downloads what
    the bucket holds, so a run on a fresh machine resumes from the bucket's
    latest checkpoint;
  * `upload()` (after each checkpoint, once orbax has finished writing it)
    sends the files that are new or changed since the last upload and
    deletes from the bucket the ones that are gone locally (checkpoints
    past `keep_checkpoints`);
  * on exit, error or not, it uploads once more and releases the lock.

What a kill loses is what a local run loses: the steps since the last
checkpoint (their metrics rows are dropped on resume). The mirror is
`$TMPDIR/specdec_jax_train/<digest of the workdir>`, emptied on entry: the
bucket is the workdir, the mirror only its working copy. A multi-host run
writes its sharded checkpoints from every process into one directory, which
per-host mirrors are not: there orbax writes `checkpoints/` and `model/`
straight into the bucket (`infra.bucket_fs`), and process 0 mirrors the
rest (`skip`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
from typing import Iterator

from absl import logging

from specdec_jax.infra import paths
from specdec_jax.infra import locks


class BucketMirror:
  """The local working copy of a gs:// workdir (see the module docstring).

  Attributes:
    remote: the gs:// workdir.
    local: the local directory to train in.
    skip: top-level names (directories) of the workdir the mirror leaves
      alone: neither downloaded nor uploaded nor deleted.
  """

  def __init__(self, remote: str, skip: tuple[str, ...] = ()):
    self.remote = remote.rstrip("/")
    self.skip = skip
    digest = hashlib.sha256(self.remote.encode()).hexdigest()[:16]
    self.local = os.path.join(tempfile.gettempdir(), "specdec_jax_train",
                              digest)
    self._uploaded: dict[str, tuple[int, int]] = {}  # name -> (size, mtime)

  def _local_files(self) -> dict[str, tuple[int, int]]:
    found = {}
    for name in paths.list_files(self.local):
      if name.split("/")[0] in self.skip:
        continue
      stat = os.stat(os.path.join(self.local, name))
      found[name] = (stat.st_size, stat.st_mtime_ns)
    return found

  def download(self) -> int:
    """Replaces the mirror with the bucket's files; returns how many."""
    shutil.rmtree(self.local, ignore_errors=True)
    os.makedirs(self.local)
    names = [n for n in paths.list_files(self.remote)
             if n != ".lock" and n.split("/")[0] not in self.skip]
    for name in names:
      paths.write_bytes(os.path.join(self.local, name),
                        paths.read_bytes(paths.join(self.remote, name)))
    if names:
      logging.info("downloaded %d files of %s into %s", len(names),
                   self.remote, self.local)
    self._uploaded = self._local_files()
    return len(names)

  def upload(self) -> None:
    """Makes the bucket's files those of the mirror (the lock aside)."""
    now = self._local_files()
    changed = [n for n, s in sorted(now.items()) if self._uploaded.get(n) != s]
    gone = sorted(set(self._uploaded) - set(now))
    for name in changed:
      paths.write_bytes(paths.join(self.remote, name),
                        paths.read_bytes(os.path.join(self.local, name)))
    for name in gone:
      paths.remove(paths.join(self.remote, name))
    if changed or gone:
      logging.info("uploaded %d files to %s, removed %d", len(changed),
                   self.remote, len(gone))
    self._uploaded = now


@contextlib.contextmanager
def bucket_mirror(remote: str) -> Iterator[BucketMirror]:
  """Locks `remote`, downloads it, yields the mirror; uploads on exit."""
  with locks.lock(remote):
    mirror = BucketMirror(remote)
    mirror.download()
    try:
      yield mirror
    finally:
      mirror.upload()
