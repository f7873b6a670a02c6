"""LLM proposals of knob changes along a repair direction, over an OpenAI-compatible chat policy.

The proposer shows a model the failures of one mode, the direction's knobs (with their allowed
values and docs, read from the harness's schema) and asks for candidates as JSON. Every proposal is
validated against the schema and the direction; whatever is invalid is dropped and counted, so a
model's mistakes never stop evolution.
"""
from __future__ import annotations

import collections
import json
import logging
from typing import Any, Iterable, Sequence

from harness_envs.harness import Direction, HarnessSpec
from hsjax.harness_s.candidates import changes_key, is_no_op
from hsjax.llm.json_extract import find_json
from hsjax.policies.base import FailedReply, SamplingParams

log = logging.getLogger(__name__)


PROPOSAL_COUNTERS = ("requests", "request_failed", "malformed_reply", "received", "valid", "invalid_shape",
                     "unknown_knob", "bad_value", "off_direction", "no_op", "duplicate")

PROPOSER_SYSTEM = (
    "You improve an agent harness for {benchmark}. A harness is a set of knobs; the agent (a "
    "language model) failed tasks under the base harness in the way described. Propose knob changes "
    "that could let the same agent succeed, using only the knobs listed and their allowed values. "
    "Answer with JSON only: {\"candidates\": [{\"knobs\": {\"knob\": value, ...}, \"why\": \"...\"}]}.")


def knob_line(spec: HarnessSpec, name: str) -> str:
    k, value = spec.schema[name], spec.knob(name)
    allowed = (f"one of {list(k.choices)}" if k.choices is not None else
               f"int in [{k.min}, {k.max}]" if k.type is int else
               "true or false" if k.type is bool else "a short string or null")
    return f"- {name} (now {json.dumps(value)}; {allowed}): {k.doc}"


def free_text_knobs(spec: HarnessSpec) -> list[str]:
    """Knobs an LLM may fill outside any direction's subspace: free text, such as a hint line."""
    return [name for name, knob in spec.schema.items() if knob.free_text]


def proposal_prompt(base: HarnessSpec, direction: Direction, failures: Sequence[dict],
                    n: int, benchmark: str, examples: int = 3) -> list[dict]:
    """The proposer's chat: the system rules (naming the benchmark, its description) and the failures."""
    knobs = [*direction.knobs, *free_text_knobs(base)]
    lines = [f"Failure mode: {direction.failure_mode} ({len(failures)} failed episodes under harness "
             f"{base.name!r}). Repair direction: {direction.name}: {direction.doc}.",
             "Knobs you may change:", *[knob_line(base, k) for k in knobs]]
    for f in failures[:examples]:
        turns = f.get("turns") or []
        last = turns[-1] if turns and isinstance(turns[-1], dict) else {}
        reply = " ".join(str(last.get("reply", "")).split())[:300]
        obs = " ".join(str(last.get("observation") or last.get("error") or "").split())[:200]
        lines.append(f"Example ({f.get('type')}, {f.get('num_turns')} turns), last reply: {reply!r}; "
                     f"then: {obs!r}")
    lines.append(f"Propose at most {n} candidates.")
    return [{"role": "system", "content": PROPOSER_SYSTEM.replace("{benchmark}", benchmark)},
            {"role": "user", "content": "\n".join(lines)}]


def parse_proposals(text: str) -> list | None:
    """The candidate list of a reply: the whole reply, a code fence, or a JSON object in prose,
    holding `{"candidates": [...]}`, or a bare list as the whole reply or fence
    (`hsjax.llm.json_extract`). None when nothing parses."""
    if not isinstance(text, str):
        return None

    def candidates(value, whole):
        if isinstance(value, dict) and isinstance(value.get("candidates"), list):
            return value["candidates"]
        return value if whole and isinstance(value, list) else None

    return find_json(text, candidates)


def validate_proposal(item: Any, base: HarnessSpec, direction: Direction) -> tuple[dict | None, str]:
    """(knob changes, "valid") or (None, reason): invalid_shape, unknown_knob, bad_value,
    off_direction (a knob outside the direction's subspace and `hint`), no_op."""
    changes = item.get("knobs") if isinstance(item, dict) else None
    if not isinstance(changes, dict) or not changes:
        return None, "invalid_shape"
    if any(k not in base.schema for k in changes):
        return None, "unknown_knob"
    for k, v in changes.items():
        try:
            base.schema[k].check(k, v)
        except ValueError:
            return None, "bad_value"
    extra = free_text_knobs(base)
    if any(k not in direction.knobs and k not in extra for k in changes):
        return None, "off_direction"
    if is_no_op(base, changes):
        return None, "no_op"
    return dict(sorted(changes.items())), "valid"


class LLMProposer:
    """Asks a ChatPolicy (normally `hsjax.policies.http_chat.HttpChatPolicy`) for knob changes per direction.

    Never raises for the model's sake: a failed request, a reply without a JSON candidate list and
    each invalid or duplicate proposal is dropped and counted (`counters`, `PROPOSAL_COUNTERS`)."""

    def __init__(self, policy, *, benchmark: str, n_proposals: int = 4, sampling=None):
        self.policy, self.benchmark = policy, benchmark
        self.n_proposals = int(n_proposals)
        self.sampling = sampling or SamplingParams(greedy=True, max_new_tokens=512)
        self.counters: collections.Counter = collections.Counter({k: 0 for k in PROPOSAL_COUNTERS})
        self.log: list[dict] = []

    def propose(self, base: HarnessSpec, direction: Direction, failures: Sequence[dict],
                existing: Iterable[dict] = ()) -> list[dict]:
        seen = {changes_key(c) for c in existing}
        self.counters["requests"] += 1
        entry = {"direction": direction.name, "valid": [], "dropped": collections.Counter()}
        self.log.append(entry)
        try:
            reply = self.policy.chat([proposal_prompt(base, direction, failures, self.n_proposals, self.benchmark)],
                                     self.sampling, [{"direction": direction.name}])[0]
            if isinstance(reply, FailedReply):  # a chat policy's per-context failure
                raise RuntimeError(reply.reason)
        except Exception as e:  # transport or server failure: evolution goes on without proposals
            self.counters["request_failed"] += 1
            entry["error"] = f"{type(e).__name__}: {str(e)[:200]}"
            log.warning("LLM proposals for %s failed: %s", direction.name, entry["error"])
            return []
        items = parse_proposals(reply)
        if items is None:
            self.counters["malformed_reply"] += 1
            entry["error"] = "malformed_reply"
            return []
        out = []
        for item in items[: self.n_proposals]:
            self.counters["received"] += 1
            changes, reason = validate_proposal(item, base, direction)
            if changes is not None and changes_key(changes) in seen:
                changes, reason = None, "duplicate"
            self.counters[reason] += 1
            if changes is None:
                entry["dropped"][reason] += 1
                continue
            seen.add(changes_key(changes))
            entry["valid"].append(changes)
            out.append(changes)
        return out
