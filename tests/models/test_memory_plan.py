"""The memory plan: block sizes from the device's memory, the backend and the shapes."""
import dataclasses

import pytest

from hsjax.models import memory_plan, model
from hsjax.models.memory_plan import GIB, MemoryPlan, plan_for, rows_per_block, vocab_block
from hsjax.models.presets import get_preset

H200_BYTES = 141e9


def test_the_cpu_hosts_of_the_recorded_figures_keep_64_mib_blocks():
    """docs/performance.md's CPU figures were measured with 64 MiB blocks on 23.5 GiB hosts."""
    for gib in (16.0, 23.5, 31.9):
        plan = plan_for(int(gib * GIB), "cpu")
        assert plan.block_bytes == 64 << 20 and plan.head_blocking == "vocab"
    assert plan_for(64 * GIB, "cpu").block_bytes == 256 << 20


def test_an_accelerator_gives_a_block_a_quarter_of_its_memory_and_the_fused_head():
    plan = plan_for(H200_BYTES, "gpu")
    assert plan.block_bytes == 32 * GIB and plan.head_blocking == "vocab"
    assert plan_for(H200_BYTES, "tpu").block_bytes == 32 * GIB


def test_rows_per_block():
    assert rows_per_block(2048, 1024, 2048 * 1024) == 0  # all fit
    assert rows_per_block(2048, 1024, 2048 * 1024 - 1) == 1024
    assert rows_per_block(45, 10, 85) == 8
    assert rows_per_block(8, 100, 1) == 1  # never fewer than one row


def test_vocab_blocks_are_aligned_few_and_fit():
    assert vocab_block(100, 500, 100 * 500 * 4) == 0
    width = vocab_block(64 * 2048, 151936, 32 * GIB)  # the GPU shape with one micro-batch
    assert width % 128 == 0 and 64 * 2048 * width * 4 <= 32 * GIB
    assert -(-151936 // width) == 3 and 3 * width - 151936 < 3 * 128
    assert vocab_block(10**6, 500, 1) == 128  # the narrowest block, even past the budget


def test_memory_budget_overrides_the_device_and_is_checked():
    assert memory_plan.plan_of(24.0, "cpu") == plan_for(24 * GIB, "cpu")
    assert memory_plan.plan_of(141e9 / GIB, "gpu").block_bytes == 32 * GIB
    assert memory_plan.plan_of(0.0, "cpu") == plan_for(memory_plan.host_memory_bytes(), "cpu")
    cfg = dataclasses.replace(get_preset("tiny"), memory_budget=8.0)
    assert model.device_plan(cfg).block_bytes == plan_for(8 * GIB, "cpu").block_bytes
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="memory_budget"):
            get_preset("tiny", memory_budget=bad)
        with pytest.raises(ValueError, match="memory_budget"):
            memory_plan.budget_bytes(bad)
    with pytest.raises(ValueError, match="head_blocking"):
        MemoryPlan(1, "rows")


def test_the_model_block_of_a_config_carries_the_budget_to_the_model():
    """`--config.model.memory_budget=8` reaches ModelConfig (builders' runtime fields), and a
    negative value is refused by run.py's range checks before anything runs."""
    from ml_collections import ConfigDict

    from hsjax import builders
    from hsjax.infra import config_checks, experiments

    common = experiments.load("common")
    block = common.model()
    assert block.memory_budget == 0.0  # auto
    block.memory_budget = 8
    cfg, _, _ = builders.model_of_block(block)
    assert cfg.memory_budget == 8.0
    config = ConfigDict({"model": common.model()})
    config.model.memory_budget = -1.0
    assert config_checks.violations(config) == [
        "--config.model.memory_budget=-1.0 is out of range: allowed a finite number >= 0"]
