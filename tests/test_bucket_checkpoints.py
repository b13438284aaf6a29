"""Checkpoints written into and read from buckets, against a real GCS
emulator (issue 34; issue 38 item 5).

Invariants: checkpoints written into a bucket (`save`, `write_t5x`,
`convert_checkpoint --output=gs://`) read back bit for bit, and `hf:gs://...`
(sharded safetensors, T5 and bfloat16 T5Gemma) loads what the local
directory holds; a server without generation headers is named, not taken
for damage; the convert script against a closed endpoint fails at once with
one message naming the bucket and the refused connection, no traceback.

The emulator (tests/gcs_emulator.py) runs in a subprocess on a free port;
these tests skip, saying so, only when it cannot start.
"""

import os
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest

from specdec_jax import Model
from specdec_jax import checkpoints
from specdec_jax.checkpoints import hf
from specdec_jax.infra import paths
from tests import gcs_emulator as gcs_emulator_lib
from tests import helpers
from tests import hf_layouts
from tests.gcs_emulator import gcs_emulator  # noqa: F401  (fixture)


def _assert_same_params(a, b):
  flat_a = jax.tree_util.tree_leaves_with_path(a)
  flat_b = dict(jax.tree_util.tree_leaves_with_path(b))
  assert len(flat_a) == len(flat_b)
  for name, value in flat_a:
    assert np.asarray(value).dtype == np.asarray(flat_b[name]).dtype, name
    np.testing.assert_array_equal(np.asarray(value),
                                  np.asarray(flat_b[name]))


@pytest.fixture(scope="module")
def t5_tiny():
  model = checkpoints.load_model("t5_tiny", seed=3)
  return Model(model.definition, jax.tree.map(np.asarray, model.params))


def test_save_into_a_bucket_round_trips_exactly(gcs_emulator, t5_tiny,  # noqa: F811
                                                tmp_path, monkeypatch):
  """checkpoints.save(model, gs://...) then load_model(gs://...) gives the
  same parameters bit for bit; overwrite=True replaces them (no stale
  orbax files mixed in); nothing lands in a local `gs:` folder."""
  monkeypatch.chdir(tmp_path)
  directory = "gs://models/saved_tiny"
  checkpoints.save(t5_tiny, directory)
  assert "config.json" in paths.list_files(directory)
  loaded = checkpoints.load_model(directory)
  assert loaded.config == t5_tiny.config
  _assert_same_params(loaded.params, t5_tiny.params)
  with pytest.raises(FileExistsError):
    checkpoints.save(t5_tiny, directory)
  doubled = jax.tree.map(lambda x: x * 2, t5_tiny.params)
  checkpoints.save(Model(t5_tiny.definition, doubled), directory,
                   overwrite=True)
  _assert_same_params(checkpoints.load_model(directory).params, doubled)
  assert not os.path.exists(tmp_path / "gs:"), os.listdir(tmp_path)


def test_a_server_without_generation_headers_is_named_not_damaged(
    gcs_emulator, t5_tiny, monkeypatch):  # noqa: F811
  """Issue 47: the stock gcp-storage-emulator sends no x-goog-generation
  header with a download, which tensorstore's OCDBT reader refuses. The
  checkpoint (written through the project's emulator, where it loads) is
  fine: the error names the server and the missing header, and never says
  "damaged". Control: the same files load from the project's emulator."""
  directory = "gs://models/generation_tiny"
  checkpoints.save(t5_tiny, directory)
  port = gcs_emulator_lib.free_port()
  stock = gcs_emulator_lib.start(port, stock=True)
  try:
    env = gcs_emulator_lib.environment(port)
    gcs_emulator_lib.create_bucket(env["TENSORSTORE_GCS_HTTP_URL"], "models")
    with monkeypatch.context() as patched:
      for key, value in env.items():
        patched.setenv(key, value)
      checkpoints.save(t5_tiny, directory)
      with pytest.raises(paths.RemoteStorageError) as error:
        checkpoints.load_model(directory)
  finally:
    stock.terminate()
    stock.wait(timeout=10)
  message = str(error.value)
  assert "x-goog-generation" in message and f"localhost:{port}" in message
  assert "damaged" not in message.replace("not found damaged", "")
  assert "scripts/gcs_emulator.py" in message
  _assert_same_params(checkpoints.load_model(directory).params,
                      t5_tiny.params)


def test_server_answers_are_told_from_data_errors():
  """What decides between the two messages: a storage server's answer
  (missing generation, refused, unreachable) versus anything else."""
  assert "x-goog-generation" in paths.server_answer(
      ValueError("Error reading x: Malformed StorageGeneration"))
  assert paths.server_answer(RuntimeError("UNAVAILABLE: HTTP 503"))
  assert paths.server_answer(ValueError("Error decoding chunk: checksum "
                                        "mismatch")) is None


