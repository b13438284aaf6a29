"""Models that satisfy the decoder's protocol: Flax T5 (v1.0, v1.1) and a GPT-like decoder, the registry of sizes, and the n-gram drafters."""
