"""A checkpoint's own chat template, as the prompt of an instruction row.

Hugging Face checkpoints carry their chat template, a Jinja program, in
tokenizer_config.json or chat_template.jinja (`tokens.BpeVocabulary.
chat_template`). `TaskConfig.prompt_template = 'checkpoint'` makes a run's
prompts what that program writes for one user message followed by the
generation prompt, rendered here in the environment transformers renders
it in (a sandbox; blocks trimmed; `loopcontrols`; its `tojson`,
`raise_exception` and `strftime_now`; the `generation` tag), with the
checkpoint's BOS and EOS tokens and the row's own variables
(`TaskConfig.chat_template_kwargs`: Qwen 3's `enable_thinking`, the
`date_string` of Llama 3's system header).

A run tokenizes every example with one `{input}` template, so the
checkpoint's template is rendered once with a marker as the message and
checked with a second message: a template that does more with a message
than place it (rewrite it, branch on it) is refused with the text to
write instead. The BOS token the template writes first is left out when
the task adds BOS as an id (`TaskConfig.inputs_bos`), so a prompt starts
with one BOS either way.

  template = prompt_template(vocab.chat_template, bos_token="<|begin_of_text|>",
                             strip_bos=True, date_string="26 Jul 2024")
  # '<|start_header_id|>system<|end_header_id|>\\n\\n...{input}<|eot_id|>...'
"""

from __future__ import annotations

import datetime
import json
from typing import Any, Mapping, Sequence

from specdec_jax import errors

# `TaskConfig.prompt_template`'s value for the checkpoint's own template.
CHECKPOINT = "checkpoint"
INPUT_PLACEHOLDER = "{input}"
# Rendered in place of the message; must come back once, verbatim.
_MARKER = "SPECDEC_MESSAGE_MARKER_7f3a"
# A second message, its rendering checked against the marker's.
_PROBE = "Two lines,\nand symbols {} <> & ' \" %."


class ChatTemplateError(ValueError, errors.UsageError):
  """A checkpoint's chat template is missing, fails, or cannot be one
  `{input}` template."""


def _environment():
  # jinja2 only when a template is rendered.
  import jinja2  # pylint: disable=g-import-not-at-top
  from jinja2 import ext  # pylint: disable=g-import-not-at-top
  from jinja2 import nodes  # pylint: disable=g-import-not-at-top
  from jinja2 import sandbox  # pylint: disable=g-import-not-at-top

  class _Generation(ext.Extension):
    """`{% generation %}...{% endgeneration %}`: marks the assistant's
    part for training masks; the text is rendered as it is."""
    tags = {"generation"}

    def parse(self, parser):
      lineno = next(parser.stream).lineno
      body = parser.parse_statements(("name:endgeneration",),
                                     drop_needle=True)
      return nodes.CallBlock(self.call_method("_as_is"), [], [],
                             body).set_lineno(lineno)

    def _as_is(self, caller):
      return caller()

  def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)

  def tojson(value, ensure_ascii=False, indent=None, separators=None,
             sort_keys=False):
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                      separators=separators, sort_keys=sort_keys)

  def strftime_now(fmt):
    return datetime.datetime.now().strftime(fmt)

  env = sandbox.ImmutableSandboxedEnvironment(
      trim_blocks=True, lstrip_blocks=True,
      extensions=[_Generation, ext.loopcontrols])
  env.filters["tojson"] = tojson
  env.globals.update(raise_exception=raise_exception,
                     strftime_now=strftime_now)
  return env


def render(template: str, messages: Sequence[Mapping[str, Any]], *,
           add_generation_prompt: bool = True, bos_token: str | None = None,
           eos_token: str | None = None, **variables: Any) -> str:
  """The text `template` writes for `messages`, as transformers'
  `apply_chat_template(..., tokenize=False)` writes it.

  Args:
    template: the Jinja source.
    messages: [{'role': ..., 'content': ...}, ...].
    add_generation_prompt: end with the assistant turn's opening.
    bos_token, eos_token: the tokenizer's, as the template reads them.
    **variables: the template's own switches (`enable_thinking`,
      `date_string`, ...).

  Raises:
    ChatTemplateError: the template does not parse, or fails (its own
      `raise_exception` included).
  """
  import jinja2  # pylint: disable=g-import-not-at-top
  try:
    program = _environment().from_string(template)
    return program.render(messages=list(messages),
                          add_generation_prompt=add_generation_prompt,
                          bos_token=bos_token, eos_token=eos_token,
                          **variables)
  except jinja2.exceptions.TemplateError as e:
    raise ChatTemplateError(
        f"the checkpoint's chat template failed: {type(e).__name__}: {e}. "
        "Give the prompt as text instead: TaskConfig.prompt_template = "
        "'...{input}...'.") from e


def prompt_template(template: str | None, *, bos_token: str | None = None,
                    eos_token: str | None = None, strip_bos: bool = False,
                    source: str = "the checkpoint",
                    **variables: Any) -> str:
  """The `{input}` template a checkpoint's chat template makes of one
  user message with the generation prompt.

  Args:
    template: the checkpoint's chat template (None: it has none).
    bos_token, eos_token: the tokenizer's special tokens as text.
    strip_bos: leave out the BOS token the template writes first (the task
      adds BOS as an id).
    source: where the template came from, for messages.
    **variables: the template's own switches.

  Returns:
    The prompt text with `{input}` once, where the message goes.

  Raises:
    ChatTemplateError: there is no template, or it does more with a
      message than place it once as it is.
  """
  if not template:
    raise ChatTemplateError(
        f"TaskConfig.prompt_template = {CHECKPOINT!r} but {source} has no "
        "chat template (tokenizer_config.json's `chat_template` or "
        "chat_template.jinja): use a base checkpoint's plain prompt "
        "('{input}') or write the template's text with '{input}'.")

  def one(message: str) -> str:
    return render(template, [{"role": "user", "content": message}],
                  add_generation_prompt=True, bos_token=bos_token,
                  eos_token=eos_token, **variables)

  text = one(_MARKER)
  if text.count(_MARKER) != 1 or INPUT_PLACEHOLDER in text:
    raise ChatTemplateError(
        f"{source}'s chat template writes the message "
        f"{text.count(_MARKER)} times (or writes '{INPUT_PLACEHOLDER}' "
        "itself); a run needs it once: write the prompt's text with "
        "'{input}' in TaskConfig.prompt_template.")
  result = text.replace(_MARKER, INPUT_PLACEHOLDER)
  if one(_PROBE) != result.replace(INPUT_PLACEHOLDER, _PROBE):
    raise ChatTemplateError(
        f"{source}'s chat template changes or branches on the message's "
        "text, so one prompt text cannot stand for it: write the prompt's "
        "text with '{input}' in TaskConfig.prompt_template (it rendered "
        f"{result!r}).")
  if strip_bos and bos_token and result.startswith(bos_token):
    result = result[len(bos_token):]
  return result
