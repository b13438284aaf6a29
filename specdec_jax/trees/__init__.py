"""Token trees' static shapes (`shape.py`); the drafter is `decoding/trees.py`."""
