"""Reading XLA's optimized HLO text: collectives and CPU-only converts.

`compiled.as_text()` of a jitted program is parsed into computations and
instructions (name, result type, opcode, the rest of the line). From them:
the collectives of a decoding loop's body and of the loops nested in it,
the copies made inside loops and the program's host callbacks (what the
design promises not to do, tests/test_tpu_compile.py), and the float32
copies XLA:CPU makes of bfloat16 arrays (see `plan.py`).
"""

from __future__ import annotations

import re

import numpy as np

_COMP = re.compile(r"^(ENTRY )?%?([\w.\-]+) .*\{\s*$")
_INSTR = re.compile(r"^\s*(ROOT )?%?([\w.\-]+) = (.+?) ([a-z][\w\-]*)\((.*)$")
_ARRAY = re.compile(r"\b(pred|[suf]\d+|bf16)\[([\d,]*)\]")
_CALLS = re.compile(r"\b(?:body|condition|calls|to_apply|true_computation|"
                    r"false_computation|branch_computations|"
                    r"called_computations)=(\{[^}]*\}|%?[\w.\-]+)")
_COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter",
                "collective-permute", "all-to-all")
_BYTES = {"pred": 1, "bf16": 2}


def _called(rest: str) -> list[str]:
  """The computations an instruction calls, in order: every branch of a
  conditional (`branch_computations={%a, %b}`), not only its first."""
  return [name for group in _CALLS.findall(rest)
          for name in re.findall(r"%?([\w.\-]+)", group)]


