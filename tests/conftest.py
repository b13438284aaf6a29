"""Test session setup: the CPU platform, 8 simulated CPU devices for the
sharding tests, and LLVM's quicker optimization level for XLA:CPU.

The flag must be set before JAX initialises its backends, so it lives here,
which pytest imports before any test module. Single-device tests are
unaffected: they run on the first device.
"""

import io
import os
import random
import string

import pytest

# The CPU, without first trying a TPU: with libtpu installed (make test
# installs it for tests/test_tpu_compile.py, which compiles for TPUs
# without initialising one) every JAX start would try it, seconds each.
# Subprocesses the tests start inherit it.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

# Three XLA:CPU settings that make compiling quicker; compiling is most of
# the suite's time (docs/log/suite_timing.md has the measurements):
#
# - LLVM at -O0 instead of -O2 for XLA:CPU's kernels: 12% off the suite's
#   CPU time when adopted. Code generation only: the optimized HLO is the
#   same at every level. -O1 and -O2 fuse multiply-adds, -O0 does not, so
#   a model's logits can differ in the last bits (sampled tokens of the
#   demo models agreed on 32 rows; acceptance sums by ~1e-6).
# - XLA:CPU's older loop emitter instead of its MLIR fusion emitters
#   (`--xla_cpu_use_fusion_emitters=false`): 30% off the suite's summed
#   test time (3,046 s -> 2,121 s, 2026-12-07). This one changes the
#   optimized HLO's fusion (which ops share a kernel: the demo speculative
#   loop has 126 fusions instead of 162, and writes a cache slice with
#   dynamic-update-slice where the other path fuses a scatter); every op
#   computes what it did. The tests that read a CPU program's structure
#   (the in-place cache writes of tests/test_t5.py) compile it with the
#   users' setting, `helpers.USERS_XLA_CPU_OPTIONS`.
# - One LLVM module per program (`--xla_cpu_parallel_codegen_split_count=1`;
#   XLA splits it into 32 to generate code on many threads at once): on 2
#   cores shared by two workers the split costs more than the threads give.
#   test_exact_demo alone: 184 s -> 168 s, 231 s -> 208 s of CPU (an
#   AVX2-only AMD EPYC, 2026-12-08). Code generation only: the same
#   functions, in one module instead of several.
#
# Tests compare programs compiled in the same process, or with tolerances;
# users' programs keep XLA's defaults.
#
# And one JAX setting, for tracing and lowering: no Python traceback in
# each op's source location (`JAX_TRACEBACK_IN_LOCATIONS_LIMIT=0`; JAX
# records 100 frames an op). Locations are metadata for error messages and
# profiles: the computation is the same (the demo's sampled speculative
# loop compiles to the same 12,186 instructions by shape and opcode, and
# samples the same tokens); op names, which the plan's HLO reader uses,
# stay. test_adaptive and test_trees alone: 106 s -> 99 s (2026-12-07).
# Launched scripts inherit it.
os.environ.setdefault("JAX_TRACEBACK_IN_LOCATIONS_LIMIT", "0")
_FLAGS = ("--xla_force_host_platform_device_count=8",
          "--xla_backend_optimization_level=0",
          "--xla_cpu_use_fusion_emitters=false",
          "--xla_cpu_parallel_codegen_split_count=1")
for _flag in _FLAGS:
  if _flag.split("=")[0] not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " +
                               _flag).strip()


def pytest_configure(config):
  config.addinivalue_line(
      "markers", "quick: a fast test module, in `make test-quick`'s subset "
      "(CI runs every test)")


