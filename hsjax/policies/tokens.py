"""Token helpers the policies and the rollout engine share: chat-template prompts, the ids that end
a reply, and where a stop string ends."""
from __future__ import annotations

from typing import Callable, Sequence

from hsjax.models.tokenizer import eos_ids


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
