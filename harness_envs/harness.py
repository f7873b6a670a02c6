"""Harness specs and the benchmark-independent behaviour their knobs drive.

A `HarnessSpec` is plain data: a name, the harness it was derived from (`parent`), the repair
`direction` it stands for, and `knobs` (only the values that differ from the defaults, which are the
benchmark's published protocol). Specs round-trip through JSON, can be validated, diffed and derived.

The knob behaviour lives in small pure functions here (observation truncation and paging, context
selection, answer normalization) and in each benchmark's harness module (instruction text, action
parsing), e.g. `harness_envs/dbbench/harness.py`. `docs/dbbench.md` ("Harness knobs") documents them.
"""
from __future__ import annotations

import ast
import dataclasses
import json
import math
import pathlib
import re
from typing import Any

from harness_envs.base import Message


@dataclasses.dataclass(frozen=True)
class Knob:
    """One knob of the schema: type, default, allowed values or range, and a one-line doc."""

    type: type
    default: Any
    doc: str
    choices: tuple | None = None
    min: int | None = None
    max: int | None = None
    optional: bool = False  # None allowed

    def check(self, name: str, value: Any) -> None:
        if value is None and self.optional:
            return
        # bool is an int subclass: a True where an int is expected is a mistake, not a 1.
        if (self.type is int and isinstance(value, bool)) or not isinstance(value, self.type):
            raise ValueError(
                f"knob {name!r} must be {self.type.__name__}{' or None' if self.optional else ''}, "
                f"got {value!r} ({type(value).__name__}); {name}: {self.doc}")
        if self.choices is not None and value not in self.choices:
            raise ValueError(f"knob {name!r}={value!r} is not one of {self.choices}; {name}: {self.doc}")
        if self.min is not None and value < self.min:
            raise ValueError(f"knob {name!r}={value!r} is below its minimum {self.min}; {name}: {self.doc}")
        if self.max is not None and value > self.max:
            raise ValueError(f"knob {name!r}={value!r} is above its maximum {self.max}; {name}: {self.doc}")


KNOBS: dict[str, Knob] = {
    "instruction": Knob(str, "agentbench", "instruction variant shown as the first user message",
                        choices=("agentbench", "schema_first", "concise")),
    "parse_mode": Knob(str, "strict", "strict: the published regexes; lenient: also repairs common format slips",
                       choices=("strict", "lenient")),
    "on_malformed": Knob(str, "fail", "on an unparseable reply: end the episode, or send format feedback",
                         choices=("fail", "retry")),
    "max_format_retries": Knob(int, 2, "format feedback messages per episode when on_malformed=retry",
                               min=0, max=10),
    "obs_max_chars": Knob(int, 800, "observation length before it is cut and '[TRUNCATED]' appended",
                          min=50, max=100_000),
    "obs_page_rows": Knob(int, 0, "0: off; else at most this many result rows per observation, the "
                                  "same query again shows the next page", min=0, max=1000),
    "schema_reminder_on_error": Knob(bool, False, "append the table schema to the observation of a failed statement"),
    "context": Knob(str, "all", "context shown to the model: all turns, the last n, or older observations elided",
                    choices=("all", "last_n", "compress")),
    "context_last_n": Knob(int, 4, "turns (reply + observation) kept intact by context=last_n/compress",
                           min=1, max=100),
    "max_rounds": Knob(int, 15, "statements executed before the episode ends on the turn limit", min=1, max=100),
    "answer_normalization": Knob(str, "none", "applied to the final answer before scoring",
                                 choices=("none", "strip", "numeric")),
    "verify_before_answer": Knob(bool, False, "an answer given before any successful statement, or an empty "
                                              "answer, gets one verification prompt instead of being accepted"),
    "hint": Knob(str, None, "an extra hint line at the end of the instruction", optional=True),
}


def knob_defaults() -> dict[str, Any]:
    return {name: k.default for name, k in KNOBS.items()}


