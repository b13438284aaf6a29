"""A checkpoint's own chat template as a run's prompt
(`TaskConfig.prompt_template = 'checkpoint'`, `data/chat_template.py`).

Invariants:
  - for the Llama-3-shaped and Qwen-3-shaped fixture tokenizers (templates
    with indented blocks, a dated system header, a thinking switch),
    `prompt_text` filled with the message is the text transformers'
    `apply_chat_template` wrote for it with the same switches
    (tests/testdata/hf_bpe_*/reference.json), and the task's ids for it
    ([BOS] + tokens where the task adds BOS) are transformers' ids;
  - negative control: the same template rendered by a plain Jinja
    environment (blocks not trimmed) is not transformers' text, so the
    comparison can fail;
  - without a `date_string` the Llama-shaped template writes today's date,
    as transformers' `strftime_now` does;
  - refused with the fix named, before any data is read: no template, a
    SentencePiece vocabulary, a template that writes the message twice or
    whose text around it changes with the message (a second message
    checks), one that raises or does not parse, and kwargs that are not
    names.
"""

import datetime
import json
import os

import pytest

from specdec_jax.data import chat_template
from specdec_jax.data import tasks
from specdec_jax.data.bpe_vocabulary import TaskBpeVocabulary

pytestmark = pytest.mark.quick

TESTDATA = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                        "testdata")


def _fixture(family):
  path = os.path.join(TESTDATA, f"hf_bpe_{family}", "tokenizer.json")
  with open(os.path.join(os.path.dirname(path), "reference.json")) as f:
    return path, json.load(f)


@pytest.mark.parametrize("family", ["llama3", "qwen3"])
def test_the_checkpoints_template_renders_as_transformers_does(family):
  path, ref = _fixture(family)
  bos = family == "llama3"
  config = tasks.TaskConfig(vocab_path=path, vocab_extra_ids=0,
                            inputs_bos=bos, prompt_template="checkpoint",
                            chat_template_kwargs=ref["chat_kwargs"])
  template = tasks.prompt_text(config)
  assert template.count("{input}") == 1
  text = template.replace("{input}", ref["message"])
  vocab = TaskBpeVocabulary(path).vocabulary
  if bos:  # the task adds BOS as an id: the text leaves it out
    assert vocab.bos_token + text == ref["chat"]
  else:
    assert text == ref["chat"]
  assert [vocab.bos_id] * bos + vocab.encode(text) == ref["chat_ids"]


def test_a_plain_jinja_environment_is_not_transformers():
  """Negative control: blocks neither trimmed nor lstripped."""
  import jinja2  # pylint: disable=g-import-not-at-top
  path, ref = _fixture("llama3")
  vocab = TaskBpeVocabulary(path).vocabulary
  plain = jinja2.Environment().from_string(vocab.chat_template).render(
      messages=[{"role": "user", "content": ref["message"]}],
      add_generation_prompt=True, bos_token=vocab.bos_token,
      **ref["chat_kwargs"])
  assert plain != ref["chat"]
  assert chat_template.render(
      vocab.chat_template, [{"role": "user", "content": ref["message"]}],
      bos_token=vocab.bos_token, **ref["chat_kwargs"]) == ref["chat"]


def test_without_a_date_the_header_has_todays():
  path, _ = _fixture("llama3")
  vocab = TaskBpeVocabulary(path).vocabulary
  days = {datetime.datetime.now().strftime("%d %b %Y")}
  text = chat_template.prompt_template(vocab.chat_template,
                                       bos_token=vocab.bos_token)
  days.add(datetime.datetime.now().strftime("%d %b %Y"))
  assert any(f"Today Date: {day}\n" in text for day in days), text


@pytest.mark.parametrize("template,words", [
    (None, "has no chat template"),
    ("{{ messages[0].content }} and {{ messages[0].content }}", "2 times"),
    ("{% if messages[0].content | length > 30 %}long: {% endif %}"
     "{{ messages[0].content }}", "branches on the message"),
    ("{{ raise_exception('no user turns here') }}", "no user turns here"),
    ("{% for m in messages %}{{ m.content", "failed"),
])
def test_templates_that_cannot_be_one_prompt_are_refused(template, words):
  with pytest.raises(chat_template.ChatTemplateError, match=words):
    chat_template.prompt_template(template, source="tiny")


def test_checkpoint_prompts_need_a_tokenizer_json():
  config = tasks.TaskConfig(vocab_path="gemma/tokenizer.model",
                            prompt_template="checkpoint")
  with pytest.raises(chat_template.ChatTemplateError,
                     match="GEMMA_CHAT_TEMPLATE"):
    tasks.prompt_text(config)


def test_chat_template_kwargs_are_names():
  with pytest.raises(ValueError, match="chat_template_kwargs"):
    tasks.TaskConfig(chat_template_kwargs={"enable thinking": False})
