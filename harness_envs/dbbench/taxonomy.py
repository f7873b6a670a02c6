"""Failure taxonomy: one failure mode per finished DBBench episode, by ordered rules.

`assign(turns, outcome)` is a pure function of the turn records and the episode outcome. The first
rule that holds names the mode (docs/dbbench.md, "Failure taxonomy", is the reference text):

 1. success                     the evaluator accepted the episode (INSERT/UPDATE: the final table
                                hash matches, whatever ended the episode, as published)
 2. context_overflow            the engine aborted the episode for its token budget
    policy_error                (same rule) aborted because the policy gave it no reply (e.g. its
                                HTTP endpoint failed after retries)
 3. env_error                   any other abort, or the environment itself failed
 4. db_size_limit               a statement grew the episode database past the backend's
                                max_db_mb; the episode ended there
 5. malformed_action            ended on a reply that could not be parsed
 6. sql_error_loop              >= 3 consecutive failed statements, or the last statement failed
 7. turn_limit                  ended because the statement budget was spent
 8. answer_format               SELECT family: the answer is right once stripped of surrounding
                                whitespace and quotes (answer_normalization=strip)
 9. answered_without_querying   answered without any successful statement
10. truncated_observation       an observation was cut at obs_max_chars ("[TRUNCATED]")
11. no_modification             INSERT/UPDATE: the table hash never changed
12. wrong_modification          INSERT/UPDATE: the table changed, but not to the gold state
13. wrong_answer                SELECT family: the answer is wrong
"""
from __future__ import annotations

import dataclasses
from typing import Iterable

from harness_envs.base import ABORT_CONTEXT_OVERFLOW, ABORT_POLICY_ERROR, TurnRecord

FAILURE_MODES = (
    "success",
    "malformed_action",
    "sql_error_loop",
    "turn_limit",
    "answer_format",
    "answered_without_querying",
    "truncated_observation",
    "no_modification",
    "wrong_modification",
    "wrong_answer",
    "context_overflow",
    "policy_error",
    "env_error",
    "db_size_limit",
)


# The record of one reply lives here, not in env.py, because these rules read its fields and the
# episode imports the rules.
@dataclasses.dataclass
class ActionRecord(TurnRecord):
    """What one model reply did. `kind` is the parsed action kind (`sql`, `answer`, `malformed`).

    `ok` is None when nothing was executed; `feedback` names a harness message sent instead of an
    observation (`format_retry`, `verify`).
    """

    reply: str
    observation: str | None = None
    sql: str | None = None
    ok: bool | None = None
    error: str | None = None
    obs_chars: int = 0
    truncated: bool = False
    feedback: str | None = None


# How an episode ended (`outcome["status"]`).
STATUSES = ("answered", "malformed", "turn_limit", "aborted", "env_error", "db_size_limit")
SQL_ERROR_RUN = 3


def max_error_run(turns: Iterable[ActionRecord]) -> int:
    """The longest run of consecutive failed statements (replies that ran no statement don't break it)."""
    best = run = 0
    for t in turns:
        if t.kind != "sql" or t.ok is None:
            continue
        run = run + 1 if not t.ok else 0
        best = max(best, run)
    return best


def last_statement_failed(turns: Iterable[ActionRecord]) -> bool:
    executed = [t for t in turns if t.kind == "sql" and t.ok is not None]
    return bool(executed) and not executed[-1].ok


def any_successful_statement(turns: Iterable[ActionRecord]) -> bool:
    return any(t.kind == "sql" and t.ok for t in turns)


def assign(turns: list[ActionRecord], outcome: dict) -> str:
    """outcome: `status` (one of STATUSES), `abort_reason`, `success`, `is_modification`,
    `table_changed` (bool or None), `correct_if_normalized` (bool)."""
    status = outcome["status"]
    if status not in STATUSES:
        raise ValueError(f"episode status {status!r} is not one of {STATUSES}")
    if outcome["success"] and status != "env_error":
        return "success"
    if status == "aborted":
        aborts = {ABORT_CONTEXT_OVERFLOW: "context_overflow", ABORT_POLICY_ERROR: "policy_error"}
        return aborts.get(outcome.get("abort_reason"), "env_error")
    if status in ("env_error", "db_size_limit"):
        return status
    if status == "malformed":
        return "malformed_action"
    if max_error_run(turns) >= SQL_ERROR_RUN or last_statement_failed(turns):
        return "sql_error_loop"
    if status == "turn_limit":
        return "turn_limit"
    if not outcome["is_modification"] and outcome.get("correct_if_normalized"):
        return "answer_format"
    if not any_successful_statement(turns):
        return "answered_without_querying"
    if any(t.truncated for t in turns):
        return "truncated_observation"
    if outcome["is_modification"]:
        return "no_modification" if outcome.get("table_changed") is False else "wrong_modification"
    return "wrong_answer"
