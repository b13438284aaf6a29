"""The shipped gin configs (configs/experiments, configs/training) parse and
describe what their file names say; only placeholders fail validation."""

import dataclasses
import os
import re

import gin
import pytest

from specdec_jax.data import tasks
from specdec_jax.experiments import fit
from specdec_jax.infra import chips
from specdec_jax.experiments import experiment
from specdec_jax.launch import gin_flags
from specdec_jax.tables import reproduce
from specdec_jax.models import registry
from specdec_jax.training import train

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_CONFIGS = os.path.join(REPO, "configs")


def _parse(gin_file):
  gin.clear_config()
  gin_flags.parse([gin_file], [])


def test_every_experiment_config_parses_and_validates_but_placeholders():
  """Each row config under configs/experiments parses into an
  ExperimentConfig whose temperature matches its file name; the only
  validation problems are the YOUR_ placeholders. The six GPT-like rows run
  lm1b on the 97M target ('gpt_97m') with the 8k vocabulary macro, and the
  shared files are left out of reproduce_tables' globs. (The demo rows,
  which need no placeholder, are checked by test_demo_rows_validate; the
  tiny Gemma 3 rows read models trained in workdir/, docs/gemma3.md.)"""
  files = [f for f in reproduce.experiment_files(["experiments/*/*.gin"],
                                                 _CONFIGS)
           if os.path.basename(os.path.dirname(f)) not in ("demo",
                                                           "gemma3_tiny")]
  lm1b = [f for f in files if os.path.basename(f).startswith("lm1b_")]
  assert sorted(os.path.basename(f) for f in lm1b) == sorted(
      f"lm1b_{d}_t{t}.gin" for d in ("unigram", "bigram", "gpt_6m")
      for t in (0, 1))
  assert not any(reproduce.is_shared_config(f) for f in files)
  # table2, table3, beyond, t5gemma, gemma3, llama3, qwen3, qwen2_5,
  # t5gemma2
  assert len(files) == 12 + 16 + 5 + 16 + 18 + 18 + 18 + 12 + 8
  try:
    for path in files:
      _parse(path)
      config = gin.get_configurable(experiment.ExperimentConfig)()
      stem = os.path.splitext(os.path.basename(path))[0]
      assert config.temperature == float(stem[-1]), path
      with pytest.raises(experiment.ConfigError) as info:
        experiment.validate(config)
      # One problem on the message's line, several a line each below it.
      problems = (str(info.value).splitlines()[1:] or
                  [str(info.value).split(": ", 1)[1]])
      assert problems and all("placeholder" in p for p in problems), path
      if path in lm1b:
        assert (config.task, config.split, config.target_config) == (
            "lm1b", "test", "gpt_97m")
        assert config.max_decode_len == 128 and config.max_input_len == 64
        assert "YOUR_" in tasks.current_config().vocab_path
        assert reproduce._draft_key(dataclasses.asdict(config)) == stem[5:-3]
  finally:
    gin.clear_config()


def test_demo_rows_validate():
  """The demo's stand-alone rows parse and validate as they are (they point
  at files shipped in the package) and differ only in their draft, so
  reproduce_tables runs them on one shared baseline."""
  files = reproduce.experiment_files(["experiments/demo/*.gin"], _CONFIGS)
  assert [os.path.basename(f) for f in files] == [
      "ende_sentences_draft_base_t0.gin", "ende_sentences_draft_small_t0.gin"]
  try:
    rows = reproduce.parse_rows(files, "/tmp/unused")
  finally:
    gin.clear_config()
  for row in rows:
    experiment.validate(row.config)
    assert os.path.exists(row.task_config.resolve(
        row.task_config.wmt_ende_files["test"] + ".en"))
  assert [len(g) for g in reproduce.share_groups(rows)] == [2]


def _shipped_gin_files():
  """Every gin file under configs/, but T5X's own (configs/t5x/ runs under
  T5X, which is not installable here: test_t5x_* below read them)."""
  out = []
  for folder, _, names in os.walk(_CONFIGS):
    if os.path.relpath(folder, _CONFIGS).split(os.sep)[0] == "t5x":
      continue
    out += [os.path.relpath(os.path.join(folder, n), _CONFIGS)
            for n in names if n.endswith(".gin")]
  return sorted(out)


