"""Tests for specdec_jax.checkpoints: T5X format, our format, load_model.

Everything runs on tiny models (`t5_tiny`, `gpt_tiny`) in temporary
directories; nothing needs the network or /work/shared.
"""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import msgpack
import numpy as np
import pytest

from specdec_jax import checkpoints
from specdec_jax.checkpoints import hf
from specdec_jax.checkpoints import native
from specdec_jax.checkpoints import t5x
from specdec_jax import sharding
from specdec_jax.decoding.protocol import Model
from specdec_jax.models import registry
from tests import helpers

GIN_DIR = os.path.join(os.path.dirname(__file__), os.pardir, "configs",
                       "models")
HF_DIR = os.path.join(os.path.dirname(__file__), "testdata", "hf_t5_v1_1")
INPUTS = np.array([[5, 9, 3, 1, 0, 0], [7, 1, 0, 0, 0, 0]], np.int32)
TARGETS = np.array([[0, 4, 8, 2], [0, 6, 1, 0]], np.int32)


def _logits(model: Model) -> np.ndarray:
  """Teacher-forced float32 logits of a T5 or GPT model."""
  fwd = jax.jit(type(model.definition).forward, static_argnums=0)
  if isinstance(model.config, registry.T5Config):
    return np.asarray(fwd(model.definition, model.params, INPUTS, TARGETS))
  return np.asarray(fwd(model.definition, model.params, INPUTS))


def _assert_trees_equal(a, b):
  flat_a = t5x.flatten_tree(a)
  flat_b = t5x.flatten_tree(b)
  assert sorted(flat_a) == sorted(flat_b)
  for name in flat_a:
    x, y = np.asarray(flat_a[name]), np.asarray(flat_b[name])
    assert x.dtype == y.dtype, name
    np.testing.assert_array_equal(x, y, err_msg=name)


@pytest.fixture(scope="module")
def tiny():
  """The seeded random t5_tiny model (host numpy parameters)."""
  model = checkpoints.load_model("t5_tiny", seed=3)
  return Model(model.definition, jax.tree.map(np.asarray, model.params))


@pytest.fixture(scope="module")
def t5x_dir(tiny, tmp_path_factory):
  """A T5X checkpoint of `tiny`: norms inline, the rest in tensorstore."""
  return checkpoints.write_t5x(
      tiny.params, str(tmp_path_factory.mktemp("t5x")), 100, inline_below=200,
      param_states={"encoder": {"encoder_norm": {"scale": {"v": np.ones(32)}}}})


def test_t5x_round_trip_float32(tiny, t5x_dir):
  """write_t5x -> read_t5x returns exactly the original float32 parameters,
  inline and tensorstore leaves alike, and no optimizer state."""
  assert os.path.basename(t5x_dir) == "checkpoint_100"
  _assert_trees_equal(checkpoints.read_t5x(t5x_dir), tiny.params)
  # The msgpack file itself is also accepted as the path.
  _assert_trees_equal(checkpoints.read_t5x(os.path.join(t5x_dir, "checkpoint")),
                      tiny.params)


def test_t5x_round_trip_bfloat16(tiny, tmp_path):
  """bfloat16 arrays (inline and tensorstore) read back as the same bfloat16
  values, and load_model casts them exactly to the config's float32."""
  params = jax.tree.map(lambda x: np.asarray(x, jnp.bfloat16), tiny.params)
  path = checkpoints.write_t5x(params, str(tmp_path), 7, inline_below=200)
  _assert_trees_equal(checkpoints.read_t5x(path), params)
  model = checkpoints.load_model("t5x:" + path, config="t5_tiny")
  _assert_trees_equal(model.params,
                      jax.tree.map(lambda x: x.astype(np.float32), params))


