"""Scripted DBBench agents, as ChatPolicies (`chat(contexts, sampling, infos) -> list[str]`).

`OracleAgent` replays the gold: SELECT family, it answers the gold label; INSERT/UPDATE, it runs the
gold statement, then answers. If a harness does not accept its answer (a verification prompt), it
checks the table with one query and answers again.

`NoisyAgent(noise={slip: probability})` solves like the oracle, except for the slips drawn for the
episode. Each slip is built so that the base harness fails it with one failure mode and exactly one
sibling direction of the starter pool repairs it (`SLIPS`; docs/dbbench.md, "Failure taxonomy").

Agents read the gold from `info["task"]` and keep per-episode state under `info["episode_id"]`. The
slips of an episode depend only on (seed, task id, sample index), never on the harness, so the same
agent behaves the same way under every harness.
"""
from __future__ import annotations

import dataclasses
import json
import re
from typing import Iterable

from harness_envs.dbbench import evaluator
from harness_envs.dbbench import harness as dbbench_harness
from harness_envs.dbbench.data import DBTask, is_modification
from harness_envs.plan_agent import Plan, PlanAgent, Slip, SlipDrawingAgent


SLIPS: dict[str, Slip] = {
    "format_slip": Slip("malformed_action", "lenient_parse",
                        "every action of the episode is mis-formatted: no 'Action:' line, ```SQL fence, or a "
                        "one-line fence; answers as a bare 'Final Answer:' first line"),
    "skip_schema": Slip("sql_error_loop", "schema_reminder",
                        "queries made-up snake_case column names and keeps doing so until an observation "
                        "shows the table schema; gives up with a wrong answer after 3 errors"),
    "premature_answer": Slip("answered_without_querying", "verify_answer",
                             "answers a wrong guess before running any statement; if asked to verify, "
                             "solves the task"),
    "long_output": Slip("truncated_observation", "paged_results",
                        "SELECT family: dumps the whole table with an end marker row and answers only once "
                        "the marker is visible (follows page notes), else guesses wrong"),
    "answer_format": Slip("answer_format", "normalize_answer",
                          "SELECT family: wraps each answer item in spaces and single quotes"),
    "turn_waste": Slip("turn_limit", "more_rounds",
                       "repeats a COUNT(*) query 16 times before solving"),
}

END_MARKER = "END_OF_RESULT"
WASTE_STATEMENTS = 16  # one more than the published 15-statement budget
SCHEMA_GUESSES = 3
_FORMAT_VARIANTS = ("no_action_line", "upper_fence", "inline_fence")


def _q(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _sql_str(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "''") + "'"


@dataclasses.dataclass(frozen=True)
class Formatter:
    """Renders actions in the base protocol, or with one persistent format slip."""

    slip: str | None = None

    def operation(self, sql: str) -> str:
        if self.slip == "no_action_line":
            return f"I will run this statement.\n```sql\n{sql}\n```"
        if self.slip == "upper_fence":
            return f"Action: Operation\n```SQL\n{sql}\n```"
        if self.slip == "inline_fence":
            return f"Action: Operation\n```sql {sql} ```"
        return f"Action: Operation\n```sql\n{sql}\n```"

    def answer(self, items: list[str]) -> str:
        payload = json.dumps(list(items), ensure_ascii=False)
        if self.slip is not None:
            return f"Final Answer: {payload}"
        return f"Action: Answer\nFinal Answer: {payload}"


def wrong_items(task: DBTask) -> list[str]:
    """An answer the evaluator rejects for this task."""
    for guess in ("unknown", "no answer found", "0", "-1"):
        if not evaluator.is_correct(task, json.dumps([guess]), None):
            return [guess]
    raise AssertionError(f"{task.task_id}: every fallback guess is correct")  # not reachable with DBBench labels


def count_sql(task: DBTask) -> str:
    return f"SELECT COUNT(*) FROM {_q(task.table.name)}"


def made_up_column(task: DBTask, attempt: int) -> str:
    """A plausible column name that the table does not have (names compare case-insensitively).
    It is a plain identifier, used unquoted, so every engine reports an unknown column."""
    columns = task.table.columns
    real = {c.lower() for c in columns}
    base = re.sub(r"[^a-z0-9]+", "_", columns[attempt % len(columns)].lower()).strip("_")
    guess = f"{base}_value" if re.match(r"[a-z]", base) else f"col_{base}_value"
    while guess.lower() in real:
        guess += "_x"
    return guess


def big_dump_sql(task: DBTask) -> str:
    pad = ", NULL" * (len(task.table.columns) - 1)
    return f"SELECT * FROM {_q(task.table.name)} UNION ALL SELECT {_sql_str(END_MARKER)}{pad}"


def padded(items: Iterable[str]) -> list[str]:
    return [f"  '{x}' " for x in items]




def _solve(task: DBTask, fmt: Formatter, answer: list[str]) -> Plan:
    """The oracle's moves from here on; never ends (answers again if the harness keeps asking)."""
    if is_modification(task):
        yield fmt.operation(task.label[0].strip())
    while True:
        yield fmt.answer(answer)
        # Still going: the harness asked to verify. Check the table, then answer again.
        yield fmt.operation(count_sql(task))


def oracle_plan(task: DBTask, fmt: Formatter | None = None) -> Plan:
    answer = ["done"] if is_modification(task) else list(task.label)
    return _solve(task, fmt or Formatter(), answer)


def noisy_plan(task: DBTask, slips: frozenset[str], fmt: Formatter) -> Plan:
    modification = is_modification(task)
    wrong = wrong_items(task)
    if "premature_answer" in slips:
        yield fmt.answer(wrong)
    if "skip_schema" in slips:
        attempt = 0
        obs = ""
        while dbbench_harness.SCHEMA_REMINDER_LEAD not in obs:
            if attempt and attempt % SCHEMA_GUESSES == 0:
                obs = yield fmt.answer(wrong)  # gives up; goes on guessing if the episode continues
                continue
            col = made_up_column(task, attempt)
            attempt += 1
            obs = yield fmt.operation(f"SELECT {col} FROM {_q(task.table.name)}")
    if "turn_waste" in slips:
        for _ in range(WASTE_STATEMENTS):
            yield fmt.operation(count_sql(task))
    if "long_output" in slips and not modification:
        sql = big_dump_sql(task)
        obs = yield fmt.operation(sql)
        while END_MARKER not in obs:
            if dbbench_harness.PAGE_MORE in obs:
                obs = yield fmt.operation(sql)
            else:
                obs = yield fmt.answer(wrong)
                break
    answer = ["done"] if modification else list(task.label)
    if "answer_format" in slips and not modification:
        answer = padded(answer)
    yield from _solve(task, fmt, answer)


class OracleAgent(PlanAgent):
    """Answers with the gold label, or runs the gold statement then answers."""

    def _new_plan(self, info: dict) -> Plan:
        return oracle_plan(info["task"])


class NoisyAgent(SlipDrawingAgent):
    """The oracle with slips: `noise` maps slip names of `SLIPS` to probabilities per episode."""

    SLIPS = SLIPS

    def _new_plan(self, info: dict) -> Plan:
        rng = self.episode_random(info)
        slips = self.draw_slips(rng)
        variant = rng.choice(_FORMAT_VARIANTS) if "format_slip" in slips else None  # the stream's next draw
        return noisy_plan(info["task"], slips, Formatter(variant))
