"""Scripted SWE-Gym agents, as chat policies (`chat(contexts, sampling, infos) -> list[str]`).

`OracleAgent` works as the instruction suggests, with the gold patch in hand: it lists the
repository, reproduces the issue (the instance's FAIL_TO_PASS test files, with the test patch applied
for the run and taken back after it), applies the gold patch through `str_replace_editor` calls
derived from its hunks (str_replace of each hunk's old lines by its new ones, bottom-up; create for a
new file; `rm` for a deleted one), then calls `finish`. `SlippingAgent(noise={slip: probability})`
is the oracle with slips (`SLIPS`): each fails under the base harness with one failure mode and is
repaired by exactly one sibling of the shipped pool, because the agent reacts only to the text that
sibling adds. An episode's slips depend only on (seed, instance id, sample index), never on the
harness. The agents read the gold patch from `info["task"]` and the repository's path from
`info["root"]` (set by the episode's reset).
"""
from __future__ import annotations

import dataclasses
import json
import re
import shlex
from typing import Callable, Generator

from harness_envs.plan_agent import Plan, PlanAgent, Slip, SlipDrawingAgent
from harness_envs.swegym import harness as swegym_harness
from harness_envs.swegym.instances import Instance
from harness_envs.swegym.runtime import pytest_command


SLIPS: dict[str, Slip] = {
    "call_format": Slip("malformed_tool_call", "lenient_parse",
                        "writes every call as a JSON object in a ```json fence instead of the <function=...> format"),
    "indentation": Slip("edit_failed", "str_replace_hint",
                        "its first str_replace gives old_str two spaces too deep on every line; it sends the right "
                        "old_str only once the harness shows the file's real lines, and gives up after 3 tries"),
    "syntax": Slip("syntax_error", "lint_on_edit",
                   "its first edit of a Python file leaves a line with an unterminated string; it notices only when "
                   "the harness reports the SyntaxError (then undoes or resends the edit)"),
    "narrow_view": Slip("no_edit", "wide_view",
                        "views 5 lines about 20 lines away from the code to change and edits only lines it has "
                        "seen; with a wider view window it sees them, else it gives up"),
    "blind_fix": Slip("blind_edit", "reproduce_first",
                      "skips reproducing, adds a comment where the bug is and finishes; once an edit is refused "
                      "for want of a reproduction it reproduces and fixes"),
    "unchecked_fix": Slip("f2p_failing", "test_after_edit",
                          "reproduces, adds a comment where the bug is and finishes without rerunning; when the "
                          "harness reruns the reproduction after the edit and it still fails, it undoes and fixes"),
    "long_explore": Slip("iteration_limit", "more_iterations",
                         "explores with 30 short commands before it starts on the fix"),
    "context_hog": Slip("context_overflow", "compress_context",
                        "prints every line of the repository 8 times before fixing; the context passes a 32k-token "
                        "budget unless older observations are condensed"),
}
ATTEMPTS = 3
EXPLORE_CALLS = 30
HOG_CALLS = 8
HOG_COMMAND = "git grep -n -I ''"
NARROW_OFFSET = 20  # the narrow view starts this many lines above the line to change
GUESS_COMMENT = "# the case from the issue is handled here"
SYNTAX_SLIP = "note = 'the fix"
MAX_REPRO_IDS = 50


# ---------------------------------------------------------------- the gold patch as editor calls

@dataclasses.dataclass(frozen=True)
class Hunk:
    old_start: int
    old_len: int
    lines: tuple[tuple[str, str], ...]  # (tag, text): tag " ", "-" or "+"

    @property
    def old(self) -> list[str]:
        return [t for tag, t in self.lines if tag != "+"]

    @property
    def new(self) -> list[str]:
        return [t for tag, t in self.lines if tag != "-"]

    def target(self) -> tuple[int, str]:
        """(old line number, text) of the line the hunk is about: its first removed line, else the
        line before its first added one (else the line after it)."""
        line = self.old_start if self.old_len else self.old_start + 1
        previous = None
        for tag, text in self.lines:
            if tag == "-":
                return line, text
            if tag == "+":
                if previous is not None:
                    return previous
                break
            previous = (line, text)
            line += 1
        nxt = next(((i, t) for i, (tag, t) in enumerate(self.lines) if tag == " "), None)
        return (line, nxt[1]) if nxt else (max(1, line - 1), "")


