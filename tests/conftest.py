"""Test-suite set-up: everything runs on the CPU, in float32, deterministically."""
import os

import pytest

from tests.fake_openai import FakeOpenAI

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def sqlite_backend():
    """One embedded SQLite DBBench backend for the whole session (each episode opens its own DB)."""
    from harness_envs.dbbench import make_backend

    backend = make_backend("sqlite")
    yield backend
    backend.close()


@pytest.fixture
def openai_server():
    """Starts fake OpenAI-compatible servers: `openai_server(*script) -> FakeOpenAI` (see
    tests/fake_openai.py for the script's steps); all are closed after the test."""
    started = []

    def start(*script):
        started.append(FakeOpenAI(*script))
        return started[-1]

    yield start
    for server in started:
        server.close()
