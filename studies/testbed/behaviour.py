"""What an agent did in its episodes: action kinds, SQL error classes, failure modes, recovery.

Pure functions over episode records (`hsjax.modes.evaluate` and the training loop's `episodes/` rows:
`turns` of {kind, sql, ok, error, observation}, and `failure_mode`). The testbed report sets the
policy's behaviour under the base harness beside what each sibling harness induced during rescue.
"""
from __future__ import annotations

import collections
import re
from typing import Sequence

ACTION_KINDS = ("inspect", "select", "modify", "answer", "malformed", "other")

_STRINGS = re.compile(r"'(?:[^'\\]|\\.|'')*'|\"(?:[^\"\\]|\\.)*\"")
_FILTERED = re.compile(r"\bWHERE\b|\bORDER\s+BY\b|\bGROUP\s+BY\b|\bHAVING\b|"
                       r"\b(?:COUNT|SUM|MIN|MAX|AVG|TOTAL|GROUP_CONCAT)\s*\(", re.I)
_MODIFY = {"INSERT", "UPDATE", "DELETE", "REPLACE", "CREATE", "DROP", "ALTER", "TRUNCATE", "RENAME"}
_META = {"DESCRIBE", "DESC", "SHOW", "PRAGMA", "EXPLAIN"}


def action_kind(turn: dict) -> str:
    """One policy action: `inspect` (DESCRIBE/SHOW, or a SELECT ... FROM with no WHERE, aggregate,
    ORDER/GROUP BY: reading the table as it is), `select`, `modify`, `answer`, `malformed`, or
    `other` (a statement of no such kind)."""
    kind = turn.get("kind")
    if kind in ("answer", "malformed"):
        return kind
    if kind != "sql":
        return "other"
    sql = _STRINGS.sub("''", (turn.get("sql") or "").strip())
    first = (re.match(r"\s*\(*\s*(\w+)", sql) or [None, ""])[1].upper()
    if first in _META:
        return "inspect"
    if first in _MODIFY:
        return "modify"
    if first in ("SELECT", "WITH"):
        return "select" if _FILTERED.search(sql) or not re.search(r"\bFROM\b", sql, re.I) else "inspect"
    return "other"


# MySQL error numbers (the SQLite backend reports its errors in MySQL's shape), then plain words.
_ERROR_CLASSES = (
    ("unknown_column", r"\b1054\b|unknown column|no such column|has no column"),
    ("unknown_table", r"\b1146\b|doesn't exist|no such table"),
    ("syntax", r"\b1064\b|syntax"),
    ("column_count", r"\b1136\b|column count"),
    ("unknown_function", r"\b1305\b|no such function"),
    ("timeout", r"\b3024\b|interrupted|timeout"),
    ("denied", r"\b1227\b|access denied|not authorized"),
)


def error_class(text: str | None) -> str:
    for name, pattern in _ERROR_CLASSES:
        if re.search(pattern, text or "", re.I):
            return name
    return "other"


def _fractions(counter: collections.Counter) -> dict[str, float]:
    total = sum(counter.values())
    return {k: v / total for k, v in counter.most_common()} if total else {}


def behaviour(records: Sequence[dict]) -> dict:
    """Action kinds over all turns; error classes over failed statements; failure modes over
    episodes; `recovered_after_error`: the share of episodes where a failed statement is followed by
    a successful one (`recovery_rate`: the same over episodes with a failed statement)."""
    actions, errors, modes = collections.Counter(), collections.Counter(), collections.Counter()
    with_error = recovered = 0
    for r in records:
        modes[r.get("failure_mode") or "unknown"] += 1
        failed = fixed = False
        for t in r.get("turns") or []:
            actions[action_kind(t)] += 1
            if t.get("kind") == "sql" and t.get("ok") is False:
                errors[error_class(t.get("error") or t.get("observation"))] += 1
                failed = True
            elif t.get("kind") == "sql" and t.get("ok") and failed:
                fixed = True
        with_error += failed
        recovered += fixed
    n = len(records)
    return {"episodes": n, "actions": _fractions(actions), "errors": _fractions(errors),
            "failure_modes": _fractions(modes), "failed_statements": sum(errors.values()),
            "recovered_after_error": recovered / n if n else 0.0,
            "recovery_rate": recovered / with_error if with_error else None}
