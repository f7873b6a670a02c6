"""The agent's tools over one `Workspace`: `execute_bash` and `str_replace_editor`.

Every file operation goes through the workspace, so the tools do not know whether the repository is
a local work tree or a container's `/testbed`. Observation texts follow a fixed format: the bash
output then an exit-code line; a file view numbered as `cat -n` prints it; one `ERROR: ...` line (and
what to do) for a call that did nothing. Knob behaviours that act inside a tool live here: the
windowed viewer (`view_window`), the hint after a failed str_replace (`str_replace_hint`) and the
compile check of an edited Python file (`lint_on_edit`).
"""
from __future__ import annotations

import dataclasses
import difflib
import posixpath
import re
import shlex
import warnings

from harness_envs.swegym import harness as swegym_harness
from harness_envs.swegym.runtime import Workspace, WorkspaceError

SNIPPET_LINES = 4  # lines shown around an edit
HINT_MATCHES = 3  # occurrences listed by the hint for a non-unique old_str
CWD_MARK = "__HSJAX_CWD__"
DEFAULT_TIMEOUT_S = 120.0
MAX_TIMEOUT_S = 1800.0


@dataclasses.dataclass
class ToolResult:
    """What one call did. `error`: None, or the kind of failure (ERRORS). `edited`: the path whose
    content changed. `returncode`/`timed_out`: execute_bash only."""

    body: str
    error: str | None = None
    edited: str | None = None
    returncode: int | None = None
    timed_out: bool = False
    dropped: int = 0
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None


ERRORS = ("empty_command", "not_absolute", "outside", "missing", "is_directory", "exists", "bad_command",
          "missing_parameter", "bad_range", "not_found", "not_unique", "no_change", "no_history", "lint",
          "refused", "workspace")


def numbered(lines: list[str], first: int) -> str:
    """Lines as `cat -n` prints them, the first numbered `first`."""
    return "\n".join(f"{first + i:6}\t{line}" for i, line in enumerate(lines))


def split_lines(text: str) -> list[str]:
    lines = text.split("\n")
    return lines[:-1] if lines and lines[-1] == "" else lines


