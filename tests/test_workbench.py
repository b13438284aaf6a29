"""The decoding core stays a workbench a researcher changes in one place.

Invariants (each can fail on the code as it was before issue 59):
- no function in `decoding/`, `drafts/` or `sampling.py` is over 80 lines;
- the public entry points take only what users choose (no test seam such
  as a draft sampler or a deliberately wrong verifier);
- drafters have a `typing.Protocol`, and every drafter the library ships
  has its members;
- no loop state field is typed `dict`;
- a decoder's and a model's `repr` name settings, never arrays.
"""

import ast
import dataclasses
import inspect
import pathlib
import typing

import jax
import numpy as np

import specdec_jax as sd
from specdec_jax import sampling
from specdec_jax.decoding import acceptance
from specdec_jax.decoding import contract
from specdec_jax.decoding import drafters
from specdec_jax.decoding import engine
from specdec_jax.decoding import protocol
from specdec_jax.decoding import stats
from specdec_jax.drafts import cascades
from specdec_jax.drafts import horizontal
from specdec_jax.drafts import prompt_lookup
from specdec_jax.drafts import trees
from specdec_jax.models import registry

ROOT = pathlib.Path(sd.__file__).parent
MAX_LINES = 80


def test_no_function_of_the_decoding_core_is_over_80_lines():
  files = (sorted((ROOT / "decoding").glob("*.py"))
           + sorted((ROOT / "drafts").glob("*.py")) + [ROOT / "sampling.py"])
  long = []
  for path in files:
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        lines = node.end_lineno - node.lineno + 1
        if lines > MAX_LINES:
          long.append(f"{path.name}:{node.name} ({lines} lines)")
  assert not long, long


def test_public_entry_points_take_no_test_seam():
  seams = {"draft_sample", "verifier", "fast", "fast_greedy"}
  for fn in (sd.tree, sd.speculative_generate, sd.generate,
             sd.SpeculativeDecoder, sd.cascade, sd.horizontal,
             engine.build_speculative):
    params = set(inspect.signature(fn).parameters)
    assert not params & seams, (fn.__name__, params & seams)


def test_every_shipped_drafter_has_the_protocols_members():
  assert issubclass(protocol.Drafter, typing.Protocol)
  members = set(contract.DRAFTER_MEMBERS)
  declared = {name for name in vars(protocol.Drafter)
              if not name.startswith("_")} | set(
                  protocol.Drafter.__annotations__)
  assert members == declared, members ^ declared
  gpt = registry.make_def(registry.get_config("gpt_tiny"))
  definition = sd.Model(gpt, {})
  built = [
      drafters.make_drafter(gpt, 3, sampling.SamplingConfig(), 1,
                            acceptance.Greedy()),
      cascades.CascadeDef(gpt, gpt, 2).make_drafter(
          3, sampling.SamplingConfig(), 1, acceptance.Greedy()),
      horizontal.HorizontalDef(gpt, gpt, 1).make_drafter(
          3, sampling.SamplingConfig(), 1, acceptance.Greedy()),
      trees.tree(definition, (2, 1)).definition.make_drafter(
          2, sampling.SamplingConfig(), 1, acceptance.Greedy()),
      prompt_lookup.PromptLookupDef(gpt.vocab_size).make_drafter(
          3, sampling.SamplingConfig(), 1, acceptance.Greedy()),
  ]
  for drafter in built:
    contract.check_drafter(drafter, gpt)  # raises naming what is missing
    assert drafter.shape.depth == (2 if isinstance(
        drafter, trees.TreeDrafter) else 3)


def test_no_loop_state_field_is_typed_dict():
  states = [engine.SpeculativeState, engine.AutoregressiveState,
            stats.Counters, stats.Trace, protocol.Levels,
            cascades.CascadeLoop, cascades.CascadeState]
  for cls in states:
    for field in dataclasses.fields(cls):
      assert "dict" not in str(field.type).lower(), (cls.__name__,
                                                     field.name, field.type)


def test_reprs_name_settings_not_arrays():
  cfg = registry.get_config("t5_1_1_small")
  definition = registry.make_def(cfg)
  # Shapes only: the repr must not depend on holding real weights.
  params = jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), jax.eval_shape(
      definition.init_params, jax.random.PRNGKey(0)))
  model = sd.Model(definition, params)
  decoder = sd.SpeculativeDecoder(model, sd.cascade(model, model, gamma=2),
                                  gamma=4, max_decode_len=8)
  assert len(repr(model)) < 1000, repr(model)
  assert "params=" in repr(model) and "array(" not in repr(model)
  assert len(repr(decoder)) < 2000, repr(decoder)
  assert "gamma=4" in repr(decoder) and "array(" not in repr(decoder)
  # What a decode returns: shapes and per-row summaries, not the padded
  # [B, max_decode_len] tokens (issue 66: the whole array was printed).
  result = sd.DecodeResult(
      tokens=np.zeros((2, 512), np.int32),
      stats=stats.DecodeStats(length=np.array([3, 7], np.int32),
                              target_calls=np.array([2, 4], np.int32),
                              alpha=np.array([0.5, 0.75], np.float32)))
  text = repr(result)
  assert text == ("DecodeResult(tokens=int32[2, 512], length=[3, 7], "
                  "target_calls=[2, 4], alpha=[0.5, 0.75])"), text


def test_the_decoders_docstring_names_every_kind_of_drafter():
  """help(sd.speculative_generate) says what `draft` takes: models, prompt
  lookup, n-grams, cascades, horizontal drafters, trees and one's own."""
  doc = sd.speculative_generate.__doc__
  for name in ("sd.prompt_lookup(target)", "fit_ngram", "sd.cascade(",
               "sd.horizontal(", "sd.tree(", "docs/extending.md"):
    assert name in doc, name