def test_t5x_msgpack_has_t5x_structure(t5x_dir):
  """The msgpack file has T5X's version-3 structure: {'version': 3,
  'optimizer': {'target', 'state': {'step', 'param_states'}}}, tensorstore
  leaves as zarr spec dicts whose kvstore path is relative and names the
  parameter with dots, inline leaves as flax's ndarray extension (code 1)."""
  with open(os.path.join(t5x_dir, "checkpoint"), "rb") as f:
    contents = msgpack.unpackb(f.read(), raw=False)
  assert set(contents) == {"version", "optimizer"}
  assert contents["version"] == 3
  assert set(contents["optimizer"]) == {"target", "state"}
  state = contents["optimizer"]["state"]
  assert set(state) == {"step", "param_states"}
  assert isinstance(state["step"], msgpack.ExtType)  # np.int32 scalar
  target = contents["optimizer"]["target"]
  spec = target["encoder"]["layers_0"]["attention"]["query"]["kernel"]
  assert spec["driver"] == "zarr" and spec["dtype"] == "float32"
  assert spec["kvstore"]["driver"] == "file"
  name = "target.encoder.layers_0.attention.query.kernel"
  assert spec["kvstore"]["path"].rstrip("/") == name
  assert spec["metadata"]["shape"] == [32, 32]
  assert spec["metadata"]["compressor"]["id"] == "gzip"
  assert os.path.isfile(os.path.join(t5x_dir, name, ".zarray"))
  inline = target["encoder"]["encoder_norm"]["scale"]
  assert isinstance(inline, msgpack.ExtType) and inline.code == 1
  states_spec = state["param_states"]["encoder"]["encoder_norm"]["scale"]["v"]
  assert states_spec["kvstore"]["path"].rstrip("/") == (
      "state.param_states.encoder.encoder_norm.scale.v")


def test_t5x_multi_chunk_arrays(tiny, tmp_path, monkeypatch):
  """Arrays split over several zarr chunks read back exactly."""
  # Patched where write_t5x reads it; checkpoints only re-exports it.
  monkeypatch.setattr(t5x, "_CHUNK_BYTES", 1024)
  path = checkpoints.write_t5x(tiny.params, str(tmp_path), 1)
  emb = os.path.join(path, "target.token_embedder.embedding")
  assert len([f for f in os.listdir(emb) if not f.startswith(".")]) > 1
  _assert_trees_equal(checkpoints.read_t5x(path), tiny.params)


def test_t5x_orbax_layout(tiny, tmp_path):
  """Newer T5X's orbax layout (checkpoint_<step>/state/) reads back exactly,
  through read_t5x and load_model."""
  path = checkpoints.write_t5x(tiny.params, str(tmp_path), 5, use_orbax=True)
  assert os.path.isdir(os.path.join(path, "state"))
  _assert_trees_equal(checkpoints.read_t5x(path), tiny.params)
  model = checkpoints.load_model("t5x:" + path, config="t5_tiny")
  np.testing.assert_array_equal(_logits(model), _logits(tiny))


def test_save_restore_round_trip(tiny, tmp_path):
  """save -> restore returns the same parameters and config; config.json
  names the family and the config fields."""
  directory = checkpoints.save(tiny, str(tmp_path / "ours"))
  with open(os.path.join(directory, "config.json")) as f:
    manifest = json.load(f)
  assert manifest["family"] == "t5"
  assert manifest["config"]["emb_dim"] == 32
  restored = checkpoints.restore(directory)
  assert restored.config == tiny.config
  _assert_trees_equal(jax.tree.map(np.asarray, restored.params), tiny.params)
  with pytest.raises(FileExistsError, match="overwrite=True"):
    checkpoints.save(tiny, directory)


def test_save_restore_gpt_and_vocab(tmp_path, monkeypatch):
  """A decoder-only model round-trips too, with its vocabulary file copied
  into the directory and handed to the restored Model."""
  model = checkpoints.load_model("gpt_tiny", seed=1)
  vocab = tmp_path / "spm.model"
  vocab.write_bytes(b"not really sentencepiece")
  directory = checkpoints.save(model, str(tmp_path / "gpt"), vocab=str(vocab))
  assert (tmp_path / "gpt" / "vocab.model").read_bytes() == vocab.read_bytes()
  monkeypatch.setattr(native, "_make_vocab", lambda path, extra_ids=0: ("vocab", path))
  restored = checkpoints.load_model(directory)
  assert restored.vocab == ("vocab", os.path.join(directory, "vocab.model"))
  assert restored.config == model.config
  np.testing.assert_array_equal(_logits(restored), _logits(model))


