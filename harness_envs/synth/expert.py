"""The scripted expert of the synthetic testbed: a ChatPolicy whose trajectories SFT imitates.

Per episode (the task is `info["task"]`, a `SynthTask`):
    turn 1: run the gold statement;
    turn 2: answer with what the observation showed (SELECT family: the cells of the result, parsed
            from the observation text) or `["done"]` (INSERT/UPDATE).
If the harness keeps the episode going after an answer (a verification prompt), it checks with one
query (the gold SELECT again, or a COUNT(*) after a modification) and answers again.

Replies carry no reasoning text, so a tiny policy can learn them. A *style* per task type sets how
the expert acts (docs/testbed.md, "The warm-start regime"):
    protocol          the base protocol; succeeds under the base harness and every starter sibling
    format_slip       the same moves with a format slip (```SQL fence, bare `Final Answer:` line) that
                      the base parser rejects and `lenient_parse` accepts
    premature_answer  first answers a wrong guess without querying (fails under the base harness);
                      `verify_answer` asks it to check, and then it solves the task
    schema_recovery   first runs the gold statement with one column misnamed (`stock` -> `stock_value`);
                      after the bare error it gives up with a wrong answer, after an error that ends
                      with the schema (`schema_reminder`) it runs the gold statement and solves the
                      task. Unlike the two styles above, the successful trajectory is valid under
                      the base harness move for move: only the observation of the error differs.
The names regime (harness_envs/synth/names.py) adds two styles that act differently only when the
task hides its table name:
    show_tables       runs `SHOW TABLES` first, then the gold statement (valid under every harness);
                      with several tables (testbed v4) it runs `DESCRIBE` on each listed table in
                      turn until the headers are the task's, then the gold statement
    guess_table       runs the gold statement on a guessed table `data`; after the bare error it gives
                      up, after an error that names the table (`schema_reminder`) it solves the task
"""
from __future__ import annotations

import ast
import collections
import json
import re

from harness_envs.dbbench.agents import Formatter, count_sql, wrong_items
from harness_envs.dbbench.data import DBTask, is_modification
from harness_envs.dbbench.harness import SCHEMA_REMINDER_LEAD
from harness_envs.harness import TRUNCATION_MARK
from harness_envs.plan_agent import MAX_TRACKED_EPISODES, Plan

STYLES = ("protocol", "format_slip", "premature_answer", "schema_recovery", "show_tables", "guess_table")
FORMAT_SLIP_VARIANTS = ("upper_fence", "no_action_line", "inline_fence")
# The sibling of the starter pool under which each style succeeds.
RESCUER = {"protocol": "base", "format_slip": "lenient_parse", "premature_answer": "verify_answer",
           "schema_recovery": "schema_reminder", "show_tables": "tables_first",
           "guess_table": "schema_reminder"}
# Styles that give up after a bare error: their episode fails under any harness but the rescuer.
GIVES_UP_WITHOUT_REMINDER = ("schema_recovery", "guess_table")
GUESSED_TABLE = "data"
DESCRIBE_CELLS = 6  # a DESCRIBE row: Field, Type, Null, Key, Default, Extra
MODIFICATION_ANSWER = ["done"]


def gold_sql(task: DBTask) -> str:
    """The task's gold statement: `task.gold_sql` for synthetic tasks, the label for DBBench
    modifications. DBBench SELECT tasks have no gold query; the expert cannot solve them."""
    sql = getattr(task, "gold_sql", "") or (task.label[0] if is_modification(task) else "")
    if not sql:
        raise ValueError(f"task {task.task_id} has no gold SQL; the expert runs synthetic tasks "
                         "(harness_envs.synth.tasks) or DBBench INSERT/UPDATE tasks")
    return sql.strip()


def misnamed_sql(task: DBTask) -> str:
    """The gold statement with the first column it names replaced by a made-up `<column>_value`,
    which every engine rejects as an unknown column."""
    sql = gold_sql(task)
    hits = [(m.start(), m.end(), col) for col in task.table.columns
            for m in [re.search(rf"(?<![\w`']){re.escape(col)}(?![\w`'])", sql)] if m]
    if not hits:
        raise ValueError(f"{task.task_id}: the gold statement names no column of {task.table.name}: {sql}")
    start, end, col = min(hits)
    return sql[:start] + f"{col}_value" + sql[end:]


def guessed_sql(task: DBTask) -> str:
    """The gold statement run on a table called `GUESSED_TABLE`, which no task has."""
    sql = gold_sql(task)
    name = task.table.name
    if name == GUESSED_TABLE:
        raise ValueError(f"{task.task_id}: the table is called {GUESSED_TABLE!r}, the expert's guess")
    guessed, hits = re.subn(rf"(?<![\w`']){re.escape(name)}(?![\w`'])", GUESSED_TABLE, sql)
    if not hits:
        raise ValueError(f"{task.task_id}: the gold statement does not name the table {name}: {sql}")
    return guessed


def acts_on_hidden_name(style: str, task: DBTask) -> bool:
    """Whether `style` plays `task` differently from the protocol (a hidden table name)."""
    return style in ("show_tables", "guess_table") and bool(getattr(task, "hidden", False))


