"""`AppWorldEpisode`: one AppWorld task under one harness: the hooks of
`harness_envs.base.EpisodeBase`, which owns the `Episode` life cycle.

The episode opens a session (the task's world: offline or real) on `reset()` and closes it as soon
as it ends. Each reply is one code cell (`appworld_harness.extract_code`); its observation is built by the
harness from what the cell did (`session.Cell`). The episode ends when the code completes the task
or the cell budget is spent; the session's tests then score it (TGC per task; SGC is counted over
the tasks of a scenario by `evaluator.summarize`).
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

from harness_envs import harness
from harness_envs.appworld import harness as appworld_harness
from harness_envs.appworld import taxonomy
from harness_envs.appworld.session import Cell
from harness_envs.base import ENV_ERROR, EpisodeBase, TurnRecord

PREFIX_LEN = 2  # instruction and task: never dropped by context management


@dataclasses.dataclass
class CellRecord(TurnRecord):
    """One reply: `kind` code | no_code | format_retry; the cell's error category for the taxonomy."""

    code: str = ""
    observation: str = ""
    error: str | None = None
    category: str | None = None
    api_errors: list = dataclasses.field(default_factory=list)
    api_calls: int = 0
    held: bool = False
    truncated: bool = False
    seconds: float = 0.0


class AppWorldEpisode(EpisodeBase):
    """One task under one harness. `open_session(task)` gives the task's `Session`."""

    prefix_len = PREFIX_LEN
    open_failure = "opening the task's world failed"
    close_failure = "closing the session failed"
    collect_failure = "scoring failed"

    def __init__(self, task, spec: harness.HarnessSpec, open_session: Callable, *, sample_index: int = 0):
        self.open_session = open_session
        super().__init__(task, spec, sample_index=sample_index)

    def _clear(self) -> None:
        super()._clear()
        self._rounds = 0
        self._sandbox_limit = False
        self._tests, self._completed = [], None  # the session's verdict, taken as the episode ends

    @property
    def _session(self):
        """The task's session, open from `reset()` until the episode ends."""
        return self._resource

    # ------------------------------------------------------------------ opening

    def _open(self):
        return self.open_session(self.task)

    def _prepare(self) -> None:
        if self.spec.knob("verify_before_answer") or self.spec.knob("review_changes"):
            self._session.hold_completion()

    def initial_messages(self) -> list[dict]:
        return appworld_harness.initial_messages(self.spec, self.task.supervisor, self.task.question)

    # ------------------------------------------------------------------ one reply

    def _step(self, text: str) -> None:
        spec = self.spec
        code = appworld_harness.extract_code(text, spec)
        if not code:
            if self._retries_format():
                self._turns.append(CellRecord("format_retry", observation=appworld_harness.FORMAT_FEEDBACK))
                self._tell(appworld_harness.FORMAT_FEEDBACK)
                return
            cell = Cell("", error="NoCode", traceback=appworld_harness.NO_CODE)
        else:
            cell = self._session.run(code)
        self._rounds += 1
        observation, truncated = self._observe(cell)
        kinds = [e["kind"] for e in cell.api_errors]
        self._turns.append(CellRecord(
            "code" if code else "no_code", code=code, observation=observation, error=cell.error,
            category=taxonomy.cell_category(cell.error, kinds), api_errors=cell.api_errors, api_calls=cell.api_calls,
            held=cell.held, truncated=truncated, seconds=cell.seconds))
        self._tell(observation)
        self._sandbox_limit = self._sandbox_limit or cell.timed_out or cell.crashed
        if cell.completed:
            self._finish("completed")
        elif self._rounds >= spec.knob("max_rounds"):
            self._finish("step_limit")

    def _observe(self, cell: Cell) -> tuple[str, bool]:
        spec = self.spec
        if cell.error == "NoCode":
            body = appworld_harness.NO_CODE
        elif cell.error is not None:
            body = (cell.output.rstrip() + "\n" if cell.output.strip() else "") + \
                appworld_harness.error_observation(cell.traceback, spec)
        else:
            body = cell.output.rstrip() or appworld_harness.SUCCESS_OUTPUT
        if cell.dropped:
            body += f"\n[{cell.dropped} more characters of output were cut]"
        body, truncated = harness.truncate(body, spec.knob("obs_max_chars"))
        notes, seen = [], set()
        for e in cell.api_errors:
            key = (e["kind"], e["app"], e["api"])
            if key in seen:
                continue
            seen.add(key)
            if e["kind"] == "unknown_api" and spec.knob("api_list_on_unknown"):
                signatures = self._session.app_signatures(e["app"])
                notes.append(appworld_harness.app_list_note(e["app"], signatures) if signatures else
                             "There is no such app; see apis.api_docs.show_app_descriptions().")
            elif e["kind"] == "wrong_arguments" and spec.knob("api_doc_on_bad_args"):
                doc = self._session.api_doc(e["app"], e["api"])
                if doc:
                    notes.append(appworld_harness.api_doc_note(e["app"], e["api"], doc))
            elif (e["kind"] == "auth" and spec.knob("credentials_reminder")
                  and appworld_harness.CREDENTIALS_REMINDER not in notes):
                notes.append(appworld_harness.CREDENTIALS_REMINDER)
        if cell.held:
            if spec.knob("review_changes"):
                notes.append(appworld_harness.review_prompt(self._session.changes()))
            if spec.knob("verify_before_answer"):
                notes.append(appworld_harness.VERIFY_PROMPT)
        return "\n\n".join([body, *notes]), truncated

    # ------------------------------------------------------------------ ending

    def _collect(self) -> None:
        if self._session is not None and self._status != ENV_ERROR:
            self._tests, self._completed = self._session.evaluate()

    def _score(self) -> dict[str, Any]:
        tests, completed = self._tests, self._completed
        passed = {t.name: t.passed for t in tests}
        success = bool(tests) and all(passed.values()) and self._status == "completed"
        kind = self.task.kind
        if kind not in ("question", "action"):  # real AppWorld: a failed test about the answer makes it a question
            kind = "question" if any("answer" in t.name.lower() and not t.passed for t in tests) else "action"
        outcome = {"status": self._status, "abort_reason": self._abort_reason, "success": success,
                   "sandbox_limit": self._sandbox_limit, "kind": kind, "tests": passed,
                   "gave_up": bool(completed) and completed.get("status") == "fail"}
        cells = [c for c in self._turns if c.kind != "format_retry"]
        return self._record(
            success=success, failure_mode=taxonomy.assign([c.category for c in cells], outcome),
            answer=None if not completed else completed.get("answer"), scenario_id=self.task.scenario_id,
            num_cells=len(cells), api_calls=sum(c.api_calls for c in cells),
            api_errors=sum(len(c.api_errors) for c in cells), tests=passed,
            failed_tests=[t.name + (f": {t.detail}" if t.detail else "") for t in tests if not t.passed],
            cell_seconds=sum(c.seconds for c in cells), episode_seconds=time.perf_counter() - self._t0)
