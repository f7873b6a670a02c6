"""The SWE-Gym agent protocol (OpenHands CodeAct, as SWE-Gym's rollouts ran it) and its knob variants.

Base behaviour, in this project's words (docs/swegym.md):
- the system message describes three functions, `execute_bash`, `str_replace_editor` (view, create,
  str_replace, insert, undo_edit) and `finish`, and the text format a call is written in; the user
  message names the repository's path and gives the issue inside `<pr_description>`, asking for
  the smallest change to non-test files, with the suggested steps (explore, reproduce, edit, rerun,
  edge cases);
- a reply is an optional thought followed by one call in the non-native function-calling format
  that OpenHands uses with models served without tool calling:

      <function=NAME>
      <parameter=KEY>VALUE</parameter>
      </function>

  (a missing final `</function>` is accepted: samplers stop on it). A value loses one leading and
  one trailing newline, so a multi-line value may sit on its own lines;
- a reply with no well-formed call gets format feedback, up to `max_format_retries` per episode,
  then the episode ends (failure mode `malformed_tool_call`); every reply counts against
  `max_iterations` (OpenHands counts each model call as an iteration);
- the episode ends on `finish`, on the iteration limit, on the malformed-call budget, or when the
  engine aborts it for its context budget.

Chat policies in this project return plain text (`hsjax.policies.http_chat`: the reply's `content`), so
calls are parsed from text. Native tool calls (an OpenAI `tool_calls` field) are future work: the
HTTP policy would send the three function schemas of `TOOLS` as `tools` and render each returned call
into the text format above, so episodes and training data keep one representation.

Sibling variants are knobs (`benchmark.KNOBS`): lenient parsing (`parse_mode`), a hint after a
failed str_replace, a compile check of edited Python files, a windowed file viewer, refusing edits
before the issue was reproduced, rerunning the reproduction after each edit, more iterations, and
older observations condensed to one line (`context=compress`). This module holds the texts and the
parser; `tools.py` the tools, `env.py` the episode.
"""
from __future__ import annotations

import dataclasses
import json
import re

from harness_envs.harness import HarnessSpec

INSTRUCTIONS = ("codeact", "concise")
EDITOR_COMMANDS = ("view", "create", "str_replace", "insert", "undo_edit")

# Each function: {parameter: (required, type name, doc)}. Types: str, int, number, int_pair.
TOOLS: dict[str, dict[str, tuple[bool, str, str]]] = {
    "execute_bash": {
        "command": (True, "str", "the bash command to run"),
        "timeout": (False, "number", "seconds before the command is stopped (default: the harness's)"),
    },
    "str_replace_editor": {
        "command": (True, "str", "one of: " + ", ".join(EDITOR_COMMANDS)),
        "path": (True, "str", "absolute path of a file or directory inside the repository"),
        "file_text": (False, "str", "create: the new file's content"),
        "old_str": (False, "str", "str_replace: text that occurs exactly once in the file, whitespace included"),
        "new_str": (False, "str", "str_replace: the text replacing old_str (empty: delete it); "
                                  "insert: the text to insert"),
        "insert_line": (False, "int", "insert: new_str goes after this line (0: at the top)"),
        "view_range": (False, "int_pair", "view: [first, last] line numbers to show; last = -1 means to the end"),
    },
    "finish": {
        "message": (False, "str", "a short summary of what you changed"),
    },
}

# ---------------------------------------------------------------- texts the agents (and tests) react to

FORMAT_FEEDBACK = ("Your reply had no function call I could run ({why}). Reply with exactly one call in the "
                   "format\n<function=NAME>\n<parameter=KEY>VALUE</parameter>\n</function>\nand call finish "
                   "once the issue is fixed. Keep working on your own: nobody will answer questions.")
REPRODUCE_RULE = ("Before you change any existing file, reproduce the issue: run a script or a test that shows "
                  "the failing behaviour with execute_bash. Edits to existing files made before that are refused.")
REPRODUCE_REFUSAL = ("ERROR: edit refused: reproduce the issue first. Run a script or a test that shows the failing "
                     "behaviour with execute_bash (python ... or pytest ...), then make this edit again.")
RETEST_LEAD = "Rerun of your reproduction after this edit"
HINT_LEAD = "Closest lines in the file"
LINT_LEAD = "This edit breaks the file's syntax"
VERIFY_PROMPT = ("You called finish without changing any file, so the issue is not fixed yet. Find the code the "
                 "pr_description is about, change it, check your change, then call finish again.")
