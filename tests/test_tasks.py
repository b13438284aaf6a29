"""Tests for specdec_jax.data.tasks and the task-backed half of specdec_jax.data.batching.

Offline throughout: the TFDS tasks are exercised by running their
preprocessors on in-memory datasets with the TFDS features, the local tasks on
files written here. Core tests use a tiny SentencePiece model trained in the
test (T5's special ids: pad 0, EOS 1, UNK 2, no BOS). Tests that need the real
T5 vocabulary or the shared dev data read them from SPECDEC_SHARED_DATA or
../shared/data and are skipped when it is absent.
"""

import json
import os
from pathlib import Path

import gin
import numpy as np
import pytest
import sentencepiece as spm
import seqio
import tensorflow as tf

from specdec_jax.data import batching
from specdec_jax.data import tasks
from specdec_jax.data import readers

SHARED = Path(os.environ.get("SPECDEC_SHARED_DATA")
              or Path(__file__).resolve().parents[2] / "shared" / "data")
T5_VOCAB = SHARED / "t5" / "spiece.model"
needs_shared = pytest.mark.skipif(
    not (T5_VOCAB.exists() and (SHARED / "newstest2014.dev100.en").exists()),
    reason=f"shared data not found at {SHARED}")

HOUSE = "The house is wonderful."
HOUSE_IDS = [13959, 1566, 12, 2968, 10, 37, 629, 19, 1627, 5]  # PROVENANCE.md


def _write_parallel(tmp_path, en, de, name="corpus"):
  (tmp_path / f"{name}.en").write_text("".join(f"{s}\n" for s in en), "utf-8")
  (tmp_path / f"{name}.de").write_text("".join(f"{s}\n" for s in de), "utf-8")
  return str(tmp_path / name)


def _preprocess(task_name, features, sequence_length):
  """Runs a registered task's preprocessors on in-memory examples."""
  task = seqio.get_mixture_or_task(task_name)
  ds = tf.data.Dataset.from_tensor_slices(features)
  ds = task.preprocess_precache(ds)
  ds = task.preprocess_postcache(ds, sequence_length=sequence_length)
  return list(ds.as_numpy_iterator())


def test_tasks_registered_with_tfds_sources_and_lengths():
  """Importing the module registers the eight tasks; the TFDS ones read the
  datasets and versions the paper's T5 setup used; lengths are T5's."""
  names = set(seqio.TaskRegistry.names())
  assert set(tasks.FEATURE_LENGTHS) <= names
  sources = {tasks.WMT14_ENDE: "wmt14_translate/de-en:1.0.0",
             tasks.WMT_T2T_ENDE: "wmt_t2t_translate/de-en:1.0.0",
             tasks.CNN_DAILYMAIL: "cnn_dailymail:3.4.0"}
  for name, tfds_name in sources.items():
    task = seqio.get_mixture_or_task(name)
    assert task.source.tfds_dataset.name == tfds_name
    assert tasks.feature_lengths(name) == {"inputs": 512, "targets": 512}
    assert set(task.output_features) == {"inputs", "targets"}
  assert tasks.feature_lengths(tasks.MULTI30K_ENDE_LOCAL)["inputs"] == 128
  with pytest.raises(ValueError, match="No feature lengths"):
    tasks.feature_lengths("no_such_task")


@pytest.mark.parametrize("name", [tasks.WMT14_ENDE, tasks.WMT_T2T_ENDE])
def test_wmt_preprocessing_on_tfds_features(tiny_vocab, name):
  """TFDS Translation examples {'de', 'en'} become T5 EnDe inputs/targets:
  prefixed text, tokens ending in EOS, trimmed to the sequence length with
  EOS kept last."""
  features = {"de": ["das Haus ist wunderbar", "der Hund"],
              "en": ["the house is wonderful", "the dog sat on the mat " * 5]}
  with tasks.override_config(vocab_path=tiny_vocab):
    vocab = tasks.get_vocabulary()
    out = _preprocess(name, features, {"inputs": 16, "targets": 16})
  assert out[0]["inputs_pretokenized"] == (
      b"translate English to German: the house is wonderful")
  assert out[0]["targets_pretokenized"] == b"das Haus ist wunderbar"
  for ex in out:
    for key in ("inputs", "targets"):
      assert ex[key][-1] == 1 and len(ex[key]) <= 16
  with tasks.override_config(vocab_path=tiny_vocab):
    assert vocab.decode(out[0]["inputs"][:-1].tolist()) == (
        "translate English to German: the house is wonderful")
  assert len(out[1]["inputs"]) == 16  # The long input was trimmed.


