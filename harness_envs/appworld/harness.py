"""The AppWorld code-agent protocol (ReAct over a Python REPL) and its knob variants.

Base behaviour, as AppWorld's published ReAct agent works (in this project's words):
- the opening context is an instruction that explains the REPL and the `apis` object, a worked
  demonstration of one task (few-shot), and the task: who the user is and what they ask;
- each reply is one code cell: the first ```` ```python ```` (or untagged) fenced block, else the
  whole reply; the cell runs in a REPL whose variables persist;
- the observation is the cell's output, or "Execution successful." when it printed nothing, or
  "Execution failed. Traceback:" and the traceback of the agent's code;
- the episode ends when the code calls `apis.supervisor.complete_task(...)`, or when the step
  budget (`max_rounds` cells) is spent.

Sibling variants are pure functions of the spec and the text: lenient code extraction, API lists or
docs appended to error observations, a credentials reminder after an auth failure, a traceback
summary, and a confirmation step before `complete_task` takes effect (answer verification, a review
of the changes made).
"""
from __future__ import annotations

import json
import re

from harness_envs.harness import HarnessSpec

SUCCESS_OUTPUT = "Execution successful."
FAILED_LEAD = "Execution failed. Traceback:\n"
_TB_HEADER = "Traceback (most recent call last):\n"
NO_CODE = "No code available to execute."

_INSTRUCTION = """\
You are an AI assistant who carries out my day-to-day tasks on my behalf, by yourself, using the apps on my phone (contacts, notes, a wallet, mail, and so on) through their APIs.
You work in a Python REPL: in every turn, write one block of Python code; I run it and show you what it printed (or the error it raised), and you write the next block based on that, until the task is done.

How to work:
- Call APIs as `apis.<app_name>.<api_name>(...)` with keyword arguments, and print what you need to see.
- You don't know the APIs in advance: look them up with `apis.api_docs.show_app_descriptions()`, `apis.api_docs.show_api_descriptions(app_name=...)` and `apis.api_docs.show_api_doc(app_name=..., api_name=...)`.
- My profile and my password for each app come from `apis.supervisor.show_profile()` and `apis.supervisor.show_account_passwords()`. Most apps need you to log in with `apis.<app>.login(username=..., password=...)` and pass the `access_token` it returns to their other APIs.
- Results come in pages: go through every page when you need all of them.
- Variables persist between turns. Write small steps and look at the results before acting on them.
- Change only what the task asks for.
- When the task is done, call `apis.supervisor.complete_task(answer=...)` with the answer if the task asks a question, else `apis.supervisor.complete_task()`. If the task cannot be done, call `apis.supervisor.complete_task(status="fail")`.
Write your code in a ```python fenced block."""

_CONCISE = """\
Do my task by writing Python code, one ```python block per turn, that calls my apps' APIs as `apis.<app>.<api>(...)`. I run each block and show you its output. Docs: `apis.api_docs.show_api_descriptions(app_name=...)`, `apis.api_docs.show_api_doc(app_name=..., api_name=...)`. Credentials: `apis.supervisor.show_account_passwords()`; log in with `apis.<app>.login(username=<my email>, password=...)` and pass access_token=. Finish with `apis.supervisor.complete_task(answer=...)`."""

# No word on docs or logins: a small policy's prompt (the testbed's API regime, harness_envs/synth/apis.py),
# where looking an API up is the behaviour a sibling's hint adds and training should bring about.
_BRIEF = """\
Do my task by writing Python code, one ```python block per turn, that calls my apps' APIs as `apis.<app>.<api>(...)`. I run each block and show you its output. Finish with `apis.supervisor.complete_task(answer=...)`."""

_DEMO = """

Here is how an earlier task went (a different task: solve yours the same way, step by step).
Task: How many of my notes mention "paint"?

Turn 1:
```python
print(apis.api_docs.show_api_descriptions(app_name="notes"))
```
Output: [{"name": "login", ...}, {"name": "search_notes", ...}, {"name": "show_note", ...}, ...]

Turn 2:
```python
print(apis.api_docs.show_api_doc(app_name="notes", api_name="search_notes"))
```
Output: {"api_name": "search_notes", "parameters": [{"name": "access_token", ...}, {"name": "query", ...}, {"name": "page_index", ...}, {"name": "page_limit", ...}], ...}

Turn 3:
```python
me = apis.supervisor.show_profile()
passwords = {p["account_name"]: p["password"] for p in apis.supervisor.show_account_passwords()}
token = apis.notes.login(username=me["email"], password=passwords["notes"])["access_token"]
found, page = [], 0
while True:
    batch = apis.notes.search_notes(access_token=token, query="paint", page_index=page, page_limit=20)
    if not batch:
        break
    found += batch
    page += 1
print(len(found))
```
Output: 3

Turn 4:
```python
apis.supervisor.complete_task(answer=3)
```"""