def test_random_init_is_seeded():
  """A bare config name gives seeded random parameters: same seed, same
  parameters; another seed, others; dtype overrides the compute dtype."""
  a = checkpoints.load_model("t5_tiny", seed=0)
  b = checkpoints.load_model("t5_tiny", seed=0)
  c = checkpoints.load_model("t5_tiny", seed=1, dtype="bfloat16")
  _assert_trees_equal(a.params, b.params)
  assert not np.array_equal(a.params["token_embedder"]["embedding"],
                            c.params["token_embedder"]["embedding"])
  assert c.config.dtype == "bfloat16" and a.config.dtype == "float32"


@pytest.mark.parametrize("config", [
    "t5_tiny",
    os.path.join(GIN_DIR, "t5_tiny.gin"),
    {"vocab_size": 128, "emb_dim": 32, "num_heads": 4,
     "num_encoder_layers": 2, "num_decoder_layers": 2, "head_dim": 8,
     "mlp_dim": 64, "mlp_activations": ("relu",),
     "logits_via_embedding": True, "dropout_rate": 0.1,
     "dtype": jnp.float32, "max_input_len": 64},
], ids=["name", "gin", "dict"])
def test_load_t5x_with_config(tiny, t5x_dir, config):
  """t5x: with the config as a name, a gin file or a dict of T5X fields
  loads the same model, which computes the original logits."""
  model = checkpoints.load_model("t5x:" + t5x_dir, config=config)
  assert model.config == tiny.config
  np.testing.assert_array_equal(_logits(model), _logits(tiny))


def test_load_ours_and_demo(tiny, tmp_path, monkeypatch):
  """A directory of ours and a demo:NAME spec both load the saved model."""
  directory = checkpoints.save(tiny, str(tmp_path / "demo" / "tiny"))
  np.testing.assert_array_equal(
      _logits(checkpoints.load_model(directory)), _logits(tiny))
  monkeypatch.setattr(native, "DEMO_DIR", str(tmp_path / "demo"))
  np.testing.assert_array_equal(
      _logits(checkpoints.load_model("demo:tiny")), _logits(tiny))
  with pytest.raises(FileNotFoundError,
                     match="demo model 'nope'.*shipped: tiny"):
    checkpoints.load_model("demo:nope")


def test_load_hf():
  """hf:DIR gives the parameters of hf.load_t5, on devices."""
  assert os.path.isdir(HF_DIR), "committed fixture tests/testdata/hf_t5_v1_1"
  config, params = hf.load_t5(HF_DIR)
  model = checkpoints.load_model("hf:" + HF_DIR)
  assert model.config == config
  _assert_trees_equal(jax.tree.map(np.asarray, model.params), params)
  assert isinstance(model.params["token_embedder"]["embedding"], jax.Array)


def test_mesh_places_named_shardings(tiny, t5x_dir, tmp_path):
  """With a 1x1 mesh every parameter is a jax.Array with a NamedSharding on
  that mesh, whichever way it was loaded, and the logits are unchanged."""
  mesh = sharding.make_mesh(1, 1)
  ours = checkpoints.save(tiny, str(tmp_path / "ours"))
  for spec, config in [("t5x:" + t5x_dir, "t5_tiny"), (ours, None),
                       ("t5_tiny", None)]:
    model = checkpoints.load_model(spec, config=config, mesh=mesh)
    for leaf in jax.tree.leaves(model.params):
      assert isinstance(leaf.sharding, jax.sharding.NamedSharding), spec
      assert leaf.sharding.mesh == mesh
    if spec != "t5_tiny":
      np.testing.assert_array_equal(_logits(model), _logits(tiny))


# --- Errors a user can cause, each naming the problem. ---


