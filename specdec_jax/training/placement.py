"""Where a training run's arrays live: one device, or a data x model mesh.

One device (`TrainConfig.mesh_shape` None): JAX's default device, the
teacher beside the student, as before meshes.

On a mesh (`mesh_shape`, which the run files set: configs/runs/*.gin) the
run follows the decoding's layout (`specdec_jax.sharding`):

  teacher     sharded by the logical axis rules (heads, MLP, vocabulary
              over `model`); a dimension the axis does not divide stays
              whole (the demo target's 6 heads on 4 devices), as
              `memory.footprint` counts it.
  student     replicated (`replicate_student`, the default), or sharded
              like the teacher; its step counter and optimizer state
              replicated (Adafactor's factored moments have no logical axes).
  batch       rows over `data` (replicated when they do not divide).

The step is traced and run inside `distill.mesh_context`, so the models'
activation constraints follow the same rules.

Multi-host (several processes, `jax.distributed`): the mesh spans every
process's devices. Every process reads only its share of the examples
(`batches.load_split`) and plans the same batches from (seed, epoch), so
the data position needs no broadcast; it fills its rows of each batch,
zeros elsewhere, and `join_shares` adds the processes' shares up on the
devices (exact: each row is one process's, zeros elsewhere), into the
batch a single process would place with `put_batch`. Device values are
read from its own shards (`local`), since no process can address all of a
sharded array.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Mapping

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from specdec_jax import checkpoints
from specdec_jax import sharding
from specdec_jax.decoding.protocol import Model
from specdec_jax.infra import multihost
from specdec_jax.memory import footprint
from specdec_jax.training import distill
from specdec_jax.training import steps

_MB = 1e6


def _default_device() -> jax.Device:
  """JAX's default device when one is set (`jax.default_device(...)` or
  `jax.config.update("jax_default_device", ...)`: a device, or a platform
  whose first local device is taken), else this process's first."""
  chosen = jax.config.jax_default_device
  if chosen is None:
    return jax.local_devices()[0]
  if isinstance(chosen, str):
    return jax.local_devices(backend=chosen)[0]
  return chosen


