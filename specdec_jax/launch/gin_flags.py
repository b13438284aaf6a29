"""Gin plumbing shared by the absl scripts (T5X-style flags).

`--gin_file=F` (repeatable) parses gin files: F as given, else found in the
folders of `--gin_search_paths` (T5X's flag, comma-separated), the
repository's `configs/` folder or the current directory. `--gin.NAME=VALUE` is
shorthand for `--gin_bindings='NAME = VALUE'`. `--tfds_data_dir` (also
T5X's) is where seqio reads prepared TFDS datasets, e.g. a gs:// folder.

Every script run through `run` also keeps the programs it compiles in a
persistent XLA compilation cache (`--compilation_cache_dir`), so a rerun
(a resumed experiment, `make demo` again) loads them instead of compiling
them again. The cache is keyed by the program, the compiler options and
the jax version; it only ever saves time.

Multi-host jobs take T5X's flags: `--coordinator_address=HOST:PORT`,
`--process_count` and `--process_index` join the processes of one job
(CPU tests, GPU clusters); on a Cloud TPU slice the gin setting
`ExperimentConfig.distributed = True` alone does (`initialize_distributed`).
"""

from __future__ import annotations

import glob
import importlib.util
import logging as py_logging
import os
import shlex
import sys
from typing import Callable, Sequence

from absl import app
from absl import flags
from absl import logging
import gin
import jax

from jax._src import xla_bridge  # pylint: disable=g-direct-jax-src-import
import numpy as np

from specdec_jax import errors
from specdec_jax import versions
from specdec_jax.experiments.experiment_config import ExperimentConfig
from specdec_jax.experiments import workdir as workdir_lib
from specdec_jax.infra import locks
from specdec_jax.infra import multihost
from specdec_jax.infra import paths
from specdec_jax.launch import cli
from specdec_jax.launch import supervise

CONFIGS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "configs")

flags.DEFINE_multi_string("gin_file", [], "Gin config files (repeatable).")
flags.DEFINE_multi_string("gin_bindings", [], "Gin bindings (repeatable); "
                          "--gin.NAME=VALUE is shorthand.")
flags.DEFINE_list(
    "gin_search_paths", [], "Folders gin files and their includes are "
    "looked up in, before the current directory and configs/ "
    "(comma-separated, as T5X's flag).")
flags.DEFINE_string(
    "tfds_data_dir", None, "Where seqio's TFDS tasks read prepared datasets "
    "(seqio's data-dir override, as T5X's flag; default: TFDS's own, "
    "$TFDS_DATA_DIR or ~/tensorflow_datasets).")
flags.DEFINE_string(
    "compilation_cache_dir", os.path.join("~", ".cache", "specdec_jax", "xla"),
    "Persistent XLA compilation cache of the compiled programs: a rerun "
    "loads them instead of compiling again ('' disables it; the folder "
    "only grows, delete it at will).")

flags.DEFINE_string(
    "coordinator_address", None, "Multi-host: HOST:PORT of process 0's "
    "coordinator (not needed on a Cloud TPU slice).")
flags.DEFINE_integer("process_count", None,
                     "Multi-host: the number of processes in the job.")
flags.DEFINE_integer("process_index", None,
                     "Multi-host: this process's index (0 writes results).")

# Every program, however quick to compile (JAX's default skips those under
# a second): the demo compiles about a hundred, and the small ones add up.
_CACHE_MIN_COMPILE_SECONDS = 0.0


def rewrite_gin_args(argv: Sequence[str]) -> list[str]:
  """Turns each `--gin.NAME=VALUE` into `--gin_bindings=NAME = VALUE`."""
  out = []
  for arg in argv:
    if arg.startswith("--gin."):
      name, sep, value = arg[len("--gin."):].partition("=")
      if not sep:
        raise app.UsageError(f"{arg}: write --gin.NAME=VALUE")
      out.append(f"--gin_bindings={name} = {value}")
    else:
      out.append(arg)
  return out


def search_paths(extra: Sequence[str] | None = None) -> list[str]:
  """Where gin files are looked up: `extra` (default --gin_search_paths)
  first, then configs/, the current directory and the repository root."""
  if extra is None:
    extra = flags.FLAGS.gin_search_paths if flags.FLAGS.is_parsed() else []
  # configs/ before the current directory: the shipped configs' includes
  # are found at the first place gin looks (it logs every miss).
  # Once each (run from the repository's root, the last two are one).
  return list(dict.fromkeys(
      [*extra, CONFIGS_DIR, os.getcwd(), os.path.dirname(CONFIGS_DIR)]))


