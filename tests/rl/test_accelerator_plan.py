"""Regression guard of issue 37, without an accelerator: the GRPO update of the GPU benchmark
(`perf/train_bench.py --gpu`: Qwen2-0.5B shapes, 64 rows x 2,048 tokens, 4 micro-batches,
bf16 compute, remat) planned for an H200's memory keeps no block loop at that shape.

At d7889b9 the 64 MiB budgets of a 2-core CPU applied on every device, and the update ran the
head 4 positions at a time (512 sequential blocks a micro-batch) and the MLP in blocks of 128
positions: 2.42x slower on the H200. The test lowers the update with abstract inputs (no memory,
no compilation) and counts the `while` loops of its StableHLO against the same update with
nothing blocked. The accelerator's plan is injected (its memory as `model.memory_budget`, its
backend by patching `memory_plan.plan_of`); nothing queries a device.
"""
import dataclasses
import functools

import jax
import jax.numpy as jnp
import pytest

from hsjax.models import memory_plan
from hsjax.models.memory_plan import GIB, MemoryPlan, plan_for
from hsjax.models.model import init_params
from hsjax.models.presets import get_preset
from hsjax.rl import grpo
from hsjax.rl.batch import TrainBatch
from hsjax.rl.losses import LossConfig
from hsjax.rl.optim import make_optimizer

H200_BYTES = 141e9
ROWS, T, MICRO_BATCHES, GROUPS = 64, 2048, 4, 4  # train_bench.py --gpu: G=4 x (n=8 + R=8)


def gpu_benchmark_config(attention_impl="xla", **overrides):
    return get_preset("qwen2_0p5b", dtype="bfloat16", param_dtype="float32", remat=True,
                      attention_impl=attention_impl, **overrides)


def abstract_batch() -> TrainBatch:
    bt = lambda dtype: jax.ShapeDtypeStruct((ROWS, T), dtype)  # noqa: E731
    b = lambda dtype: jax.ShapeDtypeStruct((ROWS,), dtype)  # noqa: E731
    return TrainBatch(
        tokens_BxT=bt(jnp.int32), positions_BxT=bt(jnp.int32), segment_ids_BxT=bt(jnp.int32),
        loss_mask_BxT=bt(jnp.bool_), old_logp_BxT=bt(jnp.float32), reward_B=b(jnp.float32),
        group_B=b(jnp.int32), slot_B=b(jnp.int32), harness_B=b(jnp.int32), is_rescue_B=b(jnp.bool_),
        valid_B=b(jnp.bool_), recontext_B=b(jnp.bool_), overlong_B=b(jnp.bool_), num_groups=GROUPS)


def while_loops(cfg, micro_batches=MICRO_BATCHES) -> int:
    """`stablehlo.while` ops of the lowered update (layer scans, micro-batch scan, block loops)."""
    optimizer = make_optimizer(learning_rate=1e-6, warmup_steps=1, total_steps=1000)
    state = jax.eval_shape(lambda: grpo.init_train_state(
        init_params(cfg, jax.random.key(0)), optimizer, jax.random.key(1)))
    step = functools.partial(grpo.train_step, cfg=cfg, loss_cfg=LossConfig(), optimizer=optimizer,
                             num_micro_batches=micro_batches)
    return jax.jit(step).lower(state, abstract_batch()).as_text().count("stablehlo.while")


@pytest.fixture
def as_if_gpu(monkeypatch):
    """Plans as a GPU would (its share of memory and its head), whatever backend runs the test."""
    real = memory_plan.plan_of
    monkeypatch.setattr(memory_plan, "plan_of", lambda budget=0.0, backend=None: real(budget, "gpu"))


def test_the_h200_plan_blocks_nothing_at_the_gpu_benchmark_shape():
    plan = plan_for(H200_BYTES, "gpu")
    rows = ROWS // MICRO_BATCHES
    cfg = gpu_benchmark_config()
    assert plan.head_positions(rows, T, cfg.vocab_size) == 0  # d7889b9: 4
    assert plan.head_vocab(rows * T, cfg.vocab_size) == 0
    assert plan.mlp_positions(rows, T, cfg.intermediate_size, 2) == 0  # d7889b9: 128
    assert plan.query_rows(rows, cfg.num_heads, T, T) == 0  # d7889b9: 32 (XLA attention)
    # One micro-batch of 64 rows: 80 GB of logits, the fused head in 3 vocabulary blocks.
    assert plan.head_vocab(ROWS * T, cfg.vocab_size) == 50688
    # An H200 whose allocator reports 75% of its memory (jax's default preallocation): 2 blocks.
    assert plan_for(0.75 * 150.7e9, "gpu").head_vocab(rows * T, cfg.vocab_size) == 76032


def test_the_lowered_update_keeps_no_block_loop_on_an_h200(as_if_gpu):
    h200 = gpu_benchmark_config(memory_budget=H200_BYTES / GIB)
    unbounded = gpu_benchmark_config(memory_budget=float(1 << 40))  # every block fits
    assert while_loops(h200) == while_loops(unbounded)


def test_the_cpu_plan_of_the_same_shape_does_block(monkeypatch):
    """The other side of the guard: at a 2-core CPU's 64 MiB the same update has block loops
    (so counting them sees a per-position loop when there is one)."""
    cfg = gpu_benchmark_config(num_layers=1)
    monkeypatch.setattr(memory_plan, "plan_of", lambda budget=0.0, backend=None: MemoryPlan(64 << 20))
    blocked = while_loops(cfg, micro_batches=1)
    monkeypatch.setattr(memory_plan, "plan_of", lambda budget=0.0, backend=None: MemoryPlan(1 << 50))
    assert blocked > while_loops(cfg, micro_batches=1)