def observed_items(observation: str) -> list[str] | None:
    """The cells of a result as the observation shows them (`[('a',), (3,)]` -> ['a', '3']); None
    when the text is not a whole result (an error, a truncated or paged observation)."""
    text = observation.strip()
    if TRUNCATION_MARK in text:
        return None
    try:
        rows = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None
    if not isinstance(rows, list) or not all(isinstance(r, tuple) for r in rows):
        return None
    return [str(cell) for row in rows for cell in row]


def expert_plan(task: DBTask, style: str = "protocol", slip_variant: str = "upper_fence") -> Plan:
    """The expert's moves for one episode: a generator fed each observation, yielding replies."""
    if style not in STYLES:
        raise ValueError(f"unknown expert style {style!r}; choose one of {STYLES}")
    if slip_variant not in FORMAT_SLIP_VARIANTS:
        raise ValueError(f"unknown format slip {slip_variant!r}; choose one of {FORMAT_SLIP_VARIANTS}")
    fmt = Formatter(slip_variant if style == "format_slip" else None)
    modification = is_modification(task)
    sql = gold_sql(task)
    if style == "premature_answer":
        yield fmt.answer(MODIFICATION_ANSWER if modification else wrong_items(task))
    if acts_on_hidden_name(style, task) and style == "show_tables":
        obs = yield fmt.operation("SHOW TABLES")  # the observation lists the table; the gold SQL names it
        if getattr(task, "extra_tables", ()):
            # Several tables (testbed v4): read the headers of each listed one until they are the
            # ones the description gives.
            for name in observed_items(obs) or sorted(t.name for t in (task.table, *task.extra_tables)):
                obs = yield fmt.operation(f"DESCRIBE {name}")
                if (observed_items(obs) or [])[::DESCRIBE_CELLS] == list(task.table.columns):
                    break
    if acts_on_hidden_name(style, task) and style == "guess_table":
        obs = yield fmt.operation(guessed_sql(task))
        while SCHEMA_REMINDER_LEAD not in obs:
            obs = yield fmt.answer(wrong_items(task))
    if style == "schema_recovery":
        obs = yield fmt.operation(misnamed_sql(task))
        while SCHEMA_REMINDER_LEAD not in obs:  # a bare error: give up (and keep giving up if asked)
            obs = yield fmt.answer(wrong_items(task))
    obs = yield fmt.operation(sql)
    check = count_sql(task) if modification else sql  # never re-run a modification
    while True:
        if modification:
            items = MODIFICATION_ANSWER
        else:
            # An unreadable observation cannot happen with the testbed's small results; the gold
            # label keeps the expert an expert if it ever does.
            items = observed_items(obs) or list(task.label)
        obs = yield fmt.answer(items)
        obs = yield fmt.operation(check)  # the harness asked to verify


class ScriptedExpert:
    """ChatPolicy: `chat(contexts, sampling, infos) -> replies`, one plan per `info["episode_id"]`.

    `styles` maps task types to a style of `STYLES`; other types get `default_style`.
    """

    def __init__(self, styles: dict[str, str] | None = None, default_style: str = "protocol",
                 slip_variant: str = "upper_fence"):
        self.styles = dict(styles or {})
        for t, style in [*self.styles.items(), ("default", default_style)]:
            if style not in STYLES:
                raise ValueError(f"expert style {style!r} for {t!r} is not one of {STYLES}")
        if slip_variant not in FORMAT_SLIP_VARIANTS:
            raise ValueError(f"unknown format slip {slip_variant!r}; choose one of {FORMAT_SLIP_VARIANTS}")
        self.default_style = default_style
        self.slip_variant = slip_variant
        self._plans: collections.OrderedDict[str, Plan] = collections.OrderedDict()

    def style_for(self, task_type: str) -> str:
        return self.styles.get(task_type, self.default_style)

    def chat(self, contexts: list[list[dict]], sampling=None, infos: list[dict] | None = None) -> list[str]:
        if infos is None or len(infos) != len(contexts):
            raise ValueError(f"ScriptedExpert.chat needs one info dict (episode.info) per context; got "
                             f"{0 if infos is None else len(infos)} for {len(contexts)} contexts")
        return [self._reply(ctx, info) for ctx, info in zip(contexts, infos)]

    def _reply(self, context: list[dict], info: dict) -> str:
        if "task" not in info or "episode_id" not in info:
            raise KeyError(f"ScriptedExpert reads info['task'] and info['episode_id']; got keys {sorted(info)}")
        key = info["episode_id"]
        plan = self._plans.get(key)
        if plan is None:
            task = info["task"]
            plan = self._plans[key] = expert_plan(task, self.style_for(task.type), self.slip_variant)
            while len(self._plans) > MAX_TRACKED_EPISODES:
                self._plans.popitem(last=False)
            return next(plan)
        last = context[-1]["content"] if context and context[-1].get("role") == "user" else ""
        return plan.send(last)


def answer_text(items: list[str]) -> str:
    """The base-protocol answer reply for `items` (for tests and docs)."""
    return "Action: Answer\nFinal Answer: " + json.dumps(list(items), ensure_ascii=False)
