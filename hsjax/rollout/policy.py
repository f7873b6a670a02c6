"""Policies: what turns a batch of contexts into a batch of replies.

Two kinds, both duck-typed protocols:

* `TokenPolicy.generate(prompts, sampling) -> list[Generation]`: token ids in, token ids and
  per-token logprobs out. The rollout engine keeps token-exact streams only with these.
* `ChatPolicy.chat(contexts, sampling, infos) -> list[str]`: chat messages in, text out. External
  models behind an OpenAI-compatible server and scripted agents are chat policies.

`JaxPolicy` is both (it renders the chat template itself for `chat`). See docs/rollout.md for the
logprob convention, stop handling and the HTTP policy's behaviour on errors.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import logging
import os
import threading
import time
from typing import Callable, Protocol, Sequence, runtime_checkable

import httpx

log = logging.getLogger(__name__)


class PolicyError(RuntimeError):
    """A policy could not produce a reply (bad request, server down after retries, bad reply)."""


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How to sample one reply.

    `stop_token_ids` holds single ids and/or tuples of ids (multi-token stop sequences); the
    tokenizer's end-of-turn ids are always added by `JaxPolicy`. `stop_strings` end a reply at the
    token that completes the string (the string stays in the reply). `greedy` ignores temperature,
    top-p and top-k for the choice, and its logprobs are taken at temperature 1.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    greedy: bool = False
    max_new_tokens: int = 256
    stop_strings: tuple[str, ...] = ()
    stop_token_ids: tuple[int | tuple[int, ...], ...] = ()
    seed: int = 0

    def __post_init__(self):
        if not self.greedy and self.temperature <= 0:
            raise ValueError(f"SamplingParams.temperature={self.temperature} must be > 0; "
                             "use greedy=True for argmax decoding")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingParams.top_p={self.top_p} must be in (0, 1]")
        if self.top_k < 0:
            raise ValueError(f"SamplingParams.top_k={self.top_k} must be >= 0 (0 disables it)")
        if self.max_new_tokens < 1:
            raise ValueError(f"SamplingParams.max_new_tokens={self.max_new_tokens} must be >= 1")
        if isinstance(self.stop_strings, str):
            raise TypeError("SamplingParams.stop_strings must be a tuple of strings, "
                            f"not the string {self.stop_strings!r}")
        # Lists are accepted for convenience and frozen into tuples so the params stay hashable.
        object.__setattr__(self, "stop_strings", tuple(self.stop_strings))
        object.__setattr__(self, "stop_token_ids", tuple(
            s if isinstance(s, int) else tuple(int(t) for t in s) for s in self.stop_token_ids))

    @property
    def logprob_temperature(self) -> float:
        """The temperature logprobs are computed at (and the trainer must use)."""
        return 1.0 if self.greedy else float(self.temperature)


@dataclasses.dataclass
class Generation:
    """One generated reply: its ids, the logprob of each id, its text, and why it ended.

    `finish_reason` is "stop" (end-of-turn id, stop sequence or stop string) or "length".
    """

    ids: list[int]
    logprobs: list[float]
    text: str | None
    finish_reason: str


@runtime_checkable
class TokenPolicy(Protocol):
    def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[Generation]:
        ...


@runtime_checkable
class ChatPolicy(Protocol):
    def chat(self, contexts: list[list[dict]], sampling: SamplingParams,
             infos: list[dict] | None = None) -> list[str]:
        ...


def is_token_policy(policy) -> bool:
    return callable(getattr(policy, "generate", None))


# ---------------------------------------------------------------------------------------------
# JAX policy


class JaxPolicy:
    """The trainable policy: a model, its params and tokenizer, sampled with `hsjax.rollout.sampler`.

    Each `generate` call draws a fresh key: fold_in(fold_in(PRNGKey(seed), sampling.seed), call
    index), so a run is reproducible from (seed, sampling.seed, call order).
    """

    def __init__(self, cfg, params, tokenizer, *, seed: int = 0, eos_ids: Sequence[int] | None = None,
                 **sampler_kwargs):
        from hsjax.rollout import sampler as sampler_lib

        self.cfg = cfg
        self.params = params
        self.tokenizer = tokenizer
        if eos_ids is None:
            eos_ids = tokenizer_eos_ids(tokenizer)
        self.eos_ids = tuple(int(i) for i in eos_ids)
        pad_id = tokenizer.pad_token_id if tokenizer is not None else None
        self.sampler = sampler_lib.Sampler(cfg, eos_ids=self.eos_ids,
                                           pad_id=pad_id if pad_id is not None else 0,
                                           **sampler_kwargs)
        self._seed = seed
        self._calls = 0
        self._lock = threading.Lock()

    @classmethod
    def from_pretrained(cls, hf_dir: str, **kwargs) -> "JaxPolicy":
        from hsjax.models import load_pretrained

        cfg, params, tokenizer = load_pretrained(hf_dir)
        return cls(cfg, params, tokenizer, **kwargs)

    def update_params(self, params) -> None:
        self.params = params

    def reseed(self, seed: int) -> None:
        """Restarts the key sequence at (seed, call 0): the training loop reseeds every phase, so a
        resumed run draws the same keys as an uninterrupted one."""
        with self._lock:
            self._seed, self._calls = int(seed), 0

    def _next_key(self, sampling: SamplingParams):
        import jax

        with self._lock:
            call = self._calls
            self._calls += 1
        key = jax.random.fold_in(jax.random.PRNGKey(self._seed), sampling.seed)
        return jax.random.fold_in(key, call)

    def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[Generation]:
        if not prompts:
            return []
        # The canonical tokenization of each stop string is stopped on inside the decode loop; the
        # host-side check below catches every other tokenization of the string.
        string_seqs = [tuple(self.tokenizer.encode(s, add_special_tokens=False))
                       for s in sampling.stop_strings]
        outs = self.sampler.generate(self.params, prompts, sampling, self._next_key(sampling),
                                     stop_sequences=[string_seqs] * len(prompts))
        gens = []
        for out in outs:
            ids, logprobs, reason = list(out.ids), list(out.logprobs), out.finish_reason
            if sampling.stop_strings:
                cut = first_stop_string_end(ids, sampling.stop_strings, self._decode_all)
                if cut is not None:
                    ids, logprobs, reason = ids[:cut], logprobs[:cut], "stop"
            gens.append(Generation(ids=ids, logprobs=logprobs, text=self.reply_text(ids),
                                   finish_reason=reason))
        return gens

    def _decode_all(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def reply_text(self, ids: list[int]) -> str:
        """The reply's text: generated ids decoded, minus a final end-of-turn id."""
        if ids and ids[-1] in self.eos_ids:
            ids = ids[:-1]
        return self._decode_all(ids)

    def chat(self, contexts: list[list[dict]], sampling: SamplingParams,
             infos: list[dict] | None = None) -> list[str]:
        prompts = [render_prompt(self.tokenizer, msgs) for msgs in contexts]
        return [g.text for g in self.generate(prompts, sampling)]


