"""Model configs: resolving a name, gin file, dict of T5X fields or config.

T5X checkpoints do not record their architecture, so `load_model("t5x:...")`
takes it from `resolve_config`; our own format stores the config fields in
config.json and reads them back with `config_from_fields`. gin is imported
only while reading a gin file.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping

import jax.numpy as jnp

from specdec_jax.checkpoints.errors import CheckpointNotFoundError
from specdec_jax.checkpoints.errors import SpecError
from specdec_jax.models import registry
from specdec_jax.models.gemma3 import Gemma3Config
from specdec_jax.models.gpt import GPTConfig
from specdec_jax.models.llama import LlamaConfig
from specdec_jax.models.t5 import T5Config
from specdec_jax.models.t5gemma import T5GemmaConfig
from specdec_jax.models.t5gemma2 import T5Gemma2Config

# T5X `T5Config` / decoder-only `TransformerConfig` fields that don't matter
# for inference.
_IGNORED_FIELDS = ("dropout_rate", "float32_attention_logits")
FAMILIES = (("t5", T5Config), ("gpt", GPTConfig),
            ("t5gemma", T5GemmaConfig), ("gemma3", Gemma3Config),
            ("t5gemma2", T5Gemma2Config), ("llama", LlamaConfig))
CONFIG_CLASSES = tuple(cls for _, cls in FAMILIES)


# --- Configs for T5X checkpoints. ---


def config_from_fields(fields: Mapping[str, Any], family: str | None,
                       where: str) -> T5Config | GPTConfig:
  """Our config from T5X-named fields (unknown ones are an error)."""
  fields = {k: v for k, v in fields.items() if k not in _IGNORED_FIELDS}
  if family is None:
    llama_only = {f.name for f in dataclasses.fields(LlamaConfig)} - {
        f.name for f in dataclasses.fields(Gemma3Config)}
    family = ("t5gemma" if "encoder" in fields and "decoder" in fields
              else "llama" if llama_only & set(fields)
              else "gemma3" if "num_kv_heads" in fields
              else "gpt" if "num_layers" in fields
              and "num_encoder_layers" not in fields else "t5")
  cls = dict(FAMILIES).get(family)
  if cls is None:
    raise SpecError(f"{where}: unknown model family {family!r}; "
                    f"known: {', '.join(f for f, _ in FAMILIES)}")
  known = [f.name for f in dataclasses.fields(cls)]
  unknown = sorted(set(fields) - set(known))
  if unknown:
    raise SpecError(f"{where}: unknown {cls.__name__} field(s) {unknown}; "
                    f"known: {', '.join(known + list(_IGNORED_FIELDS))}")
  for key in ("dtype", "param_dtype"):
    if key in fields:  # T5X binds jnp.bfloat16 objects; we keep names
      fields[key] = jnp.dtype(fields[key]).name
  try:
    return cls(**fields)
  except TypeError as e:
    raise SpecError(f"{where}: incomplete {cls.__name__}: {e}") from None


def _config_from_gin(path: str) -> T5Config | GPTConfig:
  """Reads the T5Config/GPTConfig bindings of a gin file (no global state)."""
  # gin only when a gin file is read.
  from gin import config_parser  # pylint: disable=g-import-not-at-top

  @dataclasses.dataclass(frozen=True)
  class Macro:
    name: str

  @dataclasses.dataclass(frozen=True)
  class Reference:
    name: str

  class Delegate(config_parser.ParserDelegate):
    def configurable_reference(self, scoped_configurable_name, evaluate):
      return Reference(scoped_configurable_name)

    def macro(self, macro_name):
      return Macro(macro_name)

  macros, bound = {}, {}
  with open(path) as f:
    for statement in config_parser.ConfigParser(f, Delegate()):
      if isinstance(statement, config_parser.IncludeStatement):
        raise SpecError(f"{path}: includes are not followed; bind every "
                        "config field in the one file")
      if not isinstance(statement, config_parser.BindingStatement):
        continue
      if not statement.arg_name:
        macros[statement.selector] = statement.value
        continue
      cls_name = statement.selector.rsplit(".", 1)[-1]
      if cls_name in ("T5Config", "GPTConfig", "TransformerConfig",
                      "T5GemmaConfig", "Gemma3Config", "T5Gemma2Config",
                      "LlamaConfig"):
        key = (statement.scope, statement.selector)
        bound.setdefault(key, {})[statement.arg_name] = statement.value
  if len(bound) != 1:
    found = [f"{s}/{c}" if s else c for s, c in bound] or "none"
    raise SpecError(f"{path}: expected the bindings of exactly one T5Config "
                    f"or GPTConfig, found {found}")
  (_, selector), fields = next(iter(bound.items()))

  def resolve(value):
    if isinstance(value, Macro):
      if value.name not in macros:
        raise SpecError(f"{path}: macro %{value.name} is not defined there")
      return resolve(macros[value.name])
    if isinstance(value, Reference):
      raise SpecError(f"{path}: config fields must be plain values, not "
                      f"@{value.name}")
    if isinstance(value, (tuple, list)):
      return type(value)(resolve(v) for v in value)
    return value

  family = {"T5Config": "t5", "T5GemmaConfig": "t5gemma",
            "Gemma3Config": "gemma3", "T5Gemma2Config": "t5gemma2",
            "LlamaConfig": "llama"}.get(
      selector.rsplit(".", 1)[-1], "gpt")
  return config_from_fields({k: resolve(v) for k, v in fields.items()},
                            family, path)


def resolve_config(config: Any) -> T5Config | GPTConfig:
  """A model config from a name, a gin file, a dict of fields or a config.

  Args:
    config: a `registry.NAMES` entry ("t5_1_1_xxl"), a path to a gin file
      binding one T5Config/GPTConfig (configs/models/*.gin), a dict of
      T5X `T5Config` fields (vocab_size, emb_dim, num_heads,
      num_encoder_layers, num_decoder_layers, head_dim, mlp_dim,
      mlp_activations, logits_via_embedding, dtype; dropout_rate and
      float32_attention_logits are ignored; `num_layers` instead of the two
      depths means decoder-only, with `num_kv_heads` Gemma 3 (the Llama
      layout with any of its own fields: `qk_norm`, `tie_embeddings`,
      `rope_llama3_band`); `encoder`
      and `decoder` dicts mean T5Gemma; fields not given take our
      defaults), or a
      T5Config/GPTConfig/T5GemmaConfig.

  Returns:
    A T5Config or GPTConfig.
  """
  if isinstance(config, CONFIG_CLASSES):
    return config
  if isinstance(config, Mapping):
    return config_from_fields(dict(config), None, "config dict")
  if isinstance(config, str):
    if config.endswith(".gin") or os.path.isfile(config):
      if not os.path.isfile(config):
        raise CheckpointNotFoundError(f"gin config file not found: {config!r}")
      return _config_from_gin(config)
    return registry.get_config(config)  # raises naming the known configs
  raise SpecError(f"config must be a config name, gin file, dict or "
                  f"T5Config/GPTConfig, got {type(config).__name__}")