FINISHED = "The episode has ended."

_CODEACT = """\
You are a software engineer working on a code repository in a Linux sandbox. You act by calling functions, one per reply; after each call you see its result and decide the next one.

You have these functions:

---- function 1: execute_bash ----
Runs one bash command in the repository and shows its output and exit code.
* One command at a time, in a fresh shell; the working directory carries over from the previous call, nothing else does.
* No interactive programs and no network. A command that runs past its timeout is stopped: run long jobs with a limit, and keep outputs short (| head, grep).
Parameters:
  (1) command (string, required): the bash command to run.
  (2) timeout (number, optional): seconds before the command is stopped.

---- function 2: str_replace_editor ----
Views, creates and edits files. Paths are absolute.
* view: a file is shown with line numbers, as `cat -n` prints it; a directory as its files and directories two levels deep. view_range=[first, last] shows only those lines (last = -1: to the end).
* create: writes a new file with file_text; it does not overwrite an existing file.
* str_replace: replaces old_str by new_str. old_str must match exactly one place of the file, whitespace and indentation included: give enough lines to make it unique.
* insert: inserts new_str after line insert_line (0: at the top).
* undo_edit: reverts the last edit of the file.
Parameters:
  (1) command (string, required): view, create, str_replace, insert or undo_edit.
  (2) path (string, required): absolute path of the file or directory.
  (3) file_text (string, optional): create: the content of the new file.
  (4) old_str (string, optional): str_replace: the text to replace.
  (5) new_str (string, optional): str_replace: the replacement (empty deletes old_str); insert: the text to insert.
  (6) insert_line (integer, optional): insert: the line after which new_str goes.
  (7) view_range (array of two integers, optional): view: the lines to show.

---- function 3: finish ----
Ends the task once the issue is fixed.
Parameters:
  (1) message (string, optional): what you changed.

How to call a function: write your reasoning first if you like, then exactly one call, in this format:

<function=NAME>
<parameter=KEY>VALUE</parameter>
<parameter=KEY>
a value that spans
several lines
</parameter>
</function>

Rules: one function call per reply, at the end of it; give every required parameter; a reply without a call does nothing but cost a turn.

For example, to list a directory:

<function=execute_bash>
<parameter=command>ls /tmp/example</parameter>
</function>"""

_CONCISE = """\
Fix the issue in the repository. One function call per reply, written as
<function=NAME>
<parameter=KEY>VALUE</parameter>
</function>
Functions: execute_bash(command); str_replace_editor(command=view|create|str_replace|insert|undo_edit, path, file_text, old_str, new_str, insert_line, view_range); finish()."""

_TASK = """\
<uploaded_files>
{root}
</uploaded_files>
The Python code repository at {root} has been uploaded for you. Here is the description of a pull request:

<pr_description>
{problem}
</pr_description>

Change the repository so that what the <pr_description> asks for holds. Its tests are already taken care of: do not change test files and do not write new tests. Make the smallest changes to non-test files under {root} that satisfy the description.
Suggested steps:
1. Explore the repository to learn how it is organised.
2. Write a script that reproduces the error and run it with `python <script>` through execute_bash to see the error.
3. Edit the source code to fix the issue.
4. Run your script again and check that the error is gone.
5. Think of edge cases and make sure the fix covers them too.
Reason carefully: a long reasoning is fine."""

_CONCISE_TASK = """\
Repository: {root}
<pr_description>
{problem}
</pr_description>
Make the smallest change to non-test files that fixes it, then call finish."""


# ---------------------------------------------------------------- opening context

def render_instruction(spec: HarnessSpec) -> str:
    variant = spec.knob("instruction")
    if variant == "codeact":
        text = _CODEACT
    elif variant == "concise":
        text = _CONCISE
    else:
        raise ValueError(f"instruction variant {variant!r} has no SWE-Gym text; add it to render_instruction")
    return text


def task_prompt(spec: HarnessSpec, root: str, problem: str) -> str:
    template = _CONCISE_TASK if spec.knob("instruction") == "concise" else _TASK
    text = template.format(root=root, problem=problem.strip())
    if spec.knob("reproduce_first"):
        text += "\n" + REPRODUCE_RULE
    hint = spec.knob("hint")
    return text + ("\nHint: " + hint if hint else "")


