"""Test session setup: 8 simulated CPU devices for the sharding tests.

The flag must be set before JAX initialises its backends, so it lives here,
which pytest imports before any test module. Single-device tests are
unaffected: they run on the first device.
"""

import os

_FLAG = "--xla_force_host_platform_device_count=8"
if _FLAG.split("=")[0] not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FLAG).strip()
