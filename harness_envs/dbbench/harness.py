"""The DBBench text protocol (AgentBench v0.2, "Action: Operation / Action: Answer") and its knob variants.

Base behaviour, exactly as published (docs/dbbench.md, "Harness knobs", pins each detail):
- history: user = instruction, assistant = "Ok.", user = question + "\\n" + table description;
- the action is `re.search(r"Action: (.*?)\\n")`: it needs a trailing newline, and only the exact text
  `Operation` means a statement; the first ```` ```sql\\n...\\n``` ```` block is stripped and its
  newlines become spaces; no block: the reply is malformed;
- any other reply is an answer if `re.search(r"\\nFinal Answer:(.*)")` matches (a newline must come
  before it; the raw rest of the line is the answer), else malformed;
- the observation is the raw result text, cut at 800 characters + "[TRUNCATED]".

Sibling variants (`lenient` parsing, instruction variants, schema reminders, paging notes,
verification and format-feedback prompts) are pure functions of the spec and the text.
"""
from __future__ import annotations

import dataclasses
import re

from harness_envs.harness import HarnessSpec

ACK = "Ok."

_INSTRUCTION_CORE = """\
You will work with a MySQL database through SQL to answer a question about a table, or to change the table as the question asks.
Think the problem through and explain your reasoning as you go. In every round, either run one SQL statement or give your final answer.

To run SQL, write exactly:
Action: Operation
```sql
SELECT * FROM table WHERE condition;
```
The code block holds one SQL statement, written on one line, with no comments. Only the first SQL code block of your reply is executed.

When you are done, write exactly:
Action: Answer
Final Answer: ["ANSWER1", "ANSWER2", ...]
Answer only once you are sure: the answer must match the correct one exactly. If the question asks you to modify the table, the answer field can be anything once the modification is done.
A reply that follows neither format fails the task at once. You will receive the raw MySQL result and must read it yourself."""

_SCHEMA_FIRST = """
Before writing the query that answers, look at the table (for example `SELECT * FROM table LIMIT 3`) so that you use its exact column names and value spellings; quote column names with backticks."""

_INSTRUCTION_CONCISE = """\
Answer a question about a MySQL table (or modify the table as asked) with SQL, one statement per round.
Run SQL with:
Action: Operation
```sql
<one SQL statement on one line>
```
Finish with:
Action: Answer
Final Answer: ["ANSWER1", ...]
For modifications the answer can be anything. Any other reply fails. You receive raw MySQL results."""

SCHEMA_REMINDER_LEAD = "Reminder: the table"
VERIFY_PROMPT = (
    "Before this answer is accepted: you have not yet run a successful SQL statement in this task, or your "
    "answer is empty. Check the answer against the database with a query, then give your final answer again.")
FORMAT_FEEDBACK = (
    "Your reply could not be parsed ({error}). Reply in one of the two formats:\n"
    "Action: Operation\n```sql\n<one SQL statement>\n```\n"
    "or\n"
    "Action: Answer\nFinal Answer: [\"ANSWER1\", ...]")
PAGE_MORE = "send the same statement again for the next rows"
PAGE_END = "end of result"


@dataclasses.dataclass(frozen=True)
class Action:
    """A parsed reply. kind: `sql` (with `sql`), `answer` (with the raw `answer` string) or
    `malformed` (with `error`, the reason)."""

    kind: str
    sql: str | None = None
    answer: str | None = None
    error: str | None = None


# ---------------------------------------------------------------- instruction and first messages

def render_instruction(spec: HarnessSpec) -> str:
    variant = spec.knob("instruction")
    if variant == "agentbench":
        text = _INSTRUCTION_CORE
    elif variant == "schema_first":
        text = _INSTRUCTION_CORE + _SCHEMA_FIRST
    elif variant == "concise":
        text = _INSTRUCTION_CONCISE
    else:
        raise ValueError(f"instruction variant {variant!r} has no DBBench text; add it to render_instruction")
    hint = spec.knob("hint")
    if hint:
        text += "\nHint: " + hint
    return text


def task_prompt(question: str, add_description: str) -> str:
    return question + "\n" + add_description


def initial_messages(spec: HarnessSpec, question: str, add_description: str) -> list[dict]:
    return [
        {"role": "user", "content": render_instruction(spec)},
        {"role": "assistant", "content": ACK},
        {"role": "user", "content": task_prompt(question, add_description)},
    ]


# ---------------------------------------------------------------- parsing

_STRICT_ACTION = re.compile(r"Action: (.*?)\n")
_STRICT_SQL = re.compile(r"```sql\n([\s\S]*?)\n```")
_STRICT_ANSWER = re.compile(r"\nFinal Answer:(.*)")