class GinBindingError(errors.UsageError, ValueError):
  """A `--gin.X=V` / `--gin_bindings` binding that gin cannot apply."""


class GinFileError(errors.UsageError, FileNotFoundError):
  """A `--gin_file` that is not found in any folder of the search path."""


def parse(gin_files: Sequence[str], bindings: Sequence[str],
          extra_search_paths: Sequence[str] | None = None,
          skip_unknown: bool = False) -> None:
  """Parses files, then bindings; missing files name the search path.

  Every binding applies after every file (a T5X-style `--gin.X=V` overrides
  what the files say). A binding gin cannot apply (an unknown configurable
  or parameter, a value that does not parse) raises `GinBindingError`
  naming it, which the scripts print as one line.

  Args:
    gin_files: paths, absolute or relative to a folder of `search_paths`.
    bindings: gin bindings, applied after the files.
    extra_search_paths: folders looked in first (None: --gin_search_paths).
    skip_unknown: skip bindings of configurables gin does not know yet (a
      first look at the run files, before the files that define them).
  """
  folders = search_paths(extra_search_paths)
  _search_first(folders)
  resolved = []
  for f in gin_files:
    if paths.is_remote(f):
      # Through the one I/O layer; its includes resolve as a local file's.
      try:
        resolved.append(paths.local_copy(f))
      except FileNotFoundError:
        raise GinFileError(f"gin file {f} not found: check the path, or "
                           "upload the file there.") from None
      continue
    candidates = [f] + [os.path.join(p, f) for p in folders]
    # A path as given (relative to the current directory) comes first.
    found = [c for c in candidates if os.path.exists(c)]
    if not found:
      raise GinFileError(
          f"gin file {f!r} not found (looked in {', '.join(folders)}). Pass a "
          "path like configs/experiments/table2/ende_small_t0.gin, or add "
          "its folder with --gin_search_paths.")
    # The path found, not the name: gin would log an error for each place
    # it looked in vain. (Includes inside the files still use the search
    # path added above.)
    # Absolute: gin looks an absolute path up in no search folder.
    resolved.append(os.path.abspath(found[0]))
  gin.parse_config_files_and_bindings(resolved, [], finalize_config=False)
  for binding in bindings:
    try:
      gin.parse_config(binding, skip_unknown=skip_unknown)
    except (ValueError, SyntaxError) as e:
      first = str(e).strip().splitlines()[0] if str(e).strip() else repr(e)
      raise GinBindingError(
          f"gin cannot apply the binding {binding.strip()!r}: {first} Check "
          f"the name against the configs (e.g. "
          f"--gin.ExperimentConfig.max_examples=2) and the value's Python "
          f"syntax (strings in quotes: --gin.X.name=\"'a'\").") from None


def _search_first(folders: Sequence[str]) -> None:
  """Makes gin look for includes in `folders` first, in that order.

  gin tries its search folders in turn, and each miss costs an ERROR line
  from its Python-package reader (`resource_reader.py:55] Path not found:
  experiments/table2/ende.gin`) even when a later folder has the file. Its
  list starts with '' (the current directory), where the shipped configs'
  includes are never found, and `add_config_file_search_path` can only
  append; so `folders` (which hold the current directory) go before it.
  """
  # gin has no public way to order its search path.
  prefixes = gin.config._LOCATION_PREFIXES  # pylint: disable=protected-access
  prefixes[:] = [*folders, *(p for p in prefixes if p not in folders)]


def use_tfds_data_dir(path: str | None) -> None:
  """Makes seqio's TFDS tasks read prepared datasets from `path`."""
  if not path:
    return
  import seqio  # pylint: disable=g-import-not-at-top  (TensorFlow: on demand)
  seqio.set_tfds_data_dir_override(path)