def test_cnndm_preprocessing_on_tfds_features(tiny_vocab):
  """TFDS cnn_dailymail 3.4.0 examples become 'summarize: {article}' ->
  highlights; the id survives and unused features (publisher) are dropped."""
  features = {"article": ["the cat sat on the mat today"],
              "highlights": ["cat sat"], "id": ["abc123"],
              "publisher": ["cnn"]}
  with tasks.override_config(vocab_path=tiny_vocab):
    (ex,) = _preprocess(tasks.CNN_DAILYMAIL, features,
                        {"inputs": 512, "targets": 512})
  assert ex["inputs_pretokenized"] == b"summarize: the cat sat on the mat today"
  assert ex["targets_pretokenized"] == b"cat sat"
  assert ex["id"] == b"abc123"
  assert "publisher" not in ex


@pytest.mark.parametrize("name,tfds_name,local", [
    (tasks.WMT14_ENDE, "wmt14_translate/de-en:1.0.0", tasks.WMT14_ENDE_LOCAL),
    (tasks.CNN_DAILYMAIL, "cnn_dailymail:3.4.0", tasks.CNN_DAILYMAIL_LOCAL),
    (tasks.LM1B, "lm1b:1.1.0", tasks.LM1B_LOCAL)])
def test_unprepared_tfds_data_says_how_to_prepare_it(tmp_path, tiny_vocab,
                                                     name, tfds_name, local):
  """A TFDS task whose data was never built fails at once (no download) and
  names the data dir, the `tfds build` command and the offline task."""
  with tasks.override_config(vocab_path=tiny_vocab,
                             tfds_data_dir=str(tmp_path)):
    with pytest.raises(tasks.TfdsNotPreparedError) as info:
      readers.load_examples(name, "test")
  message = str(info.value)
  assert f"tfds build {tfds_name} --data_dir={tmp_path}" in message
  assert "TaskConfig.tfds_data_dir" in message and repr(local) in message


def test_lm1b_tasks_registered_for_a_decoder_only_model():
  """lm1b reads TFDS lm1b:1.1.0 (train and test only), its inputs are a
  prompt without EOS while targets end in EOS, it has no metric (Table 3
  reports alpha only), and its lengths are 64 prompt / 128 target tokens."""
  for name in (tasks.LM1B, tasks.LM1B_LOCAL):
    task = seqio.get_mixture_or_task(name)
    assert task.output_features["inputs"].add_eos is False
    assert task.output_features["targets"].add_eos is True
    assert task.metric_fns == []
    assert tasks.feature_lengths(name) == {"inputs": 64, "targets": 128}
  source = seqio.get_mixture_or_task(tasks.LM1B).source
  assert source.tfds_dataset.name == "lm1b:1.1.0"
  assert list(source.splits) == ["train", "test"]
  with pytest.raises(ValueError, match="no split 'validation'"):
    source.get_dataset("validation")
  assert tasks.current_config().lm1b_files == {}
  assert tasks.current_config().lm1b_prompt_words == 4


def test_lm1b_preprocessing_on_tfds_features(tiny_vocab):
  """A TFDS lm1b example {'text'} becomes prompt (the first words) and
  continuation; append_eos_after_trim, given sequence lengths, adds EOS to
  the continuation only and leaves the prompt whole (seqio trims it later,
  see test_lm1b_prompt_truncation_matches_seqio); a sentence without a word
  is dropped."""
  features = {"text": ["the cat sat on the mat today", "   ",
                       "the house is wonderful " * 10]}
  with tasks.override_config(vocab_path=tiny_vocab, lm1b_prompt_words=20):
    vocab = tasks.get_vocabulary()
    full = vocab.encode("the cat sat on the mat today")
    out = _preprocess(tasks.LM1B, features, {"inputs": 6, "targets": 32})
  assert len(out) == 2
  assert out[0]["inputs_pretokenized"] == b"the cat sat on the mat today"
  assert out[0]["targets_pretokenized"] == b""
  assert out[0]["inputs"].tolist() == full  # No EOS.
  assert out[0]["targets"].tolist() == [1]
  assert 1 not in out[1]["inputs"].tolist()
  assert out[1]["targets"][-1] == 1


