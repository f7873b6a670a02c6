"""`SWEGymEpisode`: one SWE-Gym instance under one harness: the hooks of
`harness_envs.base.EpisodeBase`, which owns the `Episode` life cycle.

`reset()` opens a workspace of the instance (the repository at `base_commit`) through the runtime
and records its path as `info["root"]` (the opening context names it; scripted agents read it);
each reply is one function call (`swegym_harness.parse_call`) run by the tools (`tools.py`) in that
workspace. When the episode ends (`finish`, the iteration limit, the malformed-call budget, an
abort), the agent's patch is taken with `workspace.diff()`, the workspace is closed, and the patch
is scored in a fresh workspace by the scorer (`scoring.evaluate`, as SWE-bench does): reward 1 iff
resolved. Workspaces are closed on every path out, exceptions included.

Knob behaviours that need the episode's history live here: `reproduce_first` (an edit of an
existing file before any command that ran Python is refused), `test_after_edit` (after each
successful edit, the latest command that ran Python, preferring one that failed, runs again and its
result is appended), `verify_before_answer` (a `finish` with nothing changed gets one prompt) and
`context=compress` (observations older than the last `context_last_n` turns shown as one line).
"""
from __future__ import annotations

import dataclasses
import re
import time
from typing import Any, Callable

from harness_envs import harness
from harness_envs.base import ENV_ERROR, EpisodeBase, TurnRecord, describe
from harness_envs.swegym import harness as swegym_harness
from harness_envs.swegym import taxonomy, tools
from harness_envs.swegym.instances import Instance

PREFIX_LEN = 2  # instruction and task: never dropped by context management
RETEST_TAIL_LINES = 15
_PATCH_FILE = re.compile(r"^\+\+\+ b/(.+)$", re.M)


@dataclasses.dataclass
class StepRecord(TurnRecord):
    """One reply: `kind` is the function called, `malformed` or `format_retry`. `tool` is the editor's
    command; `error` the tool's failure kind or the call error kind; `summary` the one-line form
    of the observation that context compression shows."""

    tool: str | None = None
    path: str | None = None
    command: str | None = None
    error: str | None = None
    observation: str = ""
    summary: str = ""
    truncated: bool = False
    returncode: int | None = None
    repaired: str | None = None
    seconds: float = 0.0


