"""The chip catalogue: accelerator specifications and TPU slice topologies.

Read by the roofline projections (`planning/plan.py`), the fit check
(`experiments/fit.py`) and the run configs that name a slice.

Peak dense bfloat16 matmul throughput, HBM bandwidth and capacity, and the
per-chip interconnect bandwidth that collectives between chips of one model
axis use. Vendor figures, not measurements; sources:

  tpu_v4   https://cloud.google.com/tpu/docs/v4 (275 TFLOP/s bf16,
           32 GiB HBM2 at 1200 GB/s); ICI: 6 links x 50 GB/s per chip (TPU v4
           paper, Jouppi et al., ISCA 2023).
  tpu_v5e  https://cloud.google.com/tpu/docs/v5e (197 TFLOP/s bf16, 16 GiB
           HBM at 819 GB/s, ICI 1600 Gbit/s).
  tpu_v5p  https://cloud.google.com/tpu/docs/v5p (459 TFLOP/s bf16, 95 GiB
           HBM at 2765 GB/s, ICI 4800 Gbit/s).
  tpu_v6e  https://cloud.google.com/tpu/docs/v6e (918 TFLOP/s bf16, 32 GB
           HBM at 1640 GB/s, ICI 3584 Gbit/s).
  a100     https://www.nvidia.com/en-us/data-center/a100/ (A100 80GB SXM:
           312 TFLOP/s dense bf16, 2039 GB/s, 80 GB; NVLink 600 GB/s).
  h100     https://www.nvidia.com/en-us/data-center/h100/ (H100 SXM:
           989 TFLOP/s dense bf16 (1979 is with sparsity), 3.35 TB/s, 80 GB;
           NVLink 900 GB/s).
  h200     https://www.nvidia.com/en-us/data-center/h200/ (H200 SXM:
           989 TFLOP/s dense bf16, 4.8 TB/s, 141 GB; NVLink 900 GB/s).
"""

from __future__ import annotations

import dataclasses

GIB = 1 << 30


@dataclasses.dataclass(frozen=True)
class Chip:
  """One accelerator chip (one JAX device).

  Attributes:
    name: the key of `CHIPS`.
    bf16_flops: peak dense bfloat16 FLOP/s.
    hbm_bytes_per_s: HBM bandwidth.
    hbm_bytes: HBM capacity.
    interconnect_bytes_per_s: per-chip bandwidth to the other chips of a
      model axis (ICI on TPU, NVLink on GPU).
    device_kinds: substrings of `jax.Device.device_kind` naming this chip.
  """

  name: str
  bf16_flops: float
  hbm_bytes_per_s: float
  hbm_bytes: int
  interconnect_bytes_per_s: float
  device_kinds: tuple[str, ...] = ()


CHIPS = {
    "tpu_v4": Chip("tpu_v4", 275e12, 1200e9, 32 * GIB, 300e9, ("TPU v4",)),
    "tpu_v5e": Chip("tpu_v5e", 197e12, 819e9, 16 * GIB, 200e9,
                    ("TPU v5 lite", "TPU v5e")),
    "tpu_v5p": Chip("tpu_v5p", 459e12, 2765e9, 95 * GIB, 600e9,
                    ("TPU v5p", "TPU v5")),
    "tpu_v6e": Chip("tpu_v6e", 918e12, 1640e9, 32 * GIB, 448e9,
                    ("TPU v6 lite", "TPU v6e")),
    "a100": Chip("a100", 312e12, 2039e9, 80 * 10**9, 600e9, ("A100",)),
    "h100": Chip("h100", 989e12, 3350e9, 80 * 10**9, 900e9, ("H100",)),
    "h200": Chip("h200", 989e12, 4800e9, 141 * 10**9, 900e9, ("H200",)),
}


def get_chip(name: str) -> Chip:
  if name not in CHIPS:
    raise ValueError(f"unknown chip {name!r}; known: {', '.join(CHIPS)}")
  return CHIPS[name]


def chip_of_device_kind(kind: str) -> Chip | None:
  """The chip whose `device_kinds` matches `kind` (None: CPU or unknown).

  Longer names are tried first, so "TPU v5 lite" is not taken for v5p.
  """
  matches = [(len(k), chip) for chip in CHIPS.values()
             for k in chip.device_kinds if k.lower() in kind.lower()]
  return max(matches, key=lambda m: m[0])[1] if matches else None


@dataclasses.dataclass(frozen=True)
class Topology:
  """A TPU slice that libtpu compiles for without one
  (`specdec_jax.planning.topology`).

  Attributes:
    name: libtpu's topology name, e.g. "v4:2x2x1" (generation: chips along
      each axis); the key of `TOPOLOGIES`.
    chip: the key of `CHIPS` of its chips.
    accelerator_type: Cloud TPU's name of the slice (`--accelerator-type`).
    chips_per_host: chips each host holds along x, y, z (libtpu wants
      three, also for the 2-D v5e and v6e).
    chip_config_name: libtpu's per-chip layout ("megacore": a v4 chip's two
      TensorCores are one device, as on a Cloud TPU VM); "" for the default.
  """

  name: str
  chip: str
  accelerator_type: str
  chips_per_host: tuple[int, ...]
  chip_config_name: str = ""

  @property
  def num_chips(self) -> int:
    n = 1
    for d in self.name.split(":")[1].split("x"):
      n *= int(d)
    return n

  @property
  def num_hosts(self) -> int:
    per_host = 1
    for d in self.chips_per_host:
      per_host *= d
    return self.num_chips // per_host


TOPOLOGIES = {t.name: t for t in (
    Topology("v4:2x2x1", "tpu_v4", "v4-8", (2, 2, 1), "megacore"),
    Topology("v4:2x2x2", "tpu_v4", "v4-16", (2, 2, 1), "megacore"),
    Topology("v4:2x2x4", "tpu_v4", "v4-32", (2, 2, 1), "megacore"),
    Topology("v5e:2x2", "tpu_v5e", "v5litepod-4", (2, 2, 1)),
    Topology("v5:2x2x1", "tpu_v5p", "v5p-8", (2, 2, 1)),
    Topology("v6e:2x2", "tpu_v6e", "v6e-4", (2, 2, 1)),
)}


def get_topology(name: str) -> Topology:
  if name not in TOPOLOGIES:
    raise ValueError(f"unknown TPU topology {name!r}; known: "
                     f"{', '.join(TOPOLOGIES)}")
  return TOPOLOGIES[name]
