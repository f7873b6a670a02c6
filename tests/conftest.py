"""Test-suite set-up: everything runs on the CPU, in float32, deterministically."""
import os
import shutil
import tempfile

import pytest

from tests.fake_openai import FakeOpenAI

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# One persistent XLA compilation cache for the session: its xdist workers and every `run.py`
# subprocess the tests start inherit it. Dozens of tests build the same tiny model's train step,
# sampler and eval programs, and compiling them is most of what a smoke run costs on CI's two
# cores. Entries are keyed by the program's HLO and the compile options, so a hit is the
# executable a fresh compile would give (the exactness and resume tests still compare bits).
_XLA_CACHE = None
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID") or str(os.getpid())
    _XLA_CACHE = os.path.join(tempfile.gettempdir(), f"hsjax-tests-xla-{_run_id}")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _XLA_CACHE
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.1")


def pytest_sessionfinish(session):
    # The controller (or a run without xdist) removes the cache; workers leave it to it.
    if _XLA_CACHE and not os.environ.get("PYTEST_XDIST_WORKER"):
        shutil.rmtree(_XLA_CACHE, ignore_errors=True)


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
