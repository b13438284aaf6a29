"""Hugging Face checkpoint directories as the Hub holds large, multimodal
or older ones, cut from the tiny fixtures in tests/testdata (shared by the
Gemma 3, Llama-layout and bucket tests; tests/helpers.py holds the rest of
the shared harness)."""

import json
import os

import numpy as np


def write_sharded(tensors, config, local):
  """`tensors` ({name: array}) written as `save_pretrained` writes a large
  model: two safetensors shards and their index, with `config` (a dict, or
  the path of a config.json) as config.json, in the new folder `local`
  (a pathlib.Path, returned)."""
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  names = sorted(tensors)
  shards = {"model-00001-of-00002.safetensors": names[::2],
            "model-00002-of-00002.safetensors": names[1::2]}
  local.mkdir()
  for shard, members in shards.items():
    save_file({n: tensors[n] for n in members}, str(local / shard),
              metadata={"format": "pt"})
  index = {"metadata": {}, "weight_map": {n: shard for shard, members in
                                          shards.items() for n in members}}
  (local / "model.safetensors.index.json").write_text(json.dumps(index))
  if not isinstance(config, dict):
    with open(config) as f:
      config = json.load(f)
  (local / "config.json").write_text(json.dumps(config))
  return local


def gemma3_as_on_the_hub(source, local):
  """The gemma3_text directory `source` rewritten as the Hub holds Gemma 3
  4B-27B: model_type gemma3 with a vision tower (two stand-in tensors), the
  text model's tensors under `language_model.model.`, a transformers-4
  config.json (flat rope_theta, rope_local_base_freq and rope_scaling in
  its text_config), sharded safetensors with an index; in the new folder
  `local` (returned)."""
  from safetensors import safe_open  # pylint: disable=g-import-not-at-top
  with safe_open(os.path.join(source, "model.safetensors"), "np") as f:
    tensors = {"language_model." + name: f.get_tensor(name)
               for name in f.keys()}
  rng = np.random.default_rng(0)
  tensors["vision_tower.vision_model.embeddings.patch_embedding.weight"] = (
      rng.normal(size=(8, 3, 2, 2)).astype(np.float32))
  tensors["multi_modal_projector.mm_input_projection_weight"] = (
      rng.normal(size=(8, 4)).astype(np.float32))
  with open(os.path.join(source, "config.json")) as f:
    text = json.load(f)
  rope = text.pop("rope_parameters")
  scaling = dict(rope["full_attention"])
  text.update(rope_theta=scaling.pop("rope_theta"),
              rope_local_base_freq=rope["sliding_attention"]["rope_theta"],
              rope_scaling=scaling)
  for key in ("architectures", "dtype", "transformers_version"):
    text.pop(key, None)
  config = {"architectures": ["Gemma3ForConditionalGeneration"],
            "model_type": "gemma3", "text_config": text,
            "vision_config": {"model_type": "siglip_vision_model"},
            "torch_dtype": "bfloat16", "transformers_version": "4.50.0"}
  return write_sharded(tensors, config, local)


def llama_as_on_the_hub(source, local, tokenizer=None):
  """The llama or qwen3 directory `source` (transformers 5's config.json)
  rewritten as the Hub holds Llama 3 and Qwen 3: a transformers-4
  config.json (flat rope_theta, rope_scaling beside it, torch_dtype),
  sharded safetensors with an index, and the tokenizer files of the
  directory `tokenizer` (tokenizer.json, tokenizer_config.json,
  generation_config.json) when given; in the new folder `local`
  (returned)."""
  from safetensors import safe_open  # pylint: disable=g-import-not-at-top
  with safe_open(os.path.join(source, "model.safetensors"), "np") as f:
    tensors = {name: f.get_tensor(name) for name in f.keys()}
  with open(os.path.join(source, "config.json")) as f:
    config = json.load(f)
  rope = dict(config.pop("rope_parameters"))
  config["rope_theta"] = rope.pop("rope_theta")
  kind = rope.pop("rope_type")
  config["rope_scaling"] = None if kind == "default" else dict(
      rope, rope_type=kind)
  config.update(torch_dtype=config.pop("dtype", "bfloat16"),
                transformers_version="4.51.0")
  write_sharded(tensors, config, local)
  for name in ("tokenizer.json", "tokenizer_config.json",
               "generation_config.json"):
    if tokenizer is not None:
      with open(os.path.join(tokenizer, name), "rb") as f:
        (local / name).write_bytes(f.read())
  return local
