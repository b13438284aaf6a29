"""docs/extending.md runs as written, and its drafter is the shipped one.

Invariants: (1) every ```python block of the guide runs, in order, in one
namespace (the guide's greedy-equality assertion included); (2) the
prompt-lookup drafter the guide shows is, character for character, the code
of `specdec_jax/drafts/prompt_lookup.py` from its imports on, so the guide
cannot drift from the library.
"""

import pathlib
import re

import specdec_jax as sd

REPO = pathlib.Path(__file__).resolve().parent.parent
GUIDE = REPO / "docs" / "extending.md"
MODULE = pathlib.Path(sd.__file__).parent / "drafts" / "prompt_lookup.py"


def _blocks():
  return re.findall(r"```python\n(.*?)```", GUIDE.read_text(), re.S)


def test_the_guides_drafter_is_the_shipped_module():
  source = MODULE.read_text()
  shipped = source[source.index("import dataclasses"):].strip()
  assert _blocks()[0].strip() == shipped


def test_the_guides_python_blocks_run():
  namespace = {"__name__": "extending_guide"}
  blocks = _blocks()
  assert len(blocks) >= 2
  for block in blocks:
    exec(compile(block, str(GUIDE), "exec"), namespace)  # pylint: disable=exec-used
  # The guide decoded with its own drafter, not the library's.
  assert namespace["draft"].definition.__class__ is namespace["PromptLookupDef"]
