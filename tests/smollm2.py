"""The real test model, SmolLM2-135M-Instruct, as scripts/fetch_smollm2.sh writes it.

Its tests are skipped, and reported as skipped, when the directory is absent; with
`HSJAX_REQUIRE_SMOLLM2=1` (set in CI, after .ci/run fetched it) they fail instead.
`HSJAX_SMOLLM2_DIR` names another directory.
"""
import functools
import os
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
DEFAULT_DIR = REPO / ".cache" / "models" / "smollm2-135m-instruct"


def smollm2_dir() -> pathlib.Path:
    """The model directory, or skip (fail under HSJAX_REQUIRE_SMOLLM2=1) when it is not there."""
    path = pathlib.Path(os.environ.get("HSJAX_SMOLLM2_DIR") or DEFAULT_DIR)
    if not (path / "config.json").is_file() or not (path / "model.safetensors").is_file():
        message = f"SmolLM2-135M-Instruct not found in {path}: run scripts/fetch_smollm2.sh"
        if os.environ.get("HSJAX_REQUIRE_SMOLLM2") == "1":
            pytest.fail(message + " (HSJAX_REQUIRE_SMOLLM2=1)")
        pytest.skip(message)
    return path


@functools.lru_cache(maxsize=1)
def _load(path: str):
    from hsjax.models import load_pretrained

    return load_pretrained(path)


def load_smollm2():
    """(path, cfg, params, tokenizer), loaded once per process."""
    path = smollm2_dir()
    return (path, *_load(str(path)))


@functools.lru_cache(maxsize=1)
def _reference(path: str):
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.eval()
    return model, transformers.AutoTokenizer.from_pretrained(path)


def load_reference():
    """(transformers model, AutoTokenizer) of the same directory, loaded once per process."""
    return _reference(str(smollm2_dir()))
