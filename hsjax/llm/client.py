"""One OpenAI-compatible client for the project: the HTTP policies, the voters, the proposer.

Built on the official `openai` SDK: it owns the wire format (`POST {base_url}/chat/completions`;
`complete_tokens`: `POST {base_url}/completions` with a token-id prompt, as vLLM takes it), returns
typed `ChatCompletion`/`Completion` objects and sends server-specific fields such as vLLM's `top_k`
and `return_token_ids` through `extra_body`.

The SDK's own retries are off (`max_retries=0`) and the loop here retries instead. Why: callers
need the number of attempts a reply took (voters report it); a server's `Retry-After` must be
honoured but capped at our `max_backoff_s` (the SDK has its own cap and schedule); and every error
message and log line must go through one redaction path, so an echoed API key never leaks.

Rules, per request:

* `timeout_s` bounds each attempt by the wall clock, from the first byte sent to the last byte read:
  every socket operation gets at most the time left (`hsjax.llm.transport`), so a server that
  drips its reply cannot hold a call past it. A reply body longer than `max_reply_bytes` ends the
  attempt with reason `too_large`, not retried.
* HTTP 429 and 5xx, timeouts and connection errors are retried up to `max_retries` times. Retry n
  waits `backoff_s * 2**(n-1)` seconds, or the server's `Retry-After` (seconds) when longer, never
  more than `max_backoff_s`.
* Any other 4xx fails at once (a bad request or key does not get better by repeating it).
* So one `complete` call takes at most `ClientSettings.worst_case_s`:
  `(max_retries + 1) * timeout_s + max_retries * max_backoff_s` (every attempt times out and every
  wait is the capped Retry-After). The voters' decision deadline is derived from it.
* A 200 whose body is not a chat completion with `choices[0].message.content` is malformed
  (content null counts as ""); so is a completion without `choices[0].token_ids` and one logprob
  per id (`complete_tokens`). Retried when `retry_malformed` (a sampling policy may do better
  next time), failed at once when not (a deterministic voter would repeat itself).
* The API key comes from the environment variable named by `api_key_env` (configs hold the name,
  never the key), read at every request so a rotated key is picked up, and is sent as
  `Authorization: Bearer <key>`. It is registered with `hsjax.infra.secrets`, so every message
  here and every log line (through `console.setup_logging`'s filter) is redacted. Without
  `api_key_env` no Authorization header is sent at all, not even one from `OPENAI_API_KEY`: that
  key belongs to api.openai.com, not to whatever server `base_url` names.
  `OPENAI_ORG_ID`/`OPENAI_PROJECT_ID` headers are withheld for the same reason.

Failures raise `LLMError(reason, detail, attempts)`, reason one of `REASONS`. The SDK's exception
is not chained (`from None`): its message may quote a server's error text, which can echo the key.
The reply text is redacted too (a server that echoes the key in a 200 would otherwise hand it to an
episode's history and records).
"""
from __future__ import annotations

import dataclasses
import logging
import math
import os
import time
from typing import Any, Sequence

import httpx2
import openai
from openai.types import Completion
from openai.types.chat import ChatCompletion

from hsjax.infra import secrets
from hsjax.llm.transport import DEFAULT_MAX_REPLY_BYTES, ReplyTooLarge, bounded_http_client

log = logging.getLogger(__name__)

REASONS = ("timeout", "http_error", "connection_error", "malformed", "too_large", "missing_api_key")
REDACTED = secrets.REDACTED
# The SDK insists on an API key at construction; the real one (or none) goes in per request, so
# this placeholder is never sent.
_PLACEHOLDER_KEY = "unused-placeholder"
_WITHHELD_HEADERS = {"OpenAI-Organization": openai.Omit(), "OpenAI-Project": openai.Omit()}


class LLMError(RuntimeError):
    """A chat request failed. `reason` is one of `REASONS`; `detail` is redacted text; `attempts`
    is how many HTTP requests were made (0 when none could be)."""

    def __init__(self, reason: str, detail: str, attempts: int = 0):
        if reason not in REASONS:
            raise ValueError(f"LLMError reason {reason!r} is not one of {REASONS}")
        super().__init__(detail)
        self.reason, self.detail, self.attempts = reason, detail, attempts