def test_t5x_written_to_a_bucket_reads_as_the_local_copy(gcs_emulator,  # noqa: F811
                                                         t5_tiny, tmp_path):
  """write_t5x to gs:// (tensorstore leaves, inline leaves, and the orbax
  layout) reads back through `t5x:gs://...` exactly as the same checkpoint
  written locally does."""
  for layout, kwargs in (("msgpack", {"inline_below": 200}),
                         ("orbax", {"use_orbax": True})):
    local = checkpoints.write_t5x(t5_tiny.params, str(tmp_path / layout), 7,
                                  **kwargs)
    remote = checkpoints.write_t5x(t5_tiny.params, f"gs://models/t5x_{layout}",
                                   7, **kwargs)
    assert remote == f"gs://models/t5x_{layout}/checkpoint_7"
    from_bucket = checkpoints.load_model("t5x:" + remote, config="t5_tiny")
    from_disk = checkpoints.load_model("t5x:" + local, config="t5_tiny")
    _assert_same_params(from_bucket.params, from_disk.params)
    _assert_same_params(from_bucket.params, t5_tiny.params)


def _convert(*args, timeout=240):
  root = os.path.join(os.path.dirname(__file__), os.pardir)
  return subprocess.run(
      [sys.executable, os.path.join(root, "scripts", "convert_checkpoint.py"),
       *args], cwd=root, capture_output=True, text=True, timeout=timeout,
      env=dict(os.environ, JAX_PLATFORMS="cpu",
               PYTHONPATH=os.path.abspath(root)))


def test_convert_script_writes_into_a_bucket(gcs_emulator, t5_tiny,  # noqa: F811
                                             tmp_path):
  """convert_checkpoint --output=gs://... (our format and --format=hf)
  writes into the bucket, logging the upload, and the result loads back
  (both straight from the bucket) with the input's parameters."""
  source = checkpoints.save(t5_tiny, str(tmp_path / "source"))
  for fmt, spec in (("specdec", "gs://models/converted"),
                    ("hf", "gs://models/converted_hf")):
    # In this process (test_checkpoints.py launches the script).
    result = helpers.run_script("convert_checkpoint", "--input=" + source,
                                "--output=" + spec, "--format=" + fmt)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == spec
    # The upload is logged (file by file, or as each file starts).
    logged = "copied" if fmt == "specdec" else "uploading model.safetensors"
    assert logged in result.stderr and spec in result.stderr, result.stderr
    loaded = checkpoints.load_model(("hf:" if fmt == "hf" else "") + spec)
    _assert_same_params(loaded.params, t5_tiny.params)
  assert sorted(paths.list_files("gs://models/converted_hf")) == [
      "config.json", "model.safetensors"]


def test_sharded_hf_checkpoint_loads_from_a_bucket(gcs_emulator, t5_tiny,  # noqa: F811
                                                  tmp_path):
  """`hf:gs://...` with sharded safetensors (an index and two shards, as
  `save_pretrained` writes large models) loads the same parameters as the
  local directory; a shard the index lists but the bucket lacks, or no
  config.json, is a CheckpointNotFoundError naming the gs:// path."""
  from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top
  single = hf.save_t5(t5_tiny, str(tmp_path / "single"))
  tensors = load_file(os.path.join(single, "model.safetensors"))
  local = hf_layouts.write_sharded(tensors, os.path.join(single, "config.json"),
                         tmp_path / "sharded")
  paths.copy_tree(str(local), "gs://models/sharded_hf")
  from_bucket = checkpoints.load_model("hf:gs://models/sharded_hf")
  assert from_bucket.config == checkpoints.load_model("hf:" + str(local)).config
  _assert_same_params(from_bucket.params, t5_tiny.params)

  paths.copy_tree(str(local), "gs://models/sharded_hf_short")
  paths.remove("gs://models/sharded_hf_short/"
               "model-00002-of-00002.safetensors")
  with pytest.raises(checkpoints.CheckpointNotFoundError,
                     match="gs://models/sharded_hf_short.*index.json"):
    checkpoints.load_model("hf:gs://models/sharded_hf_short")
  with pytest.raises(checkpoints.CheckpointNotFoundError,
                     match="directory not found: 'gs://models/no_such_hf'"):
    checkpoints.load_model("hf:gs://models/no_such_hf")


