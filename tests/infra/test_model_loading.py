"""Which model a path names: a workdir warm-started from a workdir resolves down the chain of run
configs (in one loop), the outer block's runtime fields win, and a chain that loops is one line."""
import json

import pytest

from hsjax.infra import model_loading
from hsjax.infra.errors import UserError


def workdir(root, name, model_block):
    path = root / name
    (path / "checkpoints").mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"mode": "train", "model": model_block}))
    return path


def test_a_chain_of_workdirs_ends_at_the_preset_of_the_first_run(tmp_path):
    first = workdir(tmp_path, "first", {"preset": "tiny", "tokenizer": "tiny", "dtype": "bfloat16"})
    second = workdir(tmp_path, "second", {"hf_dir": str(first), "remat": True})
    third = workdir(tmp_path, "third", {"hf_dir": str(second / "checkpoints"), "dtype": "float32"})
    cfg, _, tokenizer, source = model_loading.load_model(str(third), weights=False)
    direct, direct_tokenizer, _ = model_loading.model_of_block({"preset": "tiny", "tokenizer": "tiny"})
    assert source is None and len(tokenizer) == len(direct_tokenizer)
    # second's remat comes through; of the dtypes, the block nearer the top wins (third's)
    assert (cfg.remat, cfg.dtype, cfg.num_layers) == (True, "float32", direct.num_layers)
    cfg, _, _ = model_loading.model_of_block({"hf_dir": str(second)})
    assert (cfg.remat, cfg.dtype) == (True, "bfloat16")


def test_a_chain_that_loops_and_a_broken_link_are_one_line(tmp_path):
    a = tmp_path / "a"
    workdir(tmp_path, "a", {"hf_dir": str(tmp_path / "b")})
    workdir(tmp_path, "b", {"hf_dir": str(a)})
    with pytest.raises(UserError, match="is its own base model"):
        model_loading.load_model(str(a), weights=False)
    workdir(tmp_path, "c", {"hf_dir": str(tmp_path / "missing")})
    with pytest.raises(UserError, match=r"missing is neither an HF model directory"):
        model_loading.load_model(str(tmp_path / "c"), weights=False)
