"""`HttpChatPolicy`: a ChatPolicy backed by an OpenAI-compatible server, a thin wrapper of
`hsjax.llm.client.ChatClient`.

It maps `SamplingParams` to the request (greedy: temperature 0 and top_p 1; `top_k` in
`extra_body`, a vLLM/SGLang extension, when set and not greedy; stop strings; seed; max_tokens;
the config's `extra_body` merged last, so it may override any of them), retries malformed
replies (a sampling policy may answer properly next time), runs the contexts of one `chat` call
concurrently and turns the client's `LLMError` into `PolicyError` (or "" with `on_error="empty"`).
Retry, timeout and key rules are the client's; see docs/rollout.md.
"""
from __future__ import annotations

import concurrent.futures
import json
import logging

from openai.types.chat import ChatCompletion

from hsjax.llm.client import ChatClient, ClientSettings, LLMError, reply_content
from hsjax.rollout.policy import PolicyError, SamplingParams

log = logging.getLogger(__name__)


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


class HttpChatPolicy:
    """Chat completions from an OpenAI-compatible server (`POST {base_url}/chat/completions`).

    `timeout`, `max_retries`, `backoff` and `max_backoff` (seconds) are the client's per-request
    timeout and retry schedule. A context that still fails raises `PolicyError`, or with
    `on_error="empty"` yields "" and a warning. The API key is read from the environment variable
    `api_key_env` (checked here, so a missing key fails before any rollout) and never logged.
    """

    def __init__(self, base_url: str, model: str, api_key_env: str | None = None, *,
                 timeout: float = 60.0, max_retries: int = 3, backoff: float = 1.0,
                 max_backoff: float = 30.0, max_concurrency: int = 8, on_error: str = "raise",
                 extra_body: dict | None = None):
        if on_error not in ("raise", "empty"):
            raise ValueError(f"HttpChatPolicy on_error={on_error!r}: use 'raise' or 'empty'")
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.max_retries = max_retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.max_concurrency = max_concurrency
        self.on_error = on_error
        self.extra_body = dict(extra_body or {})
        settings = ClientSettings(base_url=base_url, model=model, api_key_env=api_key_env, timeout_s=timeout,
                                  max_retries=max_retries, backoff_s=backoff, max_backoff_s=max_backoff,
                                  retry_malformed=True)
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

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def complete(self, messages: list[dict], sampling: SamplingParams) -> str:
        """One chat completion with retries; returns the reply text or raises `PolicyError`."""
        try:
            return self.client.complete(messages, **request_params(sampling, self.extra_body)).text
        except LLMError as e:
            raise PolicyError(f"HttpChatPolicy {self.url}: {e.detail}") from None

    def _complete_or_empty(self, messages, sampling):
        try:
            return self.complete(messages, sampling)
        except PolicyError as e:
            if self.on_error == "raise":
                raise
            log.warning("%s; replying with an empty string (on_error='empty')", e)
            return ""

    def chat(self, contexts: list[list[dict]], sampling: SamplingParams,
             infos: list[dict] | None = None) -> list[str]:
        if len(contexts) <= 1 or self.max_concurrency <= 1:
            return [self._complete_or_empty(m, sampling) for m in contexts]
        workers = min(self.max_concurrency, len(contexts))
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            return list(pool.map(lambda m: self._complete_or_empty(m, sampling), contexts))