class SWEGymEpisode(EpisodeBase):
    """One instance under one harness. `open_workspace(instance)` gives a fresh `Workspace`;
    `score(instance, patch)` the scorer's report of a patch."""

    prefix_len = PREFIX_LEN
    open_failure = "opening the workspace failed"
    close_failure = "closing the workspace failed"
    collect_failure = "taking the patch failed"

    def __init__(self, instance: Instance, spec: harness.HarnessSpec, open_workspace: Callable,
                 score: Callable, *, sample_index: int = 0):
        self.open_workspace, self.score = open_workspace, score
        super().__init__(instance, spec, sample_index=sample_index)

    def _clear(self) -> None:
        super()._clear()
        self._summaries: dict[int, str] = {}  # history index -> the one-line form of that observation
        self._verified = False
        self._python_ran = False
        self._blind: bool | None = None  # set at the first edit of an existing file
        self._reproduction: tuple[str, str] | None = None  # (command, cwd) that test_after_edit reruns
        self._reproduction_failed = False
        self._finish_message: str | None = None
        self._bash = self._editor = None
        self._patch, self._syntax_errors = "", {}  # taken from the workspace as the episode ends

    @property
    def _workspace(self):
        """The instance's workspace, open from `reset()` until the episode ends."""
        return self._resource

    # ------------------------------------------------------------------ opening

    def _open(self):
        return self.open_workspace(self.task)

    def _prepare(self) -> None:
        self.info["root"] = self._workspace.root
        self._bash = tools.Bash(self._workspace, self.spec.knob("command_timeout_s"))
        self._editor = tools.Editor(self._workspace, view_window=self.spec.knob("view_window"),
                                    hint=self.spec.knob("str_replace_hint"), lint=self.spec.knob("lint_on_edit"))

    def initial_messages(self) -> list[dict]:
        """The opening context names the workspace's root (`/repo` when it failed to open)."""
        root = self._workspace.root if self._workspace is not None else "/repo"
        return swegym_harness.initial_messages(self.spec, root, self.task.problem_statement)

    def _context(self) -> list[dict]:
        mode, last_n = self.spec.knob("context"), self.spec.knob("context_last_n")
        if mode != "compress":
            return super()._context()
        rest = len(self._history) - PREFIX_LEN
        keep_from = max(0, rest - 2 * last_n)
        keep_from -= keep_from % 2
        return [{"role": m["role"], "content": self._summaries.get(i, m["content"])}
                if PREFIX_LEN <= i < PREFIX_LEN + keep_from else dict(m) for i, m in enumerate(self._history)]

    # ------------------------------------------------------------------ one reply

    def _step(self, text: str) -> None:
        self._act(text)
        if not self._done and self._turn >= self.spec.knob("max_iterations"):
            self._finish("iteration_limit")

    def _act(self, text: str) -> None:
        spec = self.spec
        try:
            call = swegym_harness.parse_call(text, spec)
        except swegym_harness.CallError as e:
            if self._retries_format():
                feedback = swegym_harness.FORMAT_FEEDBACK.format(why=str(e))
                self._observe(StepRecord("format_retry", error=e.kind, summary="[format feedback]"), feedback)
                return
            self._turns.append(StepRecord("malformed", error=e.kind, observation=str(e)))
            self._finish("malformed")
            return
        t0 = time.perf_counter()
        if call.name == "finish":
            self._finish_call(call)
            return
        if call.name == "execute_bash":
            record, body = self._run_bash(call)
        else:
            record, body = self._run_editor(call)
        record.repaired, record.seconds = call.repaired, time.perf_counter() - t0
        self._observe(record, body)

    def _run_bash(self, call: swegym_harness.Call) -> tuple[StepRecord, str]:
        command = call.params["command"]
        cwd = self._bash.cwd
        res = self._bash.run(command, call.params.get("timeout"))
        body, truncated = harness.truncate(res.body, self.spec.knob("obs_max_chars"))
        if res.ok and swegym_harness.runs_python(command):
            self._python_ran = True
            failed = res.returncode != 0
            if failed or not self._reproduction_failed:
                self._reproduction, self._reproduction_failed = (command, cwd), failed
        lines = res.body.count("\n")
        summary = (f"[earlier output of `{_clip(command, 80)}` condensed: {lines} lines, "
                   f"{'timed out' if res.timed_out else f'exit code {res.returncode}'}]")
        record = StepRecord("execute_bash", command=command, error=res.error, summary=summary, truncated=truncated,
                            returncode=res.returncode)
        return record, swegym_harness.observation("execute_bash", body)

    def _run_editor(self, call: swegym_harness.Call) -> tuple[StepRecord, str]:
        params, spec = call.params, self.spec
        command, path = params["command"], params["path"]
        record = StepRecord("str_replace_editor", tool=command, path=path)
        modifies = command in ("str_replace", "insert")
        if modifies and spec.knob("reproduce_first") and not self._python_ran:
            record.error, record.summary = "refused", f"[earlier {command} of {path}: refused]"
            return record, swegym_harness.observation("str_replace_editor", swegym_harness.REPRODUCE_REFUSAL)
        res = self._editor.call(params)
        record.error = res.error
        if modifies and res.edited and self._blind is None:
            self._blind = not self._python_ran
        body, record.truncated = harness.truncate(res.body, spec.knob("obs_max_chars"))
        notes = []
        if res.edited and spec.knob("test_after_edit") and self._reproduction:
            notes.append(self._rerun_reproduction())
        outcome = "failed" if res.error else "done"
        record.summary = (f"[earlier view of {path} condensed]" if command == "view" else
                          f"[earlier {command} of {path}: {outcome}]")
        return record, swegym_harness.observation("str_replace_editor", "\n\n".join([body, *notes]))

    def _rerun_reproduction(self) -> str:
        command, cwd = self._reproduction
        previous, self._bash.cwd = self._bash.cwd, cwd
        try:
            res = self._bash.run(command)
        finally:
            self._bash.cwd = previous
        tail = "\n".join(res.body.split("\n")[-RETEST_TAIL_LINES:])
        return f"{swegym_harness.RETEST_LEAD} (`{_clip(command, 120)}`):\n{tail}"

    def _finish_call(self, call: swegym_harness.Call) -> None:
        if self.spec.knob("verify_before_answer") and not self._verified:
            self._verified = True
            if not self._workspace.diff().strip():
                held = StepRecord("finish", error="verify", summary="[finish held back]")
                self._observe(held, swegym_harness.VERIFY_PROMPT)
                return
        self._finish_message = call.params.get("message", "")
        self._turns.append(StepRecord("finish"))
        self._finish("finished")

    def _observe(self, record: StepRecord, text: str) -> None:
        record.observation = text
        self._turns.append(record)
        self._summaries[len(self._history)] = record.summary or swegym_harness.observation(record.kind, "[condensed]")
        self._tell(text)

    # ------------------------------------------------------------------ ending

    def _collect(self) -> None:
        if self._workspace is not None and self._status != ENV_ERROR:
            self._patch = self._workspace.diff()
            self._syntax_errors = self._syntax_errors_of(self._patch)

    def _syntax_errors_of(self, patch: str) -> dict[str, str]:
        out = {}
        for rel in sorted(set(_PATCH_FILE.findall(patch))):
            rel = rel.strip()
            if not rel.endswith(".py"):
                continue
            path = f"{self._workspace.root.rstrip('/')}/{rel}"
            if self._workspace.exists(path) != "file":
                continue
            error = tools.compile_error(self._workspace.read_file(path), rel)
            if error:
                out[rel] = error
        return out

    def _score(self) -> dict[str, Any]:
        """Scores the patch in a fresh workspace (the episode's own is closed by now)."""
        patch, syntax_errors, report = self._patch, self._syntax_errors, None
        t0 = time.perf_counter()
        if self._status != ENV_ERROR:
            try:
                report = self.score(self.task, patch)
            except Exception as e:
                self._status, self._error = ENV_ERROR, f"scoring failed: {describe(e)}"
        score_s = time.perf_counter() - t0
        records = self._turns
        edits = [r for r in records if r.kind == "str_replace_editor" and r.tool != "view"]
        trace = taxonomy.Trace(status=self._status, abort_reason=self._abort_reason, patch=patch,
                               failed_edits=sum(1 for r in edits if r.error), blind=bool(self._blind),
                               syntax_errors=syntax_errors)
        return self._record(
            success=report is not None and report.resolved, failure_mode=taxonomy.assign(trace, report),
            answer=self._finish_message, patch=patch, report=None if report is None else report.to_json(),
            edits=[{"command": r.tool, "path": r.path, "ok": r.error is None} for r in edits],
            commands=[r.command for r in records if r.kind == "execute_bash"],
            failed_edits=trace.failed_edits, blind_edit=trace.blind, syntax_errors=syntax_errors,
            format_retries=self._format_retries, tool_seconds=sum(r.seconds for r in records),
            score_seconds=score_s, episode_seconds=time.perf_counter() - self._t0)


def _clip(text: str, n: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[:n - 3] + "..."
