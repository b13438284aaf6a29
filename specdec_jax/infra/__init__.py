"""The I/O and cluster layer: paths (local and gs://), workdir locks, multi-host processes, TensorBoard summaries, the chip catalogue."""
