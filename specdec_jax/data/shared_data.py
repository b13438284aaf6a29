"""Where the project's shared data lives: `$SPECDEC_SHARED_DATA`, else the
`shared/data` folder beside the repository (Multi30k, newstest2014, CNN/DM
and T5's vocabulary; `../shared/data/PROVENANCE.md`).

A module of its own, importing no TensorFlow: the scripts that only need
the folder (scripts/build_paragraphs.py, scripts/train_vocab.py) start
without TensorFlow's seconds of import. `tasks` re-exports both names.
"""

from __future__ import annotations

import os
from pathlib import Path

SHARED_DATA_ENV = "SPECDEC_SHARED_DATA"


def default_local_data_dir() -> Path:
  """`$SPECDEC_SHARED_DATA`, else the `shared/data` folder beside the repo."""
  if os.environ.get(SHARED_DATA_ENV):
    return Path(os.environ[SHARED_DATA_ENV])
  return Path(__file__).resolve().parents[3] / "shared" / "data"