def _type_bytes(type_str: str) -> int:
  total = 0
  for dtype, dims in _ARRAY.findall(type_str):
    n = int(np.prod([int(d) for d in dims.split(",") if d])) if dims else 1
    total += n * (_BYTES[dtype] if dtype in _BYTES else int(dtype[1:]) // 8)
  return total


def parse_hlo(text: str) -> tuple[str, dict[str, list[dict]]]:
  """(entry name, computation -> instructions {name, type, op, rest})."""
  comps, current, entry = {}, None, None
  for line in text.splitlines():
    m = _COMP.match(line)
    if m and not line.startswith(" "):
      current = m.group(2)
      comps[current] = []
      if m.group(1):
        entry = current
      continue
    m = _INSTR.match(line)
    if m and current is not None:
      comps[current].append({"name": m.group(2), "type": m.group(3),
                             "op": m.group(4), "rest": m.group(5),
                             "root": bool(m.group(1))})
  return entry, comps


def _reachable(comps, start: str, stop: set[str] = frozenset()) -> set[str]:
  seen, todo = set(), [start]
  while todo:
    name = todo.pop()
    if name in seen or name not in comps or name in stop:
      continue
    seen.add(name)
    for instr in comps[name]:
      todo.extend(_called(instr["rest"]))
  return seen


def _collectives(comps, names, times=None) -> list[dict]:
  """The collectives in computations `names`, by kind and shape, each
  counted once per run of its computation (`times`: runs, default 1)."""
  found: dict[tuple, dict] = {}
  for name in sorted(names):
    for instr in comps[name]:
      op = instr["op"].removesuffix("-start")
      if op not in _COLLECTIVES or instr["op"].endswith("-done"):
        continue
      key = (op, re.sub(r"\{[^}]*\}", "", instr["type"]))
      entry = found.setdefault(key, {"kind": op, "shape": key[1],
                                     "bytes": _type_bytes(instr["type"]),
                                     "count": 0})
      entry["count"] += (times or {}).get(name, 1)
  return sorted(found.values(), key=lambda e: (e["kind"], -e["bytes"]))


_TRIPS = re.compile(r'"known_trip_count":\{"n":"(\d+)"')


def _whiles(comps, names) -> list[tuple[str, str]]:
  """(computation, body) of every while instruction in `names`."""
  return [(name, body) for name, body, _, _ in
          _whiles_with_trips(comps, names)]


def _whiles_with_trips(comps, names) -> list[tuple[str, str, int | None,
                                                  str]]:
  """(computation, body, known trip count or None, op_name) of every while
  instruction in `names`."""
  out = []
  for name in names:
    for instr in comps[name]:
      if instr["op"] == "while":
        body = re.search(r"body=%?([\w.\-]+)", instr["rest"])
        op_name = re.search(r'op_name="([^"]*)"', instr["rest"])
        out.append((name, body.group(1), _trips(comps, instr),
                    op_name.group(1) if op_name else ""))
  return out


def _trips(comps, instr) -> int | None:
  """A while's trip count: as the compiler states it (XLA:CPU), else that
  of a loop counting from 0 while below one s32 constant (a `fori_loop`
  as the TPU compiler leaves it); None when neither says."""
  stated = _TRIPS.search(instr["rest"])
  if stated:
    return int(stated.group(1))
  cond = re.search(r"condition=%?([\w.\-]+)", instr["rest"])
  ops = comps.get(cond.group(1), []) if cond else []
  limits = [i["rest"].split(")")[0] for i in ops
            if i["op"] == "constant" and i["type"].startswith("s32[]")]
  below = [i for i in ops if i["op"] == "compare" and "direction=LT" in
           i["rest"]]
  if len(limits) == 1 and len(below) == 1 and limits[0].isdigit():
    return int(limits[0])
  return None


# Loops of the sampler that run inside one model step (jitted functions of
# `sampling`, named in the op_name of their while instructions).
_SAMPLER_LOOPS = ("jit(nucleus_threshold)/",)


def loop_collectives(text: str) -> dict[str, list[dict]]:
  """Collectives of the decoding loop: per iteration (outside nested model
  loops: one target call plus the draft's first call) and per inner-loop
  step (the draft's scan), from the optimized HLO of a jitted loop.

  A loop of the sampler (top-p's bisection of the nucleus,
  `sampling.nucleus_threshold`, when the compiler keeps it rolled) belongs
  to the step it is in: its collectives count with that step's, once per
  trip (once when the trip count cannot be read)."""
  entry, comps = parse_hlo(text)
  outer = _whiles(comps, [entry])
  if not outer:
    return {"per_iteration": [], "per_inner_step": []}
  body = max((b for _, b in outer), key=lambda b: len(_reachable(comps, b)))
  nested = [(b, trips, any(m in op_name for m in _SAMPLER_LOOPS))
            for _, b, trips, op_name in _whiles_with_trips(
                comps, _reachable(comps, body)) if b != body]
  inner = {b for b, _, sampler in nested if not sampler}
  # By body: two whiles sharing one body must not multiply it twice.
  small = {b: trips or 1 for b, trips, sampler in nested if sampler}

  def collectives(names):
    """Those of the computations `names`, run once, or once per trip of
    each small loop around them."""
    times = {}
    for b, trips in small.items():
      if b in names:
        for name in _reachable(comps, b) & names:
          times[name] = times.get(name, 1) * trips
    return _collectives(comps, names, times)

  inner_names = set().union(*[_reachable(comps, b) for b in inner]) if inner \
      else set()
  return {
      "per_iteration": collectives(_reachable(comps, body, stop=inner)),
      "per_inner_step": collectives(inner_names)}


def loop_copies(text: str, min_bytes: int, dtype: str | None = None
                ) -> list[dict]:
  """Copies of at least `min_bytes` that a while loop's body materialises
  every iteration: a `copy` in the body or in what it calls (nested loops,
  calls, branches), not inside a fusion, where a copy is a layout change
  computed on the fly as the fused consumer reads its operand. Such a copy
  is an array the loop should update in place, duplicated instead.
  `dtype` (e.g. "bf16"): only copies of that element type."""
  _, comps = parse_hlo(text)
  fused = {c for instrs in comps.values() for i in instrs
           if i["op"] == "fusion" for c in _called(i["rest"])}
  names = set()
  for _, body in _whiles(comps, list(comps)):
    names |= _reachable(comps, body, stop=fused)
  out = []
  for name in sorted(names):
    for instr in comps[name]:
      size = _type_bytes(instr["type"])
      if (instr["op"] == "copy" and size >= min_bytes and
          (dtype is None or instr["type"].startswith(dtype + "["))):
        out.append({"computation": name, "name": instr["name"],
                    "shape": re.sub(r"\{[^}]*\}", "", instr["type"]),
                    "bytes": size})
  return out


_FEEDS = ("infeed", "outfeed")
_SEND_RECV = ("send", "recv", "send-done", "recv-done")
_TARGET = re.compile(r'custom_call_target="([^"]*)"')


def host_callbacks(text: str) -> list[dict]:
  """Every transfer to or from the host in the program: infeed/outfeed,
  send/recv to the host (`is_host_transfer=true`: how a TPU program calls
  `jax.debug.callback`), and custom calls into the host (a CPU's
  callbacks); device-to-device send/recv is not one."""
  entry, comps = parse_hlo(text)
  out = []
  for name in sorted(_reachable(comps, entry)):
    for instr in comps[name]:
      target = _TARGET.search(instr["rest"])
      if instr["op"] in _FEEDS or (
          instr["op"] in _SEND_RECV and
          "is_host_transfer=true" in instr["rest"]) or (
          instr["op"] == "custom-call" and target and re.search(
              r"callback|host", target.group(1), re.IGNORECASE)):
        out.append({"op": instr["op"],
                    "target": target.group(1) if target else ""})
  return out


def program_collectives(text: str) -> list[dict]:
  entry, comps = parse_hlo(text)
  return _collectives(comps, _reachable(comps, entry))


def cpu_convert_bytes(text: str, min_elements: int = 1 << 16) -> int:
  """Bytes of float32 copies of bfloat16 arrays (XLA:CPU's dot lowering).

  Counts every convert (or fusion whose root is a convert) from a bf16
  operand to an f32 result of the same size with at least `min_elements`.
  """
  _, comps = parse_hlo(text)
  roots = {name: next((i["op"] for i in instrs if i["root"]), None)
           for name, instrs in comps.items()}
  fused = {c for instrs in comps.values() for i in instrs
           if i["op"] == "fusion" for c in _called(i["rest"])[:1]}
  total = 0
  for name, instrs in comps.items():
    if name in fused:
      continue
    types = {i["name"]: i["type"] for i in instrs}
    for instr in instrs:
      if not instr["type"].startswith("f32["):
        continue
      if instr["op"] == "fusion":
        called = _called(instr["rest"])
        if not called or roots.get(called[0]) != "convert":
          continue
      elif instr["op"] != "convert":
        continue
      operands = re.findall(r"%([\w.\-]+)", instr["rest"].split(")")[0])
      if len(operands) != 1 or not types.get(operands[0], "").startswith(
          "bf16["):
        continue
      size = _type_bytes(instr["type"])
      if size // 4 >= min_elements and size == 2 * _type_bytes(
          types[operands[0]]):
        total += size
  return total
