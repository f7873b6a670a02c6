"""Multi-process (multi-host) JAX: start-up, host-side exchange of Python objects, global arrays.

A run on several hosts (a TPU pod slice, GPU nodes) is one process per host. `initialize` starts
JAX's distributed runtime from `config.distributed` before anything touches a device. After that
`jax.devices()` lists every process's devices, the mesh spans all of them, and the jitted update is
one program over the whole mesh; each process still runs its own Python: its share of the episodes,
its own environments and its own copy of the policy for sampling (docs/scaling.md).

Host-side values (trajectories, router decisions) move between processes as pickled bytes through
JAX's own collectives (`process_allgather`), so no second transport is needed. Every helper is
the identity in a single-process run.
"""
from __future__ import annotations

import logging
import pickle
from typing import Any, Callable, Sequence

import jax
import numpy as np
from jax.experimental import multihost_utils

log = logging.getLogger(__name__)


def initialize(block) -> None:
    """Starts the distributed runtime as `block` (`config.distributed`) says; no-op when disabled.

    `num_cpu_devices` > 0 splits each process's CPU into that many devices (tests and CPU
    rehearsals of a pod layout). With `enabled`, the coordinator address, process count and id come
    from the block when set (address non-empty, count > 0, id >= 0) and are otherwise detected by
    JAX (TPU pods, SLURM, Open MPI, `JAX_COORDINATOR_ADDRESS`).
    """
    if block.num_cpu_devices:
        jax.config.update("jax_num_cpu_devices", int(block.num_cpu_devices))
    if not block.enabled:
        return
    if jax.distributed.is_initialized():
        return
    kwargs = {}
    if block.coordinator_address:
        kwargs["coordinator_address"] = block.coordinator_address
    if block.num_processes > 0:
        kwargs["num_processes"] = int(block.num_processes)
    if block.process_id >= 0:
        kwargs["process_id"] = int(block.process_id)
    if block.initialization_timeout_s:
        kwargs["initialization_timeout"] = int(block.initialization_timeout_s)
    # JAX's start-up records go to the console before the run's log file exists: keep them off it.
    quiet = logging.getLogger("jax")
    level = quiet.level
    quiet.setLevel(logging.WARNING)
    try:
        jax.distributed.initialize(**kwargs)
    finally:
        quiet.setLevel(level)


def log_topology() -> None:
    """One log line naming this process and its devices (multi-process runs)."""
    if jax.distributed.is_initialized():
        log.info("distributed: process %d of %d, %d local / %d global devices", jax.process_index(),
                 jax.process_count(), jax.local_device_count(), jax.device_count())


def process_index() -> int:
    """This process's index; 0 (without touching a device) when the distributed runtime is off."""
    return jax.process_index() if jax.distributed.is_initialized() else 0


def is_main() -> bool:
    """Whether this process writes the run's files (metrics, logs, console, artifacts)."""
    return jax.process_index() == 0


def process_slice(n: int, index: int | None = None, count: int | None = None) -> slice:
    """The contiguous share of `n` items of process `index` (default: this one): sizes differ by at
    most one, earlier processes take the extra items."""
    index = jax.process_index() if index is None else index
    count = jax.process_count() if count is None else count
    base, extra = divmod(n, count)
    start = index * base + min(index, extra)
    return slice(start, start + base + (1 if index < extra else 0))


def allgather_objects(obj: Any) -> list[Any]:
    """Every process's `obj`, in process order (picklable objects)."""
    if jax.process_count() == 1:
        return [obj]
    payload = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)
    sizes = np.asarray(multihost_utils.process_allgather(np.array([payload.size], np.int64))).reshape(-1)
    padded = np.zeros((int(sizes.max()),), np.uint8)
    padded[:payload.size] = payload
    gathered = np.asarray(multihost_utils.process_allgather(padded))
    return [pickle.loads(gathered[i, :int(sizes[i])].tobytes()) for i in range(len(sizes))]


def gather_shares(local: Sequence[Any]) -> list[Any]:
    """The lists of every process (each its `process_slice`), concatenated in order."""
    if jax.process_count() == 1:
        return list(local)
    return [item for share in allgather_objects(list(local)) for item in share]


def from_main(compute: Callable[[], Any]) -> Any:
    """`compute()` run on process 0 only; every process returns its value (for decisions that must
    agree and may not be repeatable, e.g. router votes of LLMs over HTTP)."""
    if jax.process_count() == 1:
        return compute()
    value = compute() if is_main() else None
    return allgather_objects(value)[0]


def global_array(host_value: np.ndarray, sharding: jax.sharding.Sharding) -> jax.Array:
    """A global array from a host value every process holds in full (each process places the
    shards of its own devices)."""
    host_value = np.asarray(host_value)
    return jax.make_array_from_callback(host_value.shape, sharding, lambda index: host_value[index])


def put_global(tree, shardings):
    """`global_array` over a tree (arrays already global are left as they are). `shardings` is one
    sharding or a same-structure tree."""
    if isinstance(shardings, jax.sharding.Sharding):
        shardings = jax.tree.map(lambda _: shardings, tree)

    def put(x, sharding):
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            return x
        return global_array(np.asarray(x), sharding)
    return jax.tree.map(put, tree, shardings)


def local_copy(tree):
    """The values of a tree of (possibly multi-process) arrays as arrays on this process's first
    device: what each process samples with. Replicated arrays cost one local copy; sharded ones
    are gathered from the other processes."""
    device = jax.local_devices()[0]

    def fetch(x):
        if not isinstance(x, jax.Array) or x.is_fully_addressable:
            return x
        if x.is_fully_replicated:
            return jax.device_put(x.addressable_data(0), device)
        return jax.device_put(np.asarray(multihost_utils.process_allgather(x, tiled=True)), device)
    return jax.tree.map(fetch, tree)


def any_process(flag: bool) -> bool:
    """Whether `flag` is true on any process (one small collective; every process must call it at
    the same point, e.g. a step boundary)."""
    if jax.process_count() == 1:
        return bool(flag)
    return bool(np.asarray(multihost_utils.process_allgather(np.array([int(flag)], np.int32))).any())


def sync(name: str) -> None:
    """A barrier of every process (no-op alone)."""
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)
