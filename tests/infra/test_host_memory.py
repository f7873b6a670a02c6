"""Freed heap pages go back to the system: the ratchet the training loop trims each step."""
import ctypes.util
import platform
import subprocess
import sys
import textwrap

import pytest

from hsjax.infra import host_memory

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


@pytest.mark.skipif(platform.system() != "Linux", reason="read from /proc/self/status")
def test_resident_set_is_read_from_proc():
    rss, peak = host_memory.resident_gib(), host_memory.peak_resident_gib()
    assert 0.005 < rss <= peak < 64  # this test process: some MiB, below the machine


@pytest.mark.skipif(not GLIBC, reason="malloc_trim is glibc's; elsewhere the call does nothing")
def test_release_returns_freed_heap_pages_that_malloc_would_keep():
    """200 MiB of 2 KiB blocks (below glibc's mmap threshold, so they live in the heap), freed
    under one block still in use at the heap's top, so malloc cannot shrink the heap by itself:
    the resident set stays up until `release_free_memory`. Run in a fresh interpreter, so no
    other test's allocations blur the figures."""
    code = textwrap.dedent("""
        from hsjax.infra import host_memory
        blocks = [bytearray(2048) for _ in range(100_000)]
        pin = bytearray(2048)
        del blocks
        before = host_memory.resident_gib()
        assert host_memory.release_free_memory()
        after = host_memory.resident_gib()
        print(before, after)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    before, after = map(float, out.stdout.split())
    assert before - after > 0.1, (before, after)  # GiB: most of the 200 MiB came back


def test_release_is_a_no_op_without_glibc(monkeypatch):
    host_memory._malloc_trim.cache_clear()
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: None)
    try:
        assert host_memory.release_free_memory() is False
    finally:
        host_memory._malloc_trim.cache_clear()


def test_every_compilation_is_followed_by_a_release(monkeypatch):
    """Once registered, each XLA compilation calls `release_free_memory` (the event jax records
    is looked up by name: a jax that renamed it would fail here, not silently keep the memory)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    calls = []
    monkeypatch.setattr(host_memory, "release_free_memory", lambda: calls.append(1) or True)
    host_memory.release_after_compiles()
    host_memory.release_after_compiles()  # registers once

    f = jax.jit(lambda x: jnp.sin(x) * 3.0 + x.shape[0])
    x = np.ones(7, np.float32)
    f(x).block_until_ready()
    assert len(calls) == 1  # one program compiled
    f(x).block_until_ready()
    assert len(calls) == 1  # a cache hit compiles nothing
    f(np.ones(5, np.float32)).block_until_ready()
    assert len(calls) == 2