@pytest.mark.parametrize("spec, config, error, match", [
    ("t5x:/no/such/checkpoint_1", "t5_tiny", FileNotFoundError,
     "T5X checkpoint directory not found"),
    ("/no/such/dir", None, FileNotFoundError,
     "checkpoint directory not found"),
    ("hf:/no/such/dir", None, FileNotFoundError, "not found"),
    ("s3:bucket/x", None, ValueError, "unknown spec prefix 's3:'"),
    ("t5_tny", None, ValueError, "unknown config name 't5_tny'"),
    ("t5x:/x", None, ValueError, "pass config="),
    ("t5_tiny", "t5_tiny", ValueError, "only used with t5x"),
])
def test_spec_errors(spec, config, error, match):
  """Bad specs raise before loading anything, naming the problem."""
  with pytest.raises(error, match=match):
    checkpoints.load_model(spec, config=config)


def test_t5x_config_errors(t5x_dir, tmp_path):
  """Unknown config names, unknown dict fields and gin files without one
  config are rejected with the reason."""
  with pytest.raises(ValueError, match="unknown model config 't5_huge'"):
    checkpoints.load_model("t5x:" + t5x_dir, config="t5_huge")
  with pytest.raises(ValueError,
                     match=r"unknown T5Config field\(s\) \['emb'\]"):
    checkpoints.load_model("t5x:" + t5x_dir,
                           config={"vocab_size": 128, "emb": 3})
  gin_file = tmp_path / "empty.gin"
  gin_file.write_text("x = 1\n")
  with pytest.raises(ValueError, match="exactly one T5Config"):
    checkpoints.load_model("t5x:" + t5x_dir, config=str(gin_file))
  with pytest.raises(FileNotFoundError, match="gin config file not found"):
    checkpoints.load_model("t5x:" + t5x_dir, config="/no/such.gin")


def test_t5x_not_a_checkpoint(tmp_path):
  """A directory without a checkpoint says what it expected and lists the
  checkpoint_<step> directories it found."""
  (tmp_path / "checkpoint_10").mkdir()
  with pytest.raises(FileNotFoundError, match="checkpoint_10: pass one"):
    checkpoints.read_t5x(str(tmp_path))


def _t5x_with(tiny, path, edit):
  params = jax.tree.map(np.copy, tiny.params)
  edit(params)
  return checkpoints.write_t5x(params, str(path), 1)


def test_parameter_errors(tiny, tmp_path):
  """A wrong shape, a missing and an unexpected parameter are each named
  (with expected vs found shape) before any array is read."""
  def wrong_shape(p):
    p["encoder"]["layers_0"]["attention"]["query"]["kernel"] = np.zeros(
        (32, 16), np.float32)

  def missing(p):
    del p["decoder"]["decoder_norm"]

  def unexpected(p):
    p["decoder"]["logits_dense"] = {"kernel": np.zeros((32, 128), np.float32)}

  cases = [
      (wrong_shape, checkpoints.ParameterShapeError,
       r"encoder/layers_0/attention/query/kernel .* has shape \(32, 16\), "
       r"but the config expects \(32, 32\)"),
      (missing, checkpoints.MissingParameterError,
       "missing .*decoder/decoder_norm/scale"),
      (unexpected, checkpoints.UnexpectedParameterError,
       "unexpected .*decoder/logits_dense/kernel"),
  ]
  for i, (edit, error, match) in enumerate(cases):
    path = _t5x_with(tiny, tmp_path / str(i), edit)
    with pytest.raises(error, match=match):
      checkpoints.load_model("t5x:" + path, config="t5_tiny")
  with pytest.raises(checkpoints.MissingParameterError, match="to save"):
    checkpoints.save(jax.tree.map(np.copy, tiny.params), str(tmp_path / "s"),
                     config=registry.get_config("t5_1_1_tiny"))


