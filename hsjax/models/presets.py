"""Named model shapes: tiny ones for CPU runs and tests, and the shapes of public checkpoints
(random weights; load real ones with `load_pretrained`) for benchmarks."""
from __future__ import annotations

import dataclasses

from hsjax.models.config import ModelConfig

_LLAMA3_ROPE_SCALING = {
    "rope_type": "llama3",
    "factor": 32.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}

PRESETS: dict[str, ModelConfig] = {
    # ~1.05M params; vocab of the tiny tokenizer (hsjax.models.tokenizer.build_tiny_tokenizer).
    "tiny": ModelConfig(
        family="qwen2", vocab_size=512, hidden_size=128, intermediate_size=512, num_layers=4,
        num_heads=4, num_kv_heads=2, head_dim=32, rope_theta=10000.0, rms_norm_eps=1e-6,
        tie_embeddings=True, qkv_bias=True, max_position_embeddings=4096,
    ),
    # ~20M params, the sampler benchmark's CPU/GPU model.
    "small20m": ModelConfig(
        family="qwen2", vocab_size=8192, hidden_size=512, intermediate_size=1408, num_layers=6,
        num_heads=8, num_kv_heads=4, head_dim=64, rope_theta=10000.0, rms_norm_eps=1e-6,
        tie_embeddings=True, qkv_bias=True, max_position_embeddings=8192,
    ),
    # Shapes of Qwen/Qwen2-0.5B and Qwen/Qwen2.5-0.5B(-Instruct).
    "qwen2_0p5b": ModelConfig(
        family="qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864, num_layers=24,
        num_heads=14, num_kv_heads=2, head_dim=64, rope_theta=1000000.0, rms_norm_eps=1e-6,
        tie_embeddings=True, qkv_bias=True, max_position_embeddings=32768,
        eos_token_ids=(151645, 151643),
    ),
    # Shapes of Qwen/Qwen2.5-1.5B(-Instruct).
    "qwen2p5_1p5b": ModelConfig(
        family="qwen2", vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_layers=28,
        num_heads=12, num_kv_heads=2, head_dim=128, rope_theta=1000000.0, rms_norm_eps=1e-6,
        tie_embeddings=True, qkv_bias=True, max_position_embeddings=32768,
        eos_token_ids=(151645, 151643),
    ),
    # Shapes of meta-llama/Llama-3.2-1B(-Instruct).
    "llama3p2_1b": ModelConfig(
        family="llama", vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_layers=16,
        num_heads=32, num_kv_heads=8, head_dim=64, rope_theta=500000.0,
        rope_scaling=_LLAMA3_ROPE_SCALING, rms_norm_eps=1e-5, tie_embeddings=True,
        max_position_embeddings=131072, bos_token_id=128000, eos_token_ids=(128001, 128008, 128009),
    ),
    # Shapes of Qwen/Qwen3-0.6B.
    "qwen3_0p6b": ModelConfig(
        family="qwen3", vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_layers=28,
        num_heads=16, num_kv_heads=8, head_dim=128, rope_theta=1000000.0, rms_norm_eps=1e-6,
        tie_embeddings=True, qk_norm=True, max_position_embeddings=40960,
        eos_token_ids=(151645, 151643),
    ),
}


def get_preset(name: str, **overrides) -> ModelConfig:
    """The named preset with `overrides` applied (e.g. `vocab_size=len(tokenizer)`, `dtype='bfloat16'`)."""
    if name not in PRESETS:
        raise ValueError(f"Unknown model preset {name!r}; available: {sorted(PRESETS)}.")
    return dataclasses.replace(PRESETS[name], **overrides)
