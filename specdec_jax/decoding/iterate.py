"""One iteration at a time, from Python: `SpeculativeDecoder.iterate`.

The loop's own step (`engine.step`), jitted on its own instead of inside
the `lax.while_loop`: `start` builds the state before the first iteration,
`next` runs one iteration and returns the new state with its
`stats.Iteration` (the proposal, the accepted length, the emitted tokens,
the counters), `finish` the tokens and `DecodeStats` of a final state. The
state stays on device between calls; the host reads each iteration's
record, as in gemma's streaming sampler, to watch a rule or a drafter work
(one host round trip per iteration: for looking, not for speed; decode
with the whole loop for that).

Keys, seeds and every number are the whole loop's, so the iterations'
tokens are the loop's tokens.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from specdec_jax.decoding import engine


class Steps:
  """The three jitted pieces of one `LoopConfig` with its numbers bound
  (see the module docstring)."""

  def __init__(self, jitted: tuple[Callable, Callable, Callable],
               values: dict):
    self._start, self._next, self._finish = jitted
    self.values = values

  def start(self, target_params, draft_params, input_ids, seeds, rows):
    """(the state before the first iteration, one PRNG key per row)."""
    return self._start(target_params, draft_params, input_ids, seeds, rows,
                       self.values)

  def next(self, target_params, draft_params, keys, state):
    """(the state after one more iteration, its `stats.Iteration`)."""
    return self._next(target_params, draft_params, keys, state, self.values)

  def finish(self, state):
    """(tokens [B, T], `DecodeStats`) of a final state."""
    return self._finish(state, self.values)


@functools.lru_cache(maxsize=16)
def _jitted(config: engine.LoopConfig) -> tuple[Callable, Callable,
                                                Callable]:
  def start(target_params, draft_params, input_ids, seeds, rows, values):
    loop = engine.Loop.trace(config, values)
    state = engine.init_state(loop, target_params, draft_params, input_ids)
    return state, engine.row_keys(seeds, rows)

  def step(target_params, draft_params, keys, state, values):
    loop = engine.Loop.trace(config, values)
    return engine.step(loop, target_params, draft_params, keys, state)

  def finish(state, values):
    return engine.finish(engine.Loop.trace(config, values), state)

  return tuple(engine.jit_with_options(fn, config.compiler_options)
               for fn in (start, step, finish))


def build_steps(*args: Any, **kwargs: Any) -> Steps:
  """The `Steps` of the loop `engine.build_speculative(*args, **kwargs)`
  builds (same arguments), cached by its `LoopConfig`."""
  return Steps(*engine.loop_config(*args, build=_jitted, **kwargs))
