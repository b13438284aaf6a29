"""Checkpoints: `load_model`, our own format, Hugging Face and T5X.

  native   our format (config.json + orbax params), `load_model`, `convert`
  hf       Hugging Face T5 directories (read and export); hf_t5gemma and
           hf_gemma3 the Gemma families', hf_files what they share
  t5x      T5X checkpoint directories (read and write)
  configs  resolving a config name, gin file or T5X field dict
  storage  local/gs:// paths, flat parameter trees, leaf-by-leaf reading
  errors   every checkpoint error, each naming the file and the fix

Imports with jax, flax and numpy alone; orbax, tensorstore, gin and torch
are imported inside the functions that need them (a model's vocabulary is
SentencePiece's, `specdec_jax.tokens`, never seqio's TensorFlow).
"""

from specdec_jax.checkpoints.configs import resolve_config
from specdec_jax.checkpoints.errors import CheckpointError
from specdec_jax.checkpoints.errors import CheckpointNotFoundError
from specdec_jax.checkpoints.errors import MissingParameterError
from specdec_jax.checkpoints.errors import NonFiniteParameterError
from specdec_jax.checkpoints.errors import ParameterShapeError
from specdec_jax.checkpoints.errors import SpecError
from specdec_jax.checkpoints.errors import UnexpectedParameterError
from specdec_jax.checkpoints.errors import UnsupportedCheckpointError
from specdec_jax.checkpoints.native import CONFIG_FILE
from specdec_jax.checkpoints.native import DEMO_DIR
from specdec_jax.checkpoints.native import FORMAT
from specdec_jax.checkpoints.native import FORMAT_VERSION
from specdec_jax.checkpoints.native import PARAMS_DIR
from specdec_jax.checkpoints.native import SPEC_PREFIXES
from specdec_jax.checkpoints.native import check_finite_params
from specdec_jax.checkpoints.native import VOCAB_FILE
from specdec_jax.checkpoints.native import convert
from specdec_jax.checkpoints.native import load_model
from specdec_jax.checkpoints.native import restore
from specdec_jax.checkpoints.native import save
from specdec_jax.checkpoints.native import save_hf
from specdec_jax.checkpoints.native import vocabulary_of
from specdec_jax.checkpoints.t5x import read_t5x
from specdec_jax.checkpoints.t5x import write_t5x