@dataclasses.dataclass(frozen=True)
class ClientSettings:
    """Where and how to ask. `api_key_env` names an environment variable, never the key itself."""

    base_url: str
    model: str
    api_key_env: str | None = None
    timeout_s: float = 60.0
    max_retries: int = 3
    backoff_s: float = 1.0
    max_backoff_s: float = 30.0
    retry_malformed: bool = True
    max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES

    def __post_init__(self):
        if not self.base_url or not self.model:
            raise ValueError(f"ClientSettings needs a base_url and a model; got base_url={self.base_url!r}, "
                             f"model={self.model!r}")
        if self.timeout_s <= 0 or self.max_retries < 0 or self.backoff_s < 0 or self.max_backoff_s < 0:
            raise ValueError(f"ClientSettings for {self.base_url}: timeout_s must be > 0 and max_retries, "
                             f"backoff_s, max_backoff_s >= 0; got {self.timeout_s}, {self.max_retries}, "
                             f"{self.backoff_s}, {self.max_backoff_s}")
        if self.max_reply_bytes < 1:
            raise ValueError(f"ClientSettings for {self.base_url}: max_reply_bytes must be >= 1, "
                             f"got {self.max_reply_bytes}")

    @property
    def worst_case_s(self) -> float:
        """The longest one `complete` call can take: every attempt runs out its `timeout_s` and every
        wait before a retry is the longest allowed (a Retry-After capped at `max_backoff_s`)."""
        return (self.max_retries + 1) * self.timeout_s + self.max_retries * self.max_backoff_s


@dataclasses.dataclass
class ChatResult:
    """A reply: its text, the attempts it took, and the SDK's typed response."""

    text: str
    attempts: int
    response: ChatCompletion


@dataclasses.dataclass
class TokenResult:
    """A completion of a token-id prompt: the generated ids, the logprob of each, per id the top
    alternatives as (id, logprob) when asked for, the text, why it ended, the attempts it took."""

    ids: list[int]
    logprobs: list[float]
    top_logprobs: list[list[tuple[int, float]]] | None
    text: str
    finish_reason: str
    attempts: int
    response: Completion


@dataclasses.dataclass(frozen=True)
class _Failure:
    """One failed attempt: why, the redacted detail, whether to retry, the server's Retry-After."""

    reason: str
    detail: str
    retryable: bool
    retry_after_s: float | None = None


# ---------------------------------------------------------------------------------------------
# Pure helpers


def redact(text: str, secret: str | None) -> str:
    """`text` without `secret` and without any key registered with `hsjax.infra.secrets`."""
    return secrets.redact(text.replace(secret, REDACTED) if secret else text)


def quote(text: str, secret: str | None, limit: int = 200) -> str:
    """The start of a server's text for a message: redacted first, then cut (cutting first could
    leave half a key that redaction no longer recognises)."""
    return repr(redact(text, secret)[:limit])


def parse_retry_after(value: str | None) -> float | None:
    """A `Retry-After` header in seconds, or None when absent or not a non-negative number (the
    HTTP-date form is not honoured: servers in front of models send seconds)."""
    try:
        seconds = float(value) if value is not None else math.nan
    except ValueError:
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def retry_delay(retry: int, backoff_s: float, max_backoff_s: float, retry_after_s: float | None = None) -> float:
    """Seconds to wait before retry number `retry` (1-based): the exponential backoff or the
    server's Retry-After, whichever is longer, capped at `max_backoff_s`."""
    delay = max(backoff_s * 2 ** (retry - 1), retry_after_s or 0.0)
    return min(max_backoff_s, delay)


def reply_content(response: Any) -> str:
    """`choices[0].message.content` of a typed reply ("" for null); ValueError naming what is missing."""
    if not isinstance(response, ChatCompletion):
        raise ValueError(f"not a chat completion but a {type(response).__name__}")
    choices = response.choices
    if not isinstance(choices, list) or not choices:
        raise ValueError("no choices[0] in the reply")
    message = getattr(choices[0], "message", None)
    if message is None:
        raise ValueError("choices[0] has no message")
    content = getattr(message, "content", None)
    if content is None:
        return ""
    if not isinstance(content, str):
        raise ValueError(f"choices[0].message.content is {type(content).__name__}, not text")
    return content


def _token_id(name: str) -> int:
    """The id of a logprob entry named "token_id:<id>" (vLLM's `return_tokens_as_token_ids`)."""
    prefix, _, number = str(name).partition(":")
    if prefix != "token_id" or not number.lstrip("-").isdigit():
        raise ValueError(f"a logprob entry is named {str(name)[:40]!r}, not 'token_id:<id>' (the server ignored "
                         "return_tokens_as_token_ids)")
    return int(number)