def test_sharded_bfloat16_t5gemma_loads_from_a_bucket(gcs_emulator,  # noqa: F811
                                                      tmp_path):
  """`hf:gs://...` of a T5Gemma (bfloat16, sharded safetensors with an
  index) loads through the same I/O layer as T5's, equal to the local
  directory it was cut from."""
  from safetensors import safe_open  # pylint: disable=g-import-not-at-top
  source = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                        "testdata", "hf_t5gemma_draft")
  with safe_open(os.path.join(source, "model.safetensors"), "np") as f:
    tensors = {name: f.get_tensor(name) for name in f.keys()}
  local = hf_layouts.write_sharded(tensors, os.path.join(source, "config.json"),
                         tmp_path / "t5gemma_sharded")
  paths.copy_tree(str(local), "gs://models/t5gemma_sharded")
  from_bucket = checkpoints.load_model("hf:gs://models/t5gemma_sharded")
  expected = checkpoints.load_model("hf:" + source)
  assert from_bucket.config == expected.config
  _assert_same_params(from_bucket.params, expected.params)


def test_gemma3_as_the_hub_holds_it_loads_from_a_bucket_and_exports_to_one(
    gcs_emulator, tmp_path):  # noqa: F811
  """`hf:gs://...` of a Gemma 3 as the Hub holds 4B-27B (model_type gemma3
  with a vision tower, sharded, bfloat16, the text model under
  `language_model.model.`) loads the text model equal to the gemma3_text
  directory it was cut from; convert_checkpoint --format=hf writes it into
  a bucket as a gemma3_text directory that loads back the same."""
  source = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                        "testdata", "hf_gemma3_draft")
  local = hf_layouts.gemma3_as_on_the_hub(source, tmp_path / "gemma3_hub")
  paths.copy_tree(str(local), "gs://models/gemma3_hub")
  from_bucket = checkpoints.load_model("hf:gs://models/gemma3_hub")
  expected = checkpoints.load_model("hf:" + source)
  assert from_bucket.config == expected.config
  _assert_same_params(from_bucket.params, expected.params)
  result = helpers.run_script("convert_checkpoint",
                              "--input=hf:gs://models/gemma3_hub",
                              "--output=gs://models/gemma3_text",
                              "--format=hf")
  assert result.returncode == 0, result.stderr[-3000:]
  assert "uploading model.safetensors" in result.stderr, result.stderr
  back = checkpoints.load_model("hf:gs://models/gemma3_text")
  assert back.config == expected.config
  _assert_same_params(back.params, expected.params)


def test_qwen3_as_the_hub_holds_it_loads_from_a_bucket_and_exports_to_one(
    gcs_emulator, tmp_path):  # noqa: F811
  """`hf:gs://...` of a Qwen 3 as the Hub holds it (transformers 4's
  config.json, sharded, bfloat16, tokenizer.json and its configs beside the
  weights) loads the parameters of the local directory it was cut from and
  its tokenizer; `save_hf` writes it into a bucket, tokenizer included,
  and it loads back the same."""
  testdata = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                          "testdata")
  source = os.path.join(testdata, "hf_qwen3_draft")
  local = hf_layouts.llama_as_on_the_hub(source, tmp_path / "qwen3_hub",
                                      os.path.join(testdata, "hf_bpe_qwen3"))
  paths.copy_tree(str(local), "gs://models/qwen3_hub")
  from_bucket = checkpoints.load_model("hf:gs://models/qwen3_hub")
  expected = checkpoints.load_model("hf:" + source)
  assert from_bucket.config == expected.config
  _assert_same_params(from_bucket.params, expected.params)
  assert from_bucket.vocab.stop_ids == (402, 400)  # <|im_end|>, <|endoftext|>
  checkpoints.save_hf(from_bucket, "gs://models/qwen3_out")
  back = checkpoints.load_model("hf:gs://models/qwen3_out")
  assert back.config == expected.config
  _assert_same_params(back.params, expected.params)
  assert back.vocab == from_bucket.vocab


def test_convert_to_an_unreachable_bucket_fails_fast_and_says_why(
    t5_tiny, tmp_path):
  """With the endpoint closed (nothing listens), the script exits non-zero
  at once, before loading the input, with one message naming the bucket
  and the refused connection (not a traceback)."""
  with socket.socket() as s:
    s.bind(("localhost", 0))
    port = s.getsockname()[1]  # closed once the block ends
  source = checkpoints.save(t5_tiny, str(tmp_path / "source"))
  env = {"TENSORSTORE_GCS_HTTP_URL": f"http://localhost:{port}",
         "GOOGLE_AUTH_TOKEN_FOR_TESTING": "test", paths.TIMEOUT_ENV: "4"}
  with gcs_emulator_lib.environ(env):
    result = _convert("--input=" + source,
                      "--output=gs://unreachable-bucket/model", timeout=120)
  assert result.returncode != 0
  assert "Traceback" not in result.stderr, result.stderr[-3000:]
  assert "gs://unreachable-bucket" in result.stderr
  assert "connection refused (is the server running?" in result.stderr
