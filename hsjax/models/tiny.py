"""A random `tiny` model written as a Hugging Face directory: smoke servers and local voters."""
from __future__ import annotations

import pathlib

import jax

from hsjax.models.hf import save_pretrained
from hsjax.models.model import init_params
from hsjax.models.presets import get_preset
from hsjax.models.tokenizer import build_tiny_tokenizer


def write_tiny_model(out_dir, seed: int = 0) -> pathlib.Path:
    """The `tiny` preset with random weights and the tiny tokenizer, saved as an HF directory."""
    cfg = get_preset("tiny")
    params = jax.jit(init_params, static_argnums=0)(cfg, jax.random.PRNGKey(seed))
    save_pretrained(params, cfg, build_tiny_tokenizer(), out_dir)
    return pathlib.Path(out_dir)
