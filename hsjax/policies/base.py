"""The policy interface: what turns a batch of contexts into a batch of replies.

Every policy is a `Policy`, and one of two kinds (or both):

* `TokenPolicy.generate(prompts, sampling, turn_seeds=None) -> list[Generation]`: token ids in,
  token ids and per-token logprobs out. The rollout engine keeps token-exact segments only with
  these. `turn_seeds[i]` = (episode seed, turn) of prompt i: a policy that samples draws row i's
  tokens from them, so an episode samples the same whatever batch it shares; one that does not
  sample (scripted, HTTP) ignores them.
* `ChatPolicy.chat(contexts, sampling, infos=None) -> list[str | FailedReply]`: chat messages in,
  text out. A chat policy that could not answer one context returns a `FailedReply(reason)` in its
  place: the engine ends that episode (failure mode `policy_error`) and the others go on. Raising
  `PolicyError` stops the whole rollout; that is for failures no episode can outlive (an endpoint
  that is down, `EndpointDown`).

The base gives every hook a no-op default, so callers never ask whether a policy has one:
`update_params` (new weights), `reseed` (restart the key sequence), `end_rollout` (drop caches kept
between the turns of one rollout), `close` (free the engine, the connection); and the attributes
the engine and the server read: `tokenizer` (None: none), `eos_ids` (() : the tokenizer's),
`max_context` (prompt + reply tokens the model takes; None: no bound).

The scripted agents of `harness_envs` answer `chat` but cannot import hsjax: `as_policy` wraps such
an agent (a `ChatAgent`) in `AgentPolicy`. Backends: `jax_policy`, `vllm_policy`, `http_chat`,
`http_tokens`, `scripted`, `recording` (docs/rollout.md).
"""
from __future__ import annotations

import abc
import dataclasses
from typing import Protocol, Sequence, runtime_checkable


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


def sampling_params(block, seed: int) -> SamplingParams:
    """A config block with `temperature`, `top_p`, `top_k`, `greedy`, `max_new_tokens` as SamplingParams."""
    return SamplingParams(temperature=float(block.temperature), top_p=float(block.top_p),
                          top_k=int(block.top_k), greedy=bool(block.greedy),
                          max_new_tokens=int(block.max_new_tokens), seed=int(seed))


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


class Policy(abc.ABC):
    """What every policy is: the hooks and attributes its callers use, with defaults that do
    nothing. A concrete policy is a `TokenPolicy`, a `ChatPolicy`, or both."""

    tokenizer = None  # renders chat templates and decodes replies; None: the policy has none
    eos_ids: tuple[int, ...] = ()  # the ids that end a reply; (): the tokenizer's
    max_context: int | None = None  # prompt + reply tokens the model takes; None: no bound

    def update_params(self, params) -> None:
        """Samples from `params` from now on (the trainer calls it every step)."""

    def reseed(self, seed: int) -> None:
        """Restarts the key sequence at `seed` (the trainer calls it every phase)."""

    def end_rollout(self) -> None:
        """Drops what was kept between the turns of one rollout (`engine.collect` calls it)."""

    def close(self) -> None:
        """Frees the engine, connection or files the policy holds (idempotent)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class TokenPolicy(Policy):
    """Token ids in, token ids and per-token logprobs out (module docstring)."""

    @abc.abstractmethod
    def generate(self, prompts: list[list[int]], sampling: SamplingParams,
                 turn_seeds: Sequence[tuple[int, int]] | None = None) -> list[Generation | FailedReply]:
        ...


class ChatPolicy(Policy):
    """Chat messages in, reply text (or a `FailedReply`) out (module docstring)."""

    @abc.abstractmethod
    def chat(self, contexts: list[list[dict]], sampling: SamplingParams,
             infos: list[dict] | None = None) -> list[str | FailedReply]:
        ...


@runtime_checkable
class ChatAgent(Protocol):
    """What a benchmark's scripted agent offers (`harness_envs` agents, which import no hsjax)."""

    def chat(self, contexts: list[list[dict]], sampling, infos: list[dict] | None = None) -> list[str]:
        ...


class AgentPolicy(ChatPolicy):
    """A `ChatAgent` (a benchmark's scripted agent) as a `ChatPolicy`; `agent` is the agent itself."""

    def __init__(self, agent):
        if not isinstance(agent, ChatAgent):
            raise TypeError(f"{type(agent).__name__} is neither a hsjax Policy (hsjax.policies.base) nor an "
                            "agent with chat(contexts, sampling, infos); it cannot answer an episode")
        self.agent = agent

    def __repr__(self):
        return f"AgentPolicy({self.agent!r})"

    def chat(self, contexts, sampling, infos=None):
        if infos is None:  # the server's calls: an agent may take no infos
            return self.agent.chat(contexts, sampling)
        return self.agent.chat(contexts, sampling, infos)


def as_policy(policy_or_agent) -> Policy:
    """`policy_or_agent` if it is a `Policy`, else the `AgentPolicy` of that agent."""
    if isinstance(policy_or_agent, Policy):
        return policy_or_agent
    return AgentPolicy(policy_or_agent)
