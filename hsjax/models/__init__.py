"""The decoder family (Llama 3.x, Qwen2/2.5, Qwen3): config, params, forward, KV cache, decode
step, HF I/O."""
from hsjax.models.config import ModelConfig
from hsjax.models.decode import decode_caches, decode_step, decode_weights
from hsjax.models.hf import load_config, load_pretrained, save_pretrained
from hsjax.models.model import KVCache, forward, init_cache, init_params, param_logical_axes
from hsjax.models.presets import PRESETS, get_preset

__all__ = [
    "KVCache",
    "ModelConfig",
    "PRESETS",
    "decode_caches",
    "decode_step",
    "decode_weights",
    "forward",
    "get_preset",
    "init_cache",
    "init_params",
    "load_config",
    "load_pretrained",
    "param_logical_axes",
    "save_pretrained",
]
