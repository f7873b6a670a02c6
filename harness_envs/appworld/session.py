"""A session is one task's world while an episode runs: it executes code cells and scores the end.

Both backends give the episode the same `Session` surface: the offline world (`OfflineSession`:
the world in this process, the agent's code in a `harness_envs.sandbox.PythonSandbox` whose `apis`
calls come back here) and real AppWorld (`harness_envs.appworld.real.RealSession`, through the
worker in AppWorld's own venv).
"""
from __future__ import annotations

import dataclasses
from typing import Protocol, Sequence

from harness_envs.appworld import tasks as tasks_lib
from harness_envs.appworld.api import ApiError, Registry
from harness_envs.appworld.apps import REGISTRY
from harness_envs.appworld.world import World
from harness_envs.sandbox import Limits, PythonSandbox


@dataclasses.dataclass
class Cell:
    """What one code cell did. `api_errors`: the failed API calls of the cell ({kind, app, api}),
    caught by the code or not; `held`: a complete_task call was held back for confirmation;
    `completed`: the task is marked complete after this cell."""

    output: str
    error: str | None = None
    traceback: str | None = None
    api_errors: list = dataclasses.field(default_factory=list)
    dropped: int = 0
    timed_out: bool = False
    crashed: bool = False
    held: bool = False
    completed: bool = False
    api_calls: int = 0
    seconds: float = 0.0


class Session(Protocol):
    def run(self, code: str) -> Cell: ...

    def hold_completion(self) -> None:
        """Holds back the next complete_task call once (the confirmation knobs)."""

    def changes(self) -> list[str]:
        """The changes made to the apps' data so far, one line each."""

    def evaluate(self) -> tuple[list[tasks_lib.TaskTest], dict | None]:
        """The task's tests on the end state, and the completion record ({answer, status}) or None."""

    def app_signatures(self, app: str) -> str | None: ...

    def api_doc(self, app: str, api: str) -> dict | None: ...

    def close(self) -> None: ...


class OfflineSession:
    """The offline world of `task` with the agent's code in a sandbox; `apis` calls reach the world
    here, so the code can change the world only through its APIs. `registry`: the apps the world
    serves (the shipped ones; the testbed's API regime gives each task its own)."""

    def __init__(self, task: tasks_lib.AppWorldTask, limits: Limits, *, isolation: str = "auto",
                 hide: Sequence[str] = (), registry: Registry = REGISTRY):
        self.task = task
        self.registry = registry
        self.world = World(task.world, registry)
        self.world.confirm_hook = self._confirm
        self._hold = self._held_now = False
        self.sandbox = PythonSandbox(limits, isolation_mode=isolation, bridge="apis", on_call=self._call, hide=hide)

    def _call(self, path: list, args: list, kwargs: dict):
        return self.world.call(path, args, kwargs)

    def _confirm(self, answer, status) -> str | None:
        if not self._hold:
            return None
        self._hold, self._held_now = False, True
        return "not marked complete yet: read the note after this output"

    def hold_completion(self) -> None:
        self._hold = True

    def run(self, code: str) -> Cell:
        first = len(self.world.calls)
        self._held_now = False
        result = self.sandbox.run(code)
        calls = self.world.calls[first:]
        errors = [{"kind": c["kind"], "app": c["app"], "api": c["api"]} for c in calls if not c["ok"]]
        return Cell(result.output, error=result.error, traceback=result.traceback, api_errors=errors,
                    dropped=result.dropped, timed_out=result.timed_out, crashed=result.crashed, held=self._held_now,
                    completed=self.world.completed is not None, api_calls=len(calls), seconds=result.seconds)

    def changes(self) -> list[str]:
        return [c.describe() for c in self.world.diff()]

    def evaluate(self):
        return self.check(self.world.diff(), self.world.completed), self.world.completed

    def check(self, changes, completed) -> list[tasks_lib.TaskTest]:
        """The task's tests on the end state (the shipped tasks' checker)."""
        return tasks_lib.check_task(self.task, changes, completed)

    def app_signatures(self, app: str) -> str | None:
        return self.registry.signatures(app) or None

    def api_doc(self, app: str, api: str) -> dict | None:
        try:
            return self.registry.lookup(app, api).describe()
        except ApiError:
            return None

    def close(self) -> None:
        self.sandbox.close()
        self.world.close()
