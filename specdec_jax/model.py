"""`Model`: a model definition, its parameters and (optionally) its vocabulary."""

from __future__ import annotations

import dataclasses
from typing import Any

from specdec_jax.decoding.protocol import ModelDef


@dataclasses.dataclass(frozen=True, eq=False)
class Model:
  """What `load_model` returns and `generate`/`speculative_generate` take.

  Attributes:
    definition: the hashable, parameter-free `ModelDef` (static under jit).
    params: the parameter pytree (numpy or jax arrays, possibly sharded).
    vocab: a seqio vocabulary when one is known, else None.
  """

  definition: ModelDef
  params: Any
  vocab: Any = None

  @property
  def config(self) -> Any:
    """The architecture config of the definition (None for table models)."""
    return getattr(self.definition, "config", None)

  @property
  def vocab_size(self) -> int:
    return self.definition.vocab_size

  @property
  def max_input_len(self) -> int | None:
    return self.definition.max_input_len
