"""Hugging Face checkpoints: load a local directory into (cfg, params, tokenizer) and write back.

Weights are read with `safetensors` (numpy, memory-mapped; bf16 via ml_dtypes), never torch, and
no file is fetched from the network.
"""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import stat
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from hsjax.models.config import ModelConfig
from hsjax.models.model import _layer_shapes
from hsjax.models.tokenizer import eos_ids, write_hf_tokenizer

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX_FILE = "model.safetensors.index.json"
GENERATION_CONFIG_FILE = "generation_config.json"

_ATTN, _MLP = "self_attn", "mlp"


def _hf_layer_names(cfg: ModelConfig) -> dict[str, str]:
    """hsjax layer weight name -> HF tensor name under `model.layers.{i}.`."""
    names = {
        "attn_norm": "input_layernorm.weight",
        "mlp_norm": "post_attention_layernorm.weight",
        "q_proj": f"{_ATTN}.q_proj.weight",
        "k_proj": f"{_ATTN}.k_proj.weight",
        "v_proj": f"{_ATTN}.v_proj.weight",
        "o_proj": f"{_ATTN}.o_proj.weight",
        "q_bias": f"{_ATTN}.q_proj.bias",
        "k_bias": f"{_ATTN}.k_proj.bias",
        "v_bias": f"{_ATTN}.v_proj.bias",
        "o_bias": f"{_ATTN}.o_proj.bias",
        "q_norm": f"{_ATTN}.q_norm.weight",
        "k_norm": f"{_ATTN}.k_norm.weight",
        "gate_proj": f"{_MLP}.gate_proj.weight",
        "up_proj": f"{_MLP}.up_proj.weight",
        "down_proj": f"{_MLP}.down_proj.weight",
    }
    return {name: names[name] for name in _layer_shapes(cfg)}


def _from_hf_layout(name: str, w: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """A torch `Linear` weight is (out, in); ours is (in, out) split into heads where it applies."""
    if name in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "down_proj", "o_proj"):
        w = w.T
    return w.reshape(shape)


def _to_hf_layout(name: str, w: np.ndarray) -> np.ndarray:
    if name in ("q_proj", "k_proj", "v_proj"):  # DxNxH -> (N*H)xD
        return w.reshape(w.shape[0], -1).T
    if name == "o_proj":  # NxHxD -> Dx(N*H)
        return w.reshape(-1, w.shape[-1]).T
    if name in ("gate_proj", "up_proj", "down_proj"):
        return w.T
    return w.reshape(-1)


# ---------------------------------------------------------------------------------------- load


def load_config(hf_dir: str | os.PathLike, **runtime) -> ModelConfig:
    """`ModelConfig` from `hf_dir/config.json` (eos ids merged with generation_config.json)."""
    path = pathlib.Path(hf_dir)
    config_path = path / CONFIG_FILE
    if not config_path.is_file():
        raise FileNotFoundError(f"{config_path} not found: point to a local HF model directory.")
    with open(config_path, encoding="utf-8") as f:
        d = json.load(f)
    cfg = ModelConfig.from_hf_dict(d, **runtime)
    gen_path = path / GENERATION_CONFIG_FILE
    if gen_path.is_file():
        with open(gen_path, encoding="utf-8") as f:
            eos = json.load(f).get("eos_token_id")
        eos = [] if eos is None else list(eos) if isinstance(eos, (list, tuple)) else [eos]
        merged = tuple(dict.fromkeys([*cfg.eos_token_ids, *(int(t) for t in eos)]))
        if merged != cfg.eos_token_ids:
            cfg = dataclasses.replace(cfg, eos_token_ids=merged)
    return cfg


