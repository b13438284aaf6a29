"""The speculative decoder: one on-device `while_loop` that drafts, verifies and rolls back; its drafters, stop rules and statistics."""
