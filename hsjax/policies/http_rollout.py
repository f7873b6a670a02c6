"""`HttpRolloutPolicy`: a training run's rollouts from separate engines, with its weights pushed to them.

`rollout.backend=http_tokens` (docs/training.md, "Async rollouts"). The run's prompts go, token ids
in and ids and logprobs out, to one or more vLLM-compatible `/v1/completions` servers (`hsjax serve`,
SGLang, vLLM with a reload endpoint): row i of a batch to server i mod S, each through an
`HttpTokenPolicy` (retries, timeouts, the circuit breaker). The logprobs the servers return are the
behaviour logprobs of the loss's ratio.

Weight push (`update_params`, called by the loop once per params version): the params are written as
an HF safetensors directory `<weights_dir>/v<NNNNNN>` and every server is told to load it with
`POST <server root>/update_weights_from_disk {"model_path", "weight_version"}` (SGLang's endpoint;
`hsjax serve` answers it when started with `serve.weights_root` holding `weights_dir`). The servers must
see `weights_dir` at the same path (one machine, or a shared file system). A server that refuses or
cannot be reached stops the run with `PolicyError`: sampling on with old weights would break the
staleness bound silently. The other versions' directories are removed once every server holds the new one.
There is no in-memory path over HTTP; the in-memory engine is `rollout.backend=vllm`.
"""
from __future__ import annotations

import concurrent.futures
import json
import logging
import pathlib
import shutil

import jax
import numpy as np

from hsjax.llm.client import quote
from hsjax.llm.transport import bounded_http_client
from hsjax.models import hf
from hsjax.policies.base import FailedReply, Generation, PolicyError, SamplingParams, TokenPolicy
from hsjax.policies.http_tokens import HttpTokenPolicy

log = logging.getLogger(__name__)

PUSH_REPLY_BYTES = 1 << 16


def server_root(base_url: str) -> str:
    """The server's root URL from its OpenAI base URL (`http://host:port/v1` -> `http://host:port`)."""
    url = base_url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


class HttpRolloutPolicy(TokenPolicy):
    """Token ids in, ids and logprobs out, from `base_urls`; `update_params` pushes weights (module
    docstring). `tokenizer` and `model_cfg` are the trained model's; `client_options` are
    `HttpTokenPolicy`'s (timeouts, retries, `api_key_env`)."""

    def __init__(self, base_urls, model: str, tokenizer, model_cfg, weights_dir, *, max_concurrency: int = 16,
                 push_timeout_s: float = 600.0, **client_options):
        if not base_urls:
            raise ValueError("HttpRolloutPolicy needs at least one base URL")
        self.tokenizer = tokenizer
        self.model_cfg = model_cfg
        self.weights_dir = pathlib.Path(weights_dir)
        self.push_timeout_s = float(push_timeout_s)
        self.servers = [HttpTokenPolicy(url, model, tokenizer, max_concurrency=max_concurrency, **client_options)
                        for url in base_urls]
        self.version = None  # the weight version every server holds; None: what they started with
        self._pool = concurrent.futures.ThreadPoolExecutor(len(self.servers), thread_name_prefix="http-rollout")

    def __repr__(self):
        return f"HttpRolloutPolicy({[s.url for s in self.servers]!r})"

    def generate(self, prompts: list[list[int]], sampling: SamplingParams,
                 turn_seeds=None) -> list[Generation | FailedReply]:
        """Row i from server i mod S, the servers concurrently; turn seeds are not sent (each
        server draws by its own key schedule)."""
        shares = [list(range(s, len(prompts), len(self.servers))) for s in range(len(self.servers))]
        futures = [self._pool.submit(server.generate, [prompts[i] for i in rows], sampling)
                   for server, rows in zip(self.servers, shares) if rows]
        out: list = [None] * len(prompts)
        for rows, future in zip([r for r in shares if r], futures):
            for i, generation in zip(rows, future.result()):
                out[i] = generation
        return out

    def update_params(self, params) -> None:
        """Writes `params` as the next version's HF directory and has every server load it."""
        version = 0 if self.version is None else self.version + 1
        path = (self.weights_dir / f"v{version:06d}").resolve()
        host = jax.tree.map(np.asarray, params)
        hf.save_pretrained(host, self.model_cfg, self.tokenizer, path)
        for server in self.servers:
            self._push(server, path, version)
        self.version = version
        for old in self.weights_dir.glob("v[0-9]*"):  # earlier versions, this run's or a killed one's
            if old.resolve() != path:
                shutil.rmtree(old, ignore_errors=True)
        log.info("pushed weight version %d (%s) to %d server(s)", version, path, len(self.servers))

    def _push(self, server: HttpTokenPolicy, path: pathlib.Path, version: int) -> None:
        url = server_root(server.base_url) + "/update_weights_from_disk"
        client, _ = bounded_http_client(url, self.push_timeout_s, PUSH_REPLY_BYTES)
        key = server.client.api_key()
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        try:
            with client:
                reply = client.post(url, json={"model_path": str(path), "weight_version": str(version)},
                                    headers=headers)
        except Exception as e:
            raise PolicyError(f"pushing weight version {version} to {url} failed: {type(e).__name__}: "
                              f"{quote(str(e), key)}; the run stops rather than sample with old weights") from None
        try:
            body = reply.json()
        except (json.JSONDecodeError, ValueError):
            body = {}
        if reply.status_code != 200 or not (isinstance(body, dict) and body.get("success")):
            raise PolicyError(f"{url} refused weight version {version} (HTTP {reply.status_code}: "
                              f"{quote(reply.text, key)}); start hsjax serve with serve.weights_root holding "
                              f"{self.weights_dir} (or a server with SGLang's update_weights_from_disk)")

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        for server in self.servers:
            server.close()
