"""specdec_jax: exact speculative decoding in JAX/Flax.

The core (sampling, theory, decoding, models, checkpoints, sharding) imports
with jax, flax and numpy alone; TensorFlow, seqio and gin stay in the modules
that need them (tasks, experiments, training).
"""

from specdec_jax import sampling
from specdec_jax import theory
from specdec_jax.checkpoints import load_model
from specdec_jax.decoding.api import CPU_EIGEN_MATMULS
from specdec_jax.decoding.api import DecodeResult
from specdec_jax.decoding.api import generate
from specdec_jax.decoding.api import speculative_generate
from specdec_jax.decoding.cascades import cascade
from specdec_jax.decoding.cascades import horizontal
from specdec_jax.decoding.stopping import ConfidenceStop
from specdec_jax.decoding.stopping import ExpectedGainStop
from specdec_jax.decoding.protocol import Model
from specdec_jax.sharding import make_mesh

__version__ = "0.1.0"