def compile_error(text: str, path: str) -> str | None:
    """`SyntaxError: msg (line n)` if `text` does not compile as Python, else None. The check runs in
    this process's interpreter (compile only, nothing executes)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compile(text, path, "exec", dont_inherit=True)
    except SyntaxError as e:
        return f"{type(e).__name__}: {e.msg} (line {e.lineno})"
    except (ValueError, MemoryError, RecursionError) as e:  # null bytes, absurd nesting
        return f"{type(e).__name__}: {e}"
    return None


class Bash:
    """execute_bash: one shell line per call; the working directory carries over between calls."""

    def __init__(self, workspace: Workspace, default_timeout_s: float = DEFAULT_TIMEOUT_S):
        self.workspace, self.default_timeout_s = workspace, float(default_timeout_s)
        self.cwd = workspace.root

    def run(self, command: str, timeout_s: float | None = None) -> ToolResult:
        if not command.strip():
            return ToolResult("ERROR: the command is empty; give a bash command to run.", error="empty_command")
        timeout = min(MAX_TIMEOUT_S, float(timeout_s or self.default_timeout_s))
        script = (f"cd {shlex.quote(self.cwd)} 2>/dev/null || cd {shlex.quote(self.workspace.root)}\n{command}\n"
                  f"__hsjax_rc=$?\nprintf '\\n{CWD_MARK}%s\\n' \"$(pwd)\"\nexit $__hsjax_rc")
        res = self.workspace.run(script, timeout_s=timeout)
        output = res.output
        mark = output.rfind(CWD_MARK)
        if mark >= 0 and (mark == 0 or output[mark - 1] == "\n"):
            cwd = output[mark + len(CWD_MARK):].split("\n", 1)[0].strip()
            if cwd:
                self.cwd = cwd
            output = output[:max(0, mark - 1)]
        body = output.rstrip("\n")
        if res.dropped:
            body += f"\n[{res.dropped} more characters of output were not kept]"
        body = (body + "\n" if body else "") + swegym_harness.exit_line(res.returncode, res.timed_out, timeout)
        return ToolResult(body, returncode=res.returncode, timed_out=res.timed_out, dropped=res.dropped,
                          seconds=res.seconds)


class Editor:
    """str_replace_editor over a workspace, with an undo history per file.

    `view_window` 0 shows what a view asks for; N shows N lines per view (a narrower view_range is
    widened around its middle, a wider one cut, a view without range shows lines 1..N).
    `hint`: after a failed str_replace, show the file's lines closest to old_str. `lint`: off |
    report (apply the edit, then show the SyntaxError) | refuse (do not apply an edit that makes a
    Python file stop compiling)."""

    def __init__(self, workspace: Workspace, *, view_window: int = 0, hint: bool = False, lint: str = "off"):
        if lint not in ("off", "report", "refuse"):
            raise ValueError(f"lint={lint!r} is not one of off, report, refuse")
        self.workspace, self.view_window, self.hint, self.lint = workspace, int(view_window), bool(hint), lint
        self.root = posixpath.normpath(workspace.root)
        self.history: dict[str, list[str | None]] = {}

    # ------------------------------------------------------------------ dispatch

    def call(self, params: dict) -> ToolResult:
        command, path = params["command"], params["path"]
        if command not in swegym_harness.EDITOR_COMMANDS:
            return ToolResult(f"ERROR: unknown command {command!r}; the editor's commands are "
                              f"{', '.join(swegym_harness.EDITOR_COMMANDS)}.", error="bad_command")
        problem = self._check_path(path)
        if problem is not None:
            return problem
        path = posixpath.normpath(path)
        try:
            kind = self.workspace.exists(path)
            if command == "create":
                return self.create(path, params.get("file_text"), kind)
            if kind is None:
                return ToolResult(f"ERROR: {path} does not exist. Give the path of an existing file "
                                  "(find it with `find` or `ls`).", error="missing")
            if command == "view":
                return self.view(path, params.get("view_range"), kind)
            if kind == "dir":
                return ToolResult(f"ERROR: {path} is a directory; only `view` works on directories.",
                                  error="is_directory")
            if command == "str_replace":
                return self.str_replace(path, params.get("old_str"), params.get("new_str", ""))
            if command == "insert":
                return self.insert(path, params.get("insert_line"), params.get("new_str"))
            return self.undo(path)
        except WorkspaceError as e:
            return ToolResult(f"ERROR: {e}", error="workspace")

    def _check_path(self, path: str) -> ToolResult | None:
        if not path.startswith("/"):
            guess = posixpath.join(self.root, path)
            return ToolResult(f"ERROR: {path} is not an absolute path; paths start with `/`. "
                              f"Did you mean {guess}?", error="not_absolute")
        norm = posixpath.normpath(path)
        if norm != self.root and not norm.startswith(self.root.rstrip("/") + "/"):
            return ToolResult(f"ERROR: {path} is outside the repository {self.root}; the editor works only on "
                              "files under it.", error="outside")
        return None

    def _missing(self, command: str, name: str) -> ToolResult:
        return ToolResult(f"ERROR: `{command}` needs the parameter `{name}`.", error="missing_parameter")

    # ------------------------------------------------------------------ view

    def view(self, path: str, view_range, kind: str) -> ToolResult:
        if kind == "dir":
            if view_range is not None:
                return ToolResult("ERROR: view_range works on files, not directories.", error="bad_range")
            quoted = shlex.quote(path)
            res = self.workspace.run(f"find {quoted} -maxdepth 2 -not -path '*/.*' | sort", timeout_s=30)
            return ToolResult(f"Files and directories up to 2 levels deep in {path}, hidden items left out:\n"
                              + res.output.rstrip("\n"))
        lines = split_lines(self.workspace.read_file(path))
        n = len(lines)
        first, last = 1, n
        if view_range is not None:
            first, last = view_range
            if not 1 <= first <= max(1, n):
                return ToolResult(f"ERROR: view_range {view_range}: the first line must be between 1 and {n} "
                                  "(the file's length).", error="bad_range")
            if last == -1 or last > n:
                last = n
            elif last < first:
                return ToolResult(f"ERROR: view_range {view_range}: the last line comes before the first.",
                                  error="bad_range")
        first, last = self._window(first, last, n, view_range is not None)
        body = f"Lines of {path}, numbered as `cat -n` prints them:\n" + numbered(lines[first - 1:last], first)
        if self.view_window and (first > 1 or last < n):
            body += f"\n[lines {first}-{last} of {n} shown; see others with view_range]"
        return ToolResult(body)

    def _window(self, first: int, last: int, n: int, ranged: bool) -> tuple[int, int]:
        w = self.view_window
        if not w or n == 0:
            return first, last
        if not ranged:
            return 1, min(n, w)
        if last - first + 1 >= w:
            return first, first + w - 1
        middle = (first + last) // 2
        start = max(1, middle - w // 2)
        end = min(n, start + w - 1)
        return max(1, end - w + 1), end

    # ------------------------------------------------------------------ edits

    def create(self, path: str, file_text, kind: str | None) -> ToolResult:
        if kind is not None:
            return ToolResult(f"ERROR: {path} already exists; `create` does not overwrite files. Change it with "
                              "str_replace or insert.", error="exists")
        if file_text is None:
            return self._missing("create", "file_text")
        refused = self._lint(path, None, file_text)
        if isinstance(refused, ToolResult):
            return refused
        self.workspace.write_file(path, file_text)
        self.history.setdefault(path, []).append(None)
        return ToolResult(f"File created: {path}." + (refused or ""), edited=path)

    def str_replace(self, path: str, old_str, new_str) -> ToolResult:
        if old_str is None:
            return self._missing("str_replace", "old_str")
        new_str = "" if new_str is None else new_str
        text = self.workspace.read_file(path)
        if not old_str:
            return ToolResult("ERROR: old_str is empty; give the exact text to replace.", error="not_found")
        count = text.count(old_str)
        if count == 0:
            body = (f"ERROR: nothing was replaced: old_str does not occur verbatim in {path}. It must match the "
                    "file exactly, whitespace and indentation included.")
            return ToolResult(body + self._hint_missing(text, old_str), error="not_found")
        if count > 1:
            starts = _occurrence_lines(text, old_str)
            body = (f"ERROR: nothing was replaced: old_str occurs {count} times in {path}, at lines {starts}. "
                    "Include more lines around it so that it matches one place only.")
            return ToolResult(body + self._hint_repeated(text, old_str, starts), error="not_unique")
        if old_str == new_str:
            return ToolResult("ERROR: nothing was replaced: new_str is the same as old_str.", error="no_change")
        new_text = text.replace(old_str, new_str, 1)
        first_line = text[:text.index(old_str)].count("\n") + 1
        return self._apply(path, text, new_text, first_line, new_str.count("\n") + 1)

    def insert(self, path: str, insert_line, new_str) -> ToolResult:
        if insert_line is None:
            return self._missing("insert", "insert_line")
        if new_str is None:
            return self._missing("insert", "new_str")
        text = self.workspace.read_file(path)
        lines = split_lines(text)
        if not 0 <= insert_line <= len(lines):
            return ToolResult(f"ERROR: insert_line {insert_line} is not between 0 and {len(lines)} (the file's "
                              "length).", error="bad_range")
        added = new_str.split("\n")
        trailing = text.endswith("\n") or not text
        new_lines = lines[:insert_line] + added + lines[insert_line:]
        new_text = "\n".join(new_lines) + ("\n" if trailing else "")
        return self._apply(path, text, new_text, insert_line + 1, len(added))

    def undo(self, path: str) -> ToolResult:
        stack = self.history.get(path)
        if not stack:
            return ToolResult(f"ERROR: there is no edit of {path} to undo.", error="no_history")
        previous = stack.pop()
        if previous is None:  # undoing a create
            self.workspace.run(f"rm -f -- {shlex.quote(path)}", timeout_s=30)
            return ToolResult(f"Undid the creation of {path}: the file is removed.", edited=path)
        self.workspace.write_file(path, previous)
        lines = split_lines(previous)
        return ToolResult(f"Undid the last edit of {path}. The file now, numbered as `cat -n` prints it:\n"
                          + numbered(lines, 1), edited=path)

    def _apply(self, path: str, old_text: str, new_text: str, first: int, count: int) -> ToolResult:
        lint = self._lint(path, old_text, new_text)
        if isinstance(lint, ToolResult):
            return lint
        self.workspace.write_file(path, new_text)
        self.history.setdefault(path, []).append(old_text)
        lines = split_lines(new_text)
        start = max(1, first - SNIPPET_LINES)
        end = min(len(lines), first + count - 1 + SNIPPET_LINES)
        body = (f"The file {path} was edited. A snippet of it, numbered as `cat -n` prints it:\n"
                f"{numbered(lines[start - 1:end], start)}\n"
                "Check that the change is what you meant, and edit again if it is not.")
        return ToolResult(body + (lint or ""), edited=path)

    # ------------------------------------------------------------------ knob behaviours

    def _lint(self, path: str, old_text: str | None, new_text: str) -> ToolResult | str | None:
        """None (fine or off), a note to append (report), or a refusal (refuse). Only an edit that makes
        a compiling file (or a new one) stop compiling counts."""
        if self.lint == "off" or not path.endswith(".py"):
            return None
        error = compile_error(new_text, path)
        if error is None or (old_text is not None and compile_error(old_text, path) is not None):
            return None
        where = _error_context(new_text, error)
        if self.lint == "refuse":
            return ToolResult(f"ERROR: edit refused. {_lint_line(error)}\n{where}\nThe file is unchanged; "
                              "send a corrected edit.", error="lint")
        return f"\n{_lint_line(error)}\n{where}\nFix it with another edit, or undo_edit."

    def _hint_missing(self, text: str, old_str: str) -> str:
        if not self.hint:
            return ""
        lines = split_lines(text)
        want = split_lines(old_str) or [old_str]
        span = len(want)
        if not lines:
            return ""
        squash = [" ".join(w.split()) for w in want]
        for i in range(0, max(1, len(lines) - span + 1)):
            if [" ".join(x.split()) for x in lines[i:i + span]] == squash:
                return (f"\n{swegym_harness.HINT_LEAD}: lines {i + 1}-{i + span} hold the same text with different "
                        f"whitespace:\n{numbered(lines[i:i + span], i + 1)}\nCopy old_str from these lines "
                        "exactly, indentation included (the numbers and the tab after them are not part of the file).")
        target = "\n".join(w.strip() for w in want)
        best, best_i = 0.0, 0
        for i in range(0, max(1, len(lines) - span + 1)):
            window = "\n".join(x.strip() for x in lines[i:i + span])
            matcher = difflib.SequenceMatcher(None, target, window, autojunk=False)
            if matcher.real_quick_ratio() <= best or matcher.quick_ratio() <= best:
                continue
            ratio = matcher.ratio()
            if ratio > best:
                best, best_i = ratio, i
        if best < 0.5:
            return f"\n{swegym_harness.HINT_LEAD}: none is close to old_str; view the file to find the text you mean."
        return (f"\n{swegym_harness.HINT_LEAD} to old_str ({best:.0%} alike), lines {best_i + 1}-{best_i + span}:\n"
                f"{numbered(lines[best_i:best_i + span], best_i + 1)}\nCopy old_str from the file exactly, "
                "indentation included (the numbers and the tab after them are not part of the file).")

    def _hint_repeated(self, text: str, old_str: str, starts: list[int]) -> str:
        if not self.hint:
            return ""
        lines = split_lines(text)
        span = max(1, old_str.count("\n") + 1)
        shown = []
        for s in starts[:HINT_MATCHES]:
            a, b = max(1, s - 1), min(len(lines), s + span)
            shown.append(numbered(lines[a - 1:b], a))
        return (f"\n{swegym_harness.HINT_LEAD}: each place where old_str occurs, with a line before and after:\n"
                + "\n---\n".join(shown) + "\nAdd one of those surrounding lines to old_str so it matches once.")


def _lint_line(error: str) -> str:
    return f"{swegym_harness.LINT_LEAD}: {error}."


def _occurrence_lines(text: str, needle: str) -> list[int]:
    out, start = [], 0
    while True:
        i = text.find(needle, start)
        if i < 0:
            return out
        out.append(text.count("\n", 0, i) + 1)
        start = i + 1


def _error_context(text: str, error: str) -> str:
    m = re.search(r"\(line (\d+)\)", error)
    if not m:
        return ""
    line = int(m.group(1))
    lines = split_lines(text)
    a, b = max(1, line - 2), min(len(lines), line + 2)
    return numbered(lines[a - 1:b], a)
