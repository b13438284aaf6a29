"""The memory model: bytes a run needs per device, from shapes alone (`footprint`)."""