@dataclasses.dataclass(frozen=True)
class Placement:
  """One device or a mesh, and how the student sits on it.

  Attributes:
    device: the one device (None on a mesh).
    mesh: the (data, model) mesh (None on one device).
    replicate_student: on a mesh, the student's parameters whole on every
      device.
  """

  device: jax.Device | None
  mesh: jax.sharding.Mesh | None
  replicate_student: bool = True

  @classmethod
  def create(cls, mesh_shape, replicate_student: bool = True) -> "Placement":
    """The mesh of `mesh_shape` ((data, model); None: the default device)."""
    if mesh_shape is None:
      if jax.process_count() > 1:
        raise multihost.MultihostError(
            f"{jax.process_count()} processes train one model on a mesh "
            "over all their devices, but mesh_shape is None (one device): "
            "add a run file with a mesh, e.g. --gin_file=runs/"
            "cpu_2_processes.gin, or set TrainConfig.mesh_shape.")
      return cls(_default_device(), None, replicate_student)
    return cls(None, sharding.make_mesh(*mesh_shape), replicate_student)

  @property
  def spans_processes(self) -> bool:
    """A mesh over several processes' devices: each reads its share of the
    data (`join_shares`)."""
    return self.mesh is not None and jax.process_count() > 1

  @property
  def mesh_shape(self) -> footprint.MeshShape:
    if self.mesh is None:
      return footprint.ONE_DEVICE
    return (self.mesh.shape["data"], self.mesh.shape["model"])

  def describe(self) -> str:
    """One log line: the devices, the mesh and the processes."""
    if self.mesh is None:
      return f"training on {self.device}"
    devices = self.mesh.devices.flatten()
    return (f"training on a mesh {self.mesh_shape} (data, model) of "
            f"{len(devices)} {devices[0].platform} devices in "
            f"{jax.process_count()} process(es), "
            f"{len(self.mesh.local_devices)} of them this process's")

  def _replicated(self):
    return NamedSharding(self.mesh, P())

  def state_shardings(self, definition, state: Any) -> Any:
    """The shardings of a `steps.TrainState` (arrays or shapes)."""
    if self.mesh is None:
      one = jax.sharding.SingleDeviceSharding(self.device)
      return jax.tree.map(lambda _: one, state)
    replicated = self._replicated()
    return steps.TrainState(
        replicated,
        sharding.param_shardings(definition, state.params, self.mesh,
                                 replicate=self.replicate_student,
                                 whole_if_indivisible=True),
        jax.tree.map(lambda _: replicated, state.opt_state))

  def put_state(self, definition, state: steps.TrainState):
    """`state` committed to its devices (a restored one is already)."""
    if self.mesh is None:
      # Committed whether fresh or restored: committed and uncommitted
      # inputs make different programs (a resumed run compiled twice).
      return jax.device_put(state, self.device)
    return jax.tree.map(
        lambda x, s: x if getattr(x, "sharding", None) == s else
        sharding.put(np.asarray(x), s),
        state, self.state_shardings(definition, state))

  def put_scalar(self, value) -> jax.Array:
    if self.mesh is None:
      return jax.device_put(jnp.int32(value), self.device)
    return sharding.put(np.int32(value), self._replicated())

  def put_batch(self, batch: Mapping[str, np.ndarray]):
    """A numpy batch on the devices: rows over `data` on a mesh."""
    if self.mesh is None:
      return batch
    rows = sharding.batch_sharding(self.mesh, len(next(iter(batch.values()))))
    return {k: sharding.put(v, rows) for k, v in batch.items()}

  def join_shares(self, share: Mapping[str, np.ndarray]):
    """The batch of which every process holds a share, on the devices.

    Args:
      share: this process's share of one batch: its rows filled, zeros in
        every row another process holds (`batches.BucketedData.batch`).
        Every process calls this with the same shapes, at the same step.

    Returns:
      The sum of the processes' shares, each array placed as `put_batch`
      places a whole batch (rows over `data`).
    """
    rows = len(next(iter(share.values())))
    out = sharding.batch_sharding(self.mesh, rows)
    # One slot per device of the mesh: this process's share in the slot of
    # its first device, zeros in its other devices' slots.
    slots = NamedSharding(self.mesh, P(self.mesh.axis_names))
    count = self.mesh.devices.size

    def stacked(value):
      shape = (count,) + value.shape
      where = slots.addressable_devices_indices_map(shape)
      first = min(where, key=lambda d: where[d][0].start or 0)
      return jax.make_array_from_single_device_arrays(shape, slots, [
          jax.device_put((value if d == first else np.zeros_like(value))[None],
                         d) for d in where])

    return _sum_slots(out)({k: stacked(v) for k, v in share.items()})

  def load_teacher(self, spec: str, config: Any,
                   dtype: str | None) -> Model:
    """The teacher, on this placement's devices (see the module docstring).

    A teacher whose dimensions divide the mesh is read shard by shard, each
    process reading only its devices' shards (T5-XXL never whole on one
    chip); another (a small one) is read whole, then split where it
    divides.
    """
    kwargs = dict(config=config, dtype=dtype, param_dtype=dtype)
    if self.mesh is None:
      teacher = checkpoints.load_model(spec, **kwargs)
      return dataclasses.replace(
          teacher, params=jax.device_put(teacher.params, self.device))
    mesh = self.mesh
    teacher = checkpoints.load_model(
        spec, mesh=mesh, replicate=lambda d: not sharding.divides(
            d, d.param_shapes(), mesh), **kwargs)
    return dataclasses.replace(teacher, params=jax.device_put(
        teacher.params,
        self.teacher_shardings(teacher.definition, teacher.params)))

  def teacher_shardings(self, definition, params: Any) -> Any:
    """The teacher's shardings on the mesh (arrays or shapes)."""
    return sharding.param_shardings(definition, params, self.mesh,
                                    whole_if_indivisible=True)

  def context(self):
    """Where the step is traced and run (`distill.mesh_context`)."""
    return distill.mesh_context(self.mesh)

  def host(self, tree: Any) -> Any:
    """Device arrays -> numpy (every process must call it on a mesh)."""
    if self.mesh is None:
      return tree
    return sharding.gather(tree)

  def log_bytes(self, teacher: Model | None, definition, state) -> dict:
    """Logs (and returns) the bytes per device of the teacher's parameters
    and of the student's state, from shapes (`memory.footprint`)."""
    mesh_shape = self.mesh_shape
    params = footprint.param_bytes(definition, mesh_shape,
                                   self.replicate_student, state.params)
    optimizer = footprint.tree_bytes(footprint.abstract(state.opt_state))
    out = {"student_params": params, "student_optimizer": optimizer,
           "student_state": params + optimizer + 4,
           "teacher_params": 0 if teacher is None else footprint.param_bytes(
               teacher.definition, mesh_shape, False, teacher.params)}
    logging.info(
        "bytes per device: teacher parameters %.1f MB, student state %.1f MB"
        " (parameters %.1f MB, optimizer %.1f MB)",
        out["teacher_params"] / _MB, out["student_state"] / _MB,
        params / _MB, optimizer / _MB)
    return out


@functools.lru_cache(maxsize=None)
def _sum_slots(out: NamedSharding):
  """The jitted sum over the leading (slot) axis of every array of a dict,
  placed with `out`."""
  return jax.jit(lambda tree: jax.tree.map(lambda x: jnp.sum(x, axis=0),
                                           tree), out_shardings=out)


def local(value: Any) -> np.ndarray:
  """This process's copy of a replicated device value (a step's sums, the
  step counter), also where the array spans other processes' devices."""
  if isinstance(value, jax.Array) and not value.is_fully_addressable:
    return np.asarray(value.addressable_data(0))
  return np.asarray(value)
