"""Runs: measured experiments, costs, reports, Table 2/3 assembly, the demo.

The top layer: it may import every other layer, and gin, TensorFlow and
seqio freely. `gin_flags` holds the T5X-style `--gin_file`/`--gin.X=` flags
that the scripts share.
"""