@dataclasses.dataclass(frozen=True)
class FilePatch:
    path: str  # relative to the repository
    kind: str  # modify | create | delete
    hunks: tuple[Hunk, ...]


_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def parse_patch(patch: str) -> list[FilePatch]:
    """The files of a unified diff (git's format) with their hunks. Renames and binary files are not
    represented (the scripted agents do not need them)."""
    files, lines, i = [], patch.split("\n"), 0
    while i < len(lines):
        if not lines[i].startswith("diff --git ") and not lines[i].startswith("--- "):
            i += 1
            continue
        old = new = None
        while i < len(lines) and not lines[i].startswith("@@"):
            if lines[i].startswith("--- "):
                old = lines[i][4:].split("\t")[0].strip()
            elif lines[i].startswith("+++ "):
                new = lines[i][4:].split("\t")[0].strip()
                i += 1
                break
            i += 1
        if old is None or new is None:
            continue
        hunks = []
        while i < len(lines) and lines[i].startswith("@@"):
            m = _HUNK.match(lines[i])
            if not m:
                raise ValueError(f"bad hunk header {lines[i]!r}")
            old_len = int(m.group(2)) if m.group(2) is not None else 1
            new_len = int(m.group(4)) if m.group(4) is not None else 1
            i += 1
            body, seen_old, seen_new = [], 0, 0
            while i < len(lines) and (seen_old < old_len or seen_new < new_len):
                line = lines[i]
                tag, text = (line[:1] or " "), line[1:]
                if tag == "\\":
                    i += 1
                    continue
                body.append((tag, text))
                seen_old += tag != "+"
                seen_new += tag != "-"
                i += 1
            while i < len(lines) and lines[i].startswith("\\"):
                i += 1
            hunks.append(Hunk(int(m.group(1)), old_len, tuple(body)))
        kind = "create" if old == "/dev/null" else "delete" if new == "/dev/null" else "modify"
        path = (old if kind == "delete" else new)
        files.append(FilePatch(path[2:] if path[:2] in ("a/", "b/") else path, kind, tuple(hunks)))
    return files


@dataclasses.dataclass(frozen=True)
class Edit:
    """One editor call (or an `rm`) of the gold patch. For str_replace, `line`/`span` locate old
    in the file at the time the call runs (the hunks of a file are applied bottom-up)."""

    command: str  # str_replace | insert | create | delete
    path: str  # absolute
    old: str = ""
    new: str = ""
    line: int = 0
    span: int = 0


def gold_edits(instance: Instance, root: str) -> list[Edit]:
    out = []
    for fp in parse_patch(instance.patch):
        path = f"{root.rstrip('/')}/{fp.path}"
        if fp.kind == "create":
            text = "\n".join(t for h in fp.hunks for t in h.new)
            out.append(Edit("create", path, new=text + ("\n" if text else "")))
        elif fp.kind == "delete":
            out.append(Edit("delete", path))
        else:
            for h in sorted(fp.hunks, key=lambda h: -h.old_start):
                if h.old:
                    out.append(Edit("str_replace", path, "\n".join(h.old), "\n".join(h.new), h.old_start, len(h.old)))
                else:  # an insertion with no context: into an empty file, or git -U0
                    out.append(Edit("insert", path, new="\n".join(h.new), line=h.old_start))
    return out


def target_line(instance: Instance, root: str) -> tuple[str, int, str] | None:
    """(path, line, text) of the first line the gold patch is about in a file it modifies."""
    for fp in parse_patch(instance.patch):
        if fp.kind == "modify" and fp.hunks:
            hunk = min(fp.hunks, key=lambda h: h.old_start)
            line, text = hunk.target()
            return f"{root.rstrip('/')}/{fp.path}", line, text
    return None


# ---------------------------------------------------------------- observations the plans read

_EXIT = re.compile(r"\[The command finished with exit code (-?\d+)\.\]")
_NUMBERED = re.compile(r"^\s*(\d+)\t(.*)$")


def exit_code(observation: str) -> int | None:
    """The exit code of the last command in an observation (None: none, or it timed out)."""
    found = _EXIT.findall(observation or "")
    return int(found[-1]) if found else None


