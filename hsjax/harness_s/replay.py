"""Whether a sibling's rescue is a valid base trajectory, found by replaying its replies.

A successful rescue under sibling h trains the policy to act as it did there (in the base context
with `rescue_context=base`, or as generated in the hope that the behaviour shows under base). It is
a *valid base trajectory* when

1. its replies, fed one by one to a fresh episode of the same task under the base harness, end in
   success there: the base harness parses them and the environment accepts them; and
2. no reply uses a word that only the sibling's observations had shown: the words reply i shares
   with what the sibling showed after its opening, before reply i, all appear in what the base
   replay showed before reply i (its opening, its observations, the earlier replies).

Condition 2 is the one that matters for siblings that rescue by showing what the base harness
hides. On the testbed, `schema_reminder` answers a failed guess with the schema, hidden table name
included; the next reply names the table and succeeds, and that reply replays to success under
base too, yet the base harness never showed the name (tests/harness_s/test_replay.py). Only
observations count, not the opening: a sibling's instructions are the channel whose induced
behaviour should transfer (`tables_first` asks for SHOW TABLES first; the replies that follow it
use only what SHOW TABLES returned, which the base harness shows as well). A sibling that put task
facts into its opening would pass condition 2; no sibling of the shipped pools does.

Inconclusive (None): the environment of a replay failed, or the base episode had not ended when
the replies ran out (it may have needed a turn the sibling did not). Words are lower-cased runs of
letters, digits and underscores, so SQL's case-insensitive names compare equal.

Cost: two episodes per checked successful rescue, environment only, no model call (milliseconds
on the testbed and DBBench's SQLite). On AppWorld and SWE-Gym each replay opens a world or a
workspace, which is why the check runs only when `router.validity = "replay"`.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, Sequence

WORD = re.compile(r"[a-z0-9_]+")


def words(text: str) -> set[str]:
    return set(WORD.findall(text.lower()))


def _seen(messages: Sequence[dict]) -> set[str]:
    out: set[str] = set()
    for m in messages:
        out |= words(str(m.get("content", "")))
    return out


@dataclasses.dataclass
class Replay:
    """One replay: the words visible before each reply that was consumed, the opening's words,
    whether the episode ended, and its result (None when it did not end)."""

    before: list[set[str]]
    opening: set[str]
    done: bool
    result: dict | None


def replay(bench, task, spec, replies: Sequence[str]) -> Replay:
    """Feeds `replies` to a fresh episode of `task` under harness `spec`, stopping where it ends."""
    episode = bench.make_episode(task, spec)
    episode.reset()
    opening = _seen(episode.messages())
    before = []
    for reply in replies:
        if episode.done:
            break
        before.append(_seen(episode.messages()))
        episode.step(reply)
    done = episode.done
    if not done:
        episode.abort("replay_ended")  # closes the episode's resource
    return Replay(before, opening, done, episode.result() if done else None)


@dataclasses.dataclass(frozen=True)
class Validity:
    valid: bool | None  # None: inconclusive
    reason: str


def leaked(sibling: Replay, base: Replay, replies: Sequence[str]) -> dict[int, list[str]]:
    """{reply index: words it uses that the sibling's observations showed and the base did not}."""
    out = {}
    for i, reply in enumerate(replies[: min(len(sibling.before), len(base.before))]):
        shown_by_sibling = sibling.before[i] - sibling.opening
        new = (words(reply) & shown_by_sibling) - base.before[i]
        if new:
            out[i] = sorted(new)
    return out


def base_validity(bench, task, sibling_spec, base_spec, replies: Sequence[str], threshold: float) -> Validity:
    """Conditions 1 and 2 of the module doc for one rescue's `replies`."""
    replies = list(replies)
    base = replay(bench, task, base_spec, replies)
    if not base.done:
        return Validity(None, f"the base episode had not ended after the {len(replies)} replies")
    if base.result.get("status") == "env_error":
        return Validity(None, f"the base replay's environment failed: {base.result.get('error')}")
    if float(base.result.get("reward", 0.0)) < threshold:
        return Validity(False, f"the replies do not succeed under {base_spec.name} "
                               f"(failure mode {base.result.get('failure_mode')})")
    sibling = replay(bench, task, sibling_spec, replies)
    if sibling.result is not None and sibling.result.get("status") == "env_error":
        return Validity(None, f"the sibling replay's environment failed: {sibling.result.get('error')}")
    leaks = leaked(sibling, base, replies)
    if leaks:
        i, used = next(iter(leaks.items()))
        return Validity(False, f"reply {i + 1} uses {', '.join(used)}, shown only by {sibling_spec.name}'s "
                               "observations")
    return Validity(True, "replays to success under the base harness on what it shows")


def checker(bench, base_spec, threshold: float) -> Callable[[Any, Any, Any], Validity]:
    """`check(task, sibling_spec, trajectory)` for `rescue_failed_groups`: the trajectory's reply
    texts (`turns[i]["text"]`) checked against `base_spec`."""
    def check(task, sibling_spec, trajectory) -> Validity:
        replies = [str(t.get("text", "")) for t in trajectory.turns]
        return base_validity(bench, task, sibling_spec, base_spec, replies, threshold)
    return check
