"""Training and distillation with optax (`train`) over bucketed batches."""
