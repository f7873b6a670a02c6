"""Rotary position embeddings, the half-split ("rotate_half") layout HF Llama/Qwen checkpoints use."""
from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from hsjax.models.config import ModelConfig


def inv_frequencies(cfg: ModelConfig) -> np.ndarray:
    """Inverse frequencies, shape (head_dim // 2,), float32, as transformers computes them.

    The arithmetic stays in float32 like the torch reference so long positions rotate alike.
    """
    dim = cfg.head_dim
    exponents = np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / np.float32(dim)
    # Power in float64 rounded to float32, then a float32 reciprocal: within 1 ulp of torch's powf.
    powers = np.power(np.float64(cfg.rope_theta), exponents.astype(np.float64)).astype(np.float32)
    inv_freq = (np.float32(1.0) / powers).astype(np.float32)
    if cfg.rope_scaling is None:
        return inv_freq
    return _llama3_scaled(inv_freq, cfg.rope_scaling)


def _llama3_scaled(inv_freq: np.ndarray, scaling: dict) -> np.ndarray:
    """Llama 3.1 frequency scaling: long wavelengths divided by `factor`, short ones kept, a smooth
    interpolation in between."""
    f32 = np.float32
    factor = f32(scaling["factor"])
    low, high = f32(scaling["low_freq_factor"]), f32(scaling["high_freq_factor"])
    old_len = f32(scaling["original_max_position_embeddings"])
    low_freq_wavelen = old_len / low
    high_freq_wavelen = old_len / high
    wavelen = f32(2 * math.pi) / inv_freq
    scaled = np.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq).astype(f32)
    smooth = ((old_len / wavelen - low) / (high - low)).astype(f32)
    smoothed = ((f32(1) - smooth) * scaled / factor + smooth * scaled).astype(f32)
    is_medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return np.where(is_medium, smoothed, scaled).astype(f32)


def cos_sin(positions_BxT: jnp.ndarray, inv_freq_R: np.ndarray, dtype) -> tuple[jnp.ndarray, jnp.ndarray]:
    """cos and sin tables of shape BxTxH (H = 2R, the frequencies repeated for the two halves)."""
    freqs_BxTxR = positions_BxT.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq_R)
    emb_BxTxH = jnp.concatenate([freqs_BxTxR, freqs_BxTxR], axis=-1)
    return jnp.cos(emb_BxTxH).astype(dtype), jnp.sin(emb_BxTxH).astype(dtype)


def apply_rope(x_BxTxNxH: jnp.ndarray, cos_BxTxH: jnp.ndarray, sin_BxTxH: jnp.ndarray) -> jnp.ndarray:
    """Rotates each head's (x[:H/2], x[H/2:]) pairs by the position angle."""
    half = x_BxTxNxH.shape[-1] // 2
    x1, x2 = x_BxTxNxH[..., :half], x_BxTxNxH[..., half:]
    rotated = jnp.concatenate([-x2, x1], axis=-1)
    cos, sin = cos_BxTxH[:, :, None, :], sin_BxTxH[:, :, None, :]
    return x_BxTxNxH * cos + rotated * sin
