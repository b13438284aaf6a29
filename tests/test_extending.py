"""docs/extending.md runs as written, and its drafter and rule are the
shipped ones.

Invariants: (1) every ```python block of the guide runs, in order, in one
namespace (the guide's greedy-equality and exactness assertions included);
(2) the prompt-lookup drafter and the typical-acceptance rule the guide
shows are, character for character, the code of
`specdec_jax/drafts/prompt_lookup.py` and `specdec_jax/rules/typical.py`
from their imports on, so the guide cannot drift from the library.
"""

import pathlib
import re

import pytest

import specdec_jax as sd

REPO = pathlib.Path(__file__).resolve().parent.parent
GUIDE = REPO / "docs" / "extending.md"
PACKAGE = pathlib.Path(sd.__file__).parent


def _blocks():
  return re.findall(r"```python\n(.*?)```", GUIDE.read_text(), re.S)


@pytest.mark.parametrize("module,defines", [
    ("drafts/prompt_lookup.py", "class PromptLookupDef"),
    ("rules/typical.py", "class TypicalAcceptance")])
def test_the_guides_code_is_the_shipped_module(module, defines):
  source = (PACKAGE / module).read_text()
  shipped = source[source.index("import dataclasses"):].strip()
  shown = [b.strip() for b in _blocks() if defines in b]
  assert shown == [shipped]


def test_the_guides_python_blocks_run():
  namespace = {"__name__": "extending_guide"}
  blocks = _blocks()
  assert len(blocks) >= 5
  for block in blocks:
    exec(compile(block, str(GUIDE), "exec"), namespace)  # pylint: disable=exec-used
  # The guide decoded with its own drafter and rule, not the library's.
  assert namespace["mixed"].definition.early.__class__ is namespace[
      "PromptLookupDef"]
  assert namespace["TypicalAcceptance"] is not sd.TypicalAcceptance
  assert namespace["typical"].stats.exact is False
