"""LoRA through the training loop (`lora.rank > 0`): only the adapters train, sit in the optimizer
state and the checkpoint; a workdir loads as its base with the adapters merged, exports to a
directory plain transformers runs to the same logits, and a resumed run ends where an uninterrupted
one does."""
import json

import jax
import numpy as np
import pytest
import torch
import transformers

from hsjax import builders
from hsjax.infra import checkpoint as ckpt_lib
from hsjax.infra import config_checks, experiments
from hsjax.infra.errors import UserError
from hsjax.models import forward, lora
from hsjax.modes import export as export_mode
from hsjax.modes import train

pytestmark = pytest.mark.filterwarnings("ignore:Some donated buffers were not usable")
testbed = experiments.load("testbed")


def lora_config(total_steps):
    # The v3 warm start with the tables_first sibling: some rollouts succeed, so the adapters get a gradient.
    config = experiments.get_config("testbed", "names_tables_first,smoke,v3")
    config.lora.rank, config.lora.alpha = 4, 8.0
    config.loss.beta = 0.04  # the KL term's reference is the frozen base itself
    config.total_steps = total_steps
    config.optim.schedule_steps = 2  # the same schedule for a run stopped after step 1 and extended
    config.checkpoint.every = 1
    config.eval.every = 0
    config.rollout.groups, config.rollout.max_new_tokens = 4, 64
    return config


def leaves(tree):
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("lora") / "run"
    train.main(lora_config(2), str(workdir))
    return workdir


def test_only_the_adapters_train_and_are_saved(run):
    _, base, _, _ = builders.load_model(testbed.NAMES_V3_WARMSTART)
    adapters = ckpt_lib.load_params(run / "checkpoints")
    assert set(adapters) == {"layers"} and set(adapters["layers"]) == set(lora.INPUT_AXES)
    assert all(set(ab) == {"a", "b"} for ab in adapters["layers"].values())
    lora.check_fits(adapters, base)
    # B started at zero: the two updates moved it
    assert max(float(np.abs(ab["b"]).max()) for ab in adapters["layers"].values()) > 0
    # the whole saved state (adapters, Adam's moments, step, rng) is a fraction of the base model
    state = ckpt_lib.load_params(run / "checkpoints", subtree=None)
    saved = sum(x.size for x in leaves(state))
    assert 3 * lora.num_params(adapters) <= saved < 3 * lora.num_params(adapters) + 100
    assert saved < lora.num_params(base) / 4
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all(np.isfinite(r["loss/pg"]) for r in rows)
    assert rows[0]["loss/kl"] == pytest.approx(0.0, abs=1e-9)  # step 1 plays the base itself
    assert all(np.isfinite(r["loss/kl"]) for r in rows)


def test_the_workdir_loads_merged_and_exports_to_plain_transformers(run, tmp_path):
    cfg, base, _, _ = builders.load_model(testbed.NAMES_V3_WARMSTART)
    adapters = ckpt_lib.load_params(run / "checkpoints")
    _, loaded, _, _ = builders.load_model(str(run))
    merged = lora.merge(base, adapters, lora.scale_of(8.0, 4))
    for got, want in zip(leaves(loaded), leaves(merged)):
        np.testing.assert_array_equal(got, want)
    assert any(not np.array_equal(a, b) for a, b in zip(leaves(loaded), leaves(base)))

    config = experiments.get_config("export")
    config.export.checkpoint = str(run)
    export_mode.main(config, str(tmp_path / "export"))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "export" / "hf"),
                                                              dtype=torch.float32).eval()
    tokens = np.arange(3, 40, dtype=np.int32)[None] % cfg.vocab_size
    ours = np.asarray(forward(cfg, merged, tokens, np.arange(tokens.shape[1])[None])[0][0])
    with torch.no_grad():
        theirs = model(torch.tensor(tokens, dtype=torch.long)).logits[0].numpy()
    # the f32 gap of any export (tests/modes/test_export.py); the merge itself is exact to 1e-5
    # against the low-rank path (tests/models/test_lora.py)
    assert np.abs(theirs - ours).max() < 1e-4


def test_a_resumed_lora_run_ends_where_an_uninterrupted_one_does(run, tmp_path):
    train.main(lora_config(1), str(tmp_path / "b"))
    train.main(lora_config(2), str(tmp_path / "b"))  # resumes from step 1's checkpoint
    for got, want in zip(leaves(ckpt_lib.load_params(tmp_path / "b" / "checkpoints", subtree=None)),
                         leaves(ckpt_lib.load_params(run / "checkpoints", subtree=None))):
        np.testing.assert_array_equal(got, want)


def test_lora_keys_are_checked_and_unread_without_adapters():
    config = lora_config(1)
    config.lora.targets = ("q_proj", "qkv")
    with pytest.raises(UserError, match=r"--config.lora.targets=.* is out of range: allowed one of"):
        config_checks.check(config)
    plain = experiments.get_config("testbed", "names_tables_first,smoke")
    assert {"lora.alpha", "lora.targets"} <= set(train.unread(plain)) and "lora.rank" not in train.unread(plain)
    assert "lora.alpha" not in train.unread(lora_config(1))
