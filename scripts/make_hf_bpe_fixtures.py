r"""Writes two tokenizer.json tokenizers and transformers' readings of them.

Needs tokenizers and transformers (`pip install -e '.[hf]'`; made with
tokenizers 0.23.3 and transformers 5.24.0):

  python scripts/make_hf_bpe_fixtures.py --out_dir=tests/testdata

Writes tests/testdata/hf_bpe_{llama3,qwen3}: a byte-level BPE tokenizer
trained by the `tokenizers` library on the package's demo sentences and
saved by it (tokenizer.json), shaped as the family's own:
  * llama3: Llama 3's split pattern (digits in threes), merges applied
    whole words first (ignore_merges), <|begin_of_text|> put before a text
    by the post-processor, tokenizer_class PreTrainedTokenizerFast (which
    transformers reads from tokenizer.json as it is), EOS <|eot_id|>, stop
    ids <|end_of_text|> and <|eot_id|>;
  * qwen3: Qwen's split pattern (single digits) after NFC, no BOS,
    tokenizer_class Qwen2Tokenizer (which transformers rebuilds from the
    file's pieces and merges), EOS <|im_end|>, stop ids <|im_end|> and
    <|endoftext|>;
special tokens after the learned pieces, as the real ones (Llama 3's from
128000, Qwen's from 151643); tokenizer_config.json with a chat template
in the family's form (Llama's dated system header, Qwen's thinking
switch); generation_config.json. reference.json holds
`AutoTokenizer`'s ids and texts: each text encoded with and without
special tokens, decoded with and without them, and one user message
through the chat template with the family's switches (`chat_kwargs`:
a fixed date, thinking off), text and ids.
"""

import json
import os

from absl import app
from absl import flags
import tokenizers
from tokenizers import decoders, models, normalizers, pre_tokenizers
from tokenizers import processors, trainers
import transformers

_OUT_DIR = flags.DEFINE_string("out_dir", "tests/testdata", "Output folder.")

DEMO = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))), "specdec_jax", "demo_data")
# The families' split patterns (transformers' TikTokenConverter default is
# Llama 3's; Qwen2Tokenizer's PRETOKENIZE_REGEX is Qwen's).
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|"
                r"\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|"
                r"\s+")