def test_lm1b_local_task_splits_prompt_and_continuation(tmp_path,
                                                        tiny_vocab):
  """One sentence a line: the first lm1b_prompt_words words are the prompt,
  tokenized WITHOUT EOS (the model continues it), the rest the target WITH
  EOS; a sentence of fewer words is all prompt with an empty target (just
  EOS); blank lines are skipped and ids are line numbers; prompt + target
  tokens read as the whole sentence, and batches keep the prompt's last
  token last."""
  lines = ["the cat sat on the mat today", "a house", "",
           "  the   house is  wonderful  ",
           "das Haus ist wunderbar auf der Matte"]
  path = tmp_path / "lm1b.txt"
  path.write_text("\n".join(lines) + "\n", "utf-8")
  with tasks.override_config(vocab_path=tiny_vocab,
                             lm1b_files={"test": str(path)}):
    examples = readers.load_examples(tasks.LM1B_LOCAL, "test")
    vocab = tasks.get_vocabulary()
    (batch,) = readers.iterate_examples(tasks.LM1B_LOCAL, "test", batch_size=4)
    with tasks.override_config(lm1b_prompt_words=2):
      (two,) = readers.load_examples(tasks.LM1B_LOCAL, "test", max_examples=1)
    for e, line in zip(examples, [lines[0], lines[1], lines[3], lines[4]]):
      assert vocab.decode(e.inputs.tolist()) == e.inputs_text
      whole = np.concatenate([e.inputs, e.targets[:-1]]).tolist()
      assert vocab.decode(whole) == " ".join(line.split())
  assert [e.id for e in examples] == ["0", "1", "3", "4"]
  assert [(e.inputs_text, e.targets_text) for e in examples] == [
      ("the cat sat on", "the mat today"), ("a house", ""),
      ("the house is wonderful", ""),
      ("das Haus ist wunderbar", "auf der Matte")]
  for e in examples:
    assert not e.inputs_eos and 1 not in e.inputs.tolist()
    assert e.targets[-1] == 1 and 1 not in e.targets[:-1].tolist()
  assert examples[1].targets.tolist() == [1]
  assert (two.inputs_text, two.targets_text) == ("the cat", "sat on the mat "
                                                 "today")
  for row, length, e in zip(batch.input_ids, batch.input_lengths, examples):
    assert length == len(e.inputs)
    np.testing.assert_array_equal(row[:length], e.inputs)
  assert not batch.truncated.any()


def test_lm1b_local_needs_configuring(tmp_path, tiny_vocab):
  """With no file configured (the default) lm1b_local says which setting to
  make; a prompt of no words is refused with the setting to fix."""
  with tasks.override_config(vocab_path=tiny_vocab):
    with pytest.raises(ValueError, match="TaskConfig.lm1b_files"):
      readers.load_examples(tasks.LM1B_LOCAL, "test")
    path = tmp_path / "s.txt"
    path.write_text("a b c\n", "utf-8")
    with tasks.override_config(lm1b_files={"train": str(path)},
                               lm1b_prompt_words=0):
      with pytest.raises(ValueError, match="lm1b_prompt_words"):
        readers.load_examples(tasks.LM1B_LOCAL, "train")


def test_lm1b_prompt_truncation_matches_seqio(tmp_path, tiny_vocab):
  """`batches` cuts an over-long prompt exactly as seqio trims a feature
  without EOS: its first max_length tokens, no EOS added."""
  path = tmp_path / "long.txt"
  path.write_text("the cat sat on the mat " * 6 + "\nthe cat\n", "utf-8")
  with tasks.override_config(vocab_path=tiny_vocab,
                             lm1b_files={"test": str(path)},
                             lm1b_prompt_words=100):
    task = seqio.get_mixture_or_task(tasks.LM1B_LOCAL)
    seqio_rows = [ex["inputs"] for ex in task.get_dataset(
        {"inputs": 12, "targets": 12}, split="test",
        shuffle=False).as_numpy_iterator()]
    (batch,) = readers.iterate_examples(tasks.LM1B_LOCAL, "test", batch_size=2,
                                         max_length=12)
  for row, length, expected in zip(batch.input_ids, batch.input_lengths,
                                   seqio_rows):
    np.testing.assert_array_equal(row[:length], expected)
  assert batch.truncated.tolist() == [True, False]
  assert batch.input_lengths[0] == 12 and batch.input_ids[0, -1] != 1


