"""Scripted policies for tests and oracles: replies from a function or a list, no model.

`ScriptedChatPolicy` is a ChatPolicy (text in, text out); `ScriptedTokenPolicy` is a TokenPolicy
(token ids in, token ids and constant logprobs out), so the engine keeps token-exact segments.
"""

from __future__ import annotations

import threading
from typing import Callable, Sequence

from hsjax.policies.base import ChatPolicy, Generation, PolicyError, SamplingParams, TokenPolicy


class ScriptedChatPolicy(ChatPolicy):
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


class ScriptedTokenPolicy(TokenPolicy):
    """Replies as token ids from a function `fn(prompt_ids) -> list[int] | str`, or from a list.

    A str reply is encoded with `tokenizer` and gets `eos_id` appended (a scripted reply that ends
    its turn). Replies are cut at `max_new_tokens` ("length"); every logprob is `logprob`. Turn
    seeds are ignored: nothing is drawn.
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

    def generate(self, prompts: list[list[int]], sampling: SamplingParams,
                 turn_seeds=None) -> list[Generation]:
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

