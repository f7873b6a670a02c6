"""A deterministic voter that reads the router's prompt and ranks candidates by their cards.

`RuleVoterPolicy` is a `ChatPolicy` (`chat(contexts, sampling, infos=None) -> list[str]`), served
like any model with `hsjax.llm.server.build_app(RuleVoterPolicy(), "rule-voter")` (the train mode
starts it: `hsjax.voter_servers`). For each prompt it
reads, from the text `VoteRequest.messages` builds:

    the task type           first line, "Task (<type>, id <task_id>):"
    the failure modes       the group summary's "failure modes: m x3, n x1" line
    the candidates          the last "Candidates: [...]" line (JSON)
    each candidate's card   the "[name]" blocks under the last "Candidate harnesses:" heading

and answers `{"ranking": [...]}`: candidates by their card's rescue rate for the group's dominant
failure mode (most rollouts, ties by name; "unknown" is no mode), else the card's rate for the task
type, else its overall rate, best first; ties by name. A candidate whose card gives no rate (no
profile yet) comes after every candidate with one.

The prompt mixes free text (the question, example snippets) with the structure above, so parsing
anchors on what free text cannot fake: snippets are single lines, and every section the voter reads
comes after the question, so the last occurrence of each heading is the real one. A prompt without
a candidate list gets a reply without a ranking, which the router counts as `malformed`.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import re
from typing import Sequence

from hsjax.policies.base import ChatPolicy

log = logging.getLogger(__name__)

_TASK_LINE = re.compile(r"\ATask \((?P<type>.*?), id .*\):$", re.M)
_CANDIDATES_LINE = re.compile(r"^Candidates: (\[.*\])$", re.M)
_GROUP_HEADING = "Failed group under the base harness:\n"
_CARDS_HEADING = "\n\nCandidate harnesses:\n"
_MODES_LINE = re.compile(r"^failure modes: (.*)$", re.M)
_MODE_ITEM = re.compile(r"(?:^|, )(?P<mode>.+?) x(?P<count>\d+)(?=, |$)")
_OVERALL_LINE = re.compile(r"^rescue rate overall: (?P<rate>\d+(?:\.\d+)?) ")
_RATE_ITEM = re.compile(r"(?:^|, )(?P<key>.+?) (?P<rate>\d+(?:\.\d+)?) \([0-9.]+/[0-9.]+\)(?=, |$)")
_NO_TYPE = "unknown type"   # what VoteRequest writes when the task has no type
_NO_MODE = "unknown"        # what group_summary writes for a rollout without a failure mode


class PromptError(ValueError):
    """The voter prompt lacks something the rule voter needs (named in the message)."""


@dataclasses.dataclass(frozen=True)
class CardRates:
    """The rescue rates one profile card states (posterior means, as printed)."""

    overall: float | None = None
    by_mode: dict[str, float] = dataclasses.field(default_factory=dict)
    by_type: dict[str, float] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class VoterPrompt:
    """What the rule voter reads from one router prompt."""

    task_type: str | None
    failure_modes: dict[str, int]
    candidates: tuple[str, ...]
    cards: dict[str, CardRates]

    @property
    def dominant_mode(self) -> str | None:
        modes = {m: c for m, c in self.failure_modes.items() if m != _NO_MODE}
        return min(modes, key=lambda m: (-modes[m], m)) if modes else None


# ---------------------------------------------------------------------------------------------
# Parsing (pure)


def _rate_items(text: str) -> dict[str, float]:
    return {m["key"]: float(m["rate"]) for m in _RATE_ITEM.finditer(text)}


def parse_card(text: str) -> CardRates:
    """The rates of a `Profiles.card` text; lines it does not know (costs, snippets) are skipped."""
    overall, by_mode, by_type = None, {}, {}
    for line in text.splitlines():
        m = _OVERALL_LINE.match(line)
        if m:
            overall = float(m["rate"])
        elif line.startswith("by base failure mode: "):
            by_mode = _rate_items(line[len("by base failure mode: "):])
        elif line.startswith("by task type: "):
            by_type = _rate_items(line[len("by task type: "):])
    return CardRates(overall, by_mode, by_type)


def _split_cards(section: str, candidates: Sequence[str]) -> dict[str, str]:
    """Card texts by candidate: a block starts at a line that is exactly "[name]"."""
    headers = {f"[{c}]": c for c in candidates}
    blocks: dict[str, list[str]] = {}
    current = None
    for line in section.splitlines():
        if line in headers:
            current = headers[line]
            blocks[current] = []
        elif current is not None:
            blocks[current].append(line)
    return {c: "\n".join(lines).strip() for c, lines in blocks.items()}


def parse_prompt(text: str) -> VoterPrompt:
    """Reads the user message of a router prompt (`VoteRequest.messages()[-1]['content']`)."""
    found = _CANDIDATES_LINE.findall(text)
    if not found:
        raise PromptError("no 'Candidates: [...]' line in the prompt; the rule voter reads prompts "
                          "built by hsjax.harness_s.router.voters.VoteRequest")
    try:
        candidates = json.loads(found[-1])
    except ValueError as e:
        raise PromptError(f"the 'Candidates:' line is not a JSON list: {e}") from None
    if not isinstance(candidates, list) or not all(isinstance(c, str) for c in candidates):
        raise PromptError(f"the 'Candidates:' line must list names as strings, got {found[-1][:200]!r}")
    candidates = tuple(dict.fromkeys(candidates))

    task_type = None
    m = _TASK_LINE.search(text.split("\n", 1)[0])
    if m and m["type"] != _NO_TYPE:
        task_type = m["type"]

    cards_at = text.rfind(_CARDS_HEADING)
    head = text[:cards_at] if cards_at >= 0 else text
    cards_text = text[cards_at + len(_CARDS_HEADING):] if cards_at >= 0 else ""
    group_at = head.rfind(_GROUP_HEADING)
    failure_modes: dict[str, int] = {}
    if group_at >= 0:
        m = _MODES_LINE.search(head, group_at)
        if m:
            failure_modes = {i["mode"]: int(i["count"]) for i in _MODE_ITEM.finditer(m[1])}
    cards = {c: parse_card(t) for c, t in _split_cards(cards_text, candidates).items()}
    return VoterPrompt(task_type, failure_modes, candidates, cards)


# ---------------------------------------------------------------------------------------------
# The rule (pure)


def card_rate(card: CardRates | None, task_type: str | None,
              failure_mode: str | None) -> tuple[float | None, str]:
    """(rate, level): the card's rate for the failure mode, else the task type, else overall."""
    if card is None:
        return None, "no card"
    if failure_mode is not None and failure_mode in card.by_mode:
        return card.by_mode[failure_mode], f"mode {failure_mode}"
    if task_type is not None and task_type in card.by_type:
        return card.by_type[task_type], f"type {task_type}"
    if card.overall is not None:
        return card.overall, "overall"
    return None, "no rate"


