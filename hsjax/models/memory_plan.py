"""How large a block of the model's transient tensors may be, decided in one place per device.

Three tensors of a training step grow with B x T and are bounded by running them in blocks: the
float32 logits of the head (B x T x V), the MLP's activations (B x T x F) and the dense attention
scores (B x N x T x S). Each is live for a moment (scores and MLP inside one layer, the logits after
the last), so each may take the same share of the device, `MemoryPlan.block_bytes`:

    block_bytes = largest power of two <= capacity / share(backend)

- capacity: `model.memory_budget` GiB when set (> 0); else what the device reports
  (`memory_stats()["bytes_limit"]`, a GPU's allocator limit); else the host's memory (CPU: the
  physical memory, or the cgroup's limit when lower). The physical memory, not "available" memory:
  that changes from minute to minute, and the compiled programs would change with it.
- share: 256 on the CPU, 4 on an accelerator. A CPU shares the host with the sampler, voter
  servers and other runs, and a loop of blocks costs it almost nothing (each block's matmul still
  runs at the CPU's speed); on the 23.5 GiB hosts of docs/performance.md this gives the 64 MiB
  every CPU figure there was measured with. An accelerator's memory belongs to this process, and a
  block loop costs it dearly (sequential small kernels: 512 blocks of 4 positions made the H200
  update 2.4x slower, issue 37), so a block there may take a quarter: at the H200 benchmark's
  shape (16 rows x 2,048 tokens, 151,936 vocabulary) nothing is blocked.
- The power of two keeps plans equal across machines whose memory differs a little.

Blocks: `rows_per_block` (positions of the MLP and the head, query rows of attention) is 0 when
the whole tensor fits, else the largest power of two of rows whose block fits. The head can block
over the vocabulary instead (`vocab_block`, used by `hsjax.rl.fused_head`): the matmuls stay
B x T wide whatever the budget. `MemoryPlan.head_blocking` says which; the vocabulary by default,
faster on the CPU as measured and the only one that keeps an accelerator's matmuls wide.
"""
from __future__ import annotations

import dataclasses
import functools
import os

import jax

GIB = 1 << 30
# Share of the device's memory one block may take: capacity // SHARE[backend] (module docstring).
CPU_SHARE = 256
ACCELERATOR_SHARE = 4
# Vocabulary blocks are multiples of this (a lane-dense width on GPU and TPU).
VOCAB_ALIGN = 128
HEAD_BLOCKINGS = ("positions", "vocab")
# How the head blocks when its logits pass the budget: the fused head over vocabulary blocks on
# every backend. On the 2-core CPU it took 0.75-0.82x the time of position blocks at the testbed's
# head and 0.25-0.47x at a 0.5B model's (perf/head_bench.py); on an accelerator position
# blocks make the matmuls narrow, while vocabulary blocks keep all B x T rows (docs/performance.md,
# "Memory plan per device"). `positions` stays for tests and benchmarks.
HEAD_BLOCKING = "vocab"


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    """Block sizes for one device: `block_bytes` per transient tensor, and how the head blocks
    when its logits pass it (`positions`: a block of positions at a time through the dense head;
    `vocab`: the fused head over blocks of the vocabulary, every position at once)."""

    block_bytes: int
    head_blocking: str = HEAD_BLOCKING

    def __post_init__(self):
        if self.block_bytes < 1:
            raise ValueError(f"MemoryPlan.block_bytes={self.block_bytes} must be >= 1")
        if self.head_blocking not in HEAD_BLOCKINGS:
            raise ValueError(f"MemoryPlan.head_blocking={self.head_blocking!r} is not one of {HEAD_BLOCKINGS}")

    def query_rows(self, batch: int, num_heads: int, seq: int, slots: int) -> int:
        """Query rows per attention block (float32 scores, B x N x rows x S); 0: dense."""
        return rows_per_block(seq, batch * num_heads * slots * 4, self.block_bytes)

    def mlp_positions(self, batch: int, seq: int, ffn: int, itemsize: int) -> int:
        """Positions per MLP block (B x positions x F activations of `itemsize` bytes); 0: one block."""
        return rows_per_block(seq, batch * ffn * itemsize, self.block_bytes)

    def head_positions(self, batch: int, seq: int, vocab: int) -> int:
        """Positions per block of the dense head (float32 logits, B x positions x V); 0: all."""
        return rows_per_block(seq, batch * vocab * 4, self.block_bytes)

    def head_vocab(self, tokens: int, vocab: int) -> int:
        """Vocabulary entries per block of the fused head (float32 tokens x block); 0: all."""
        return vocab_block(tokens, vocab, self.block_bytes)