CREDENTIALS_REMINDER = (
    "Reminder: every app has its own password. Get them with apis.supervisor.show_account_passwords() (one "
    "entry per app, by account_name), log in with apis.<app>.login(username=<your email from "
    "apis.supervisor.show_profile()>, password=<that app's password>), and pass the returned access_token to "
    "that app's APIs only.")
VERIFY_PROMPT = (
    "The task is not marked complete yet. Before it is: check your answer (or the changes you made) against the "
    "apps' data once more, reading every page of the results it depends on. Then call "
    "apis.supervisor.complete_task(...) again.")
REVIEW_LEAD = "The task is not marked complete yet. Your code changed the apps' data as follows:"
REVIEW_TAIL = ("Undo any change the task did not ask for (delete what you created, restore what you changed), then "
               "call apis.supervisor.complete_task(...) again.")
FORMAT_FEEDBACK = "Your reply had no code to run. Reply with one ```python fenced block of code."
APP_LIST_LEAD = "The app {app!r} has these APIs:"
API_DOC_LEAD = "Documentation of apis.{app}.{api}:"


# ---------------------------------------------------------------- opening context

def render_instruction(spec: HarnessSpec) -> str:
    variant = spec.knob("instruction")
    if variant == "appworld":
        text = _INSTRUCTION + (_DEMO if spec.knob("few_shot") else "")
    elif variant == "concise":
        text = _CONCISE + (_DEMO if spec.knob("few_shot") else "")
    elif variant == "brief":
        text = _BRIEF + (_DEMO if spec.knob("few_shot") else "")
    else:
        raise ValueError(f"instruction variant {variant!r} has no AppWorld text; add it to render_instruction")
    hint = spec.knob("hint")
    return text + ("\nHint: " + hint if hint else "")


def task_prompt(supervisor: dict, question: str) -> str:
    return (f"My name is {supervisor['first_name']} {supervisor['last_name']}. My email is {supervisor['email']} and "
            f"my phone number is {supervisor['phone']}.\nTask: {question}")


def initial_messages(spec: HarnessSpec, supervisor: dict, question: str) -> list[dict]:
    return [{"role": "system", "content": render_instruction(spec)},
            {"role": "user", "content": task_prompt(supervisor, question)}]


# ---------------------------------------------------------------- code extraction

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\n(.*?)```", re.S)
_STRICT_TAGS = ("python", "")
_LENIENT_TAGS = ("python", "py", "python3", "ipython", "py3", "")


def extract_code(text: str, spec: HarnessSpec) -> str:
    """The code of a reply: strict, the first ```python (or untagged) block, else the whole reply;
    lenient, every Python-tagged (py, python3, ...) or untagged block joined, else a block on one line,
    else the whole reply."""
    if not isinstance(text, str):
        return ""
    if spec.knob("parse_mode") != "lenient":
        for match in _FENCE.finditer(text):
            if match.group(1) in _STRICT_TAGS:
                return match.group(2).strip()
        return text.strip()
    blocks = [m.group(2).strip() for m in _FENCE.finditer(text) if m.group(1).lower() in _LENIENT_TAGS]
    if blocks:
        return "\n".join(blocks)
    inline = re.search(r"```(?:python|py)?\s*(.+?)```", text, re.S)
    return inline.group(1).strip() if inline else text.strip()


# ---------------------------------------------------------------- observations

def summarize_traceback(traceback: str) -> str:
    """The error line and the line of the agent's code it came from."""
    lines = [line for line in (traceback or "").strip().splitlines() if line.strip()]
    if not lines:
        return "unknown error"
    where = ""
    for i, line in enumerate(lines):
        if line.strip().startswith('File "<cell') and i + 1 < len(lines):
            number = re.search(r"line (\d+)", line)
            where = f" (line {number.group(1) if number else '?'}: {lines[i + 1].strip()})"
    return f"Error summary: {lines[-1].strip()}{where}"


def error_observation(traceback: str, spec: HarnessSpec) -> str:
    if spec.knob("traceback_summary"):
        return "Execution failed. " + summarize_traceback(traceback)
    text = (traceback or "").rstrip()
    return FAILED_LEAD + text.removeprefix(_TB_HEADER)  # as AppWorld: the lead, then the frames


def app_list_note(app: str, signatures: str) -> str:
    return APP_LIST_LEAD.format(app=app) + "\n" + signatures


def api_doc_note(app: str, api: str, doc: dict) -> str:
    return API_DOC_LEAD.format(app=app, api=api) + "\n" + json.dumps(doc, indent=1)


def review_prompt(changes: list[str]) -> str:
    listed = "\n".join(f"- {c}" for c in changes) if changes else "- (no changes)"
    return f"{REVIEW_LEAD}\n{listed}\n{REVIEW_TAIL}"