def rule_ranking(prompt: VoterPrompt) -> list[str]:
    """Candidates best first: higher card rate first, candidates without a rate last, ties by name."""
    mode = prompt.dominant_mode

    def key(name):
        rate, _ = card_rate(prompt.cards.get(name), prompt.task_type, mode)
        return (rate is None, -(rate or 0.0), name)

    return sorted(prompt.candidates, key=key)


# ---------------------------------------------------------------------------------------------
# The policy


class RuleVoterPolicy(ChatPolicy):
    """A chat policy answering router prompts with `{"ranking": [...]}`; deterministic, stateless.

    Sampling settings are ignored. A prompt it cannot read gets `{"error": ...}` (counted by the
    router as `malformed`), never an exception, so the server answers 200 either way.
    """

    def answer(self, messages: list[dict]) -> str:
        users = [m.get("content") for m in messages if m.get("role") == "user"]
        if not users or not isinstance(users[-1], str):
            return json.dumps({"error": "no user message with text content"})
        try:
            prompt = parse_prompt(users[-1])
        except PromptError as e:
            log.warning("rule voter: %s", e)
            return json.dumps({"error": str(e)})
        return json.dumps({"ranking": rule_ranking(prompt)})

    def chat(self, contexts: list[list[dict]], sampling=None, infos: list[dict] | None = None) -> list[str]:
        return [self.answer(messages) for messages in contexts]