def test_t5x_style_gin_with_macros(tiny, t5x_dir, tmp_path):
  """A T5X-style gin file (unscoped `network.T5Config.x = %MACRO` bindings,
  dtype as a constant, dropout ignored) gives the same config."""
  gin_file = tmp_path / "t5x_style.gin"
  gin_file.write_text(
      "from __gin__ import dynamic_registration\n"
      "NUM_EMBEDDINGS = 128\n"
      "network.T5Config.vocab_size = %NUM_EMBEDDINGS\n"
      "network.T5Config.emb_dim = 32\n"
      "network.T5Config.num_heads = 4\n"
      "network.T5Config.num_encoder_layers = 2\n"
      "network.T5Config.num_decoder_layers = 2\n"
      "network.T5Config.head_dim = 8\n"
      "network.T5Config.mlp_dim = 64\n"
      "network.T5Config.mlp_activations = ('relu',)\n"
      "network.T5Config.dropout_rate = 0.0\n"
      "network.T5Config.logits_via_embedding = True\n"
      "network.T5Config.max_input_len = 64\n")
  model = checkpoints.load_model("t5x:" + t5x_dir, config=str(gin_file))
  assert model.config == tiny.config


def test_convert_script(tiny, t5x_dir, tmp_path):
  """scripts/convert_checkpoint.py turns a T5X checkpoint into our format,
  casting to --param_dtype; the result loads with the same (cast) values."""
  root = os.path.join(os.path.dirname(__file__), os.pardir)
  output = str(tmp_path / "converted")
  subprocess.run(
      [sys.executable, os.path.join(root, "scripts", "convert_checkpoint.py"),
       "--input=t5x:" + t5x_dir, "--config=t5_tiny",
       "--param_dtype=bfloat16", "--output=" + output],
      check=True, cwd=root, capture_output=True,
      # PYTHONPATH: the script must not depend on how the package is installed.
      env=dict(os.environ, JAX_PLATFORMS="cpu",
               PYTHONPATH=os.path.abspath(root)))
  model = checkpoints.load_model(output)
  assert model.config.param_dtype == "bfloat16"
  _assert_trees_equal(
      jax.tree.map(np.asarray, model.params),
      jax.tree.map(lambda x: x.astype(jnp.bfloat16), tiny.params))


def test_convert_script_to_hugging_face_format(tiny, t5x_dir, tmp_path):
  """--format=hf writes a Hugging Face T5 directory (config.json +
  model.safetensors, no pickle) that loads back as the same model."""
  output = str(tmp_path / "hf")
  # In this process (test_convert_script launches the script).
  result = helpers.run_script("convert_checkpoint", "--input=t5x:" + t5x_dir,
                              "--config=t5_tiny", "--format=hf",
                              "--output=" + output)
  assert result.returncode == 0, result.stderr[-3000:]
  assert sorted(os.listdir(output)) == ["config.json", "model.safetensors"]
  model = checkpoints.load_model("hf:" + output)
  assert model.config.num_decoder_layers == tiny.config.num_decoder_layers
  _assert_trees_equal(jax.tree.map(np.asarray, model.params),
                      jax.tree.map(np.asarray, tiny.params))


# Heavy optional dependencies; a GPU benchmark machine has only jax, flax
# and numpy, so the core must not import these when it is imported.
_LAZY_MODULES = ("orbax", "tensorstore", "gin", "tensorflow", "seqio",
                 "torch", "safetensors")


def test_import_needs_only_jax_flax_numpy(tmp_path):
  """Importing specdec_jax and specdec_jax.checkpoints (and the modules it
  is split into) imports none of orbax, tensorstore, gin, tensorflow,
  seqio, torch or safetensors: each is imported inside the function that
  uses it. Checked in a fresh interpreter, as pytest has imported them;
  the negative control sets up the gs:// client, which must bring
  tensorstore in (a local read must not)."""
  root = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir))
  code = (
      "import sys\n"
      "import specdec_jax\n"
      "import specdec_jax.checkpoints\n"
      "import specdec_jax.checkpoints.t5x\n"
      "import specdec_jax.checkpoints.configs\n"
      f"heavy = {_LAZY_MODULES!r}\n"
      "def imported():\n"
      "  return [m for m in heavy if any(k == m or k.startswith(m + '.')\n"
      "                                  for k in sys.modules)]\n"
      "print(imported())\n"
      "specdec_jax.checkpoints.t5x.read_bytes(sys.argv[1])\n"
      # A local read needs no tensorstore; the gs:// client's setup does.
      "assert not imported()\n"
      "specdec_jax.infra.paths._context(1.0)\n"
      "print(imported())\n")
  result = subprocess.run(
      [sys.executable, "-c", code, str(tmp_path / "absent")], check=True,
      cwd=root, capture_output=True, text=True,
      env=dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=root))
  lines = result.stdout.split()
  assert lines == ["[]", "['tensorstore']"], result.stdout + result.stderr