def _lost_peer_message() -> str:
  """The one line a process ended by JAX's distributed service leaves."""
  index, count = flags.FLAGS.process_index, flags.FLAGS.process_count
  who = (f"process {index} of {count}" if count is not None
         else "this host's process")
  workdir = flags.FLAGS["workdir"].value if "workdir" in flags.FLAGS else None
  kept = (f"The results in {workdir} up to its last finished example are "
          "kept. " if workdir else "")
  lock = ""
  if workdir and paths.is_remote(workdir):
    lock = (" (started at once, it waits for a lost process 0's lock to "
            f"run out, at most {locks.lease_seconds():g} s, and takes it "
            "over)")
  command = " ".join(shlex.quote(arg) for arg in sys.argv)
  return (f"PeerHostLost: {who} was ended by JAX's distributed service: a "
          "peer host of this multi-host job was lost (killed or preempted) "
          f"or stopped answering. {kept}To resume, run the same command on "
          f"every host{lock}: {command}")


def initialize_distributed(distributed: bool = False) -> bool:
  """Joins the multi-host job the flags (or `distributed`) describe, before
  anything touches a device; returns whether this is one.

  A multi-host process runs under `supervise` (started here unless the
  script's first lines did, `supervise.supervise_flagged_launch`): if JAX's
  distributed service ends it (a lost peer host), it exits with status 1
  and one line saying what was lost, what the workdir keeps and the command
  that resumes."""
  if distributed or flags.FLAGS.coordinator_address is not None:
    supervise.supervise(_lost_peer_message)  # returns in the child only
    supervise.leave_note(_lost_peer_message)
  joined = multihost.initialize(distributed, flags.FLAGS.coordinator_address,
                                flags.FLAGS.process_count,
                                flags.FLAGS.process_index)
  if joined and not multihost.is_primary():
    # Progress (loading, compiling, examples) is process 0's to log; the
    # others would repeat it line for line.
    logging.set_verbosity(logging.WARNING)
  return joined


# The fields of `ExperimentConfig` that describe the machine, not the
# experiment: what configs/runs/*.gin bind, for every script.
RUN_FIELDS = ("mesh_shape", "distributed", "topology", "dtype")


def run_settings() -> dict:
  """The machine the parsed run file describes (configs/runs/*.gin bind
  `ExperimentConfig`'s mesh_shape, distributed, topology and dtype): those
  fields, for a script that is not an experiment (scripts/train.py)."""
  try:
    config = gin.get_configurable(ExperimentConfig)()
  except ValueError:
    # No run file: gin registers `ExperimentConfig` only when a file names
    # it (`dynamic_registration`), and then there is nothing to read but
    # its defaults (one device, no multi-host job).
    config = ExperimentConfig()
  out = {name: getattr(config, name) for name in RUN_FIELDS}
  if out["mesh_shape"] is not None:
    out["mesh_shape"] = tuple(int(n) for n in out["mesh_shape"])
  return out


def simulate_cpu_devices(mesh_shape, process_count: int | None = None) -> None:
  """Gives the CPU the devices a mesh needs, before JAX starts it.

  A run file with a mesh (runs/cpu_8_model_parallel.gin's (2, 4)) runs on a
  laptop or CI as on the slice it mirrors: the CPU platform is given
  mesh size / `process_count` simulated devices
  (--xla_force_host_platform_device_count), so the user sets no XLA_FLAGS.
  Only the CPU platform reads the flag: on a TPU or GPU machine the mesh
  takes the accelerator's devices as before. Nothing happens when XLA_FLAGS
  already names a count, or once JAX has started (a notebook, a test
  process: its devices are what they are).
  """
  if mesh_shape is None:
    return
  flag = "--xla_force_host_platform_device_count"
  if flag in os.environ.get("XLA_FLAGS", "") or (
      xla_bridge.backends_are_initialized()):
    return
  count = -(-int(np.prod(mesh_shape)) // max(process_count or 1, 1))
  if count > 1:
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               f" {flag}={count}").strip()


def is_primary() -> bool:
  """Whether this process writes (process 0 of a multi-host job)."""
  return multihost.is_primary()


def write_config(workdir: str, name: str = "config.gin") -> str:
  """Writes the parsed gin config (what this run was told) to the workdir."""
  workdir_lib.make_directory(workdir)
  path = paths.join(workdir, name)
  paths.write_text(path, gin.config_str())
  return path


def write_operative_config(workdir: str) -> str:
  """Writes the values the run actually used (after it ran)."""
  return write_config(workdir, "operative_config.gin")


class _QuietOrbax(py_logging.Filter):
  """Orbax logs every checkpoint file it reads or writes at INFO."""

  def filter(self, record):
    return record.levelno >= py_logging.WARNING or "orbax" not in (
        record.pathname or "")


