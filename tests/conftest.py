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

# LLVM at -O0 instead of -O2 for XLA:CPU's kernels: compiling is most of
# the suite's time, and this takes 12% off its CPU time (1,234 s -> 1,080 s
# of test time, 11m06s -> 9m46s of pytest on 2 cores, docs/log/
# suite_timing.md); the compiled code runs slower, which the few tests
# that run much (the 250-row samples of tests/test_exact_demo.py) pay for
# in part. It is code generation only: the optimized HLO is the same at
# every level (XLA's passes do not read it), so every program a test
# checks is the one users run. Without fast math at any level the numbers
# are IEEE float32 either way; -O1 and -O2 fuse multiply-adds, -O0 does
# not, so a model's logits can differ in the last bits (sampled tokens of
# the demo models agreed on 32 rows; acceptance sums by ~1e-6). Tests compare
# programs compiled in the same process, or with tolerances.
_FLAGS = ("--xla_force_host_platform_device_count=8",
          "--xla_backend_optimization_level=0")
for _flag in _FLAGS:
  if _flag.split("=")[0] not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " +
                               _flag).strip()


def pytest_configure(config):
  config.addinivalue_line(
      "markers", "quick: a fast test module, in `make test-quick`'s subset "
      "(CI runs every test)")


# Each module's summed test time in seconds (`--durations=0` of a
# `make test` on 2 cores, 2026-12-07, less what that day's merges took
# out), for the order below; a module not listed counts as 0 s. Rough
# numbers do: only the order matters.
MODULE_SECONDS = {
    "test_exact_demo.py": 208, "test_multihost.py": 200,
    "test_docs_commands.py": 185, "test_train_mesh.py": 130,
    "test_experiment.py": 80,
    "test_experiment_script.py": 50, "test_tpu_compile.py": 112,
    "test_t5gemma.py": 112, "test_adaptive.py": 112, "test_decoding.py": 107,
    "test_scripts.py": 80, "test_trees.py": 71, "test_plan.py": 70,
    "test_gemma3.py": 70, "test_demo.py": 67, "test_model_contract.py": 65,
    "test_llama.py": 60, "test_train_resume.py": 56, "test_train.py": 50,
    "test_reproduce.py": 40, "test_layering.py": 38, "test_buckets.py": 37,
    "test_sharding.py": 32, "test_t5gemma_rows.py": 31,
    "test_extending.py": 30, "test_checkpoints.py": 30,
    "test_distill.py": 29, "test_checkpoints_hf.py": 29,
    "test_sampling.py": 23, "test_t5.py": 23, "test_traced_numbers.py": 23,
    "test_reliability.py": 21, "test_rules.py": 20, "test_composites.py": 19,
    "test_plan_training.py": 19, "test_gemma3_rows.py": 17,
    "test_t5gemma2.py": 17, "test_configs.py": 17,
    "test_bucket_checkpoints.py": 16, "test_llama_rows.py": 16,
    "test_gemma3_checkpoints.py": 16, "test_theory_adaptive.py": 11,
    "test_negative_controls.py": 11, "test_experiment_lm.py": 11,
    "test_prompt_lookup.py": 10, "test_distill_sharded.py": 8,
    "test_iterate.py": 7, "test_footprint.py": 7, "test_step_timers.py": 6,
    "test_quiet_import.py": 5, "test_llama_checkpoints.py": 5,
    "test_tasks.py": 4, "test_teacher.py": 4,
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