def initial_messages(spec: HarnessSpec, root: str, problem: str) -> list[dict]:
    return [{"role": "system", "content": render_instruction(spec)},
            {"role": "user", "content": task_prompt(spec, root, problem)}]


# ---------------------------------------------------------------- parsing calls

@dataclasses.dataclass(frozen=True)
class Call:
    """One parsed function call: its name, typed parameters, the thought before it, and a note of
    what lenient parsing repaired (None in strict mode)."""

    name: str
    params: dict
    thought: str = ""
    repaired: str | None = None


class CallError(ValueError):
    """A reply with no runnable call; `kind` is one of CALL_ERRORS, the message says what is wrong."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


CALL_ERRORS = ("no_call", "two_calls", "unknown_function", "missing_parameter", "unknown_parameter",
               "repeated_parameter", "bad_value")

_OPEN = re.compile(r"<function=([^>\s]*)>")
_CLOSE = "</function>"
_PARAM = re.compile(r"<parameter=([A-Za-z0-9_]+)>(.*?)</parameter>", re.S)
_LENIENT_OPEN = re.compile(r"<function\s+name\s*=\s*[\"']?([^\"'>\s]+)[\"']?\s*>")
_LENIENT_PARAM = re.compile(r"<parameter\s+name\s*=\s*[\"']?([A-Za-z0-9_]+)[\"']?\s*>")
_OPEN_PARAM = re.compile(r"<parameter=([A-Za-z0-9_]+)>")


def _value(raw: str) -> str:
    """A parameter's text: one leading and one trailing newline dropped, nothing else."""
    if raw.startswith("\n"):
        raw = raw[1:]
    if raw.endswith("\n"):
        raw = raw[:-1]
    return raw


def parse_call(text: str, spec: HarnessSpec) -> Call:
    """The call of a reply, checked against `TOOLS`; raises CallError.

    strict (published): exactly one `<function=NAME>` block, parameters as `<parameter=KEY>...</parameter>`,
    the closing `</function>` optional at the end of the reply. lenient also accepts `<function name="X">`
    and `<parameter name="K">` tags, a parameter whose closing tag is missing, a JSON call
    (`{"name": ..., "arguments": {...}}`, fenced or bare), and runs the first of several calls."""
    if not isinstance(text, str):
        text = "" if text is None else str(text)
    lenient = spec.knob("parse_mode") == "lenient"
    repaired = []
    if lenient:
        normal = _LENIENT_PARAM.sub(lambda m: f"<parameter={m.group(1)}>", _LENIENT_OPEN.sub(
            lambda m: f"<function={m.group(1)}>", text))
        if normal != text:
            repaired.append("tag attributes")
        text = normal
    opens = list(_OPEN.finditer(text))
    if not opens:
        if lenient:
            call = _json_call(text)
            if call is not None:
                return _checked(call[0], call[1], call[2], "JSON call")
        raise CallError("no_call", "no <function=...> call found")
    if len(opens) > 1:
        if not lenient:
            raise CallError("two_calls", f"{len(opens)} calls in one reply; send one call per reply")
        repaired.append(f"ran the first of {len(opens)} calls")
    first = opens[0]
    name = first.group(1).strip()
    end = text.find(_CLOSE, first.end())
    stop = opens[1].start() if len(opens) > 1 else len(text)
    body = text[first.end(): end if 0 <= end < stop else stop]
    params = _params(body, lenient, repaired)
    return _checked(name, params, text[:first.start()].strip(), "; ".join(repaired) if repaired else None)


def _params(body: str, lenient: bool, repaired: list) -> dict[str, str]:
    out: dict[str, str] = {}
    if lenient:
        opens = list(_OPEN_PARAM.finditer(body))
        for i, m in enumerate(opens):
            stop = opens[i + 1].start() if i + 1 < len(opens) else len(body)
            chunk = body[m.end():stop]
            close = chunk.find("</parameter>")
            if close < 0:
                repaired.append(f"closed parameter {m.group(1)!r}")
                chunk = chunk.rstrip()
            else:
                chunk = chunk[:close]
            if m.group(1) in out:
                raise CallError("repeated_parameter", f"parameter {m.group(1)!r} is given twice")
            out[m.group(1)] = _value(chunk)
        return out
    for m in _PARAM.finditer(body):
        if m.group(1) in out:
            raise CallError("repeated_parameter", f"parameter {m.group(1)!r} is given twice")
        out[m.group(1)] = _value(m.group(2))
    return out


