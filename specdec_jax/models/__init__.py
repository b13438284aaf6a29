"""Flax models that satisfy the decoder's protocol: T5 (v1.0, v1.1) and a GPT-like decoder, and the registry of sizes."""