# --- Issue 18: damaged files and bad values are named with the fix. ---


def _largest_file(directory):
  files = [os.path.join(root, name) for root, _, names in os.walk(directory)
           for name in names]
  return max(files, key=os.path.getsize)


def test_damaged_files_name_the_file_and_the_fix(tiny, tmp_path):
  """Finding 8: a truncated model.safetensors gave safetensors' header
  error without the path; our format with a damaged data file gave a bare
  Exception 21 frames deep. Both are a CheckpointError naming the file or
  directory and what to do, raised from our frame (no chained cause)."""
  weights = os.path.join(hf.save_t5(tiny, str(tmp_path / "hf")),
                         hf.SAFETENSORS_FILE)
  data = open(weights, "rb").read()
  for cut in (len(data) // 2, 5):
    with open(weights, "wb") as f:
      f.write(data[:cut])
    with pytest.raises(checkpoints.CheckpointError,
                       match=f"{weights} is damaged or truncated.*"
                       "re-download it, or re-export") as info:
      checkpoints.load_model("hf:" + str(tmp_path / "hf"))
    assert info.value.__cause__ is None and info.value.__suppress_context__
  ours = checkpoints.save(tiny, str(tmp_path / "ours"))
  data_file = _largest_file(os.path.join(ours, native.PARAMS_DIR))
  with open(data_file, "r+b") as f:
    f.truncate(os.path.getsize(data_file) // 2)
  with pytest.raises(checkpoints.CheckpointError,
                     match=f"checkpoint {ours}: the parameter files under "
                     f"{ours}/params are damaged.*re-save") as info:
    checkpoints.load_model(ours)
  assert info.value.__suppress_context__


def test_non_finite_parameters_are_refused_unless_asked(tiny, tmp_path):
  """Finding 4: load_model checks parameters for NaN/inf by default, naming
  the tensors; check_finite=False loads them anyway (for speed)."""
  params = jax.tree.map(np.array, tiny.params)
  params["token_embedder"]["embedding"][3, 0] = np.inf
  path = checkpoints.save(Model(tiny.definition, params),
                          str(tmp_path / "bad"))
  with pytest.raises(checkpoints.NonFiniteParameterError,
                     match="NaN or inf in 1 tensor.*token_embedder/embedding"
                     ".*check_finite=False"):
    checkpoints.load_model(path)
  loaded = checkpoints.load_model(path, check_finite=False)
  assert np.isinf(np.asarray(loaded.params["token_embedder"]["embedding"])
                  ).sum() == 1
  checkpoints.load_model(checkpoints.save(tiny, str(tmp_path / "good")))


def test_demo_specs_take_shipped_names_only(tiny, tmp_path, monkeypatch):
  """Finding 9: demo:../demo_models/target was accepted (a path outside the
  shipped models). Only the names listed in the demo directory load."""
  demo = tmp_path / "demo"
  checkpoints.save(tiny, str(demo / "tiny"))
  checkpoints.save(tiny, str(tmp_path / "outside"))
  monkeypatch.setattr(native, "DEMO_DIR", str(demo))
  for spec in ("demo:../outside", "demo:tiny/../../outside", "demo:."):
    with pytest.raises(FileNotFoundError, match="is not shipped.*shipped: "
                       "tiny"):
      checkpoints.load_model(spec)
  checkpoints.load_model("demo:tiny")


def test_hf_export_is_readable_like_every_other_file(tiny, tmp_path):
  """Finding 9: model.safetensors was written 0600 (owner only). It gets
  0666 less the umask, like config.json."""
  umask = os.umask(0o022)
  try:
    out = hf.save_t5(tiny, str(tmp_path / "hf"))
  finally:
    os.umask(umask)
  for name in (hf.SAFETENSORS_FILE, "config.json"):
    assert os.stat(os.path.join(out, name)).st_mode & 0o777 == 0o644, name
