"""Policies: what turns a batch of contexts into a batch of replies.

Two kinds, both duck-typed protocols:

* `TokenPolicy.generate(prompts, sampling) -> list[Generation]`: token ids in, token ids and
  per-token logprobs out. The rollout engine keeps token-exact streams only with these.
* `ChatPolicy.chat(contexts, sampling, infos) -> list[str | FailedReply]`: chat messages in, text
  out. External models behind an OpenAI-compatible server (`hsjax.llm.http_policy.HttpChatPolicy`)
  and scripted agents (`hsjax.rollout.scripted`) are chat policies. A chat policy that could not
  answer one context returns a `FailedReply(reason)` in its place: the engine ends that episode
  (failure mode `policy_error`) and the others go on. Raising `PolicyError` stops the whole rollout;
  that is for failures no episode can outlive (an endpoint that is down, `EndpointDown`).

`JaxPolicy` is both (it renders the chat template itself for `chat`). See docs/rollout.md for the
logprob convention, stop handling and the HTTP policy's behaviour on errors. `PolicyError`,
`EndpointDown` and `FailedReply` live here, not in `hsjax.llm`, because the rollout layer never
imports the llm layer.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Callable, Protocol, Sequence, runtime_checkable

import jax

from hsjax.models import load_pretrained
from hsjax.models.tokenizer import eos_ids
from hsjax.rollout import sampler as sampler_lib
from hsjax.rollout.kv_reuse import TurnCache


class PolicyError(RuntimeError):
    """A policy could not produce a reply (bad request, server down after retries, bad reply)."""


class EndpointDown(PolicyError):
    """A chat policy's endpoint is plainly down (many requests in a row failed): the run stops."""


