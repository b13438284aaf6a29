"""Launch plumbing the scripts share: T5X-style `--gin_file`/`--gin.X=` flags, multi-host start-up, usage errors."""
