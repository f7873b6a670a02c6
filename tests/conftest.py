"""Test-suite set-up: everything runs on the CPU, in float32, deterministically."""
import os

import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def sqlite_backend():
    """One embedded SQLite DBBench backend for the whole session (each episode opens its own DB)."""
    from harness_envs.dbbench.backends import make_backend

    backend = make_backend("sqlite")
    yield backend
    backend.close()
