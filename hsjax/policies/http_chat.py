"""`HttpChatPolicy`: a ChatPolicy backed by an OpenAI-compatible server, a thin wrapper of
`hsjax.llm.client.ChatClient` (`hsjax.policies.http_tokens.HttpTokenPolicy` is the same as a
TokenPolicy, over a vLLM-compatible server's `/v1/completions`).

It maps `SamplingParams` to the request (greedy: temperature 0 and top_p 1; `top_k` in
`extra_body`, a vLLM/SGLang extension, when set and not greedy; stop strings; seed; max_tokens;
the config's `extra_body` merged last, so it may override any of them), retries malformed
replies (a sampling policy may answer properly next time) and runs the contexts of one `chat` call
concurrently. Retry, timeout, reply-size and key rules are the client's; see docs/rollout.md.

Failures, per context and per run:

* A context whose request still fails after the client's retries gets a `FailedReply(reason)` in
  place of its reply (`on_error="episode"`, the default): the engine ends that episode with
  failure mode `policy_error` and the run goes on. `on_error="raise"` raises `PolicyError` instead.
* A circuit breaker: after `max_consecutive_failures` failed requests with no success between
  them, the endpoint is taken to be down and every call raises `EndpointDown` (a `PolicyError`)
  naming the URL, the count and the last reason, so a run stops with one clear message instead of
  failing each episode slowly. 0 turns the breaker off.
* A reply longer than `max_tokens` allows (a server that ignores it) is cut to `max_reply_chars`
  characters (default `CHARS_PER_TOKEN * sampling.max_new_tokens`), counted in `truncated_replies`
  and logged.
"""
from __future__ import annotations

import concurrent.futures
import json
import logging
import threading

from openai.types.chat import ChatCompletion

from hsjax.infra.metrics import encodable_text
from hsjax.llm.client import ChatClient, ClientSettings, LLMError, reply_content
from hsjax.llm.transport import DEFAULT_MAX_REPLY_BYTES
from hsjax.policies.base import ChatPolicy, EndpointDown, FailedReply, PolicyError, SamplingParams

log = logging.getLogger(__name__)

ON_ERROR = ("episode", "raise")
# Characters a reply may hold per token of `max_new_tokens`: generous (English runs ~4 characters a
# token), so only a server that ignored max_tokens is cut.
CHARS_PER_TOKEN = 16


def request_params(sampling: SamplingParams, extra_body: dict | None = None) -> dict:
    """Keyword arguments of `ChatClient.complete` for one sampling setting."""
    params = {"temperature": 0.0 if sampling.greedy else sampling.temperature,
              "top_p": 1.0 if sampling.greedy else sampling.top_p,
              "max_tokens": sampling.max_new_tokens, "seed": sampling.seed,
              "stop": list(sampling.stop_strings) or None}
    body = {}
    if sampling.top_k and not sampling.greedy:
        body["top_k"] = sampling.top_k  # not OpenAI's; vLLM/SGLang servers accept it
    body.update(extra_body or {})
    params["extra_body"] = body or None
    return params


