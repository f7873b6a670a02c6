"""`SWEGymEpisode`: one SWE-Gym instance under one harness, implementing `harness_envs.base.Episode`.

`reset()` opens a workspace of the instance (the repository at `base_commit`) through the runtime
and records its path as `info["root"]` (the opening context names it; scripted agents read it);
each reply is one function call (`harness.parse_call`) run by the tools (`tools.py`) in that
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

from harness_envs import harness as hz
from harness_envs.base import new_episode_id
from harness_envs.swegym import harness as swh
from harness_envs.swegym import taxonomy, tools
from harness_envs.swegym.instances import Instance

PREFIX_LEN = 2  # instruction and task: never dropped by context management
RETEST_TAIL_LINES = 15
_PATCH_FILE = re.compile(r"^\+\+\+ b/(.+)$", re.M)


@dataclasses.dataclass
class StepRecord:
    """One reply: `kind` is the function called, `malformed` or `format_retry`. `tool` is the editor's
    command; `error` the tool's failure kind or the call error kind; `summary` the one-line form
    of the observation that context compression shows."""

    kind: str
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

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


class SWEGymEpisode:
    """One instance under one harness. `open_workspace(instance)` gives a fresh `Workspace`;
    `score(instance, patch)` the scorer's report of a patch."""

    def __init__(self, instance: Instance, spec: hz.HarnessSpec, open_workspace: Callable,
                 score: Callable, *, sample_index: int = 0):
        self.task, self.spec = instance, spec.validate()
        self.open_workspace, self.score = open_workspace, score
        self.info: dict[str, Any] = {
            "task_id": instance.task_id, "type": instance.type, "harness": spec.name, "task": instance,
            "episode_id": new_episode_id(f"{instance.task_id}/{spec.name}"), "sample_index": sample_index,
        }
        self._workspace = None
        self._started = False
        self._clear()

    def _clear(self) -> None:
        self._history: list[dict] = []
        self._summaries: dict[int, str] = {}  # history index -> the one-line form of that observation
        self._records: list[StepRecord] = []
        self._turn = self._format_retries = 0
        self._done = False
        self._status = self._abort_reason = self._error = None
        self._verified = False
        self._python_ran = False
        self._blind: bool | None = None  # set at the first edit of an existing file
        self._reproduction: tuple[str, str] | None = None  # (command, cwd) that test_after_edit reruns
        self._reproduction_failed = False
        self._finish_message: str | None = None
        self._result: dict | None = None
        self._bash = self._editor = None
        self._t0 = time.perf_counter()

    # ------------------------------------------------------------------ Episode protocol

    def reset(self) -> None:
        self._close_workspace()
        self._clear()
        self._started = True
        try:
            self._workspace = self.open_workspace(self.task)
        except Exception as e:
            self._history = self.initial_messages("/repo")
            self._finish("env_error", error=f"opening the workspace failed: {type(e).__name__}: {e}")
            return
        root = self._workspace.root
        self.info["root"] = root
        self._history = self.initial_messages(root)
        self._bash = tools.Bash(self._workspace, self.spec.knob("command_timeout_s"))
        self._editor = tools.Editor(self._workspace, view_window=self.spec.knob("view_window"),
                                    hint=self.spec.knob("str_replace_hint"), lint=self.spec.knob("lint_on_edit"))

    def initial_messages(self, root: str) -> list[dict]:
        return swh.initial_messages(self.spec, root, self.task.problem_statement)

    def messages(self) -> list[dict]:
        if not self._started:
            raise RuntimeError(f"{self.info['episode_id']}: call reset() before messages()/step()")
        mode, last_n = self.spec.knob("context"), self.spec.knob("context_last_n")
        if mode != "compress":
            return hz.select_context(self._history, PREFIX_LEN, mode, last_n)
        rest = len(self._history) - PREFIX_LEN
        keep_from = max(0, rest - 2 * last_n)
        keep_from -= keep_from % 2
        return [{"role": m["role"], "content": self._summaries.get(i, m["content"])}
                if PREFIX_LEN <= i < PREFIX_LEN + keep_from else dict(m) for i, m in enumerate(self._history)]

    @property
    def done(self) -> bool:
        return self._done

    @property
    def turn(self) -> int:
        return self._turn

    def step(self, action_text: str) -> None:
        if not self._started:
            raise RuntimeError(f"{self.info['episode_id']}: call reset() before messages()/step()")
        if self._done:
            raise RuntimeError(f"{self.info['episode_id']}: step() after the episode ended; check `done` first")
        text = action_text if isinstance(action_text, str) else ("" if action_text is None else str(action_text))
        self._turn += 1
        self._history.append({"role": "assistant", "content": text})
        try:
            self._step(text)
            if not self._done and self._turn >= self.spec.knob("max_iterations"):
                self._finish("iteration_limit")
        except Exception as e:
            self._finish("env_error", error=f"{type(e).__name__}: {e}")

    def abort(self, reason: str) -> None:
        if not self._done:
            self._abort_reason = str(reason)
            self._finish("aborted")

    def result(self) -> dict[str, Any]:
        if not self._done:
            raise RuntimeError(f"{self.info['episode_id']}: result() before the episode ended")
        return self._result

    # ------------------------------------------------------------------ one reply

    def _step(self, text: str) -> None:
        spec = self.spec
        try:
            call = swh.parse_call(text, spec)
        except swh.CallError as e:
            if spec.knob("on_malformed") == "retry" and self._format_retries < spec.knob("max_format_retries"):
                self._format_retries += 1
                feedback = swh.FORMAT_FEEDBACK.format(why=str(e))
                self._observe(StepRecord("format_retry", error=e.kind, summary="[format feedback]"), feedback)
                return
            self._records.append(StepRecord("malformed", error=e.kind, observation=str(e)))
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

    def _run_bash(self, call: swh.Call) -> tuple[StepRecord, str]:
        command = call.params["command"]
        cwd = self._bash.cwd
        res = self._bash.run(command, call.params.get("timeout"))
        body, truncated = hz.truncate(res.body, self.spec.knob("obs_max_chars"))
        if res.ok and swh.runs_python(command):
            self._python_ran = True
            failed = res.returncode != 0
            if failed or not self._reproduction_failed:
                self._reproduction, self._reproduction_failed = (command, cwd), failed
        lines = res.body.count("\n")
        summary = (f"[earlier output of `{_clip(command, 80)}` condensed: {lines} lines, "
                   f"{'timed out' if res.timed_out else f'exit code {res.returncode}'}]")
        record = StepRecord("execute_bash", command=command, error=res.error, summary=summary, truncated=truncated,
                            returncode=res.returncode)
        return record, swh.observation("execute_bash", body)

    def _run_editor(self, call: swh.Call) -> tuple[StepRecord, str]:
        params, spec = call.params, self.spec
        command, path = params["command"], params["path"]
        record = StepRecord("str_replace_editor", tool=command, path=path)
        modifies = command in ("str_replace", "insert")
        if modifies and spec.knob("reproduce_first") and not self._python_ran:
            record.error, record.summary = "refused", f"[earlier {command} of {path}: refused]"
            return record, swh.observation("str_replace_editor", swh.REPRODUCE_REFUSAL)
        res = self._editor.call(params)
        record.error = res.error
        if modifies and res.edited and self._blind is None:
            self._blind = not self._python_ran
        body, record.truncated = hz.truncate(res.body, spec.knob("obs_max_chars"))
        notes = []
        if res.edited and spec.knob("test_after_edit") and self._reproduction:
            notes.append(self._rerun_reproduction())
        outcome = "failed" if res.error else "done"
        record.summary = (f"[earlier view of {path} condensed]" if command == "view" else
                          f"[earlier {command} of {path}: {outcome}]")
        return record, swh.observation("str_replace_editor", "\n\n".join([body, *notes]))

    def _rerun_reproduction(self) -> str:
        command, cwd = self._reproduction
        previous, self._bash.cwd = self._bash.cwd, cwd
        try:
            res = self._bash.run(command)
        finally:
            self._bash.cwd = previous
        tail = "\n".join(res.body.split("\n")[-RETEST_TAIL_LINES:])
        return f"{swh.RETEST_LEAD} (`{_clip(command, 120)}`):\n{tail}"

    def _finish_call(self, call: swh.Call) -> None:
        if self.spec.knob("verify_before_answer") and not self._verified:
            self._verified = True
            if not self._workspace.diff().strip():
                self._observe(StepRecord("finish", error="verify", summary="[finish held back]"), swh.VERIFY_PROMPT)
                return
        self._finish_message = call.params.get("message", "")
        self._records.append(StepRecord("finish"))
        self._finish("finished")

    def _observe(self, record: StepRecord, text: str) -> None:
        record.observation = text
        self._records.append(record)
        self._summaries[len(self._history)] = record.summary or swh.observation(record.kind, "[condensed]")
        self._history.append({"role": "user", "content": text})

    # ------------------------------------------------------------------ ending

    def _finish(self, status: str, error: str | None = None) -> None:
        self._status = status
        self._error = error or self._error
        patch, syntax_errors, report = "", {}, None
        try:
            if self._workspace is not None and status != "env_error":
                patch = self._workspace.diff()
                syntax_errors = self._syntax_errors(patch)
        except Exception as e:
            self._status, self._error = "env_error", f"taking the patch failed: {type(e).__name__}: {e}"
        finally:
            self._close_workspace()
        t0 = time.perf_counter()
        if self._status != "env_error":
            try:
                report = self.score(self.task, patch)
            except Exception as e:
                self._status, self._error = "env_error", f"scoring failed: {type(e).__name__}: {e}"
        self._done = True
        self._result = self._record(patch, syntax_errors, report, time.perf_counter() - t0)

    def _syntax_errors(self, patch: str) -> dict[str, str]:
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

    def _record(self, patch: str, syntax_errors: dict, report, score_s: float) -> dict[str, Any]:
        records = self._records
        edits = [r for r in records if r.kind == "str_replace_editor" and r.tool != "view"]
        trace = taxonomy.Trace(status=self._status, abort_reason=self._abort_reason, patch=patch,
                               failed_edits=sum(1 for r in edits if r.error), blind=bool(self._blind),
                               syntax_errors=syntax_errors)
        success = bool(report is not None and report.resolved)
        return {
            "task_id": self.task.task_id, "type": self.task.type, "harness": self.spec.name,
            "sample_index": self.info["sample_index"], "success": success, "reward": 1.0 if success else 0.0,
            "failure_mode": taxonomy.assign(trace, report),
            "status": self._status, "abort_reason": self._abort_reason, "error": self._error,
            "answer": self._finish_message, "num_turns": self._turn, "actions": [r.kind for r in records],
            "patch": patch, "report": None if report is None else report.to_json(),
            "edits": [{"command": r.tool, "path": r.path, "ok": r.error is None} for r in edits],
            "commands": [r.command for r in records if r.kind == "execute_bash"],
            "failed_edits": trace.failed_edits, "blind_edit": trace.blind, "syntax_errors": syntax_errors,
            "format_retries": self._format_retries,
            "tool_seconds": sum(r.seconds for r in records), "score_seconds": score_s,
            "episode_seconds": time.perf_counter() - self._t0,
            "turns": [r.to_json() for r in records],
        }

    def _close_workspace(self) -> None:
        workspace, self._workspace = self._workspace, None
        if workspace is not None:
            try:
                workspace.close()
            except Exception as e:
                self._error = self._error or f"closing the workspace failed: {type(e).__name__}: {e}"

    def __del__(self):
        try:
            self._close_workspace()
        except Exception:
            pass


def _clip(text: str, n: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[:n - 3] + "..."