def test_read_tfds_split_never_downloads(tmp_path):
  """Reading a TFDS split for export (scripts/export_text.py) is read-only:
  an unprepared dataset fails at once with the command that prepares it."""
  with tasks.override_config(tfds_data_dir=str(tmp_path)):
    with pytest.raises(tasks.TfdsNotPreparedError) as info:
      tasks.read_tfds_split("lm1b", "train")
  assert f"tfds build lm1b --data_dir={tmp_path}" in str(info.value)


def test_local_parallel_text_task(tmp_path, tiny_vocab):
  """Aligned .en/.de lines become examples in file order with line-number
  ids; token ids decode back to the text; batches use the promised buckets."""
  en = ["the cat sat on the mat", "a house", "the dog is wonderful " * 10]
  de = ["die Katze auf der Matte\r", "ein Haus", "der Hund"]  # CRLF trimmed.
  prefix = _write_parallel(tmp_path, en, de)
  with tasks.override_config(vocab_path=tiny_vocab,
                             wmt_ende_files={"test": prefix}):
    examples = readers.load_examples(tasks.WMT14_ENDE_LOCAL, "test")
    batches = list(readers.iterate_examples(
        tasks.WMT14_ENDE_LOCAL, "test", batch_size=2, buckets=(8, 16, 32),
        max_length=32))
    vocab = tasks.get_vocabulary()
    assert [vocab.decode(e.inputs[:-1].tolist()) for e in examples] == [
        e.inputs_text for e in examples]
  assert [e.id for e in examples] == ["0", "1", "2"]
  assert examples[0].inputs_text == f"{tasks.TRANSLATE_PREFIX}{en[0]}"
  assert [e.targets_text for e in examples] == [d.strip() for d in de]
  assert all(e.inputs[-1] == 1 and e.targets[-1] == 1 for e in examples)
  assert [b.input_ids.shape[1] for b in batches] == [16, 32]
  assert [len(b) for b in batches] == [2, 1]
  assert batches[1].truncated.tolist() == [True]
  assert batches[1].input_ids[0, -1] == 1
  assert batches[0].input_ids.dtype == np.int32


def test_local_jsonl_task(tmp_path, tiny_vocab):
  """JSONL rows become 'summarize:' examples; ids come from the 'id' field
  or, without one, the row number; the max_examples cap is honoured."""
  path = tmp_path / "cnndm.jsonl"
  rows = [{"id": "x1", "article": "the cat sat", "highlights": "cat"},
          {"article": "a house", "highlights": "house", "url": "u"},
          {"id": "x3", "article": "news", "highlights": "today"}]
  path.write_text("\n".join(json.dumps(r) for r in rows) + "\n", "utf-8")
  with tasks.override_config(vocab_path=tiny_vocab,
                             cnndm_files={"test": str(path)}):
    examples = readers.load_examples(tasks.CNN_DAILYMAIL_LOCAL, "test")
    first = readers.load_examples(tasks.CNN_DAILYMAIL_LOCAL, "test",
                                   max_examples=1)
  assert [e.id for e in examples] == ["x1", "1", "x3"]
  assert examples[0].inputs_text == "summarize: the cat sat"
  assert [e.targets_text for e in examples] == ["cat", "house", "today"]
  assert [e.id for e in first] == ["x1"]


