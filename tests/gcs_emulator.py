"""A real Cloud Storage emulator for the gs:// tests, on a free local port.

`gcp-storage-emulator` (PyPI, pinned in setup.py's test extra) serves the
GCS JSON API in memory. tensorstore reaches it through
`TENSORSTORE_GCS_HTTP_URL` with its testing credential
`GOOGLE_AUTH_TOKEN_FOR_TESTING`; Python clients through
`STORAGE_EMULATOR_HOST`. Tests using the fixture skip, saying why, only when
the emulator cannot start (not installed, or no local port).

It runs through scripts/gcs_emulator.py, the project's emulator for users'
dry runs too, which adds the behaviours of GCS the stock emulator lacks
(generation headers, `ifGenerationMatch` preconditions, listing offsets,
empty uploads).
"""

import contextlib
import os
import json
import socket
import subprocess
import sys
import time
import urllib.request

import pytest


_MAIN = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                     os.pardir, "scripts", "gcs_emulator.py")
# Buckets the fixture creates.
BUCKETS = ("models", "results")


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def start(port: int, stock: bool = False) -> subprocess.Popen:
  """Starts the emulator (`stock`: gcp-storage-emulator as it ships, without
  the project's fixes); raises RuntimeError if it does not serve in 30 s."""
  program = ["-m", "gcp_storage_emulator"] if stock else [_MAIN]
  process = subprocess.Popen(
      [sys.executable, *program, "start", "--port",
       str(port), "--in-memory", "--quiet"],
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
  deadline = time.monotonic() + 30
  while time.monotonic() < deadline:
    if process.poll() is not None:
      out = process.stdout.read().decode(errors="replace")[-2000:]
      raise RuntimeError(f"gcp-storage-emulator exited: {out}")
    try:
      socket.create_connection(("localhost", port), timeout=0.2).close()
      return process
    except OSError:
      time.sleep(0.1)
  process.kill()
  raise RuntimeError("gcp-storage-emulator did not listen within 30 s")


def create_bucket(url: str, name: str) -> None:
  """Creates a bucket through the JSON API (tensorstore has no call for it)."""
  request = urllib.request.Request(
      f"{url}/storage/v1/b?project=test", method="POST",
      data=json.dumps({"name": name}).encode(),
      headers={"Content-Type": "application/json"})
  with urllib.request.urlopen(request, timeout=10):
    pass


def environment(port: int) -> dict[str, str]:
  url = f"http://localhost:{port}"
  return {"TENSORSTORE_GCS_HTTP_URL": url, "STORAGE_EMULATOR_HOST": url,
          "GOOGLE_AUTH_TOKEN_FOR_TESTING": "test"}


@contextlib.contextmanager
def environ(env: dict[str, str]):
  """`os.environ` with `env` set inside the block, as it was after."""
  saved = {k: os.environ.get(k) for k in env}
  os.environ.update(env)
  try:
    yield
  finally:
    for k, v in saved.items():
      if v is None:
        os.environ.pop(k, None)
      else:
        os.environ[k] = v


@pytest.fixture(scope="session")
def gcs_emulator():
  """The emulator's URL, with the environment pointing every client at it."""
  try:
    import gcp_storage_emulator  # pylint: disable=g-import-not-at-top,unused-import
  except ImportError:
    pytest.skip("gcp-storage-emulator is not installed (pip install "
                "-e '.[test]'): the gs:// tests need it")
  port = free_port()
  try:
    process = start(port)
  except (RuntimeError, OSError) as e:
    pytest.skip(f"the Cloud Storage emulator could not start: {e}")
  env = environment(port)
  for name in BUCKETS:
    create_bucket(env["TENSORSTORE_GCS_HTTP_URL"], name)
  try:
    with environ(env):
      yield env["TENSORSTORE_GCS_HTTP_URL"]
  finally:
    process.terminate()
    process.wait(timeout=10)
