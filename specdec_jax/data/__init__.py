"""Data: seqio tasks, bucketed batches, metrics, vocabularies.

Above the core: `tasks` needs TensorFlow and seqio; `batching` and
`metrics` import them only where a task is read.
"""