def test_local_data_errors_name_the_file(tmp_path, tiny_vocab):
  """Missing files, unconfigured splits, misaligned files and malformed
  JSONL raise errors that say which file or setting to fix."""
  with tasks.override_config(vocab_path=tiny_vocab,
                             local_data_dir=str(tmp_path)):
    with pytest.raises(FileNotFoundError, match=r"nowhere\.en"):
      with tasks.override_config(wmt_ende_files={"test": "nowhere"}):
        readers.load_examples(tasks.WMT14_ENDE_LOCAL, "test")
    with pytest.raises(ValueError, match="TaskConfig.multi30k_files"):
      with tasks.override_config(multi30k_files={}):
        readers.load_examples(tasks.MULTI30K_ENDE_LOCAL, "test")
    prefix = _write_parallel(tmp_path, ["a", "b"], ["a"], name="skew")
    with pytest.raises(ValueError, match="Misaligned.*2 lines.*1"):
      with tasks.override_config(wmt_ende_files={"test": prefix}):
        readers.load_examples(tasks.WMT14_ENDE_LOCAL, "test")
    (tmp_path / "bad.jsonl").write_text('{"article": "a"}\n', "utf-8")
    with pytest.raises(ValueError, match=r"bad\.jsonl line 1"):
      with tasks.override_config(cnndm_files={"test": "bad.jsonl"}):
        readers.load_examples(tasks.CNN_DAILYMAIL_LOCAL, "test")


def test_bad_bytes_and_blank_pairs_in_local_files_are_named(tmp_path,
                                                            tiny_vocab):
  """Issue 38, findings 6 and 7: a non-UTF-8 byte gave a bare
  UnicodeDecodeError without the file's name, and a blank line in parallel
  files was decoded silently (an empty reference scored in BLEU). Both are
  now refused, naming the file and the line."""
  with tasks.override_config(vocab_path=tiny_vocab,
                             local_data_dir=str(tmp_path)):
    prefix = _write_parallel(tmp_path, ["a", "b", "c"], ["a", "b", "c"],
                             name="latin")
    with open(prefix + ".de", "wb") as f:
      f.write(b"a\nb\ngr\xfcn\n")
    with pytest.raises(ValueError, match=r"latin\.de .*line 3.*UTF-8"):
      with tasks.override_config(wmt_ende_files={"test": prefix}):
        readers.load_examples(tasks.WMT14_ENDE_LOCAL, "test")
    prefix = _write_parallel(tmp_path, ["a", "", "c", "d"], ["a", "b", "c", " "],
                             name="blank")
    with pytest.raises(ValueError, match=r"blank\.en/\.de .*2 pair.*\[2, 4\]"):
      with tasks.override_config(wmt_ende_files={"test": prefix}):
        readers.load_examples(tasks.WMT14_ENDE_LOCAL, "test")


def test_vocabulary_that_does_not_load(tmp_path):
  """A missing or corrupt vocabulary file raises VocabularyError naming the
  path and the setting to change, also through a task's pipeline."""
  garbage = tmp_path / "garbage.model"
  garbage.write_bytes(b"\x00 this is not a sentencepiece model")
  for path in (str(tmp_path / "missing.model"), str(garbage)):
    with pytest.raises(tasks.VocabularyError) as info:
      tasks.get_vocabulary(path).encode("hello")
    assert path in str(info.value)
    assert "TaskConfig.vocab_path" in str(info.value)
  prefix = _write_parallel(tmp_path, ["a"], ["b"])
  with tasks.override_config(vocab_path=str(garbage),
                             wmt_ende_files={"test": prefix}):
    with pytest.raises(tasks.VocabularyError, match="garbage.model"):
      readers.load_examples(tasks.WMT14_ENDE_LOCAL, "test")


def test_configured_vocabulary_follows_the_config(tmp_path, tiny_vocab):
  """The tasks' shared vocabulary reads the config when it loads, so a path
  set after import (or changed later) is the one used."""
  vocab = tasks.get_vocabulary()
  with tasks.override_config(vocab_path=tiny_vocab):
    assert vocab.sentencepiece_model_file == tiny_vocab
    size = vocab.vocab_size
  assert size == spm.SentencePieceProcessor(model_file=tiny_vocab
                                            ).get_piece_size() + 100
  with tasks.override_config(vocab_path=str(tmp_path / "other.model")):
    with pytest.raises(tasks.VocabularyError, match="other.model"):
      vocab.encode("x")