def rows_per_block(rows: int, bytes_per_row: int, budget: int) -> int:
    """0 when all `rows` fit `budget`; else the largest power of two of rows (at least 1, fewer
    than `rows`) whose bytes fit it."""
    if rows * bytes_per_row <= budget:
        return 0
    block = 1
    while block * 2 * bytes_per_row <= budget and block * 2 < rows:
        block *= 2
    return block


def vocab_block(tokens: int, vocab: int, budget: int) -> int:
    """0 when float32 logits of `tokens` x `vocab` fit `budget`; else the width of equal vocabulary
    blocks (a multiple of VOCAB_ALIGN, at least one VOCAB_ALIGN) of as few blocks as fit it, so the
    padding of the last block stays under VOCAB_ALIGN x blocks."""
    if tokens * vocab * 4 <= budget:
        return 0
    blocks = max(2, -(-tokens * vocab * 4 // budget))
    while True:
        width = -(-vocab // blocks)
        width = -(-width // VOCAB_ALIGN) * VOCAB_ALIGN
        if tokens * width * 4 <= budget or width == VOCAB_ALIGN:
            return width
        blocks += 1


def plan_for(capacity_bytes: int, backend: str) -> MemoryPlan:
    """The plan of a device with `capacity_bytes` of memory on `backend` ('cpu', 'gpu', 'tpu', ...)."""
    share = CPU_SHARE if backend == "cpu" else ACCELERATOR_SHARE
    block = 1 << max(0, (int(capacity_bytes) // share).bit_length() - 1)
    return MemoryPlan(block_bytes=block)


def budget_bytes(memory_budget_gib: float) -> int:
    """`model.memory_budget` (GiB) in bytes; refuses a negative or non-finite value."""
    if not (memory_budget_gib >= 0 and memory_budget_gib != float("inf")):
        raise ValueError(f"model.memory_budget={memory_budget_gib!r}: expected GiB >= 0 (0: the device's own memory)")
    return int(memory_budget_gib * GIB)


@functools.lru_cache(maxsize=None)
def device_capacity_bytes(backend: str) -> int:
    """The memory of this process's first device of `backend`: its allocator's limit where the
    backend reports one, else (the CPU) the host's physical memory or its cgroup limit, the lower.
    A local device: in a multi-process run `jax.devices()[0]` may belong to another process, whose
    memory_stats() raises ("only supported for addressable PjRt devices")."""
    stats = jax.local_devices(backend=backend)[0].memory_stats() or {}
    if stats.get("bytes_limit"):
        return int(stats["bytes_limit"])
    return host_memory_bytes()


def host_memory_bytes() -> int:
    """Physical memory of the host, or the cgroup (v2 or v1) limit of this process when lower."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                limit = f.read().strip()
        except OSError:
            continue
        if limit.isdigit():
            total = min(total, int(limit))
    return total


def plan_of(memory_budget_gib: float = 0.0, backend: str | None = None) -> MemoryPlan:
    """The plan of the default backend's device (or `backend`'s), with `memory_budget_gib` GiB as
    its capacity when > 0. Called at trace time; the device is asked once per process."""
    backend = backend or jax.default_backend()
    capacity = budget_bytes(memory_budget_gib) or device_capacity_bytes(backend)
    return plan_for(capacity, backend)
