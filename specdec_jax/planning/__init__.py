"""What a run will cost before it runs: memory, collectives and step times compiled from shapes, for decoding, training and whole tables."""