def test_gin_binds_task_config():
  """TaskConfig is a gin configurable: a binding changes current_config(),
  in plain and in dynamic-registration gin files."""
  try:
    gin.parse_config("TaskConfig.vocab_path = '/v/a.model'")
    assert tasks.current_config().vocab_path == "/v/a.model"
    gin.clear_config()
    gin.parse_config("\n".join([
        "from __gin__ import dynamic_registration",
        "from specdec_jax.data import tasks",
        "tasks.TaskConfig.tfds_data_dir = '/tfds'"]))
    assert tasks.current_config().tfds_data_dir == "/tfds"
    assert tasks.current_config().vocab_path == tasks.DEFAULT_VOCAB_PATH
  finally:
    gin.clear_config()


def test_batch_truncation_matches_seqio(tmp_path, tiny_vocab):
  """`batches` truncates exactly as seqio does when the task is read with a
  sequence length (append_eos_after_trim): same ids, EOS last."""
  prefix = _write_parallel(tmp_path, ["the cat sat on the mat " * 6, "a"],
                           ["x", "y"])
  with tasks.override_config(vocab_path=tiny_vocab,
                             wmt_ende_files={"test": prefix}):
    task = seqio.get_mixture_or_task(tasks.WMT14_ENDE_LOCAL)
    seqio_rows = [ex["inputs"] for ex in task.get_dataset(
        {"inputs": 12, "targets": 12}, split="test",
        shuffle=False).as_numpy_iterator()]
    (batch,) = readers.iterate_examples(tasks.WMT14_ENDE_LOCAL, "test",
                                         batch_size=2, max_length=12)
  for row, length, expected in zip(batch.input_ids, batch.input_lengths,
                                   seqio_rows):
    np.testing.assert_array_equal(row[:length], expected)
  assert batch.truncated.tolist() == [True, False]


@needs_shared
def test_t5_vocabulary_matches_reference_ids(tmp_path):
  """The real T5 vocabulary through the EnDe pipeline gives the token ids
  PROVENANCE.md records for the prefix sentence, then EOS 1."""
  prefix = _write_parallel(tmp_path, [HOUSE], ["Das Haus ist wunderbar."])
  with tasks.override_config(vocab_path=str(T5_VOCAB),
                             wmt_ende_files={"test": prefix}):
    (example,) = readers.load_examples(tasks.WMT14_ENDE_LOCAL, "test")
    vocab = tasks.get_vocabulary()
    assert vocab.vocab_size == 32100
    assert vocab.decode(example.inputs.tolist()) == example.inputs_text
  assert example.inputs.tolist() == HOUSE_IDS + [1]


@needs_shared
def test_shared_newstest_dev100():
  """newstest2014.dev100 loads as 100 examples in file order; ids round-trip
  to the text unless the T5 vocabulary lacks a character (UNK 2, e.g.
  'Ö'); batches of 8 use the default power-of-two buckets."""
  en = (SHARED / "newstest2014.dev100.en").read_text("utf-8").splitlines()
  with tasks.override_config(vocab_path=str(T5_VOCAB),
                             local_data_dir=str(SHARED)):
    examples = readers.load_examples(tasks.WMT14_ENDE_LOCAL, "test")
    vocab = tasks.get_vocabulary()
    for e in examples:
      for ids, text in ((e.inputs, e.inputs_text), (e.targets, e.targets_text)):
        assert 2 in ids or vocab.decode(ids.tolist()) == text
    out = list(batching.batches(examples, batch_size=8, max_length=512))
  assert len(examples) == 100
  assert examples[0].inputs_text == tasks.TRANSLATE_PREFIX + en[0]
  assert [len(b) for b in out] == [8] * 12 + [4]
  assert {b.input_ids.shape[1] for b in out} <= {16, 32, 64, 128}
  assert not any(b.truncated.any() for b in out)


@needs_shared
def test_shared_cnndm_dev100_truncates_long_articles():
  """The CNN/DM dev JSONL loads with its ids; articles past 512 tokens are
  cut to 512 with EOS last, and exactly those rows are flagged."""
  ids = [json.loads(line)["id"] for line in
         (SHARED / "cnndm_test_frank250.dev100.jsonl").read_text("utf-8")
         .splitlines()]
  with tasks.override_config(vocab_path=str(T5_VOCAB),
                             local_data_dir=str(SHARED)):
    examples = readers.load_examples(tasks.CNN_DAILYMAIL_LOCAL, "test")
  assert [e.id for e in examples] == ids
  out = list(batching.batches(examples, batch_size=10, max_length=512))
  truncated = np.concatenate([b.truncated for b in out])
  assert truncated.tolist() == [len(e.inputs) > 512 for e in examples]
  assert truncated.sum() > 50  # Most articles are longer than T5's 512.
  for b in out:
    rows = b.input_ids[b.truncated]
    assert rows.shape[1] == 512 and (rows[:, -1] == 1).all()


