"""Drafts beyond one draft model, each a `decoding.protocol.Drafter`:
cascades (`cascades.py`), horizontal drafters (`horizontal.py`), token trees
(`trees.py`) and prompt lookup (`prompt_lookup.py`). docs/extending.md adds
one."""
