"""The shell commands of README.md and docs/*.md, as tests read them.

A page's commands are its fenced ```sh / ```bash blocks. `blocks()` reads
them from the pages as they are now (nothing is copied into the tests), and
`commands()` splits a block into the commands a shell runs one after the
other: continuation lines joined, a `for ... done` loop or a function
definition kept whole, comments dropped. `for_test()` rewrites a command
to run here, from the repository's root: the venv's Python for
`.venv/bin/python` and `python`, every relative `workdir/`, `/tmp/` and
`$HOME/results` under a test's folder, and a test's tiny settings (fewer
steps, fewer examples) added at the end of a script's invocation.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import re
import shlex
import sys
from typing import Mapping, Sequence

from tests import helpers

PAGES = ("README.md", *sorted(
    os.path.relpath(p, helpers.REPO)
    for p in glob.glob(os.path.join(helpers.REPO, "docs", "*.md"))))

_FENCE = re.compile(r"^\s*```(\w*)\s*$")
_SHELL = ("sh", "bash", "shell", "console")
_OPENERS = re.compile(r"^(for|while|until|if|case)\b|^\w+\s*\(\)\s*\{")
_CLOSERS = re.compile(r"(^|;\s*|\s)(done|fi|esac)\b|^\}")


@dataclasses.dataclass(frozen=True)
class Block:
  """A fenced shell block: `page#n`, the n-th of its page (from 1)."""
  key: str
  text: str

  @property
  def commands(self) -> list[str]:
    return commands(self.text)


def blocks(pages: Sequence[str] = PAGES) -> dict[str, Block]:
  """Every shell block of `pages`, by key."""
  out = {}
  for page in pages:
    with open(os.path.join(helpers.REPO, page)) as f:
      lines = f.read().splitlines()
    inside, language, body, count = False, "", [], 0
    for line in lines:
      fence = _FENCE.match(line)
      if fence and not inside:
        inside, language, body = True, fence.group(1), []
      elif fence and inside:
        inside = False
        if language in _SHELL:
          count += 1
          key = f"{page}#{count}"
          out[key] = Block(key, _dedent("\n".join(body)))
      elif inside:
        body.append(line)
  return out


def _dedent(text: str) -> str:
  lines = text.splitlines()
  indent = min((len(line) - len(line.lstrip()) for line in lines
                if line.strip()), default=0)
  return "\n".join(line[indent:] for line in lines)


def _open_quote(line: str, quote: str | None) -> str | None:
  """The quote still open at the end of `line`, given the one open at its
  start (None: none)."""
  escaped = False
  for char in line:
    if escaped:
      escaped = False
    elif char == "\\" and quote != "'":
      escaped = True
    elif quote is None and char in "'\"":
      quote = char
    elif char == quote:
      quote = None
    elif quote is None and char == "#":
      break
  return quote


def commands(text: str) -> list[str]:
  """The top-level commands of a shell block, in order."""
  out, current, depth, quote = [], [], 0, None
  for raw in text.splitlines():
    line = raw
    if quote is None:
      line = (raw.split(" #")[0].rstrip()
              if not raw.lstrip().startswith("#") else "")
      if not line.strip():
        continue
    current.append(line)
    stripped = line.strip()
    if quote is None and _OPENERS.search(stripped):
      depth += 1
    quote = _open_quote(line, quote)
    if quote is None and _CLOSERS.search(stripped) and depth:
      depth -= 1
    if line.endswith("\\") or depth or quote:
      continue
    out.append("\n".join(current))
    current = []
  if current:
    out.append("\n".join(current))
  return out


def script_of(command: str) -> str | None:
  """The first `scripts/NAME.py` (or `benchmarks/...`) a command runs."""
  found = re.search(r"\b((?:scripts|benchmarks)/\w+\.py)", command)
  return found.group(1) if found else None


def for_test(command: str, root: str,
             extra: Mapping[str, Sequence[str]] = ()) -> str:
  """`command` as it runs in a test: see the module docstring.

  Args:
    command: a documented command.
    root: the test's folder; relative workdirs, /tmp and $HOME/results go
      under it.
    extra: script path (e.g. "scripts/train.py") -> flags added at the end
      of each of its invocations in the command.
  """
  # /tmp first: `root` itself may be under /tmp. The interpreter last: it
  # may be under /tmp too (a clone in /tmp), and is no workdir to move.
  out = re.sub(r"(^|[\s=])/tmp/", rf"\1{root}/tmp/", command)
  out = re.sub(r"(^|[\s=])workdir/", rf"\1{root}/workdir/", out)
  out = out.replace("$HOME/results", f"{root}/results")
  python = shlex.quote(sys.executable)
  out = re.sub(r"(^|\s)\.venv/bin/python\b", rf"\1{python}", out)
  out = re.sub(r"(^|[\s;(])python3?(\s)", rf"\1{python}\2", out)
  for script, flags in dict(extra).items():
    out = _append_flags(out, script, " ".join(shlex.quote(f) for f in flags))
  return out


def _append_flags(command: str, script: str, added: str) -> str:
  """`added` at the end of every invocation of `script` in `command` (after
  its own flags, so a gin binding there wins over the page's)."""
  lines = command.split("\n")
  for i, line in enumerate(lines):
    if script not in line:
      continue
    end = i
    while lines[end].rstrip().endswith("\\") and end + 1 < len(lines):
      end += 1
    last = lines[end].rstrip()
    tail = re.search(r"(\s*(?:&|;|>>?\s*\S+.*|\|.*))$", last)
    cut = tail.start() if tail else len(last)
    lines[end] = f"{last[:cut]} {added}{last[cut:]}"
  return "\n".join(lines)