@dataclasses.dataclass(frozen=True)
class HarnessSpec:
    """A harness as data. `knobs` holds only overrides of `KNOBS` defaults; read values with `knob()`."""

    name: str
    parent: str | None = None
    direction: str | None = None
    knobs: dict = dataclasses.field(default_factory=dict)
    doc: str = ""

    def validate(self) -> "HarnessSpec":
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"harness name must be a non-empty str, got {self.name!r}")
        unknown = sorted(set(self.knobs) - set(KNOBS))
        if unknown:
            raise ValueError(f"harness {self.name!r}: unknown knob(s) {unknown}; known knobs: {sorted(KNOBS)}")
        for name, value in self.knobs.items():
            KNOBS[name].check(name, value)
        return self

    def knob(self, name: str) -> Any:
        if name not in KNOBS:
            raise KeyError(f"unknown knob {name!r}; known knobs: {sorted(KNOBS)}")
        return self.knobs.get(name, KNOBS[name].default)

    def resolved(self) -> dict[str, Any]:
        """Every knob's value, defaults filled in."""
        return {**knob_defaults(), **self.knobs}

    def with_knobs(self, *, name: str | None = None, direction: str | None = None, doc: str = "",
                   **changes) -> "HarnessSpec":
        """A child spec: this spec's knobs with `changes` applied; parent = this spec's name."""
        if name is None:
            name = self.name + "+" + "+".join(f"{k}={v}" for k, v in sorted(changes.items()))
        knobs = {**self.knobs, **changes}
        knobs = {k: v for k, v in knobs.items() if k not in KNOBS or v != KNOBS[k].default}
        return HarnessSpec(name=name, parent=self.name, direction=direction, knobs=knobs, doc=doc).validate()

    def diff(self, other: "HarnessSpec") -> dict[str, tuple[Any, Any]]:
        """Knobs whose resolved values differ: {knob: (self value, other value)}."""
        a, b = self.resolved(), other.resolved()
        return {k: (a[k], b[k]) for k in KNOBS if a[k] != b[k]}

    def to_json(self) -> dict:
        return {"name": self.name, "parent": self.parent, "direction": self.direction,
                "knobs": dict(sorted(self.knobs.items())), "doc": self.doc}

    @classmethod
    def from_json(cls, data: dict | str) -> "HarnessSpec":
        if isinstance(data, str):
            data = json.loads(data)
        allowed = {"name", "parent", "direction", "knobs", "doc"}
        extra = sorted(set(data) - allowed)
        if extra:
            raise ValueError(f"harness spec has unknown field(s) {extra}; allowed: {sorted(allowed)}")
        if "name" not in data:
            raise ValueError(f"harness spec {data!r} has no 'name'")
        return cls(name=data["name"], parent=data.get("parent"), direction=data.get("direction"),
                   knobs=dict(data.get("knobs") or {}), doc=data.get("doc", "")).validate()


BASE = HarnessSpec(name="base", doc="The benchmark's published protocol: every knob at its default.")


def load_pool(path: str | pathlib.Path) -> dict[str, HarnessSpec]:
    """Reads a pool file `{"harnesses": [spec, ...]}`; returns {name: spec} with `base` always present.

    Every sibling must name an existing parent, so lineage stays inspectable.
    """
    path = pathlib.Path(path)
    if not path.exists():
        raise FileNotFoundError(f"harness pool {path} does not exist; see harness_envs/pools/ for examples")
    data = json.loads(path.read_text())
    if not isinstance(data, dict) or not isinstance(data.get("harnesses"), list):
        raise ValueError(f"{path}: a pool file is an object with a list 'harnesses'")
    pool = {"base": BASE}
    for raw in data["harnesses"]:
        spec = HarnessSpec.from_json(raw)
        if spec.name in pool and spec != pool[spec.name]:
            raise ValueError(f"{path}: harness {spec.name!r} defined twice (or redefines the base)")
        pool[spec.name] = spec
    for spec in pool.values():
        if spec.parent is not None and spec.parent not in pool:
            raise ValueError(f"{path}: harness {spec.name!r} names parent {spec.parent!r}, not in the pool")
    return pool


def save_pool(path: str | pathlib.Path, specs: list[HarnessSpec], **extra) -> None:
    payload = {**extra, "harnesses": [s.to_json() for s in specs if s.name != "base" or s != BASE]}
    pathlib.Path(path).write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n")


# ---------------------------------------------------------------- observations

TRUNCATION_MARK = "[TRUNCATED]"


