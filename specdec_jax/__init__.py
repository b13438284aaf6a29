"""specdec_jax: exact speculative decoding in JAX/Flax.

The core (sampling, theory, decoding, models, checkpoints, sharding) imports
with jax, flax and numpy alone; TensorFlow, seqio and gin stay in the modules
that need them (tasks, experiments, training).
"""

from specdec_jax import versions as _versions

if _versions.python_problem():
  raise ImportError(_versions.python_problem())

# Before anything starts JAX's backends: libtpu, installed on a machine
# without a TPU, would otherwise print a page of errors while JAX probes it.
from specdec_jax.infra import accelerators as _accelerators  # noqa: E402

_accelerators.quiet_libtpu_without_tpu()

from specdec_jax import sampling  # noqa: E402
from specdec_jax import theory  # noqa: E402
from specdec_jax.checkpoints import load_model  # noqa: E402
from specdec_jax.decoding.api import CPU_EIGEN_MATMULS  # noqa: E402
from specdec_jax.decoding.api import DecodeResult  # noqa: E402
from specdec_jax.decoding.api import generate  # noqa: E402
from specdec_jax.decoding.api import SpeculativeDecoder  # noqa: E402
from specdec_jax.decoding.api import speculative_generate  # noqa: E402
from specdec_jax.drafts.cascades import cascade  # noqa: E402
from specdec_jax.drafts.horizontal import horizontal  # noqa: E402
from specdec_jax.drafts.prompt_lookup import prompt_lookup  # noqa: E402
from specdec_jax.decoding.stopping import ConfidenceStop  # noqa: E402
from specdec_jax.decoding.stopping import ExpectedGainStop  # noqa: E402
from specdec_jax.drafts.trees import tree  # noqa: E402
from specdec_jax.decoding.tree_shape import TreeShape  # noqa: E402
from specdec_jax.decoding.protocol import Model  # noqa: E402
from specdec_jax.rules.typical import TypicalAcceptance  # noqa: E402
from specdec_jax.sharding import make_mesh  # noqa: E402

__version__ = "0.1.0"