def token_reply(response: Any, num_top: int = 0) -> tuple[list[int], list[float], list | None, str, str]:
    """(ids, logprobs, top alternatives or None, text, finish_reason) of a completion asked with
    `return_token_ids`, `return_tokens_as_token_ids` and `logprobs=num_top`; ValueError naming what
    is missing (a server that is not vLLM-compatible leaves `token_ids` out)."""
    if not isinstance(response, Completion):
        raise ValueError(f"not a completion but a {type(response).__name__}")
    if not isinstance(response.choices, list) or not response.choices:
        raise ValueError("no choices[0] in the reply")
    choice = response.choices[0]
    if not isinstance(ids := getattr(choice, "token_ids", None), list) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise ValueError("choices[0] has no token_ids list: the server does not return token ids (vLLM >= 0.10.2 "
                         "or hsjax serve return them for return_token_ids=true)")
    logprobs = getattr(entries := getattr(choice, "logprobs", None), "token_logprobs", None)
    if not isinstance(logprobs, list) or len(logprobs) != len(ids) or not all(
            isinstance(x, (int, float)) and math.isfinite(x) for x in logprobs):
        raise ValueError(f"choices[0].logprobs.token_logprobs is not one finite logprob per generated id "
                         f"({len(ids)} ids)")
    top = None
    if num_top:
        tops, names = getattr(entries, "top_logprobs", None), getattr(entries, "tokens", None)
        if not isinstance(tops, list) or len(tops) != len(ids) or not isinstance(names, list):
            raise ValueError("choices[0].logprobs.top_logprobs is not one entry per generated id")
        if [_token_id(n) for n in names] != ids:
            raise ValueError("choices[0].logprobs.tokens do not name the token_ids")
        top = [sorted(((_token_id(k), float(v)) for k, v in (t or {}).items()), key=lambda kv: -kv[1])[:num_top]
               for t in tops]
    if choice.finish_reason not in ("stop", "length"):
        raise ValueError(f"choices[0].finish_reason is {choice.finish_reason!r}, not 'stop' or 'length'")
    return [int(t) for t in ids], [float(x) for x in logprobs], top, choice.text or "", choice.finish_reason


def _as_text(response: Any) -> str:
    """A parsed reply back as text, for error messages (the SDK hands back a model or, for a
    non-JSON body, the text itself)."""
    if isinstance(response, (ChatCompletion, Completion)):
        return response.to_json(indent=None, warnings=False)  # no warnings about ill-typed fields
    return str(response)


def _omit_none(value):
    return openai.omit if value is None else value


# ---------------------------------------------------------------------------------------------
# The client