def truncate(text: str, max_chars: int) -> tuple[str, bool]:
    """Cuts `text` at `max_chars` and appends the truncation mark (the published 800-char rule)."""
    if len(text) > max_chars:
        return text[:max_chars] + TRUNCATION_MARK, True
    return text, False


def paginate(rows: list, offset: int, max_rows: int, max_chars: int) -> tuple[list, int | None]:
    """One page of `rows` from `offset`: at most `max_rows` rows, and fewer if `str(page)` would pass
    `max_chars` (never fewer than one). Returns (page, next offset or None on the last page)."""
    offset = max(0, min(offset, len(rows)))
    end = min(len(rows), offset + max_rows)
    page = rows[offset:end]
    while len(page) > 1 and len(str(page)) > max_chars:
        page = page[: max(1, len(page) * 3 // 4)]
    end = offset + len(page)
    return page, (end if end < len(rows) else None)


# ---------------------------------------------------------------- context management

def elide_observation(text: str) -> str:
    return f"[earlier observation elided: {len(text)} characters]"


def select_context(history: list[Message], prefix_len: int, mode: str, last_n: int) -> list[Message]:
    """The messages shown to the model. `history[:prefix_len]` (instruction and task) is always kept;
    the rest is turns of (assistant reply, user observation).

    all: everything. last_n: the prefix and the last `last_n` turns. compress: every reply, but the
    observations of turns older than the last `last_n` are replaced by a one-line stub.
    """
    if mode == "all":
        return [dict(m) for m in history]
    prefix, rest = history[:prefix_len], history[prefix_len:]
    keep_from = max(0, len(rest) - 2 * last_n)
    keep_from -= keep_from % 2  # cut between turns, never inside one
    if mode == "last_n":
        return [dict(m) for m in prefix + rest[keep_from:]]
    if mode == "compress":
        out = [dict(m) for m in prefix]
        for i, m in enumerate(rest):
            if i < keep_from and m["role"] == "user":
                out.append({"role": "user", "content": elide_observation(m["content"])})
            else:
                out.append(dict(m))
        return out
    raise ValueError(f"context mode {mode!r} is not one of {KNOBS['context'].choices}")


# ---------------------------------------------------------------- answers

_QUOTES = "'`"


def _clean_item(text: str) -> str:
    """Strips whitespace and surrounding single quotes/backticks (copied from raw SQL results such as
    `[('Vienna',)]`). Double quotes stay: gold answers may contain them (e.g. a quoted title)."""
    prev = None
    while prev != text:
        prev = text
        text = text.strip()
        if len(text) >= 2 and text[0] == text[-1] and text[0] in _QUOTES:
            text = text[1:-1]
    return text


_PLAIN_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)")


def _canonical_number(text: str) -> str:
    """'12' -> '12.0', '3.50' -> '3.5' (the labels' float style); other text unchanged."""
    if _PLAIN_NUMBER.fullmatch(text) and len(text) <= 15:
        value = float(text)
        if math.isfinite(value):
            return repr(value)
    return text


def answer_items(answer: str) -> list[str]:
    """The answer as a list of strings, read the way the scorer reads it (a list literal, else one item)."""
    text = answer.strip()
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return [answer]
    if isinstance(value, (list, tuple, set)):
        return [str(v) for v in value]
    return [str(value)]


def normalize_answer(answer: str | None, mode: str) -> str | None:
    """none: unchanged. strip: each item loses surrounding whitespace, single quotes and backticks.
    numeric: strip, then plain numbers in the labels' float style ('12' -> '12.0'). The result is a
    JSON list of strings, which the scorer reads as the same list."""
    if answer is None or mode == "none":
        return answer
    if mode not in KNOBS["answer_normalization"].choices:
        raise ValueError(f"answer_normalization {mode!r} is not one of {KNOBS['answer_normalization'].choices}")
    items = [_clean_item(x) for x in answer_items(answer)]
    if mode == "numeric":
        items = [_canonical_number(x) for x in items]
    return json.dumps(items, ensure_ascii=False)


def is_empty_answer(answer: str | None) -> bool:
    """True for a missing answer, blank text, or an answer list whose items are all blank."""
    if answer is None or not answer.strip():
        return True
    return all(not _clean_item(x).strip('"') for x in answer_items(answer))
