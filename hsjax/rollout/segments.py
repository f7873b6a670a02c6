"""Token segments built outside the sampler: conversations of a chat policy rendered as a token
policy's trajectory would be (SFT data, recorded by `hsjax.policies.recording.RecordingChatPolicy`),
and rescue trajectories re-rendered under another harness's opening context (training rescues "as
if" under the base harness).

Both lay tokens out exactly as `engine.collect` lays out a token policy's episodes, so the trainer
cannot tell them from sampled ones: prompt and environment tokens have loss mask 0, reply tokens
(with their end-of-turn id) loss mask 1.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from hsjax.policies.tokens import render_prompt
from hsjax.rollout import engine


def render_segments(tokenizer, turns: list[tuple[list[dict], str]], eos_id: int) -> list[engine.Segment]:
    """The token segments the rollout engine would record for this conversation, had a token policy
    produced each reply as `encode(reply) + [eos_id]`: same prompts, same tails between turns
    (`engine.continuation_ids`), a new segment whenever a context does not extend the open one."""
    segments, tokens, mask = [], [], []
    prev_messages = prev_prompt_text = last = None

    def close():
        if tokens:
            segments.append(engine.Segment(np.asarray(tokens, np.int32), np.asarray(mask, np.int32),
                                           np.zeros(len(tokens), np.float32)))

    for messages, reply in turns:
        tail = None
        if tokens:
            tail = engine.continuation_ids(tokenizer, prev_messages, prev_prompt_text, last[0], last[1], messages)
        if tail is None:
            close()
            tokens = render_prompt(tokenizer, messages)
            mask = [0] * len(tokens)
            prompt_text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        else:
            tail_ids, prompt_text = tail
            tokens, mask = tokens + list(tail_ids), mask + [0] * len(tail_ids)
        ids = tokenizer.encode(reply, add_special_tokens=False) + [int(eos_id)]
        tokens, mask = tokens + ids, mask + [1] * len(ids)
        prev_messages, prev_prompt_text, last = messages, prompt_text, (reply, ids)
    close()
    return segments


def rerender_with_prefix(traj: engine.Trajectory, prompt_ids) -> engine.Trajectory | None:
    """The trajectory with its first prompt (instruction, acknowledgement, task) replaced by
    `prompt_ids`, e.g. the base harness's opening context. The policy's actions and the
    observations it saw stay token for token. None when that is not well defined: several segments
    (the harness rewrote its history) or no turn."""
    if len(traj.segments) != 1 or not traj.turns:
        return None
    prefix = np.asarray(prompt_ids, np.int32)
    seg, cut = traj.segments[0], int(traj.turns[0]["prompt_tokens"])
    rest = slice(cut, None)
    rerendered = engine.Segment(
        tokens=np.concatenate([prefix, seg.tokens[rest]]).astype(np.int32),
        loss_mask=np.concatenate([np.zeros(len(prefix), seg.loss_mask.dtype), seg.loss_mask[rest]]),
        logprobs=np.concatenate([np.zeros(len(prefix), np.float32), seg.logprobs[rest]]))
    return dataclasses.replace(traj, segments=[rerendered])