@dataclasses.dataclass(frozen=True)
class FailedReply:
    """What a chat policy returns, in place of a reply, for a context it could not answer: the
    engine ends that episode with abort reason `policy_error` and records `reason` (redacted text
    naming the failure) as the trajectory's error."""

    reason: str


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How to sample one reply.

    `stop_token_ids` holds single ids and/or tuples of ids (multi-token stop sequences); the
    tokenizer's end-of-turn ids are always added by `JaxPolicy`. `stop_strings` end a reply at the
    token that completes the string (the string stays in the reply). `greedy` ignores temperature,
    top-p and top-k for the choice, and its logprobs are taken at temperature 1. `top_logprobs` k > 0
    asks for the k most likely tokens and their logprobs at each step (`Generation.top_logprobs`;
    a policy that cannot report them raises `PolicyError`); it never changes what is sampled.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    greedy: bool = False
    max_new_tokens: int = 256
    stop_strings: tuple[str, ...] = ()
    stop_token_ids: tuple[int | tuple[int, ...], ...] = ()
    seed: int = 0
    top_logprobs: int = 0

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
        if self.top_logprobs < 0:
            raise ValueError(f"SamplingParams.top_logprobs={self.top_logprobs} must be >= 0 (0: none)")
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
    `top_logprobs` (when `SamplingParams.top_logprobs` asked for them) holds, per generated id, the
    most likely (id, logprob) pairs, most likely first.
    """

    ids: list[int]
    logprobs: list[float]
    text: str | None
    finish_reason: str
    top_logprobs: list[list[tuple[int, float]]] | None = None


@runtime_checkable
class TokenPolicy(Protocol):
    def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[Generation]:
        ...


@runtime_checkable
class ChatPolicy(Protocol):
    def chat(self, contexts: list[list[dict]], sampling: SamplingParams,
             infos: list[dict] | None = None) -> list[str | FailedReply]:
        ...


def is_token_policy(policy) -> bool:
    return callable(getattr(policy, "generate", None))


# ---------------------------------------------------------------------------------------------
# JAX policy


class JaxPolicy:
    """The trainable policy: a model, its params and tokenizer, sampled with `hsjax.rollout.sampler`.

    Keys. With `streams` (what the rollout engine passes: one (episode stream id, turn) per prompt),
    row i draws from fold_in(fold_in(fold_in(PRNGKey(seed), sampling.seed), stream), turn): an
    episode's tokens depend on (seed, phase, episode, turn) only, not on the batch it shares, so a
    step's episodes can be split across processes (multi-host) or batches and sample the same.
    Without, each call draws a fresh key, fold_in(fold_in(PRNGKey(seed), sampling.seed), call
    index), so a run is reproducible from (seed, sampling.seed, call order) (the server's requests).
    """

    keyed_streams = True  # `generate` accepts `streams` (engine.collect passes them)

    def __init__(self, cfg, params, tokenizer, *, seed: int = 0, eos_ids: Sequence[int] | None = None,
                 kv_reuse: bool = True, **sampler_kwargs):
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
        # KV reuse across turns (`hsjax.rollout.kv_reuse`): keyed calls (the engine's) only; a call
        # without streams (the server's) has no episode to continue.
        self.turn_cache = TurnCache(self.sampler) if kv_reuse else None

    @classmethod
    def from_pretrained(cls, hf_dir: str, **kwargs) -> "JaxPolicy":
        cfg, params, tokenizer = load_pretrained(hf_dir)
        return cls(cfg, params, tokenizer, **kwargs)

    def update_params(self, params) -> None:
        self.params = params
        if self.turn_cache is not None:
            self.turn_cache.clear()  # kept keys/values belong to the old params

    def end_rollout(self) -> None:
        """Drops the caches kept for the next turn: `engine.collect` calls it when its episodes are
        done, so they are not held through the update that follows."""
        if self.turn_cache is not None:
            self.turn_cache.clear()

    def reseed(self, seed: int) -> None:
        """Restarts the key sequence at (seed, call 0): the training loop reseeds every phase, so a
        resumed run draws the same keys as an uninterrupted one."""
        with self._lock:
            self._seed, self._calls = int(seed), 0
        if self.turn_cache is not None:
            self.turn_cache.clear()

    def _next_key(self, sampling: SamplingParams):
        with self._lock:
            call = self._calls
            self._calls += 1
        key = jax.random.fold_in(jax.random.PRNGKey(self._seed), sampling.seed)
        return jax.random.fold_in(key, call)

    def generate(self, prompts: list[list[int]], sampling: SamplingParams,
                 streams: Sequence[tuple[int, int]] | None = None) -> list[Generation]:
        if not prompts:
            return []
        if streams is None:
            key = self._next_key(sampling)
        else:
            key = jax.random.fold_in(jax.random.PRNGKey(self._seed), sampling.seed)
        # The canonical tokenization of each stop string is stopped on inside the decode loop; the
        # host-side check below catches every other tokenization of the string.
        string_seqs = [tuple(self.tokenizer.encode(s, add_special_tokens=False))
                       for s in sampling.stop_strings]
        reuse = streams is not None and self.turn_cache is not None
        if reuse:
            new_prompts, offsets, prefix = self.turn_cache.plan(prompts, streams)
            outs, kept = self.sampler.generate(
                self.params, new_prompts, sampling, key, stop_sequences=[string_seqs] * len(prompts),
                num_top_logprobs=sampling.top_logprobs, streams=streams, prefix=prefix,
                offsets=offsets, keep_cache=True)
        else:
            outs = self.sampler.generate(self.params, prompts, sampling, key,
                                         stop_sequences=[string_seqs] * len(prompts),
                                         num_top_logprobs=sampling.top_logprobs, streams=streams)
        gens = []
        for out in outs:
            ids, logprobs, reason = [int(i) for i in out.ids], [float(x) for x in out.logprobs], out.finish_reason
            top = None if out.top_ids is None else [
                [(int(t), float(x)) for t, x in zip(row_ids, row_lp)]
                for row_ids, row_lp in zip(out.top_ids, out.top_logprobs)]
            if sampling.stop_strings:
                cut = first_stop_string_end(ids, sampling.stop_strings, self._decode_all)
                if cut is not None:
                    ids, logprobs, reason = ids[:cut], logprobs[:cut], "stop"
                    top = top[:cut] if top is not None else None
            gens.append(Generation(ids=ids, logprobs=logprobs, text=self.reply_text(ids),
                                   finish_reason=reason, top_logprobs=top))
        if reuse:
            self.turn_cache.record(prompts, streams, [g.ids for g in gens], kept)
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
    """The ids that end a reply: the tokenizer's eos and its chat template's end-of-turn ids."""
    return tuple(eos_ids(tokenizer))


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