def render_prompt(tokenizer, messages: list[dict]) -> list[int]:
    """Chat-template token ids of `messages` followed by the assistant generation prompt."""
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                        return_dict=False)
    return [int(i) for i in ids]


def tokenizer_eos_ids(tokenizer) -> tuple[int, ...]:
    try:
        from hsjax.models.tokenizer import eos_ids
        return tuple(eos_ids(tokenizer))
    except ImportError:
        ids = {tokenizer.eos_token_id}
        for tok in ("<|im_end|>", "<|endoftext|>", "<|eot_id|>"):
            tid = tokenizer.convert_tokens_to_ids(tok)
            if isinstance(tid, int) and tid != tokenizer.unk_token_id:
                ids.add(tid)
        return tuple(sorted(i for i in ids if i is not None))


def first_stop_string_end(ids: list[int], stop_strings: Sequence[str],
                          decode: Callable[[list[int]], str]) -> int | None:
    """Smallest n such that decode(ids[:n]) contains a stop string, or None.

    Binary search: once a prefix's text contains a stop string, every longer prefix's does too.
    """
    def hit(n):
        text = decode(ids[:n])
        return any(s and s in text for s in stop_strings)

    if not ids or not hit(len(ids)):
        return None
    lo, hi = 1, len(ids)
    while lo < hi:
        mid = (lo + hi) // 2
        if hit(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


# ---------------------------------------------------------------------------------------------
# OpenAI-compatible HTTP policy


class HttpChatPolicy:
    """Chat completions from an OpenAI-compatible server (`POST {base_url}/chat/completions`).

    Retries with exponential backoff (`backoff * 2**attempt` seconds, capped at `max_backoff`) on
    5xx, 429, timeouts, connection errors and malformed replies; any other 4xx fails at once. A
    context that still fails raises `PolicyError` (or, with `on_error="empty"`, yields "" and a
    warning). The API key is read from the environment variable `api_key_env` and sent as a
    Bearer token; it is never logged.
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
        headers = {"Content-Type": "application/json"}
        if api_key_env:
            key = os.environ.get(api_key_env)
            if not key:
                raise PolicyError(f"HttpChatPolicy: environment variable {api_key_env} is unset or "
                                  "empty; export the API key there or pass api_key_env=None")
            headers["Authorization"] = f"Bearer {key}"
        self._client = httpx.Client(timeout=timeout, headers=headers)

    def __repr__(self):
        return f"HttpChatPolicy(url={self.url!r}, model={self.model!r})"

    def close(self):
        self._client.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def payload(self, messages: list[dict], sampling: SamplingParams) -> dict:
        body = {"model": self.model, "messages": messages,
                "temperature": 0.0 if sampling.greedy else sampling.temperature,
                "top_p": 1.0 if sampling.greedy else sampling.top_p,
                "max_tokens": sampling.max_new_tokens, "seed": sampling.seed}
        if sampling.stop_strings:
            body["stop"] = list(sampling.stop_strings)
        if sampling.top_k and not sampling.greedy:
            body["top_k"] = sampling.top_k  # not OpenAI's; vLLM/SGLang servers accept it
        body.update(self.extra_body)
        return body

    def complete(self, messages: list[dict], sampling: SamplingParams) -> str:
        """One chat completion with retries; returns the reply text or raises `PolicyError`."""
        body = self.payload(messages, sampling)
        last_error = "no attempt made"
        for attempt in range(self.max_retries + 1):
            if attempt:
                delay = min(self.max_backoff, self.backoff * 2 ** (attempt - 1))
                log.warning("HttpChatPolicy %s: %s; retry %d/%d in %.1fs", self.url, last_error,
                            attempt, self.max_retries, delay)
                time.sleep(delay)
            try:
                resp = self._client.post(self.url, json=body)
            except httpx.TimeoutException as e:
                last_error = f"timed out ({type(e).__name__})"
                continue
            except httpx.TransportError as e:
                last_error = f"connection error ({type(e).__name__}: {e})"
                continue
            if resp.status_code == 429 or resp.status_code >= 500:
                last_error = f"HTTP {resp.status_code}: {resp.text[:200]!r}"
                continue
            if resp.status_code >= 400:
                raise PolicyError(f"HttpChatPolicy {self.url}: HTTP {resp.status_code} (not "
                                  f"retried): {resp.text[:500]!r}; check the model name "
                                  f"{self.model!r}, the API key and the request parameters")
            try:
                return parse_chat_completion(resp.text)
            except ValueError as e:
                last_error = f"malformed reply ({e})"
                continue
        raise PolicyError(f"HttpChatPolicy {self.url}: gave up after {self.max_retries + 1} "
                          f"attempts; last error: {last_error}")

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


def parse_chat_completion(text: str) -> str:
    """The first choice's message content of a chat-completions reply; ValueError if malformed."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"not JSON: {e}; body starts {text[:80]!r}") from None
    try:
        content = data["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        raise ValueError(f"no choices[0].message.content in {text[:200]!r}") from None
    if content is None:
        return ""
    if not isinstance(content, str):
        raise ValueError(f"choices[0].message.content is {type(content).__name__}, not str")
    return content


# ---------------------------------------------------------------------------------------------
# Scripted policies (tests, oracles)


class ScriptedChatPolicy:
    """Replies from a function `fn(context, info) -> str`, or from a list consumed in call order."""

    def __init__(self, replies: Callable[[list[dict], dict], str] | Sequence[str]):
        self._fn = replies if callable(replies) else None
        self._queue = None if callable(replies) else list(replies)
        self._lock = threading.Lock()
        self.calls: list[list[list[dict]]] = []

    def _pop(self) -> str:
        with self._lock:
            if not self._queue:
                raise PolicyError("ScriptedChatPolicy: the list of scripted replies is exhausted; "
                                  "script more replies or use a function")
            return self._queue.pop(0)

    def chat(self, contexts: list[list[dict]], sampling: SamplingParams,
             infos: list[dict] | None = None) -> list[str]:
        infos = infos if infos is not None else [{} for _ in contexts]
        self.calls.append(contexts)
        if self._fn is not None:
            return [self._fn(ctx, info) for ctx, info in zip(contexts, infos)]
        return [self._pop() for _ in contexts]


class ScriptedTokenPolicy:
    """Replies as token ids from a function `fn(prompt_ids) -> list[int] | str`, or from a list.

    A str reply is encoded with `tokenizer` and gets `eos_id` appended (a scripted reply that ends
    its turn). Replies are cut at `max_new_tokens` ("length"); every logprob is `logprob`.
    """

    def __init__(self, replies, tokenizer=None, eos_id: int | None = None, logprob: float = 0.0):
        self._fn = replies if callable(replies) else None
        self._queue = None if callable(replies) else list(replies)
        self.tokenizer = tokenizer
        self.eos_id = eos_id
        self.logprob = logprob
        self.calls: list[list[list[int]]] = []

    def _reply(self, prompt):
        if self._fn is not None:
            return self._fn(prompt)
        if not self._queue:
            raise PolicyError("ScriptedTokenPolicy: the list of scripted replies is exhausted")
        return self._queue.pop(0)

    def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[Generation]:
        self.calls.append([list(p) for p in prompts])
        gens = []
        for prompt in prompts:
            reply = self._reply(prompt)
            if isinstance(reply, str):
                if self.tokenizer is None:
                    raise PolicyError("ScriptedTokenPolicy got a str reply but no tokenizer")
                ids = self.tokenizer.encode(reply, add_special_tokens=False)
                if self.eos_id is not None:
                    ids = ids + [self.eos_id]
            else:
                ids = [int(i) for i in reply]
            reason = "stop"
            if len(ids) > sampling.max_new_tokens:
                ids, reason = ids[:sampling.max_new_tokens], "length"
            elif self.eos_id is not None and (not ids or ids[-1] != self.eos_id):
                reason = "length"
            text = None
            if self.tokenizer is not None:
                body = ids[:-1] if ids and ids[-1] == self.eos_id else ids
                text = self.tokenizer.decode(body, skip_special_tokens=False)
            gens.append(Generation(ids=ids, logprobs=[self.logprob] * len(ids), text=text,
                                   finish_reason=reason))
        return gens

