"""What the Hugging Face readers and writers of the Gemma families and the
Llama layout share (`hf_t5gemma`, `hf_gemma3`, `hf_llama`): telling a
directory's model type, reading our parameters from HF tensors and turning
them back, and writing config.json + model.safetensors (local or gs://,
config.json last: a directory with config.json is a complete checkpoint).
Reading one tensor is `hf.Tensors`'s job."""

from __future__ import annotations

import json
import logging
import os
import tempfile
from typing import Any, Callable

import numpy as np

from specdec_jax.infra import paths
from specdec_jax.checkpoints import hf
from specdec_jax.checkpoints import hf_io
from specdec_jax.checkpoints.errors import CheckpointNotFoundError
from specdec_jax.checkpoints.errors import UnsupportedCheckpointError


def model_type(path: str) -> str | None:
  """The `model_type` of the config.json in `path` (local or gs://); None
  without one, or when it is not a JSON object (the T5 loader then names
  what is wrong)."""
  data = paths.read_bytes(paths.join(path, hf.CONFIG_FILE))
  if data is None:
    return None
  try:
    return json.loads(data).get("model_type")
  except (ValueError, AttributeError):
    return None


def read_config(path: str, model_types: tuple[str, ...],
                reader: str) -> tuple[dict[str, Any], str]:
  """(config.json of the local directory `path`, its file name), checked to
  be of one of `model_types` (`reader` names the function that reads them,
  for the error).

  Raises:
    CheckpointNotFoundError: no directory or no config.json.
    UnsupportedCheckpointError: another model_type.
  """
  if not os.path.isdir(path):
    raise CheckpointNotFoundError(
        f"HF checkpoint directory not found: {path!r}")
  config_file = os.path.join(path, hf.CONFIG_FILE)
  if not os.path.isfile(config_file):
    raise CheckpointNotFoundError(
        f"missing {hf.CONFIG_FILE} in HF checkpoint directory {path!r}")
  with open(config_file) as f:
    hf_config = json.load(f)
  if hf_config.get("model_type") not in model_types:
    raise UnsupportedCheckpointError(
        f"{config_file}: model_type={hf_config.get('model_type')!r}; "
        f"{reader} reads model_type {' or '.join(map(repr, model_types))} "
        "(hf.load_t5 reads T5)")
  return hf_config, config_file


def read_params(tensors: hf.Tensors, definition: Any,
                hf_name: Callable[[tuple[str, ...]], tuple[str, bool]],
                param_dtype: str) -> dict[str, Any]:
  """The parameter tree `definition` needs, each leaf read from the HF
  tensor `hf_name(our path)` names (transposed where it says), checked
  against its shape and cast to `param_dtype`, one at a time.

  Raises:
    MissingParameterError, ParameterShapeError: the tensors do not fit.
  """
  params: dict[str, Any] = {}
  for ours, shape_dtype in hf.tree_paths(definition.param_shapes()):
    name, transpose = hf_name(ours)
    hf.set_path(params, ours, hf.convert_tensor(
        tensors, name, ours, shape_dtype.shape, transpose, param_dtype, None))
  return params


def tensor_names(path: str) -> list[str]:
  """Every tensor name a local safetensors checkpoint holds (its index's,
  or its single file's): what a reader of part of it reports skipping."""
  index = os.path.join(path, hf.SAFETENSORS_INDEX)
  if os.path.isfile(index):
    with open(index) as f:
      return sorted(json.load(f)["weight_map"])
  # safetensors only when Hugging Face files are read.
  import safetensors  # pylint: disable=g-import-not-at-top
  with safetensors.safe_open(os.path.join(path, hf.SAFETENSORS_FILE),
                             framework="np") as f:
    return sorted(f.keys())


def export_tensors(definition: Any, params: Any,
                   hf_name: Callable[[tuple[str, ...]], tuple[str, bool]]
                   ) -> dict[str, np.ndarray]:
  """{HF name: tensor in HF's layout} of every parameter `definition`
  needs, named (and transposed or not) by `hf_name(our path)`: the one
  export shape check (`hf_io.export_tensors`) against the definition's
  shapes.

  Raises:
    CheckpointError: parameters the definition does not have.
    MissingParameterError, ParameterShapeError: the parameters do not fit
      the definition's config.
  """
  return hf_io.export_tensors(
      dict(hf_io.tree_paths(definition.param_shapes())), params, hf_name,
      type(getattr(definition, "config", definition)).__name__)


def write_directory(directory: str, tensors: dict[str, np.ndarray],
                    hf_config: dict[str, Any], overwrite: bool,
                    extra_files: dict[str, bytes] | None = None) -> str:
  """Writes config.json and model.safetensors (metadata format "pt", as
  `save_pretrained` writes) into `directory`, local or gs:// (written
  locally, then uploaded through `infra.paths`); config.json's `dtype` is
  the tensors' when they share one. `extra_files` ({name: contents}, a
  tokenizer's) are written first.

  Raises:
    FileExistsError: `directory` holds a checkpoint and not overwrite.
  """
  dtypes = {str(t.dtype) for t in tensors.values()}
  if len(dtypes) == 1:
    hf_config = dict(hf_config, dtype=dtypes.pop())
  extra_files = extra_files or {}
  for name in (hf.CONFIG_FILE, hf.SAFETENSORS_FILE, *extra_files):
    if paths.exists(paths.join(directory, name)) and not overwrite:
      raise FileExistsError(f"{paths.join(directory, name)} exists; pass "
                            "overwrite=True")
  for name, data in extra_files.items():
    paths.write_bytes(paths.join(directory, name), data)
  if not paths.is_remote(directory):
    _write_local(directory, tensors, hf_config)
    return directory
  with tempfile.TemporaryDirectory(prefix="specdec_jax_hf.") as local:
    _write_local(local, tensors, hf_config)
    for name in (hf.SAFETENSORS_FILE, hf.CONFIG_FILE):  # config last
      data = paths.read_bytes(os.path.join(local, name))
      logging.info("uploading %s (%.1f MB) to %s", name, len(data) / 1e6,
                   directory)
      paths.write_bytes(paths.join(directory, name), data)
  return directory


def _write_local(directory: str, tensors: dict[str, np.ndarray],
                 hf_config: dict[str, Any]) -> None:
  os.makedirs(directory, exist_ok=True)
  # safetensors only when Hugging Face files are written.
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  weights = os.path.join(directory, hf.SAFETENSORS_FILE)
  save_file(tensors, weights, metadata={"format": "pt"})
  # safetensors creates the file 0600; give it the mode of every other file
  # (0666 less the umask), so a shared checkpoint is readable.
  umask = os.umask(0)
  os.umask(umask)
  os.chmod(weights, 0o666 & ~umask)
  with open(os.path.join(directory, hf.CONFIG_FILE), "w") as f:
    json.dump(hf_config, f, indent=2, sort_keys=True)
    f.write("\n")