def _tensor_reader(hf_dir: pathlib.Path) -> tuple[Callable[[str], np.ndarray], set[str]]:
    """(get(name) -> numpy array, all tensor names) over a single or sharded safetensors checkpoint."""
    single, index = hf_dir / WEIGHTS_FILE, hf_dir / WEIGHTS_INDEX_FILE
    if single.is_file():
        files = {None: single}
        with safe_open(str(single), framework="numpy") as f:
            where = {name: None for name in f.keys()}
    elif index.is_file():
        with open(index, encoding="utf-8") as f:
            weight_map = json.load(f).get("weight_map")
        if not weight_map:
            raise ValueError(f"{index} has no 'weight_map'.")
        files = {}
        for shard in sorted(set(weight_map.values())):
            if not (hf_dir / shard).is_file():
                raise FileNotFoundError(f"{hf_dir / shard} (listed in {index.name}) not found.")
            files[shard] = hf_dir / shard
        where = dict(weight_map)
    else:
        raise FileNotFoundError(
            f"Neither {single} nor {index} found: hsjax reads safetensors checkpoints only."
        )
    handles = {key: safe_open(str(p), framework="numpy") for key, p in files.items()}

    def get(name: str) -> np.ndarray:
        if name not in where:
            raise ValueError(f"Tensor {name!r} missing from the checkpoint in {hf_dir}.")
        return handles[where[name]].get_tensor(name)

    return get, set(where)


def params_from_hf(cfg: ModelConfig, get: Callable[[str], np.ndarray], names: set[str]) -> dict:
    """hsjax params (numpy, `cfg.param_dtype`) from HF tensors fetched by name."""
    dtype = np.dtype(jnp.dtype(cfg.param_dtype))

    def fetch(name: str, shape: tuple[int, ...]) -> np.ndarray:
        w = get(name)
        if w.size != int(np.prod(shape)):
            raise ValueError(f"Tensor {name!r} has shape {w.shape}; the config implies {shape}.")
        return w

    embed = fetch("model.embed_tokens.weight", (cfg.vocab_size, cfg.hidden_size))
    params = {
        "embed": embed.reshape(cfg.vocab_size, cfg.hidden_size).astype(dtype),
        "final_norm": fetch("model.norm.weight", (cfg.hidden_size,)).astype(dtype),
        "layers": {},
    }
    for name, hf_name in _hf_layer_names(cfg).items():
        shape = _layer_shapes(cfg)[name][0]
        stacked = np.empty((cfg.num_layers, *shape), dtype)
        for i in range(cfg.num_layers):
            w = fetch(f"model.layers.{i}.{hf_name}", shape)
            stacked[i] = _from_hf_layout(name, w, shape)
        params["layers"][name] = stacked
    if not cfg.tie_embeddings:
        if "lm_head.weight" not in names:
            raise ValueError(
                "Tensor 'lm_head.weight' missing while config.json has tie_word_embeddings=false."
            )
        params["lm_head"] = fetch("lm_head.weight", (cfg.vocab_size, cfg.hidden_size)).T.astype(dtype)
    return params


def load_tokenizer_file(hf_dir: str | os.PathLike):
    """The tokenizer exactly as `hf_dir/tokenizer.json` (+ tokenizer_config.json) defines it.

    Not `AutoTokenizer`: next to a qwen2 `config.json` it builds a `Qwen2Tokenizer`, which replaces
    the saved pre-tokenizer with Qwen's regex and so changes the ids of any non-Qwen vocabulary
    (e.g. the tiny tokenizer). For real checkpoints both give the same tokenizer.
    """
    import transformers  # heavy; only the tokenizer path needs it

    path = pathlib.Path(hf_dir) / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} not found: save a tokenizer there, or call load_pretrained(..., tokenizer=False)."
        )
    return transformers.PreTrainedTokenizerFast.from_pretrained(str(path.parent), local_files_only=True)


def load_pretrained(hf_dir: str | os.PathLike, tokenizer: bool = True, **runtime):
    """(cfg, params, tokenizer) from a local HF directory, e.g. `load_pretrained('/ckpt/Qwen2.5-0.5B')`.

    Reads `config.json`, `model.safetensors` or `model.safetensors.index.json` + shards, and (unless
    `tokenizer=False`, which returns None in its place) `tokenizer.json` with
    `load_tokenizer_file`. `runtime` sets ModelConfig runtime fields
    (dtype, param_dtype, remat, attention_impl). Weights are converted to `param_dtype`.
    """
    path = pathlib.Path(hf_dir)
    if not path.is_dir():
        raise FileNotFoundError(f"{path} is not a directory: point to a local HF model directory.")
    cfg = load_config(path, **runtime)
    tok = load_tokenizer_file(path) if tokenizer else None
    get, names = _tensor_reader(path)
    params = jax.tree.map(jnp.asarray, params_from_hf(cfg, get, names))
    return cfg, params, tok