# --------------------- Gemma's tokenizer (T5Gemma's rows) ---------------------

GEMMA_SETTINGS = dict(vocab_extra_ids=0, inputs_bos=True)


def test_gemma_settings_give_bos_tokens_eos_and_no_sentinels(tmp_path,
                                                             gemma_vocab):
  """With Gemma's settings every input is [BOS] + the SentencePiece model's
  ids + [EOS] and every target its ids + [EOS] (no BOS: the decoder starts
  from the model's start id); the vocabulary has exactly the model's pieces.
  Truncation keeps BOS first and EOS last. Negative control: T5's defaults
  on the same model give no BOS and 100 more ids."""
  en = ["A man in a hat.", " ".join(["Two dogs play on the grass"] * 4)]
  de = ["Ein Mann mit Hut.", "Zwei Hunde"]
  prefix = _write_parallel(tmp_path, en, de)
  sp = spm.SentencePieceProcessor(model_file=gemma_vocab)
  bos, eos = sp.bos_id(), sp.eos_id()
  assert (bos, eos, sp.pad_id()) == (2, 1, 0)  # Gemma's ids
  expected_inputs = [sp.encode(tasks.TRANSLATE_PREFIX + s) for s in en]
  expected_targets = [sp.encode(s) + [eos] for s in de]
  with tasks.override_config(vocab_path=gemma_vocab,
                             wmt_ende_files={"test": prefix},
                             **GEMMA_SETTINGS):
    examples = readers.load_examples(tasks.WMT14_ENDE_LOCAL, "test")
    vocab = tasks.get_vocabulary()
    assert (vocab.vocab_size, vocab.extra_ids) == (sp.get_piece_size(), 0)
  assert [e.inputs.tolist() for e in examples] == [
      [bos] + ids + [eos] for ids in expected_inputs]
  assert [e.targets.tolist() for e in examples] == expected_targets
  (batch,) = batching.batches(examples, batch_size=2, max_length=8,
                              buckets=(8,))
  assert batch.input_ids[1].tolist() == (
      [bos] + expected_inputs[1][:6] + [eos])
  assert batch.truncated.tolist() == [len(expected_inputs[0]) + 2 > 8, True]
  with tasks.override_config(vocab_path=gemma_vocab,
                             wmt_ende_files={"test": prefix}):
    t5_way = readers.load_examples(tasks.WMT14_ENDE_LOCAL, "test")
    assert tasks.get_vocabulary().vocab_size == sp.get_piece_size() + 100
  assert [e.inputs.tolist() for e in t5_way] == [
      ids + [eos] for ids in expected_inputs]


def test_gemma_chat_template_wraps_the_input(gemma_vocab):
  """`GEMMA_CHAT_TEMPLATE` puts the task's input, stripped as Gemma's chat
  template trims a message, in one user turn followed by the model's turn;
  `<start_of_turn>` and `<end_of_turn>` are single pieces (tokenized by the
  SentencePiece model itself). The plain default leaves the text as it is."""
  features = {"en": ["the house is wonderful  "], "de": ["das Haus"]}
  sp = spm.SentencePieceProcessor(model_file=gemma_vocab)
  start, end = (sp.piece_to_id(p) for p in ("<start_of_turn>",
                                             "<end_of_turn>"))
  text = tasks.TRANSLATE_PREFIX + "the house is wonderful"
  chat = f"<start_of_turn>user\n{text}<end_of_turn>\n<start_of_turn>model\n"
  assert tasks.GEMMA_CHAT_TEMPLATE.replace("{input}", text) == chat
  with tasks.override_config(vocab_path=gemma_vocab,
                             prompt_template=tasks.GEMMA_CHAT_TEMPLATE,
                             **GEMMA_SETTINGS):
    (out,) = _preprocess(tasks.WMT14_ENDE, features, None)
  assert out["inputs_pretokenized"].decode() == chat
  ids = out["inputs"].tolist()
  assert ids == [sp.bos_id()] + sp.encode(chat) + [sp.eos_id()]
  assert ids[:2] == [sp.bos_id(), start]
  assert ids.count(start) == 2 and ids.count(end) == 1
  assert sp.decode(ids[ids.index(start) + 1:ids.index(end)]) == "user\n" + text
  with tasks.override_config(vocab_path=gemma_vocab, **GEMMA_SETTINGS):
    (plain,) = _preprocess(tasks.WMT14_ENDE, features, None)
  assert plain["inputs_pretokenized"].decode() == (
      tasks.TRANSLATE_PREFIX + features["en"][0])
  assert start not in plain["inputs"].tolist()


