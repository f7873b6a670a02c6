"""Runs many multi-turn episodes at once and records token-exact trajectories.

Each turn: gather the context of every live episode, generate for all of them in one policy call,
hand each reply to its episode (environment steps in a thread pool), repeat until all are done.

With a token policy the engine keeps, per episode, the exact token sequence the policy saw and
produced: the chat template is rendered incrementally, generated ids are never re-tokenized, and
only the tokens between the end of the reply and the next generation prompt (end-of-turn and the
new messages) are tokenized, with loss mask 0. When a harness rewrites its history so that the
new context no longer extends the open segment, a new `Segment` starts. See docs/rollout.md.

An episode ends early, and the others go on, when its context passes the budget
(`context_overflow`: `max_context_tokens`, or for chat policies `max_context_chars`), when its
environment raises (`env_error`) or when a chat policy returns a `FailedReply` for it
(`policy_error`, e.g. its request to an HTTP endpoint failed after retries). A `PolicyError` raised
by the policy ends the whole call.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import logging
import time

import numpy as np

from hsjax.policies.base import FailedReply, Generation, SamplingParams, TokenPolicy, as_policy
from hsjax.policies.tokens import render_prompt, tokenizer_eos_ids

log = logging.getLogger(__name__)

CONTEXT_OVERFLOW = "context_overflow"
ENV_ERROR = "env_error"
POLICY_ERROR = "policy_error"


@dataclasses.dataclass
class Segment:
    """One contiguous token sequence: `tokens` int32, `loss_mask` int32 (1 on policy tokens) and
    `logprobs` float32 (sampler logprob on policy tokens, 0 elsewhere), all of equal length."""

    tokens: np.ndarray
    loss_mask: np.ndarray
    logprobs: np.ndarray

    def __post_init__(self):
        n = len(self.tokens)
        if len(self.loss_mask) != n or len(self.logprobs) != n:
            raise ValueError(f"Segment arrays differ in length: tokens {n}, loss_mask "
                             f"{len(self.loss_mask)}, logprobs {len(self.logprobs)}")

    @property
    def num_policy_tokens(self) -> int:
        return int(self.loss_mask.sum())


@dataclasses.dataclass
class Trajectory:
    """A finished episode: its result dict, token segments (token policies only) and records.

    `turns[i]` holds the reply text, finish reason, prompt and reply token counts and the segment
    index of turn i. `abort_reason` is set when the engine ended the episode early.
    """

    result: dict
    segments: list[Segment]
    turns: list[dict]
    num_generated_tokens: int
    timings: dict
    abort_reason: str | None = None
    error: str | None = None
    episode_id: str | None = None  # the episode's `info["episode_id"]` (agents key their state by it)


class _OpenSegment:
    """The segment of one episode that is still growing (turn by turn) until it is closed."""

    def __init__(self, tokens: list[int]):
        self.tokens = list(tokens)
        self.loss_mask = [0] * len(tokens)
        self.logprobs = [0.0] * len(tokens)

    def extend(self, ids, mask: int, logprobs=None):
        self.tokens.extend(int(i) for i in ids)
        self.loss_mask.extend([mask] * len(ids))
        self.logprobs.extend([float(x) for x in logprobs] if logprobs is not None
                             else [0.0] * len(ids))

    def to_segment(self) -> Segment:
        return Segment(np.asarray(self.tokens, np.int32), np.asarray(self.loss_mask, np.int32),
                       np.asarray(self.logprobs, np.float32))


def _same_message(a: dict, b: dict) -> bool:
    return a.get("role") == b.get("role") and a.get("content") == b.get("content")


def _template_text(tokenizer, messages, add_generation_prompt):
    return tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                         tokenize=False)


def continuation_ids(tokenizer, prev_messages: list[dict], prev_prompt_text: str, reply_text: str,
                     reply_ids: list[int], new_messages: list[dict]) -> tuple[list[int], str] | None:
    """The ids to append after a reply so the open segment becomes the prompt of `new_messages`.

    Returns (ids, new_prompt_text), or None when `new_messages` is not `prev_messages` + the
    assistant reply + more messages, or the template does not render it as an extension (then the
    caller starts a new segment). The tail is the template's end-of-turn text (e.g.
    "<|im_end|>\\n") followed by the new messages and the generation prompt; when the reply already
    ends with the tail's first id (the model generated `<|im_end|>`), that id is not repeated.
    """
    n = len(prev_messages)
    if len(new_messages) <= n or not all(
            _same_message(a, b) for a, b in zip(prev_messages, new_messages)):
        return None
    if not _same_message(new_messages[n], {"role": "assistant", "content": reply_text}):
        return None
    with_reply = _template_text(tokenizer, new_messages[:n + 1], False)
    new_prompt = _template_text(tokenizer, new_messages, True)
    if not with_reply.startswith(prev_prompt_text) or not new_prompt.startswith(with_reply):
        return None
    assistant_part = with_reply[len(prev_prompt_text):]
    if not assistant_part.startswith(reply_text):
        return None
    tail_text = assistant_part[len(reply_text):] + new_prompt[len(with_reply):]
    tail = tokenizer.encode(tail_text, add_special_tokens=False)
    if reply_ids and tail and tail[0] == reply_ids[-1]:
        tail = tail[1:]
    return tail, new_prompt


class _EpisodeState:
    """What `collect` keeps of one episode while it runs: its closed segments and open one, the
    last prompt and reply, turn records, timings and why it was aborted."""

    def __init__(self, episode):
        self.episode = episode
        self.segments: list[Segment] = []
        self.open_segment: _OpenSegment | None = None
        self.prev_messages: list[dict] | None = None
        self.prev_prompt_text: str | None = None
        self.last_reply: tuple[str, list[int]] | None = None
        self.turns: list[dict] = []
        self.num_generated = 0
        self.generate_s = 0.0
        self.env_s = 0.0
        self.abort_reason = None
        self.error = None
        self.pending_prompt: list[int] | None = None
        self.pending_state = None

    def close_segment(self):
        if self.open_segment is not None and any(self.open_segment.loss_mask):
            self.segments.append(self.open_segment.to_segment())
        self.open_segment = None


def _abort(state: _EpisodeState, reason: str):
    state.abort_reason = reason
    state.episode.abort(reason)


def _prepare_token_prompt(state: _EpisodeState, tokenizer, max_context_tokens, max_new_tokens):
    """Builds the next prompt of a live episode (extending the open segment or starting a new one);
    aborts the episode on context overflow. Returns the prompt ids or None if aborted."""
    messages = [dict(m) for m in state.episode.messages()]
    tail = None
    if state.open_segment is not None and state.last_reply is not None:
        text, ids = state.last_reply
        tail = continuation_ids(tokenizer, state.prev_messages, state.prev_prompt_text, text, ids,
                                messages)
    if tail is not None:
        tail_ids, prompt_text = tail
        prompt_len = len(state.open_segment.tokens) + len(tail_ids)
        new_segment = None
    else:
        prompt_text = _template_text(tokenizer, messages, True)
        new_segment = render_prompt(tokenizer, messages)
        prompt_len = len(new_segment)
    if max_context_tokens is not None and prompt_len + max_new_tokens > max_context_tokens:
        log.info("episode %s: prompt of %d tokens + max_new_tokens %d exceeds max_context_tokens "
                 "%d; aborting", state.episode.info.get("task_id"), prompt_len, max_new_tokens,
                 max_context_tokens)
        _abort(state, CONTEXT_OVERFLOW)
        return None
    if new_segment is None:
        state.open_segment.extend(tail_ids, 0)
    else:
        if state.open_segment is not None:
            log.debug("episode %s: history rewritten, new segment",
                      state.episode.info.get("task_id"))
        state.close_segment()
        state.open_segment = _OpenSegment(new_segment)
    state.prev_messages = messages
    state.prev_prompt_text = prompt_text
    return list(state.open_segment.tokens)


def _prepare_chat_context(state: _EpisodeState, tokenizer, max_context_tokens, max_new_tokens, max_context_chars):
    messages = [dict(m) for m in state.episode.messages()]
    if max_context_chars is not None:
        n = sum(len(str(m.get("content") or "")) for m in messages)
        if n > max_context_chars:
            log.info("episode %s: context of %d characters exceeds max_context_chars %d; aborting",
                     state.episode.info.get("task_id"), n, max_context_chars)
            _abort(state, CONTEXT_OVERFLOW)
            return None
    if max_context_tokens is not None and tokenizer is not None:
        n = len(render_prompt(tokenizer, messages))
        if n + max_new_tokens > max_context_tokens:
            _abort(state, CONTEXT_OVERFLOW)
            return None
    return messages


def _policy_failed(state: _EpisodeState, failure: FailedReply):
    log.warning("episode %s: no reply from the policy (%s); ending this episode as %s",
                state.episode.info.get("task_id"), failure.reason, POLICY_ERROR)
    state.error = failure.reason
    _abort(state, POLICY_ERROR)


def _step(state: _EpisodeState, text: str):
    t0 = time.perf_counter()
    try:
        state.episode.step(text)
    except Exception as e:  # an environment bug ends its episode, not the whole rollout
        log.exception("episode %s: step raised; aborting it", state.episode.info.get("task_id"))
        state.error = f"{type(e).__name__}: {e}"
        state.abort_reason = ENV_ERROR
        if not state.episode.done:
            state.episode.abort(ENV_ERROR)
    state.env_s += time.perf_counter() - t0


def collect(episodes: list, policy, sampling: SamplingParams, tokenizer=None,
            max_context_tokens: int | None = None, env_workers: int = 4,
            max_context_chars: int | None = None,
            episode_seeds: list[int] | None = None) -> list[Trajectory]:
    """Runs every episode to its end and returns their trajectories, in the order given.

    `episode_seeds[i]` seeds episode i's draws: a token policy gets (episode seed, turn) per prompt
    (`turn_seeds`), so episode i samples the same whatever other episodes share its batches.
    Default: its index here.
    `policy` is a `TokenPolicy` (token-exact segments are recorded, `tokenizer` defaults to
    `policy.tokenizer`) or a `ChatPolicy` (text only); a benchmark's scripted agent is taken as a
    chat policy (`hsjax.policies.base.as_policy`). An episode whose next
    prompt plus `sampling.max_new_tokens` would exceed `max_context_tokens` is aborted with
    "context_overflow" (for chat policies only when a tokenizer is given to count with); so is, with
    a chat policy, one whose context holds more than `max_context_chars` characters of content. A
    `FailedReply` from a chat policy aborts its episode with "policy_error" (the reason in
    `Trajectory.error`).
    """
    policy = as_policy(policy)
    token_mode = isinstance(policy, TokenPolicy)
    if tokenizer is None:
        tokenizer = policy.tokenizer
    if token_mode and tokenizer is None:
        raise ValueError("collect with a token policy needs a tokenizer to render the chat "
                         "template: pass tokenizer=... or give the policy a .tokenizer")
    eos = set(policy.eos_ids or (tokenizer_eos_ids(tokenizer) if tokenizer is not None else ()))
    t_start = time.perf_counter()
    states = [_EpisodeState(ep) for ep in episodes]
    if episode_seeds is None:
        episode_seeds = list(range(len(episodes)))
    if len(episode_seeds) != len(episodes):
        raise ValueError(f"got {len(episode_seeds)} episode seeds for {len(episodes)} episodes")
    seed_of = {id(r): int(s) for r, s in zip(states, episode_seeds)}
    try:
        with concurrent.futures.ThreadPoolExecutor(max(1, env_workers)) as pool:
            list(pool.map(lambda r: r.episode.reset(), states))
            turn = 0
            while True:
                live, prompts = [], []
                for r in states:
                    if r.episode.done:
                        continue
                    if token_mode:
                        prompt = _prepare_token_prompt(r, tokenizer, max_context_tokens, sampling.max_new_tokens)
                    else:
                        prompt = _prepare_chat_context(r, tokenizer, max_context_tokens, sampling.max_new_tokens,
                                                       max_context_chars)
                    if prompt is not None:
                        live.append(r)
                        prompts.append(prompt)
                if not live:
                    break
                t0 = time.perf_counter()
                if token_mode:
                    gens = policy.generate(prompts, sampling, turn_seeds=[(seed_of[id(r)], turn) for r in live])
                else:
                    texts = policy.chat(prompts, sampling, [r.episode.info for r in live])
                    gens = [t if isinstance(t, FailedReply)
                            else Generation(ids=[], logprobs=[], text=t, finish_reason="stop") for t in texts]
                dt = time.perf_counter() - t0
                if len(gens) != len(live):
                    raise RuntimeError(f"policy {type(policy).__name__} returned {len(gens)} replies "
                                       f"for {len(live)} contexts")
                stepped, texts = [], []
                for r, prompt, gen in zip(live, prompts, gens):
                    r.generate_s += dt
                    if isinstance(gen, FailedReply):
                        _policy_failed(r, gen)
                        continue
                    text = gen.text
                    if token_mode:
                        if text is None:
                            ids = gen.ids[:-1] if gen.ids and gen.ids[-1] in eos else gen.ids
                            text = tokenizer.decode(ids, skip_special_tokens=False)
                        r.open_segment.extend(gen.ids, 1, gen.logprobs)
                        r.last_reply = (text, list(gen.ids))
                        n_new = len(gen.ids)
                    else:
                        n_new = len(tokenizer.encode(text, add_special_tokens=False)) if tokenizer else 0
                    r.num_generated += n_new
                    r.turns.append({"turn": turn, "text": text, "finish_reason": gen.finish_reason,
                                    "prompt_tokens": len(prompt) if token_mode else None,
                                    "new_tokens": n_new,
                                    "segment": len(r.segments) if token_mode else None})
                    stepped.append(r)
                    texts.append(text)
                list(pool.map(_step, stepped, texts))
                turn += 1
    finally:
        # Caches kept for a next turn (`JaxPolicy`'s KV reuse) would otherwise sit in memory
        # through the update that follows.
        policy.end_rollout()
    wall = time.perf_counter() - t_start
    trajectories = []
    for r in states:
        r.close_segment()
        trajectories.append(Trajectory(
            result=r.episode.result(), segments=r.segments, turns=r.turns,
            num_generated_tokens=r.num_generated,
            timings={"generate_s": r.generate_s, "env_s": r.env_s, "wall_s": wall},
            abort_reason=r.abort_reason, error=r.error, episode_id=r.episode.info.get("episode_id")))
    return trajectories


def rollout_stats(trajectories: list[Trajectory]) -> dict:
    """Summary metrics of a batch of trajectories (slash-separated names)."""
    n = len(trajectories)
    if n == 0:
        return {"rollout/episodes": 0}
    rewards = np.array([float(t.result.get("reward", 0.0)) for t in trajectories])
    success = np.array([bool(t.result.get("success", False)) for t in trajectories])
    turns = np.array([len(t.turns) for t in trajectories])
    stats = {
        "rollout/episodes": n,
        "reward/mean": float(rewards.mean()),
        "rollout/success_frac": float(success.mean()),
        "rollout/turns_mean": float(turns.mean()),
        "rollout/turns_max": int(turns.max()),
        "rollout/generated_tokens": int(sum(t.num_generated_tokens for t in trajectories)),
        "rollout/segments_per_episode": float(np.mean([len(t.segments) for t in trajectories])),
        "rollout/aborted_frac": float(np.mean([t.abort_reason is not None for t in trajectories])),
    }
    modes = collections.Counter(str(t.result.get("failure_mode", "")) for t in trajectories)
    for mode, count in sorted(modes.items()):
        if mode and mode != "none":
            stats[f"rollout/failure_mode/{mode}"] = count / n
    return stats
