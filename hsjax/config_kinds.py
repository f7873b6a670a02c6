"""The kinds of the `policy` and `benchmark.backend` blocks, each a typed config of the keys it reads.

`hsjax.builders` builds a policy from the typed config of its kind (`POLICY_KINDS`); a benchmark
backend block goes to the benchmark as it is, and its kinds here name the options each backend
takes (the benchmark's constructor reads them: DBBench's SQLite and MariaDB backends, AppWorld's
offline and real backends, SWE-Gym's instance sources and runtimes). From these types follow the
keys a kind never reads (`hsjax.infra.config_blocks.unread`), which `run.py` refuses to see
overridden. The rescue kinds are in `hsjax.harness_s.rescue_kinds`.
"""
from __future__ import annotations

import dataclasses

from hsjax.infra.config_blocks import BlockConfig

# ------------------------------------------------------------------------------------------------
# policy.kind


@dataclasses.dataclass(frozen=True)
class HttpOptions(BlockConfig):
    """The keys both HTTP kinds read: where the server is and how patiently it is reached."""

    base_url: str
    model: str
    api_key_env: str
    timeout: float
    max_retries: int
    backoff: float
    max_backoff: float
    max_reply_bytes: int
    max_consecutive_failures: int

    def client_options(self) -> dict:
        """The keyword arguments of the HTTP policies' clients."""
        return dict(api_key_env=self.api_key_env or None, timeout=self.timeout, max_retries=self.max_retries,
                    backoff=self.backoff, max_backoff=self.max_backoff, max_reply_bytes=self.max_reply_bytes,
                    max_consecutive_failures=self.max_consecutive_failures)


@dataclasses.dataclass(frozen=True)
class HttpPolicyConfig(HttpOptions):
    """`policy.kind=http`: chat text from an OpenAI-compatible server."""

    max_reply_chars: int


@dataclasses.dataclass(frozen=True)
class HttpTokensPolicyConfig(HttpOptions):
    """`policy.kind=http_tokens`: token ids and logprobs from a vLLM-compatible `/v1/completions`,
    prompts rendered with the tokenizer of `hf_dir`."""

    hf_dir: str


@dataclasses.dataclass(frozen=True)
class JaxPolicyConfig(BlockConfig):
    """`policy.kind=jax`: a checkpoint sampled in process."""

    checkpoint: str
    hf_dir: str


@dataclasses.dataclass(frozen=True)
class ScriptedPolicyConfig(BlockConfig):
    """`policy.kind=scripted`: the benchmark's slipping agent, with a probability per slip."""

    noise: dict


@dataclasses.dataclass(frozen=True)
class OraclePolicyConfig(BlockConfig):
    """`policy.kind=oracle`: the benchmark's gold replayer; reads nothing."""


POLICY_KINDS: dict[str, type[BlockConfig]] = {
    "http": HttpPolicyConfig, "http_tokens": HttpTokensPolicyConfig, "jax": JaxPolicyConfig,
    "scripted": ScriptedPolicyConfig, "oracle": OraclePolicyConfig,
}

# ------------------------------------------------------------------------------------------------
# benchmark.backend.kind (DBBench, synth, AppWorld)


@dataclasses.dataclass(frozen=True)
class SqliteBackend(BlockConfig):
    time_budget_s: float
    max_db_mb: float


@dataclasses.dataclass(frozen=True)
class MariadbBackend(SqliteBackend):
    url: str


@dataclasses.dataclass(frozen=True)
class SandboxBackend(BlockConfig):
    """AppWorld's `offline` backend: the sandbox its cells run in."""

    isolation: str
    wall_s: float
    cpu_s: int
    memory_mb: int


@dataclasses.dataclass(frozen=True)
class AppWorldBackend(SandboxBackend):
    python: str
    root: str


BACKEND_KINDS: dict[str, type[BlockConfig]] = {
    "sqlite": SqliteBackend, "mariadb": MariadbBackend,
    "offline": SandboxBackend, "appworld": AppWorldBackend,
}

# ------------------------------------------------------------------------------------------------
# SWE-Gym's backend: two selectors, `kind` (where the instances come from) and `runtime` (where
# they run); a key is read if either's choice reads it, or every choice does.


@dataclasses.dataclass(frozen=True)
class SwegymOfflineSource(BlockConfig):
    instances: str
    cache_dir: str


@dataclasses.dataclass(frozen=True)
class SwegymSource(SwegymOfflineSource):
    split_file: str


@dataclasses.dataclass(frozen=True)
class SwegymLocalRuntime(BlockConfig):
    repos_dir: str
    venvs_dir: str
    isolation: str
    cpu_s: int
    memory_mb: int


@dataclasses.dataclass(frozen=True)
class SwegymContainerRuntime(BlockConfig):
    container_cli: str


@dataclasses.dataclass(frozen=True)
class SwegymEveryBackend(BlockConfig):
    test_timeout_s: float


SWEGYM_BACKEND_KINDS: dict[str, dict[str, type[BlockConfig]]] = {
    "kind": {"offline": SwegymOfflineSource, "swegym": SwegymSource},
    "runtime": {"local": SwegymLocalRuntime, "container": SwegymContainerRuntime},
}