def test_every_shipped_gin_file_parses():
  """Every gin file a user may pass (and every file they include) parses as
  the scripts parse it, and each training config gives a TrainConfig that
  passes its checks: a config no test reads cannot rot unnoticed."""
  files = _shipped_gin_files()
  assert len(files) > 100
  included = set()
  for path in files:
    with open(os.path.join(_CONFIGS, path)) as f:
      included |= set(re.findall(r"^include '([^']+)'", f.read(), re.M))
  # A recipe another file includes (demo_common.gin) is not run alone.
  runnable = [f for f in files if f.startswith("training" + os.sep)
              and f not in included]
  assert len(runnable) >= 15
  try:
    for path in files:
      _parse(path)
      if path in runnable:
        config = gin.get_configurable(train.TrainConfig)()
        try:
          dataclasses.replace(config, workdir="w").check()
        except ValueError as e:
          raise AssertionError(f"{path}: {e}") from None
  finally:
    gin.clear_config()


@pytest.mark.parametrize("name,model", [("lm1b_gpt_97m", "gpt_97m"),
                                        ("lm1b_gpt_6m", "gpt_6m")])
def test_lm1b_training_configs(name, model):
  """The GPT-like training configs parse and pass TrainConfig.check: lm1b,
  the paper's architecture, an 8k vocabulary that fits vocab_size 8192 with
  the 100 extra ids, and length buckets that hold a whole prompt +
  continuation row (64 + 128 tokens)."""
  try:
    _parse(os.path.join(_CONFIGS, "training", f"{name}.gin"))
    config = gin.get_configurable(train.TrainConfig)()
  finally:
    gin.clear_config()
  dataclasses.replace(config, workdir="w").check()
  assert (config.task, config.model, config.eval_split) == ("lm1b", model,
                                                            "test")
  assert config.model_config() == registry.get_config(model)
  assert 8000 + tasks.NUM_EXTRA_IDS <= config.model_config().vocab_size
  assert config.max_lengths() == (64, 128)
  assert max(config.length_buckets) >= sum(config.max_lengths())
  assert config.bleu_examples == 0


def test_table2_rows_on_the_public_t5_v1_0_checkpoints():
  """One extra gin file puts every Table 2 row on the public original T5
  checkpoints: the row then validates with no placeholder left, its target
  is t5_11B and its draft the row's size, both T5 v1.0 architectures read
  from gs://t5-data, and the pair fits one TPU v4 chip in bfloat16 (shape
  check, nothing loaded)."""
  files = reproduce.experiment_files(["experiments/table2/*.gin"], _CONFIGS)
  assert len(files) == 12
  v1_0 = os.path.join(_CONFIGS, "experiments/table2/checkpoints_t5_v1_0.gin")
  try:
    for path in files:
      _parse(path)
      gin.parse_config_file(v1_0)
      config = gin.get_configurable(experiment.ExperimentConfig)()
      experiment.validate(config)
      size = os.path.basename(path).split("_")[1]
      assert config.target_config == "t5_11b"
      assert config.draft_config == f"t5_{size}"
      assert config.target.startswith(
          "t5x:gs://t5-data/pretrained_models/t5x/t5_11B/checkpoint_")
      assert f"/t5x/t5_{size}/checkpoint_" in config.draft
      fit.check_fits(config, chips.get_chip("tpu_v4"))
      gin.clear_config()
  finally:
    gin.clear_config()