def numbered_lines(observation: str) -> dict[int, str]:
    """{line number: text} of the `cat -n` lines in an observation."""
    out = {}
    for line in (observation or "").split("\n"):
        m = _NUMBERED.match(line)
        if m:
            out[int(m.group(1))] = m.group(2)
    return out


def reproduce_command(instance: Instance, root: str) -> str:
    """Runs the FAIL_TO_PASS test files; the test patch is applied for the run and taken back."""
    test = pytest_command(instance, instance.FAIL_TO_PASS[:MAX_REPRO_IDS])
    lines = [f"cd {shlex.quote(root)}"]
    if not instance.test_patch.strip():
        return "\n".join(lines + [test])
    patch = instance.test_patch if instance.test_patch.endswith("\n") else instance.test_patch + "\n"
    lines += [f"git apply - <<'HSJAX_TEST_PATCH'\n{patch}HSJAX_TEST_PATCH", f"{test}", "status=$?",
              f"git apply -R - <<'HSJAX_TEST_PATCH'\n{patch}HSJAX_TEST_PATCH", "exit $status"]
    return "\n".join(lines)


# ---------------------------------------------------------------- plans

Fmt = Callable[..., str]


def text_call(name: str, **params) -> str:
    return swegym_harness.format_call(name, **params)


def json_call(name: str, **params) -> str:
    args = {k: v for k, v in params.items() if v is not None}
    return "I will call the tool now.\n```json\n" + json.dumps({"name": name, "arguments": args}, indent=1) + "\n```"


def editor(fmt: Fmt, command: str, path: str, **params) -> str:
    return fmt("str_replace_editor", command=command, path=path, **params)


def _apply_edit(edit: Edit, fmt: Fmt) -> Generator[str, str, str]:
    """Sends one gold edit; when old_str is not unique, widens it with the lines around it (read with
    view_range) until it is. Returns the last observation."""
    if edit.command == "create":
        return (yield editor(fmt, "create", edit.path, file_text=edit.new))
    if edit.command == "delete":
        return (yield fmt("execute_bash", command=f"rm -f -- {shlex.quote(edit.path)}"))
    if edit.command == "insert":
        return (yield editor(fmt, "insert", edit.path, insert_line=edit.line - (1 if edit.line else 0),
                             new_str=edit.new))
    obs = yield editor(fmt, "str_replace", edit.path, old_str=edit.old, new_str=edit.new)
    for around in (3, 10, 30, 100):
        if "occurs" not in obs or "ERROR" not in obs:
            return obs
        first, last = max(1, edit.line - around), edit.line + edit.span - 1 + around
        view = numbered_lines((yield editor(fmt, "view", edit.path, view_range=[first, last])))
        if edit.line not in view or edit.line + edit.span - 1 not in view:
            return obs
        before = [view[n] for n in sorted(view) if n < edit.line]
        after = [view[n] for n in sorted(view) if n >= edit.line + edit.span]
        old = "\n".join(before + edit.old.split("\n") + after)
        new = "\n".join(before + edit.new.split("\n") + after)
        obs = yield editor(fmt, "str_replace", edit.path, old_str=old, new_str=new)
    return obs


def apply_gold(instance: Instance, root: str, fmt: Fmt) -> Plan:
    for edit in gold_edits(instance, root):
        yield from _apply_edit(edit, fmt)


def finish_forever(fmt: Fmt) -> Plan:
    while True:
        yield fmt("finish", message="I changed the code the issue is about.")


def oracle_plan(instance: Instance, root: str, fmt: Fmt = text_call) -> Plan:
    yield editor(fmt, "view", root)
    yield fmt("execute_bash", command=reproduce_command(instance, root))
    yield from apply_gold(instance, root, fmt)
    yield from finish_forever(fmt)


def _guess(instance: Instance, root: str, fmt: Fmt) -> Generator[str, str, str | None]:
    """A comment inserted above the line to change (no behaviour changes); the observation."""
    where = target_line(instance, root)
    if where is None:
        return None
    path, line, text = where
    indent = text[:len(text) - len(text.lstrip())]
    return (yield editor(fmt, "insert", path, insert_line=max(0, line - 1), new_str=indent + GUESS_COMMENT))


