"""`RecordingChatPolicy`: a chat policy (or a benchmark's scripted agent) whose every reply is kept,
per episode, with the context it answered (the data `hsjax.rollout.segments.render_segments` turns
into token segments for SFT)."""
from __future__ import annotations

import collections

from hsjax.policies.base import ChatPolicy, FailedReply, as_policy


class RecordingChatPolicy(ChatPolicy):
    """Wraps a ChatPolicy and records, per episode, each context it was shown and its reply (a
    `FailedReply` is no reply: nothing is recorded for it, and its episode ends as policy_error)."""

    def __init__(self, inner):
        self.inner = as_policy(inner)
        self.turns: dict[str, list[tuple[list[dict], str]]] = collections.defaultdict(list)

    def chat(self, contexts, sampling, infos=None):
        replies = self.inner.chat(contexts, sampling, infos)
        for ctx, info, reply in zip(contexts, infos, replies):
            if not isinstance(reply, FailedReply):
                self.turns[info["episode_id"]].append(([dict(m) for m in ctx], reply))
        return replies

    def close(self) -> None:
        self.inner.close()