def test_t5x_fine_tuning_configs_cover_the_papers_models():
  """configs/t5x has a T5X fine-tuning config for each of the paper's
  models (T5 v1.1 small/base/large/XXL on EnDe and CNN/DM): each starts
  from the public v1.1 checkpoint of its size, includes T5X's model gin of
  that size and the task's shared file, names its slice, and ends with the
  flag pointing our Table 2 macro at its last checkpoint. (They are T5X's
  gin, read by t5x.train, so only their text is checked here.)"""
  folder = os.path.join(_CONFIGS, "t5x")
  macros = open(os.path.join(_CONFIGS, "experiments/table2/checkpoints.gin")
                ).read()
  for task, mixture in (("ende", "specdec_wmt14_ende"),
                        ("cnndm", "specdec_cnn_dailymail")):
    shared = open(os.path.join(folder, f"{task}_finetune.gin")).read()
    assert f'MIXTURE_OR_TASK_NAME = "{mixture}"' in shared
    assert 'include "t5x/configs/runs/finetune.gin"' in shared
    for size in ("small", "base", "large", "xxl"):
      text = open(os.path.join(
          folder, f"t5_1_1_{size}_{task}_finetune.gin")).read()
      assert (f'INITIAL_CHECKPOINT_PATH = "gs://t5-data/pretrained_models/'
              f't5x/t5_1_1_{size}/checkpoint_1000000"') in text
      assert f'include "t5x/examples/t5/t5_1_1/{size}.gin"' in text
      assert f'include "{task}_finetune.gin"' in text
      assert "# TPU slice: v4-" in text
      macro = f"{task.upper()}_{size.upper()}"
      assert f"--gin.{macro}=" in text and f"{macro} = " in macros


def test_the_draft_recipe_comparison_differs_only_in_the_loss():
  """configs/training/compare/ is a controlled comparison (docs/
  demo_models.md): the three recipes start from the same weights, see the
  same inputs under the same optimiser and schedule, and differ only in
  what the loss matches (references, the target's translations, or the
  target scoring the draft's own samples) and in the steps that fill the
  same time."""
  configs = {}
  try:
    for name in ("supervised", "seqkd", "onpolicy"):
      _parse(os.path.join(_CONFIGS, "training", "compare", f"{name}.gin"))
      configs[name] = gin.get_configurable(train.TrainConfig)()
  finally:
    gin.clear_config()
  loss_fields = {"task", "train_translations", "teacher", "onpolicy",
                 "num_steps"}
  shared = [{k: v for k, v in dataclasses.asdict(c).items()
             if k not in loss_fields} for c in configs.values()]
  assert shared[0] == shared[1] == shared[2]
  assert shared[0]["init_from"] == "demo:draft_base"
  assert shared[0]["max_train_examples"] == 6000
  assert configs["supervised"].train_translations is None
  assert configs["supervised"].teacher is None
  assert (configs["seqkd"].train_translations
          == configs["onpolicy"].train_translations is not None)
  assert configs["onpolicy"].onpolicy.onpolicy_fraction == 0.5
  for config in configs.values():
    dataclasses.replace(config, workdir="w").check()


def test_a_command_lines_length_replaces_the_gin_files():
  """scripts/train.py's `--gin.train.TrainConfig.num_steps=2` on a demo
  config that gives num_epochs means 2 steps instead (the other field bound
  to None after it); both on the command line, or neither, is left to
  TrainConfig.check, which refuses both. Control: without the extra
  binding the config holds both and is refused."""
  from specdec_jax.training import config as config_lib  # pylint: disable=g-import-not-at-top
  gin_file = os.path.join(_CONFIGS, "training", "demo_draft_small_distill.gin")
  steps = ["train.TrainConfig.num_steps = 2"]
  extra = config_lib.length_from_command_line(steps)
  assert extra == ["train.TrainConfig.num_epochs = None"], extra
  assert config_lib.length_from_command_line(
      steps + ["train.TrainConfig.num_epochs = 3"]) == []
  assert config_lib.length_from_command_line(
      ["TrainConfig.num_epochs = 3"]) == ["TrainConfig.num_steps = None"]
  try:
    for bindings, refused in ((steps + extra, False), (steps, True)):
      gin.clear_config()
      gin_flags.parse([gin_file], bindings)
      config = dataclasses.replace(gin.get_configurable(train.TrainConfig)(),
                                   workdir="w")
      if refused:
        with pytest.raises(config_lib.TrainConfigError,
                           match="exactly one of num_steps"):
          config.check()
      else:
        assert (config.num_steps, config.num_epochs) == (2, None)
        config.check()
  finally:
    gin.clear_config()


