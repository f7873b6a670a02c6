"""The host process's memory: its resident set, and handing freed heap pages back to the system.

A training step allocates and frees hundreds of MiB on the host (the sampler's prompts and caches,
the packed batch, the update's buffers on CPU). glibc's malloc keeps freed chunks of its heaps for
reuse instead of returning them, and its mmap threshold rises after each large free, so more of the
next step's large buffers land in those heaps: the resident set ratchets up step after step
(README's demo: 1.29 GiB after its harness_s arm of which 0.50 GiB were free heap, measured
2026-12-04, docs/performance.md). `release_free_memory` asks glibc to return what is free
(`malloc_trim`); the training loop calls it after each step and, through
`release_after_compiles`, after every XLA compilation, whose working memory (a few hundred MiB for
the GRPO update) would otherwise stay resident under the buffers of the program's first run.
Elsewhere (macOS, musl) it does nothing.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools


@functools.lru_cache(maxsize=None)
def _malloc_trim():
    """glibc's `malloc_trim`, or None where the C library has none."""
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        return ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None


def release_free_memory() -> bool:
    """Returns the heap pages malloc holds free to the system; True where glibc did it."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(ctypes.c_size_t(0))
    return True


# What jax records when XLA has compiled a program (`jax._src.dispatch.BACKEND_COMPILE_EVENT`).
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


def _after_compile(event: str, duration_secs: float, **kwargs) -> None:
    del duration_secs, kwargs
    if event == COMPILE_EVENT:
        release_free_memory()


@functools.lru_cache(maxsize=None)
def release_after_compiles() -> None:
    """From now on, every XLA compilation in this process is followed by `release_free_memory`
    (once per process; later calls do nothing)."""
    import jax  # here, so that the rest of this module stays usable without jax

    jax.monitoring.register_event_duration_secs_listener(_after_compile)


def _status_gib(pid, key: str) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return 0.0


def resident_gib(pid: int | str = "self") -> float:
    """The process's resident set now (VmRSS), GiB; 0.0 where /proc is unavailable."""
    return _status_gib(pid, "VmRSS")


def peak_resident_gib(pid: int | str = "self") -> float:
    """The process's largest resident set so far (VmHWM), GiB; 0.0 where /proc is unavailable."""
    return _status_gib(pid, "VmHWM")