def test_bos_needs_a_vocabulary_with_one(tmp_path, tiny_vocab):
  """inputs_bos with a SentencePiece model that defines no BOS (T5's, the
  tiny one here) is refused, naming the setting; bad values of the three
  settings are refused when the config is made."""
  prefix = _write_parallel(tmp_path, ["a house"], ["ein Haus"])
  with tasks.override_config(vocab_path=tiny_vocab, inputs_bos=True,
                             wmt_ende_files={"test": prefix}):
    with pytest.raises(ValueError, match="defines no BOS id.*inputs_bos"):
      readers.load_examples(tasks.WMT14_ENDE_LOCAL, "test")
  for bad, match in ((dict(vocab_extra_ids=-1), "vocab_extra_ids"),
                     (dict(vocab_extra_ids=True), "vocab_extra_ids"),
                     (dict(inputs_bos="yes"), "inputs_bos"),
                     (dict(prompt_template="Q: {input} {input}"), "exactly"),
                     (dict(prompt_template="no placeholder"), "exactly")):
    with pytest.raises(ValueError, match=match):
      tasks.TaskConfig(**bad)


def test_the_task_vocabulary_follows_the_configured_sentinels(gemma_vocab):
  """The vocabulary the tasks registered at import hold reloads when
  vocab_extra_ids changes after import, as it does for vocab_path: 0 gives
  the model's size, 100 (the default) 100 more; a fixed-path vocabulary
  (training's) follows it too."""
  size = spm.SentencePieceProcessor(model_file=gemma_vocab).get_piece_size()
  vocab = tasks.get_task(tasks.WMT14_ENDE_LOCAL).output_features[
      "inputs"].vocabulary
  fixed = tasks.get_vocabulary(gemma_vocab)
  with tasks.override_config(vocab_path=gemma_vocab):
    assert (vocab.vocab_size, fixed.vocab_size) == (size + 100, size + 100)
    with tasks.override_config(vocab_extra_ids=0):
      assert (vocab.vocab_size, fixed.vocab_size) == (size, size)
      assert (vocab.extra_ids, fixed.extra_ids) == (0, 0)
    assert vocab.vocab_size == size + 100 and vocab.extra_ids == 100


def test_t5gemma_rows_bind_gemmas_settings():
  """Every T5Gemma row sets Gemma's tokenizer settings (no sentinels, BOS,
  plain prompts); the one-flag override of checkpoints.gin switches to the
  chat template, which equals `tasks.GEMMA_CHAT_TEMPLATE`."""
  from specdec_jax.launch import gin_flags  # pylint: disable=g-import-not-at-top
  rows = sorted((Path(gin_flags.CONFIGS_DIR) / "experiments" / "t5gemma"
                 ).glob("*_t[01].gin"))
  assert len(rows) == 16
  try:
    for row in rows:
      gin.clear_config()
      gin_flags.parse([str(row)], [], extra_search_paths=[])
      config = tasks.current_config()
      assert (config.vocab_extra_ids, config.inputs_bos,
              config.prompt_template) == (0, True, tasks.PLAIN_PROMPT), row
    gin_flags.parse([str(rows[0])],
                    ["T5GEMMA_PROMPT_TEMPLATE = %T5GEMMA_CHAT_TEMPLATE"],
                    extra_search_paths=[])
    assert tasks.current_config().prompt_template == tasks.GEMMA_CHAT_TEMPLATE
  finally:
    gin.clear_config()
  assert tasks.current_config().vocab_extra_ids == tasks.NUM_EXTRA_IDS