def _json_call(text: str) -> tuple[str, dict, str] | None:
    """The first JSON object of the reply shaped as a call: {"name"|"function": N, "arguments"|"parameters": {...}}."""
    decoder = json.JSONDecoder()
    for m in re.finditer(r"\{", text):
        try:
            obj, _ = decoder.raw_decode(text, m.start())
        except json.JSONDecodeError:
            continue
        if not isinstance(obj, dict):
            continue
        name = obj.get("name", obj.get("function"))
        args = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                continue
        if isinstance(name, str) and isinstance(args, dict):
            params = {k: v if isinstance(v, str) else json.dumps(v) for k, v in args.items()}
            return name, params, text[:m.start()].strip()
    return None


def _checked(name: str, raw: dict[str, str], thought: str, repaired: str | None) -> Call:
    if name not in TOOLS:
        raise CallError("unknown_function", f"there is no function {name!r}; the functions are {', '.join(TOOLS)}")
    schema = TOOLS[name]
    unknown = sorted(set(raw) - set(schema))
    if unknown:
        raise CallError("unknown_parameter", f"{name} has no parameter(s) {', '.join(unknown)}; "
                                             f"its parameters are {', '.join(schema)}")
    missing = [k for k, (required, _, _) in schema.items() if required and k not in raw]
    if missing:
        raise CallError("missing_parameter", f"{name} needs the parameter(s) {', '.join(missing)}")
    params = {k: _typed(name, k, schema[k][1], v) for k, v in raw.items()}
    return Call(name, params, thought, repaired)


def _typed(function: str, key: str, kind: str, value: str):
    value = value.strip() if kind != "str" else value
    try:
        if kind == "int":
            return int(value)
        if kind == "number":
            number = float(value)
            if not number > 0:
                raise ValueError
            return number
        if kind == "int_pair":
            pair = json.loads(value)
            if (not isinstance(pair, list) or len(pair) != 2
                    or not all(isinstance(x, int) and not isinstance(x, bool) for x in pair)):
                raise ValueError
            return pair
    except (ValueError, json.JSONDecodeError):
        shape = {"int": "an integer", "number": "a positive number",
                 "int_pair": "a list of two integers like [10, 40]"}[kind]
        raise CallError("bad_value", f"{function}: parameter {key!r} must be {shape}, got {value[:80]!r}") from None
    return value


def format_call(name: str, **params) -> str:
    """A call in the published text format (scripted agents and tests write theirs with it)."""
    lines = [f"<function={name}>"]
    for key, value in params.items():
        if value is None:
            continue
        if not isinstance(value, str):
            value = json.dumps(value)
        lines.append(f"<parameter={key}>\n{value}\n</parameter>" if "\n" in value else
                     f"<parameter={key}>{value}</parameter>")
    lines.append("</function>")
    return "\n".join(lines)


# ---------------------------------------------------------------- observations

def observation(tool: str, body: str) -> str:
    """How a function's result is shown (the user turn after the call)."""
    return f"Result of {tool}:\n{body}"


def exit_line(returncode: int | None, timed_out: bool, timeout_s: float) -> str:
    if timed_out:
        return f"[The command was stopped after {timeout_s:g} seconds: it ran past its timeout.]"
    return f"[The command finished with exit code {returncode}.]"


# A command word that runs Python: at the start of a command (after ; && || | ( $( or a newline), past
# variable assignments and timeout/env/time/nice prefixes, possibly as a path (/venv/bin/python).
_PYTHON = re.compile(r"(?:^|[;&|(`\n]|\$\()\s*(?:\w+=\S*\s+)*(?:(?:timeout|time|env|nice)\s+(?:-\S+\s+)*"
                     r"(?:\w+=\S*\s+|\d+[smh]?\s+)*)*(?:\S*/)?(?:python[0-9.]*|pytest|py\.test|tox|nox)(?=\s|$|;)")


def runs_python(command: str) -> bool:
    """Whether a shell line runs Python code (a script, a test run): the evidence `reproduce_first` wants."""
    return bool(_PYTHON.search(command or ""))