QWEN3_SPLIT = LLAMA3_SPLIT.replace(r"\p{N}{1,3}", r"\p{N}")
FAMILIES = {
    "llama3": dict(
        specials=["<|begin_of_text|>", "<|end_of_text|>",
                  "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
        plain=[], bos="<|begin_of_text|>", eos="<|eot_id|>",
        stops=["<|end_of_text|>", "<|eot_id|>"],
        tokenizer_class="PreTrainedTokenizerFast",
        # A system header dated by `date_string`, else today (transformers'
        # `strftime_now`), as Llama 3.2's is; indented blocks, so trimming
        # and lstrip matter.
        chat_template=(
            "{{- bos_token }}\n"
            "{%- if not date_string is defined %}\n"
            "    {%- set date_string = strftime_now('%d %b %Y') %}\n"
            "{%- endif %}\n"
            "<|start_header_id|>system<|end_header_id|>\n\n"
            "Today Date: {{ date_string }}\n\n<|eot_id|>\n"
            "{%- for m in messages %}\n"
            "    {%- if m['role'] not in ['user', 'assistant'] %}\n"
            "        {{- raise_exception('roles are user and assistant') }}\n"
            "    {%- endif %}\n"
            "    {{- '<|start_header_id|>' + m['role'] + '<|end_header_id|>"
            "\\n\\n' + m['content'] | trim + '<|eot_id|>' }}\n"
            "{%- endfor %}\n"
            "{%- if add_generation_prompt %}\n"
            "    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n"
            "{%- endif %}\n"),
        chat_kwargs={"date_string": "26 Jul 2024"}),
    "qwen3": dict(
        specials=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        plain=["<think>", "</think>"], bos=None, eos="<|im_end|>",
        stops=["<|im_end|>", "<|endoftext|>"],
        tokenizer_class="Qwen2Tokenizer",
        # Thinking switched off by `enable_thinking`, as Qwen 3's is.
        chat_template=(
            "{%- for m in messages %}\n"
            "{{- '<|im_start|>' + m.role + '\\n' + m.content + "
            "'<|im_end|>\\n' }}\n"
            "{%- endfor %}\n"
            "{%- if add_generation_prompt %}\n"
            "    {{- '<|im_start|>assistant\\n' }}\n"
            "    {%- if enable_thinking is defined and enable_thinking is "
            "false %}\n"
            "        {{- '<think>\\n\\n</think>\\n\\n' }}\n"
            "    {%- endif %}\n"
            "{%- endif %}\n"),
        chat_kwargs={"enable_thinking": False}),
}
TEXTS = [
    "A man in a blue shirt is standing on a ladder.",
    "It's 2024: don't panic, 1234567 apples cost $3.50!",
    "  two spaces\tand a tab\n\nnew paragraph\r\n",
    "Größe über Äpfel, naïve café, Ein Mann mit Hut.",
    "emoji 🙂 and 日本語 fall back to bytes",
    "ends with an exclamation mark!",
]
MESSAGE = "Translate to German: a man in a hat."


def _tokenizer(family: str) -> tokenizers.Tokenizer:
  spec = FAMILIES[family]
  tok = tokenizers.Tokenizer(models.BPE(ignore_merges=family == "llama3"))
  split = LLAMA3_SPLIT if family == "llama3" else QWEN3_SPLIT
  tok.pre_tokenizer = pre_tokenizers.Sequence([
      pre_tokenizers.Split(tokenizers.Regex(split), behavior="isolated"),
      pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
  tok.decoder = decoders.ByteLevel()
  if family == "qwen3":
    tok.normalizer = normalizers.NFC()
  lines = []
  for name in ("sentences.en", "sentences.de", "paragraphs.en"):
    with open(os.path.join(DEMO, name), encoding="utf-8") as f:
      lines += f.read().splitlines()
  tok.train_from_iterator(lines, trainers.BpeTrainer(
      vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
      show_progress=False))
  tok.add_special_tokens(spec["specials"])
  tok.add_tokens(spec["plain"])
  if spec["bos"]:
    bos = spec["bos"]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B:1",
        special_tokens=[(bos, tok.token_to_id(bos))])
  return tok


def _write(family: str, path: str) -> None:
  spec = FAMILIES[family]
  tok = _tokenizer(family)
  os.makedirs(path, exist_ok=True)
  tok.save(os.path.join(path, "tokenizer.json"))
  decoder = {str(tok.token_to_id(t)): {
      "content": t, "special": t in spec["specials"], "lstrip": False,
      "rstrip": False, "normalized": t not in spec["specials"],
      "single_word": False} for t in spec["specials"] + spec["plain"]}
  config = {"tokenizer_class": spec["tokenizer_class"],
            "bos_token": spec["bos"], "eos_token": spec["eos"],
            "added_tokens_decoder": decoder,
            "chat_template": spec["chat_template"],
            "clean_up_tokenization_spaces": family == "llama3",
            "model_max_length": 131072}
  if family == "qwen3":
    config.update(pad_token="<|endoftext|>", unk_token=None)
  with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
    json.dump(config, f, indent=2)
  stops = [tok.token_to_id(t) for t in spec["stops"]]
  generation = {"eos_token_id": stops,
                "bos_token_id": tok.token_to_id(spec["bos"] or
                                                "<|endoftext|>")}
  with open(os.path.join(path, "generation_config.json"), "w") as f:
    json.dump(generation, f, indent=2)
  _reference(path, spec["chat_kwargs"])


def _reference(path: str, chat_kwargs) -> None:
  """What transformers' AutoTokenizer makes of the directory."""
  hf = transformers.AutoTokenizer.from_pretrained(path)
  rows = []
  for text in TEXTS:
    with_special = hf.encode(text)
    rows.append({"text": text,
                 "ids": hf.encode(text, add_special_tokens=False),
                 "ids_with_special": with_special,
                 "decoded": hf.decode(with_special),
                 "decoded_skip": hf.decode(with_special,
                                           skip_special_tokens=True)})
  messages = [{"role": "user", "content": MESSAGE}]
  chat = hf.apply_chat_template(messages, tokenize=False,
                                add_generation_prompt=True, **chat_kwargs)
  chat_ids = hf.apply_chat_template(messages, tokenize=True,
                                    add_generation_prompt=True,
                                    **chat_kwargs)
  if hasattr(chat_ids, "keys"):  # transformers 5 returns a BatchEncoding
    chat_ids = chat_ids["input_ids"]
  reference = {"class": type(hf).__name__, "vocab_size": len(hf),
               "bos_id": hf.bos_token_id, "eos_id": hf.eos_token_id,
               "texts": rows, "message": MESSAGE,
               "chat_kwargs": chat_kwargs, "chat": chat,
               "chat_ids": list(chat_ids)}
  with open(os.path.join(path, "reference.json"), "w") as f:
    json.dump(reference, f, indent=1, ensure_ascii=False)
  print("wrote", path, type(hf).__name__, len(hf), "ids")


def main(_):
  for family in FAMILIES:
    _write(family, os.path.join(_OUT_DIR.value, f"hf_bpe_{family}"))


if __name__ == "__main__":
  app.run(main)