def _buildable_versions(tfds_name: str) -> set[str]:
  """The versions the pinned TFDS can build of `name[/config]`."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  name, _, config = tfds_name.partition("/")
  builder = tfds.builder_cls(name)
  if config:
    return {str(c.version) for c in builder.BUILDER_CONFIGS
            if c.name == config}
  return {str(v) for v in [builder.VERSION, *builder.SUPPORTED_VERSIONS]
          if v}


def test_t5x_configs_read_the_datasets_the_tpu_guide_prepares():
  """Issue 48: the T5X fine-tuning configs name seqio tasks that read the
  TFDS datasets docs/tpu.md's data step builds, at versions the pinned TFDS
  can build, and import no `t5` package (not in T5X's install). Control:
  T5's own cnn_dailymail_v002 read version 3.1.0, which is not among the
  buildable ones (what made the old configs unusable)."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  import re  # pylint: disable=g-import-not-at-top
  import seqio  # pylint: disable=g-import-not-at-top
  folder = os.path.join(_CONFIGS, "t5x")
  spec = importlib.util.spec_from_file_location(
      "specdec_t5x_tasks", os.path.join(folder, "specdec_t5x_tasks.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  with open(os.path.join(REPO, "docs", "tpu.md")) as f:
    built = set(re.findall(r"tfds build (\S+)", f.read()))
  read = {}
  for task in ("specdec_wmt14_ende", "specdec_cnn_dailymail"):
    tfds_name = seqio.get_mixture_or_task(task).source.tfds_dataset.name
    name, _, version = tfds_name.partition(":")
    assert name in built or name.split("/")[0] in built, (name, built)
    assert version in _buildable_versions(name), (tfds_name, task)
    read[task] = tfds_name
  assert "3.1.0" not in _buildable_versions("cnn_dailymail")
  for path in sorted(os.listdir(folder)):
    if not path.endswith(".gin"):
      continue
    with open(os.path.join(folder, path)) as f:
      text = f.read()
    assert "t5.data" not in text and "import t5\n" not in text, path
    for task in re.findall(r'MIXTURE_OR_TASK_NAME = "(\w+)"', text):
      assert task in read, (path, task)
      assert "import specdec_t5x_tasks" in text, path
    if path.startswith("t5_1_1_"):
      assert "PYTHONPATH=$SPECDEC/configs/t5x" in text, path


def test_a_pairs_rows_on_other_tasks_plan_as_one():
  """A plan's programs are a function of the run's shapes
  (`fit.run_shape`), and every task of these families reads 512 tokens and
  writes 512: the rows of one pair at one temperature (EnDe, CNN/DM and the
  instructions) have equal shapes, so one compiled plan covers them all
  (`plan_run --experiments` compiles once and says so), while another
  draft, target or temperature is another plan."""
  run = os.path.join(_CONFIGS, "runs", "tpu_v4_8_model_parallel.gin")
  for family in ("gemma3", "llama3", "qwen3", "qwen2_5", "t5gemma2"):
    groups = {}
    folder = os.path.join(_CONFIGS, "experiments", family)
    for name in sorted(os.listdir(folder)):
      if not re.search(r"_t[01]\.gin$", name):
        continue
      gin.clear_config()
      gin_flags.parse([os.path.join(folder, name), run], [])
      shape = fit.run_shape(gin.get_configurable(experiment.ExperimentConfig)())
      groups.setdefault(shape, set()).add(name)
    gin.clear_config()
    tasks_of_pair = {re.sub(r"^(ende|cnndm|instruct)_", "", n)
                     for n in set().union(*groups.values())}
    # One group a (pair, temperature), holding that pair's every task.
    assert len(groups) == len(tasks_of_pair), (family, list(groups.values()))
    for names in groups.values():
      assert len({re.sub(r"^(ende|cnndm|instruct)_", "", n)
                  for n in names}) == 1, names
      assert {n.split("_")[0] for n in names} >= {"ende", "cnndm"}, names