def parse_chat_completion(text: str) -> str:
    """The first choice's message content of a chat-completions body; ValueError if malformed."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"not JSON: {e}; body starts {text[:80]!r}") from None
    if not isinstance(data, dict):
        raise ValueError(f"not a chat completion but a JSON {type(data).__name__}")
    return reply_content(ChatCompletion.construct(**data))


class HttpChatPolicy(ChatPolicy):
    """Chat completions from an OpenAI-compatible server (`POST {base_url}/chat/completions`).

    `timeout`, `max_retries`, `backoff` and `max_backoff` (seconds) are the client's per-attempt
    wall-clock limit and retry schedule; `max_reply_bytes` bounds a reply body. `on_error`,
    `max_consecutive_failures` and `max_reply_chars`: the module docstring. The API key is read
    from the environment variable `api_key_env` (checked here, so a missing key fails before any
    rollout) and never logged.
    """

    def __init__(self, base_url: str, model: str, api_key_env: str | None = None, *,
                 timeout: float = 60.0, max_retries: int = 3, backoff: float = 1.0,
                 max_backoff: float = 30.0, max_concurrency: int = 8, on_error: str = "episode",
                 max_consecutive_failures: int = 16, max_reply_chars: int | None = None,
                 max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES, extra_body: dict | None = None):
        if on_error not in ON_ERROR:
            raise ValueError(f"HttpChatPolicy on_error={on_error!r}: use one of {ON_ERROR}")
        if max_consecutive_failures < 0 or (max_reply_chars is not None and max_reply_chars < 1):
            raise ValueError(f"HttpChatPolicy: max_consecutive_failures must be >= 0 (0: no breaker) and "
                             f"max_reply_chars >= 1 or None; got {max_consecutive_failures}, {max_reply_chars}")
        self.base_url = base_url
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.max_retries = max_retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.max_concurrency = max_concurrency
        self.on_error = on_error
        self.max_consecutive_failures = int(max_consecutive_failures)
        self.max_reply_chars = max_reply_chars
        self.extra_body = dict(extra_body or {})
        self.consecutive_failures = 0
        self.truncated_replies = 0
        self._down: str | None = None  # the EndpointDown message once the breaker tripped
        self._lock = threading.Lock()
        settings = ClientSettings(base_url=base_url, model=model, api_key_env=api_key_env, timeout_s=timeout,
                                  max_retries=max_retries, backoff_s=backoff, max_backoff_s=max_backoff,
                                  retry_malformed=True, max_reply_bytes=max_reply_bytes)
        self.client = ChatClient(settings, label="HttpChatPolicy")
        try:
            self.client.api_key()
        except LLMError as e:
            self.client.close()
            raise PolicyError(f"HttpChatPolicy: {e.detail}, or pass api_key_env=None") from None

    def __repr__(self):
        return f"HttpChatPolicy(url={self.url!r}, model={self.model!r})"

    def close(self):
        self.client.close()

    def complete(self, messages: list[dict], sampling: SamplingParams) -> str:
        """One chat completion with retries: the reply text (cut to `max_reply_chars`), or
        `PolicyError` (`EndpointDown` once the breaker has tripped)."""
        if self._down is not None:
            raise EndpointDown(self._down)
        try:
            text = self.client.complete(messages, **request_params(sampling, self.extra_body)).text
        except LLMError as e:
            self._failed(e.detail)
            raise PolicyError(f"HttpChatPolicy {self.url}: {e.detail}") from None
        with self._lock:
            self.consecutive_failures = 0
        # A JSON `\udcff` escape in the reply leaves a lone surrogate, which no later request, log
        # or result file can encode (the next turn's request failed as "malformed" every retry):
        # kept as the visible text `\udcff` instead.
        return self._bounded(encodable_text(text), sampling)

    def _failed(self, detail: str) -> None:
        """Counts a failed request; trips the breaker (raising `EndpointDown`) at the limit."""
        with self._lock:
            self.consecutive_failures += 1
            n = self.consecutive_failures
            if self._down is None and self.max_consecutive_failures and n >= self.max_consecutive_failures:
                self._down = (f"HttpChatPolicy: the endpoint {self.url} looks down: {n} requests in a row failed "
                              f"with no success between them (last: {detail}). Check that the server is up and "
                              "reachable at that URL, or raise policy.max_consecutive_failures")
        if self._down is not None:
            raise EndpointDown(self._down)

    def _bounded(self, text: str, sampling: SamplingParams) -> str:
        limit = self.max_reply_chars or CHARS_PER_TOKEN * sampling.max_new_tokens
        if len(text) <= limit:
            return text
        with self._lock:
            self.truncated_replies += 1
            n = self.truncated_replies
        (log.warning if n == 1 else log.info)(
            "HttpChatPolicy %s: a reply of %d characters, more than max_tokens=%d allows, was cut to %d "
            "(%d replies cut so far; the server may ignore max_tokens)", self.url, len(text),
            sampling.max_new_tokens, limit, n)
        return text[:limit]

    def _reply(self, messages: list[dict], sampling: SamplingParams) -> str | FailedReply:
        try:
            return self.complete(messages, sampling)
        except EndpointDown:
            raise
        except PolicyError as e:
            if self.on_error == "raise":
                raise
            return FailedReply(str(e))

    def chat(self, contexts: list[list[dict]], sampling: SamplingParams,
             infos: list[dict] | None = None) -> list[str | FailedReply]:
        if len(contexts) <= 1 or self.max_concurrency <= 1:
            return [self._reply(m, sampling) for m in contexts]
        workers = min(self.max_concurrency, len(contexts))
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            return list(pool.map(lambda m: self._reply(m, sampling), contexts))