class ChatClient:
    """Chat completions with our retry rules (module docstring). Thread-safe; close it when done
    (or use it as a context manager)."""

    def __init__(self, settings: ClientSettings, *, label: str = "LLM client"):
        self.settings = settings
        self.label = label
        http_client, self._transport = bounded_http_client(settings.base_url, settings.timeout_s,
                                                           settings.max_reply_bytes)
        self._sdk = openai.OpenAI(base_url=settings.base_url, api_key=_PLACEHOLDER_KEY, max_retries=0,
                                  timeout=settings.timeout_s, http_client=http_client)

    def __repr__(self):
        s = self.settings
        return f"ChatClient(base_url={s.base_url!r}, model={s.model!r}, api_key_env={s.api_key_env!r})"

    def close(self) -> None:
        self._sdk.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- the key ----------------------------------------------------------------------------

    def api_key(self) -> str | None:
        """The key from `api_key_env` now (registered for redaction), None without one;
        `LLMError("missing_api_key")` when the variable is unset or empty."""
        name = self.settings.api_key_env
        if not name:
            return None
        key = os.environ.get(name)
        if not key:
            raise LLMError("missing_api_key", f"environment variable {name} is unset or empty; export the "
                                              "API key there (configs name the variable, never the key)")
        secrets.register(key)
        return key

    def redact(self, text: str) -> str:
        """`text` without the current key (for callers that quote a reply in their own messages)."""
        name = self.settings.api_key_env
        return redact(text, os.environ.get(name) if name else None)

    def _headers(self, key: str | None) -> dict:
        auth = f"Bearer {key}" if key else openai.Omit()  # Omit: no header at all
        return {"Authorization": auth, **_WITHHELD_HEADERS}

    # -- one request -------------------------------------------------------------------------

    def complete(self, messages: Sequence[dict], *, temperature: float | None = None, top_p: float | None = None,
                 max_tokens: int | None = None, seed: int | None = None, stop: Sequence[str] | None = None,
                 extra_body: dict | None = None) -> ChatResult:
        """One chat completion with retries: a `ChatResult`, or `LLMError` after the last attempt.
        Parameters left None are not sent; `extra_body` is merged into the JSON body last."""
        s = self.settings
        key = self.api_key()
        request = dict(model=s.model, messages=list(messages), temperature=_omit_none(temperature),
                       top_p=_omit_none(top_p), max_tokens=_omit_none(max_tokens), seed=_omit_none(seed),
                       stop=list(stop) if stop else openai.omit, extra_body=extra_body or None,
                       extra_headers=self._headers(key))
        (text, response), attempts = self._with_retries(self._sdk.chat.completions.create, request, key,
                                                        lambda r: (redact(reply_content(r), key), r))
        return ChatResult(text=text, attempts=attempts, response=response)

    def complete_tokens(self, prompt_ids: Sequence[int], *, temperature: float | None = None,
                        top_p: float | None = None, max_tokens: int | None = None, seed: int | None = None,
                        stop: Sequence[str] | None = None, top_logprobs: int = 0,
                        extra_body: dict | None = None) -> TokenResult:
        """One completion of a token-id prompt (`POST {base_url}/completions`, `prompt` a list of
        ids), asking for the generated ids and their logprobs as vLLM gives them
        (`return_token_ids`, `logprobs=top_logprobs`, `return_tokens_as_token_ids`); retries as
        `complete`. `extra_body` is merged into the JSON body last."""
        s = self.settings
        key = self.api_key()
        body = {"return_token_ids": True, "return_tokens_as_token_ids": True, **(extra_body or {})}
        request = dict(model=s.model, prompt=[int(t) for t in prompt_ids], temperature=_omit_none(temperature),
                       top_p=_omit_none(top_p), max_tokens=_omit_none(max_tokens), seed=_omit_none(seed),
                       stop=list(stop) if stop else openai.omit, logprobs=int(top_logprobs), extra_body=body,
                       extra_headers=self._headers(key))
        (reply, response), attempts = self._with_retries(self._sdk.completions.create, request, key,
                                                         lambda r: (token_reply(r, top_logprobs), r))
        ids, logprobs, top, text, finish = reply
        return TokenResult(ids, logprobs, top, redact(text, key), finish, attempts, response)

    def _with_retries(self, call, request: dict, key: str | None, parse):
        """(parse(response), attempts) of the first attempt that succeeds; `LLMError` otherwise."""
        s = self.settings
        attempts = s.max_retries + 1
        failure = None
        for attempt in range(1, attempts + 1):
            if failure is not None:
                delay = retry_delay(attempt - 1, s.backoff_s, s.max_backoff_s, failure.retry_after_s)
                log.warning("%s %s: %s; retry %d/%d in %.2fs", self.label, s.base_url, failure.detail,
                            attempt - 1, s.max_retries, delay)
                time.sleep(delay)
            outcome = self._attempt(call, request, key, parse)
            if not isinstance(outcome, _Failure):
                return outcome, attempt
            failure = outcome
            if not failure.retryable:
                raise LLMError(failure.reason, failure.detail, attempt) from None
        raise LLMError(failure.reason, f"gave up after {attempts} attempts; last error: {failure.detail}",
                       attempts) from None

    def _attempt(self, call, request: dict, key: str | None, parse):
        """One HTTP request: parse(response), or the failure, classified."""
        s = self.settings
        try:
            with self._transport.deadline(time.monotonic() + s.timeout_s):
                response = call(**request)
        except openai.APITimeoutError:  # before APIConnectionError, its base class
            return _Failure("timeout", f"timed out after {s.timeout_s}s", True)
        except openai.APIConnectionError as e:
            return self._transport_failure(e.__cause__ or e, key)
        except httpx2.HTTPError as e:  # raised past the SDK (e.g. while it reads an error body)
            return self._transport_failure(e, key)
        except openai.APIStatusError as e:
            return _status_failure(e.status_code, e.response.text, e.response.headers.get("retry-after"),
                                   s.model, key)
        except (openai.APIResponseValidationError, ValueError) as e:  # ValueError: JSON, pydantic
            return self._malformed(f"{type(e).__name__}: {e}", key)
        try:
            return parse(response)
        except ValueError as e:
            return self._malformed(f"{e}; body starts {quote(_as_text(response), key)}", key)

    def _transport_failure(self, cause: BaseException, key: str | None) -> _Failure:
        if isinstance(cause, ReplyTooLarge):
            return _Failure("too_large", redact(f"reply too large ({cause}; not retried)", key), False)
        if isinstance(cause, httpx2.TimeoutException):
            return _Failure("timeout", f"timed out after {self.settings.timeout_s}s", True)
        return _Failure("connection_error", redact(f"connection error ({type(cause).__name__}: {cause})", key), True)

    def _malformed(self, why: str, key: str | None) -> _Failure:
        retry = self.settings.retry_malformed
        return _Failure("malformed", redact(f"malformed reply ({why})", key) + ("" if retry else " (not retried)"),
                        retry)


def _status_failure(status: int, body: str, retry_after: str | None, model: str, key: str | None) -> _Failure:
    """429 and 5xx are retried (honouring Retry-After); any other status fails at once."""
    if status == 429 or status >= 500:
        return _Failure("http_error", f"HTTP {status}: {quote(body, key)}", True, parse_retry_after(retry_after))
    return _Failure("http_error", f"HTTP {status} (not retried): {quote(body, key, 500)}; check the model name "
                                  f"{model!r}, the API key and the request parameters", False)
