"""One measured run in one workdir: its config, fit check, loading, gamma tuning, decoding, records and report."""