def use_compilation_cache(path: str) -> None:
  """Keeps compiled programs in `path` (nothing when it is empty)."""
  if not path:
    return
  # pylint: disable=g-import-not-at-top
  import jax
  from jax.experimental.compilation_cache import compilation_cache
  # pylint: enable=g-import-not-at-top
  jax.config.update("jax_compilation_cache_dir", os.path.expanduser(path))
  jax.config.update("jax_persistent_cache_min_compile_time_secs",
                    _CACHE_MIN_COMPILE_SECONDS)
  # JAX decides whether to use the cache at its first compile, which an
  # import may already have done: make it decide again (quietly: JAX logs
  # "Resetting cache at <empty>" at info level).
  logger = py_logging.getLogger("jax._src.compilation_cache")
  level = logger.level
  logger.setLevel(py_logging.WARNING)
  try:
    compilation_cache.reset_cache()
  finally:
    logger.setLevel(level)


def skip_absent_tpu() -> None:
  """Keeps JAX from trying a TPU that is not there.

  With libtpu installed (`make test` installs it, for the TPU compile
  checks) JAX tries the TPU first at every start, which on a machine
  without one costs seconds and prints errors. Where JAX_PLATFORMS is unset,
  no TPU device file exists (/dev/accel*, /dev/vfio/N on Cloud TPU VMs) and
  no CUDA plugin is installed, JAX is told to use the CPU. A TPU VM, a GPU
  machine or an explicit JAX_PLATFORMS is left alone.
  """
  if os.environ.get("JAX_PLATFORMS") or (
      importlib.util.find_spec("libtpu") is None):
    return
  if glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"):
    return
  if any(importlib.util.find_spec(p) for p in ("jax_cuda12_plugin",
                                               "jax_cuda13_plugin")):
    return
  jax.config.update("jax_platforms", "cpu")


INTERRUPTED_STATUS = cli.INTERRUPTED_STATUS


def _finished_examples(workdir: str) -> int | None:
  """The examples finished in `workdir`, its rows' included (None: it
  holds no results file, e.g. a training workdir, or could not be read)."""
  try:
    files = [name for name in paths.list_files(workdir)
             if name.rsplit("/", 1)[-1] == workdir_lib.RESULTS]
    return sum(
        len(workdir_lib.read_done(paths.join(workdir, name), truncate=False))
        for name in files) if files else None
  except Exception:  # pylint: disable=broad-except  (a count is a courtesy)
    return None


def stopped_by_user_line() -> str:
  """The one line a script stopped by Ctrl-C prints instead of a traceback:
  what the workdir keeps, and the command that resumes."""
  try:
    workdir = flags.FLAGS["workdir"].value if "workdir" in flags.FLAGS else None
  except Exception:  # pylint: disable=broad-except  (flags not parsed yet)
    workdir = None
  command = " ".join(shlex.quote(arg) for arg in sys.argv)
  done = _finished_examples(workdir) if workdir else None
  if done:
    kept = (f" after {done} finished example" + (
        f"s: they are kept in {workdir}" if done != 1 else
        f": it is kept in {workdir}"))
  elif done == 0:
    kept = " before any example finished"
  else:
    kept = (f": what {workdir} holds is kept" if workdir else
            ": what its workdir holds is kept")
  return (f"Stopped by the user (Ctrl-C){kept}. To resume, run the same "
          f"command: {command}")


def run(main: Callable[[Sequence[str]], None]) -> None:
  """absl `app.run` with `--gin.NAME=VALUE` support, quiet orbax logs, a
  check of the Python and jax versions (`versions.check`), the compilation
  cache of `--compilation_cache_dir` and seqio's `--tfds_data_dir`. A
  `UsageError` (a bad config, a busy workdir, a missing checkpoint, ...)
  ends the script with its message and status 1, no traceback. Ctrl-C
  (KeyboardInterrupt) ends it with one line (`stopped_by_user_line`) and
  status 130: results are written as they finish, so nothing to show but
  how to resume."""
  logging.get_absl_logger().addFilter(_QuietOrbax())
  skip_absent_tpu()

  def main_with_cache(argv):
    versions.check()
    use_compilation_cache(flags.FLAGS.compilation_cache_dir)
    use_tfds_data_dir(flags.FLAGS.tfds_data_dir)
    return main(argv)

  cli.run(main_with_cache, stopped_by_user_line, rewrite_gin_args(sys.argv))
