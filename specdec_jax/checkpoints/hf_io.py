"""Hugging Face checkpoint files, whatever the model: the file names, a
reader of named tensors (safetensors, sharded safetensors or a torch .bin,
one tensor at a time), the conversion of one tensor into our layout and
dtype, a gs:// directory's local copy, and the paths of a nested dict of
parameters. `hf.py` (T5) and `hf_t5gemma.py` map their models' names
through these.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
from typing import Any, Iterator

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.infra import paths
from specdec_jax.checkpoints.errors import CheckpointError
from specdec_jax.checkpoints.errors import CheckpointNotFoundError
from specdec_jax.checkpoints.errors import MissingParameterError
from specdec_jax.checkpoints.errors import ParameterShapeError
from specdec_jax.checkpoints.errors import UnsupportedCheckpointError

CONFIG_FILE = "config.json"
SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
TORCH_FILE = "pytorch_model.bin"
TORCH_INDEX = "pytorch_model.bin.index.json"


class Tensors:
  """Reads named tensors of a checkpoint one at a time, as numpy arrays."""

  def __init__(self, path: str):
    self._files: dict[str, str] = {}  # tensor name -> file
    self._torch_state = None
    single = os.path.join(path, SAFETENSORS_FILE)
    index = os.path.join(path, SAFETENSORS_INDEX)
    torch_file = os.path.join(path, TORCH_FILE)
    if os.path.isfile(single):
      with _damaged_file_named(single):
        # safetensors only when Hugging Face files are read.
        import safetensors  # pylint: disable=g-import-not-at-top
        with safetensors.safe_open(single, framework="np") as f:
          self._files = {name: single for name in f.keys()}
    elif os.path.isfile(index):
      with open(index) as f:
        weight_map = json.load(f)["weight_map"]
      for name, shard in weight_map.items():
        shard_path = os.path.join(path, shard)
        if not os.path.isfile(shard_path):
          raise CheckpointNotFoundError(
              f"missing safetensors shard {shard!r} listed in {index}")
        self._files[name] = shard_path
    elif os.path.isfile(torch_file):
      self._torch_state = _torch_load(torch_file)
    elif os.path.isfile(os.path.join(path, TORCH_INDEX)):
      raise UnsupportedCheckpointError(
          f"sharded {TORCH_INDEX} in {path!r} is not supported; load it "
          "with transformers and save_pretrained() it as safetensors")
    else:
      raise CheckpointNotFoundError(
          f"no weights in HF checkpoint directory {path!r}: expected "
          f"{SAFETENSORS_FILE}, {SAFETENSORS_INDEX} or {TORCH_FILE}")
    self._handles: dict[str, Any] = {}
    # Some checkpoints (older .bin files) carry the embedding only under the
    # names of its tied copies.
    self._aliases: dict[str, str] = {}
    if not self._has("shared.weight"):
      for copy in ("encoder.embed_tokens.weight",
                   "decoder.embed_tokens.weight"):
        if self._has(copy):
          self._aliases["shared.weight"] = copy
          break

  def _has(self, name: str) -> bool:
    if self._torch_state is not None:
      return name in self._torch_state
    return name in self._files

  def __contains__(self, name: str) -> bool:
    return self._has(self._aliases.get(name, name))

  def get(self, name: str) -> np.ndarray:
    name = self._aliases.get(name, name)
    if self._torch_state is not None:
      return _torch_to_numpy(self._torch_state[name])
    file = self._files[name]
    with _damaged_file_named(file):
      if file not in self._handles:
        # safetensors only when Hugging Face files are read.
        import safetensors  # pylint: disable=g-import-not-at-top
        # Opened once per shard and kept: safe_open memory-maps the file, so
        # a handle costs no memory for the tensors not read yet.
        self._handles[file] = safetensors.safe_open(file, framework="np")
      return self._handles[file].get_tensor(name)


@contextlib.contextmanager
def _damaged_file_named(file: str):
  """Turns safetensors' errors (no path in them) into a CheckpointError
  naming the file and the fix."""
  try:
    yield
  except (OSError, CheckpointError):
    raise
  except Exception as e:  # pylint: disable=broad-except  (SafetensorError)
    raise CheckpointError(
        f"{file} is damaged or truncated ({type(e).__name__}: {e}): "
        "re-download it, or re-export it (hf.save_t5 / save_pretrained)."
    ) from None


def _torch_load(file: str):
  try:
    # torch is optional (the hf extra).
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise ImportError(
        f"reading {file} needs torch, which is not installed; install it "
        "with `pip install -e '.[hf]'` or convert the checkpoint to "
        "safetensors") from None
  try:
    # Memory-mapped, so tensors are paged in one at a time as converted.
    return torch.load(file, map_location="cpu", weights_only=True, mmap=True)
  except RuntimeError:  # legacy (pre-zip) format cannot be memory-mapped
    return torch.load(file, map_location="cpu", weights_only=True)


def _torch_to_numpy(tensor) -> np.ndarray:
  # torch is optional (the hf extra).
  import torch  # pylint: disable=g-import-not-at-top
  if tensor.dtype == torch.bfloat16:
    # only for bfloat16 torch tensors.
    import ml_dtypes  # pylint: disable=g-import-not-at-top
    return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
  return tensor.numpy()


def tree_paths(tree: Any) -> Iterator[tuple[tuple[str, ...], Any]]:
  """(key path, leaf) of every leaf of a nested dict of parameters."""
  for keypath, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    yield tuple(k.key for k in keypath), leaf


def set_path(tree: dict, path: tuple[str, ...], value: Any) -> None:
  """`tree[path[0]][path[1]]... = value`, making the dicts on the way."""
  for key in path[:-1]:
    tree = tree.setdefault(key, {})
  tree[path[-1]] = value


@contextlib.contextmanager
def local_directory(path: str) -> Iterator[str]:
  """`path` itself, or for gs:// a temporary local copy of the files
  `load_t5` reads (config.json and the weights its directory has); safetensors
  and torch open local files only. Errors raised inside name `path`."""
  if not paths.is_remote(path):
    yield path
    return
  present = set(paths.list_dir(path))
  if CONFIG_FILE not in present:
    raise CheckpointNotFoundError(
        f"HF checkpoint directory not found: {path!r}" if not present else
        f"missing {CONFIG_FILE} in HF checkpoint directory {path!r}")
  names = [CONFIG_FILE]
  for weights in (SAFETENSORS_FILE, SAFETENSORS_INDEX, TORCH_FILE):
    if weights in present:
      names.append(weights)
      break
  if names[-1] == SAFETENSORS_INDEX:
    index = json.loads(paths.read_text(paths.join(path, SAFETENSORS_INDEX)))
    # A shard the index lists but the bucket lacks stays missing, for
    # `Tensors` to name.
    names += sorted(set(index["weight_map"].values()) & present)
  with tempfile.TemporaryDirectory(prefix="specdec_jax_hf.") as local:
    for i, name in enumerate(names, start=1):
      data = paths.read_bytes(paths.join(path, name))
      if data is None:
        raise CheckpointNotFoundError(
            f"{paths.join(path, name)} disappeared while being downloaded")
      logging.info("downloaded %s (%d/%d, %.1f MB) from %s", name, i,
                   len(names), len(data) / 1e6, path)
      with open(os.path.join(local, name), "wb") as f:
        f.write(data)
      del data
    try:
      yield local
    except (CheckpointError, CheckpointNotFoundError) as e:
      raise type(e)(str(e).replace(local, path)) from e


def convert_tensor(tensors: Tensors, name: str, ours: tuple[str, ...],
             shape: tuple[int, ...], transpose: bool, param_dtype: str,
             scale: float | None) -> np.ndarray:
  """Reads one HF tensor and returns it in our layout and dtype."""
  ours_name = "/".join(ours)
  if name not in tensors:
    raise MissingParameterError(
        f"missing parameter {name!r} ({ours_name}) in the checkpoint")
  value = tensors.get(name)
  hf_shape = tuple(reversed(shape)) if transpose else tuple(shape)
  if value.shape != hf_shape:
    raise ParameterShapeError(
        f"parameter {name!r} ({ours_name}) has shape {value.shape}, "
        f"expected {hf_shape} from config.json")
  if transpose:
    value = value.T
  if scale is not None:
    value = value.astype(np.float32) * np.float32(scale)
  # jnp.dtype also knows bfloat16, which plain numpy does not.
  return np.ascontiguousarray(value.astype(jnp.dtype(param_dtype)))


def export_tensors(expected: dict, params: Any, hf_name, what: str
                   ) -> dict[str, np.ndarray]:
  """HF name -> tensor in HF's layout, for every parameter an export
  writes, checked against the shapes its config gives.

  Args:
    expected: our parameter path -> ShapeDtypeStruct, from the config.
    params: the model's parameter tree.
    hf_name: our path -> (HF name, whether to transpose).
    what: the config, as errors name it.

  Raises:
    CheckpointError: parameters the config does not have.
    MissingParameterError, ParameterShapeError: parameters the config
      needs are missing or shaped otherwise.
  """
  found = dict(tree_paths(params))
  extra = sorted("/".join(p) for p in set(found) - set(expected))
  if extra:
    raise CheckpointError(
        f"{len(extra)} parameter(s) not in the config {what}: "
        f"{', '.join(extra[:8])}{' ...' if len(extra) > 8 else ''}")
  tensors: dict[str, np.ndarray] = {}
  for ours, shape_dtype in expected.items():
    ours_name = "/".join(ours)
    if ours not in found:
      raise MissingParameterError(
          f"missing parameter {ours_name} that the config needs")
    value = np.asarray(found[ours])
    if value.shape != tuple(shape_dtype.shape):
      raise ParameterShapeError(
          f"parameter {ours_name} has shape {value.shape}, expected "
          f"{tuple(shape_dtype.shape)} from the config")
    name, transpose = hf_name(ours)
    tensors[name] = np.ascontiguousarray(value.T if transpose else value)
  return tensors
