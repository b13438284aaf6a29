"""TPU devices to compile for on a machine without a TPU.

With libtpu installed (`pip install -e '.[tpu]'`), libtpu describes any TPU
slice (`jax.experimental.topologies.get_topology_desc`): its devices run
nothing, but `jax.jit(f).lower(...).compile()` on a mesh of them runs the
TPU compiler itself, whose `memory_analysis()` and optimized HLO are the
ones the real chips would get. A multi-host slice (v4:2x2x4, four hosts)
compiles in one process: its devices carry their hosts' process indices.

This works beside `JAX_PLATFORMS=cpu` (nothing here initialises a TPU
backend), so planning on a TPU VM neither waits for nor takes the chips of
a running job.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import os
from typing import Sequence

import jax
from jax.experimental import topologies

from specdec_jax.infra import chips

INSTALL_HINT = "pip install -e '.[tpu]' (brings libtpu)"


def libtpu_missing() -> str | None:
  """Why TPU programs cannot be compiled here (None: they can)."""
  if importlib.util.find_spec("libtpu") is None:
    return f"libtpu is not installed ({INSTALL_HINT})"
  return None


def libtpu_version() -> str:
  try:
    return importlib.metadata.version("libtpu")
  except importlib.metadata.PackageNotFoundError:
    return "unknown"


@functools.lru_cache(maxsize=None)
def devices(name: str) -> tuple[jax.Device, ...]:
  """The devices of TPU topology `name` (a key of `chips.TOPOLOGIES`).

  Raises RuntimeError naming the fix if libtpu is missing.
  """
  topology = chips.get_topology(name)
  missing = libtpu_missing()
  if missing:
    raise RuntimeError(f"cannot compile for TPU {name}: {missing}")
  # Without these libtpu asks a metadata server that only TPU VMs have (and
  # warns at length); describing a slice needs none of it.
  os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
  os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
  os.environ.setdefault("TPU_ACCELERATOR_TYPE", topology.accelerator_type)
  # libtpu otherwise takes a lock file that lets one process use it at a
  # time: compiling needs no chip to own, and tests and plans run side by
  # side.
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  kwargs = dict(chips_per_host_bounds=topology.chips_per_host,
                num_slices=1, wrap=(False,) * len(topology.chips_per_host))
  if topology.chip_config_name:
    kwargs["chip_config_name"] = topology.chip_config_name
  desc = topologies.get_topology_desc(platform="tpu", topology_name=name,
                                      **kwargs)
  return tuple(desc.devices)


def compiler_name(devs: Sequence[jax.Device]) -> str:
  """Which compiler programs for `devs` get, as plans report it."""
  device = devs[0]
  if device.platform == "tpu":
    return f"libtpu {libtpu_version()} (TPU compiler, ahead of time)"
  return f"XLA:{device.platform.upper()} (simulated devices)"