# Each module's summed test time in seconds (`--durations=0` of a
# `make test` on 2 cores, 2026-12-07, with both flags above), for the
# order below; a module not listed counts as 0 s. Rough
# numbers do: only the order matters.
MODULE_SECONDS = {
    "test_docs_commands.py": 295, "test_multihost.py": 191,
    "test_exact_demo.py": 184, "test_train_mesh.py": 142,
    "test_scripts.py": 107, "test_demo.py": 97, "test_tpu_compile.py": 94,
    "test_adaptive.py": 79, "test_t5gemma.py": 67,
    "test_experiment_script.py": 57, "test_gemma3.py": 54,
    "test_decoding.py": 53, "test_plan.py": 48, "test_experiment.py": 46,
    "test_model_contract.py": 42, "test_trees.py": 41,
    "test_train_resume.py": 36, "test_reproduce.py": 34, "test_train.py": 33,
    "test_llama.py": 33, "test_buckets.py": 31, "test_layering.py": 25,
    "test_checkpoints.py": 25, "test_sharding.py": 19,
    "test_checkpoints_hf.py": 18, "test_configs.py": 17,
    "test_t5gemma_rows.py": 17, "test_extending.py": 16, "test_t5.py": 16,
    "test_sampling.py": 15, "test_traced_numbers.py": 15,
    "test_reliability.py": 14, "test_gemma3_checkpoints.py": 14,
    "test_distill.py": 13, "test_composites.py": 12,
    "test_plan_training.py": 11, "test_t5gemma2.py": 11, "test_rules.py": 10,
    "test_bucket_checkpoints.py": 10, "test_gemma3_rows.py": 9,
    "test_llama_rows.py": 8, "test_experiment_lm.py": 8,
    "test_distill_sharded.py": 8, "test_negative_controls.py": 8,
    "test_theory_adaptive.py": 6, "test_quiet_import.py": 4,
    "test_tasks.py": 4, "test_prompt_lookup.py": 4,
}


def pytest_collection_modifyitems(config, items):
  """The slowest modules first, each keeping its tests' order.

  `make test` hands whole modules to two workers (`--dist loadfile
  --no-loadscope-reorder`) in this order, the next to whichever worker
  finishes first; long modules first and short ones last keep one worker
  from running a long module alone at the end."""
  del config
  items.sort(key=lambda item: -MODULE_SECONDS.get(item.path.name, 0))


@pytest.fixture(scope="session")
def tiny_vocab(tmp_path_factory):
  """Path of a 200-piece BPE SentencePiece model covering printable ASCII,
  with T5's special ids (pad 0, EOS 1, UNK 2, no BOS).

  The task prefixes and the words below are single pieces, so the lengths the
  tests rely on are easy to count: "translate English to German: the house is
  wonderful" is 9 pieces.
  """
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  rng = random.Random(0)
  words = ("the a house is wonderful cat sat on mat news today article das "
           "Haus ist wunderbar Katze auf der Matte").split()
  prefixes = ("translate English to German: ", "summarize: ", "")
  lines = [rng.choice(prefixes) + " ".join(
      rng.choice(words) for _ in range(rng.randint(3, 12))) for _ in range(300)]
  lines.append(" ".join(string.ascii_letters + string.digits +
                        string.punctuation))
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(lines), model_writer=model, vocab_size=200,
      model_type="bpe", pad_id=0, eos_id=1, unk_id=2, bos_id=-1,
      hard_vocab_limit=False, character_coverage=1.0, minloglevel=2)
  path = tmp_path_factory.mktemp("vocab") / "tiny.model"
  path.write_bytes(model.getvalue())
  return str(path)



@pytest.fixture(scope="session")
def gemma_vocab(tmp_path_factory):
  """Path of a 600-piece SentencePiece model shaped like Gemma's
  tokenizer.model, for the T5Gemma task settings.

  Gemma's special ids (pad 0, EOS 1, BOS 2, UNK 3), `<start_of_turn>` and
  `<end_of_turn>` as single user-defined pieces (ids 4 and 5 here, 106 and
  107 in Gemma's), identity normalization without a dummy prefix (newlines
  and spaces kept) and byte fallback. Trained in 0.1 s on the demo
  sentences shipped in the package (Gemma's own model is gated and 4 MB),
  so nothing outside the repository is read.
  """
  # pylint: disable=g-import-not-at-top
  from specdec_jax.experiments import tiny_checkpoints
  return tiny_checkpoints.gemma_like_vocab(str(
      tmp_path_factory.mktemp("gemma_vocab") / "tokenizer.model"))