# ---------------------------------------------------------------------------------------- save


def params_to_hf(cfg: ModelConfig, params: dict, dtype=None) -> dict[str, np.ndarray]:
    """HF tensor name -> numpy array (torch layout), in `dtype` (default: the params' own)."""
    def host(x):
        x = np.asarray(jax.device_get(x))
        return x.astype(np.dtype(jnp.dtype(dtype))) if dtype is not None else x

    tensors = {
        "model.embed_tokens.weight": host(params["embed"]),
        "model.norm.weight": host(params["final_norm"]),
    }
    for name, hf_name in _hf_layer_names(cfg).items():
        if name not in params["layers"]:
            raise ValueError(f"params['layers'] lacks {name!r}, which the config requires.")
        stacked = host(params["layers"][name])
        for i in range(cfg.num_layers):
            tensors[f"model.layers.{i}.{hf_name}"] = _to_hf_layout(name, stacked[i])
    if not cfg.tie_embeddings:
        tensors["lm_head.weight"] = host(params["lm_head"]).T
    return {k: np.ascontiguousarray(v) for k, v in tensors.items()}


def special_token_ids(cfg: ModelConfig, tokenizer=None) -> dict:
    """{bos_token_id, eos_token_id, pad_token_id} for config.json and generation_config.json: the
    config's own, else the tokenizer's. Without eos ids in the config (the presets of random models),
    eos lists the ids that end a reply for the policy's sampler (the tokenizer's eos,
    `<|im_end|>`, `<|endoftext|>`: `hsjax.models.tokenizer.eos_ids`), so `generate` stops at the end
    of a chat turn. One id is written as an int, several as a list, none as null."""
    eos = list(cfg.eos_token_ids)
    bos, pad = cfg.bos_token_id, None
    if tokenizer is not None:
        eos = eos or eos_ids(tokenizer)
        bos = bos if bos is not None else tokenizer.bos_token_id
        pad = tokenizer.pad_token_id
    return {"bos_token_id": bos, "eos_token_id": eos[0] if len(eos) == 1 else (eos or None), "pad_token_id": pad}


def save_pretrained(params: dict, cfg: ModelConfig, tokenizer, out_dir: str | os.PathLike, dtype=None):
    """Writes config.json, model.safetensors, generation_config.json (and the tokenizer when not
    None) so `transformers.AutoModelForCausalLM.from_pretrained(out_dir)` gives the same logits and
    its `generate` stops where the policy's sampler does (`special_token_ids`).

    `dtype` ('float32' | 'bfloat16') is the stored weight dtype; default `cfg.param_dtype`. Every
    file gets the mode `open` gives under the process umask (0644 under the usual 022; safetensors
    alone would leave the weights 0600).
    """
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    dtype = dtype or cfg.param_dtype
    hf_config = cfg.to_hf_dict()
    hf_config["torch_dtype"] = hf_config["dtype"] = str(dtype)
    special = special_token_ids(cfg, tokenizer)
    hf_config.update(special)
    with open(out / CONFIG_FILE, "w", encoding="utf-8") as f:
        json.dump(hf_config, f, indent=2)
    with open(out / GENERATION_CONFIG_FILE, "w", encoding="utf-8") as f:
        json.dump(special, f, indent=2)
    save_file(params_to_hf(cfg, params, dtype), str(out / WEIGHTS_FILE), metadata={"format": "pt"})
    os.chmod(out / WEIGHTS_FILE, stat.S_IMODE(os.stat(out / CONFIG_FILE).st_mode))
    if tokenizer is not None:
        write_hf_tokenizer(tokenizer, out, hf_config.get("model_type"))