def _break_syntax(edit: Edit) -> Edit:
    """The edit with a line holding an unterminated string after its first changed line."""
    old, new = edit.old.split("\n"), edit.new.split("\n")
    at = next((i for i, text in enumerate(new) if i >= len(old) or text != old[i]), 0)
    indent = new[at][:len(new[at]) - len(new[at].lstrip())] if new else ""
    broken = new[:at + 1] + [indent + SYNTAX_SLIP] + new[at + 1:]
    return dataclasses.replace(edit, new="\n".join(broken))


def slipping_plan(instance: Instance, root: str, slips: frozenset[str], fmt: Fmt) -> Plan:
    """The oracle's plan with `slips` (SLIPS) woven in; each slip's test for the sibling's text is the
    only place the plan looks at an observation."""
    gold = gold_edits(instance, root)
    where = target_line(instance, root)  # (path, line, text) of the line the fix is about, if any
    yield editor(fmt, "view", root)
    if "long_explore" in slips:
        probes = [f"ls {shlex.quote(root)}", "git status --short | head -5", "git log --oneline -1",
                  f"find {shlex.quote(root)} -name '*.py' -not -path '*/.*' | head -5",
                  "grep -rln 'def ' --include='*.py' . | head -5"]
        for i in range(EXPLORE_CALLS):
            yield fmt("execute_bash", command=probes[i % len(probes)])
    if "context_hog" in slips:
        for _ in range(HOG_CALLS):
            yield fmt("execute_bash", command=HOG_COMMAND)
    if "blind_fix" in slips:
        yield editor(fmt, "view", where[0] if where else root)
        obs = yield from _guess(instance, root, fmt)
        if obs is None or swegym_harness.REPRODUCE_REFUSAL not in obs:
            yield from finish_forever(fmt)
    obs = yield fmt("execute_bash", command=reproduce_command(instance, root))
    if "unchecked_fix" in slips:
        obs = yield from _guess(instance, root, fmt)
        if obs is None or swegym_harness.RETEST_LEAD not in obs or exit_code(obs) == 0:
            yield from finish_forever(fmt)
        yield editor(fmt, "undo_edit", where[0])
    if "narrow_view" in slips:
        if where is not None:
            path, line, text = where
            first = line - NARROW_OFFSET if line > NARROW_OFFSET else 1 if line > 5 else line + 1
            seen = numbered_lines((yield editor(fmt, "view", path, view_range=[max(1, first), max(1, first) + 4])))
            if seen.get(line) != text:
                yield from finish_forever(fmt)
    for i, edit in enumerate(gold):
        first_replace = edit.command == "str_replace" and all(e.command != "str_replace" for e in gold[:i])
        if "indentation" in slips and first_replace:
            wrong = "\n".join("  " + x if x.strip() else x for x in edit.old.split("\n"))
            for _ in range(ATTEMPTS):
                obs = yield editor(fmt, "str_replace", edit.path, old_str=wrong, new_str=edit.new)
                if swegym_harness.HINT_LEAD in obs:
                    break
            else:
                yield from finish_forever(fmt)
        first_py = edit.command == "str_replace" and edit.path.endswith(".py") and all(
            not (e.command == "str_replace" and e.path.endswith(".py")) for e in gold[:i])
        if "syntax" in slips and first_py:
            obs = yield from _apply_edit(_break_syntax(edit), fmt)
            if swegym_harness.LINT_LEAD in obs:
                if "edit refused" not in obs:
                    yield editor(fmt, "undo_edit", edit.path)
                yield from _apply_edit(edit, fmt)
            continue
        yield from _apply_edit(edit, fmt)
    yield from finish_forever(fmt)


def _root(info: dict) -> str:
    if "root" not in info:
        raise KeyError("SWE-Gym scripted agents read the repository's path from info['root'], set by the episode's "
                       "reset(); reset the episode before asking the agent")
    return info["root"]


class OracleAgent(PlanAgent):
    """Reproduces the issue, applies the gold patch through the editor, finishes."""

    def _new_plan(self, info: dict) -> Plan:
        return oracle_plan(info["task"], _root(info))


class SlippingAgent(SlipDrawingAgent):
    """The oracle with slips: `noise` maps slip names of `SLIPS` to probabilities per episode."""

    SLIPS = SLIPS
    slip_noun = "SWE-Gym slip"

    def _new_plan(self, info: dict) -> Plan:
        slips = self.slips_for(info)
        return slipping_plan(info["task"], _root(info), slips, json_call if "call_format" in slips else text_call)