def parse_strict(text: str) -> Action:
    """The published parser, bit for bit (see the module docstring)."""
    action = _STRICT_ACTION.search(text)
    if action and action.group(1) == "Operation":
        block = _STRICT_SQL.search(text)
        if not block:
            return Action("malformed", error="'Action: Operation' without a ```sql code block")
        return Action("sql", sql=block.group(1).strip().replace("\n", " "))
    answer = _STRICT_ANSWER.search(text)
    if answer:
        return Action("answer", answer=answer.group(1))
    if action:
        return Action("malformed", error=f"'Action: {action.group(1)[:40]}' without a 'Final Answer:' line")
    return Action("malformed", error="no 'Action: Operation' line and no 'Final Answer:' line")


_LENIENT_ACTION = re.compile(r"^[\s>*#_`-]*Action\s*\**\s*[:：]\s*\**\s*(Operation|Answer)\b", re.I | re.M)
_FENCE = re.compile(r"```(.*?)```", re.S)
_FENCE_WORD = re.compile(r"[ \t]*([A-Za-z]+)")
_SQL_TAGS = {"sql", "mysql", "sqlite", "mariadb", "postgresql", "postgres", "tsql", "plsql"}
_SQL_START = re.compile(r"(SELECT|INSERT|UPDATE|DELETE|WITH|SHOW|DESCRIBE|DESC|REPLACE)\b", re.I)
_LENIENT_ANSWER = re.compile(r"Final\s*Answer\s*\**\s*[:：]\**(.*)", re.I)


def _lenient_sql(text: str, action: re.Match | None) -> str | None:
    for block in _FENCE.finditer(text):
        inner = block.group(1)
        word = _FENCE_WORD.match(inner)
        if word and word.group(1).lower() in _SQL_TAGS:
            inner = inner[word.end():]
        elif word and inner[word.end():word.end() + 1] in ("\n", "") and not _SQL_START.fullmatch(word.group(1)):
            continue  # a block in another language (```python, ```json ...)
        sql = inner.strip().replace("\n", " ")
        if sql:
            return sql
    if action is not None and action.group(1).lower() == "operation":
        # An unfenced statement right after the action line, up to a blank line.
        rest = text[action.end():].lstrip()
        if _SQL_START.match(rest):
            return rest.split("\n\n", 1)[0].strip().replace("\n", " ")
    return None


def _lenient_answer(text: str) -> str | None:
    match = _LENIENT_ANSWER.search(text)
    if not match:
        return None
    answer = match.group(1)
    if answer.strip():
        return answer
    for line in text[match.end():].split("\n"):  # "Final Answer:" with the list on the next line
        if line.strip():
            return line
    return answer


def parse_lenient(text: str) -> Action:
    """Accepts what strict parsing accepts, plus common slips: a missing or decorated `Action:` line,
    ```SQL/```mysql/unlabelled fences, a one-line fence, unfenced SQL after `Action: Operation`,
    `Final Answer` anywhere (any case, list on the next line). With no action line and both a statement
    and an answer, the statement runs (the model has not seen its result yet)."""
    strict = parse_strict(text)
    if strict.kind != "malformed":
        return strict
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    action = _LENIENT_ACTION.search(text)
    sql = _lenient_sql(text, action)
    answer = _lenient_answer(text)
    wants = action.group(1).lower() if action else None
    if wants == "answer":
        if answer is not None:
            return Action("answer", answer=answer)
        return Action("malformed", error="'Action: Answer' without a 'Final Answer:' line")
    if sql is not None:
        return Action("sql", sql=sql)
    if answer is not None:
        return Action("answer", answer=answer)
    return Action("malformed", error=strict.error)


def find_answer(text: str, spec: HarnessSpec) -> str | None:
    """The final answer anywhere in a reply, even one that is a statement (used once the statement
    budget is spent, where the published loop reads the answer from whatever the last reply was)."""
    if spec.knob("parse_mode") == "lenient":
        return _lenient_answer(text.replace("\r\n", "\n").replace("\r", "\n"))
    match = _STRICT_ANSWER.search(text)
    return match.group(1) if match else None


def parse_action(text: str, spec: HarnessSpec) -> Action:
    if not isinstance(text, str):
        return Action("malformed", error=f"reply is {type(text).__name__}, not text")
    mode = spec.knob("parse_mode")
    return parse_lenient(text) if mode == "lenient" else parse_strict(text)


# ---------------------------------------------------------------- observations and prompts

def schema_reminder(table_name: str, columns: tuple[str, ...]) -> str:
    cols = ", ".join(f"`{c}`" for c in columns)
    return f"{SCHEMA_REMINDER_LEAD} `{table_name}` has the columns: {cols}."


def page_note(first: int, last: int, total: int, more: bool) -> str:
    return f"[rows {first}-{last} of {total}; {PAGE_MORE if more else PAGE_END}]"
