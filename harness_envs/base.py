"""The Episode protocol shared by every benchmark, and the small types around it.

An episode is one task under one harness: stateful, JAX-free, driven turn by turn by
`hsjax.rollout.engine.collect`. A chat message is a plain dict `{"role": ..., "content": str}` with role
`system`, `user` or `assistant`.

Life cycle:
    ep.reset()
    while not ep.done:
        reply = policy(ep.messages())   # the context the model must see now
        ep.step(reply)                  # consumes the reply; appends it and the observation
    ep.result()                         # the episode record

The engine may end an episode early with `ep.abort(reason)`: `context_overflow` (its context passed
the budget), `policy_error` (the policy could not answer it, e.g. its HTTP endpoint failed) or
`env_error`; a benchmark's taxonomy names the failure mode after the reason.

`EpisodeBase` implements this life cycle once; a benchmark's episode writes only its hooks (open
its resource, the opening messages, one step on a reply, what to take before the resource closes,
the score).
"""
from __future__ import annotations

import abc
import dataclasses
import itertools
import time
from typing import Any, Protocol, runtime_checkable

from harness_envs import harness

Message = dict  # {"role": "system" | "user" | "assistant", "content": str}


@runtime_checkable
class Task(Protocol):
    """What every benchmark's tasks carry: a stable id, a type (the unit of per-type scores and
    profiles) and the task's statement in words (shown to LLM voters)."""

    task_id: str
    type: str
    question: str

ROLES = ("system", "user", "assistant")
ABORT_CONTEXT_OVERFLOW = "context_overflow"
ABORT_POLICY_ERROR = "policy_error"

# Keys every `Episode.result()` carries; benchmarks add their own (e.g. `sql_errors`).
RESULT_KEYS = (
    "task_id", "type", "harness", "success", "reward", "failure_mode", "answer", "num_turns", "actions",
)
INFO_KEYS = ("task_id", "type", "harness", "task")


@runtime_checkable
class Episode(Protocol):
    """One task under one harness. See the module docstring for the life cycle.

    `info` holds at least `task_id`, `type`, `harness` and `task` (the task object; scripted agents
    read the gold answer from it) and `episode_id` (unique per episode object).
    """

    info: dict

    def reset(self) -> None:
        """Starts (or restarts) the episode: fresh environment state, first context ready."""

    def messages(self) -> list[Message]:
        """The context the model must see now, after the harness's context management."""

    def step(self, action_text: str) -> None:
        """Consumes one model reply: records it and the observation, or ends the episode."""

    @property
    def done(self) -> bool:
        """True once the episode has ended (answered, failed, aborted)."""

    @property
    def turn(self) -> int:
        """Model replies consumed so far."""

    def abort(self, reason: str) -> None:
        """Ends the episode from outside (e.g. `context_overflow`); the reason is the failure mode."""

    def result(self) -> dict[str, Any]:
        """The episode record (keys in `RESULT_KEYS` and more); only valid once `done`."""


@dataclasses.dataclass
class TurnRecord:
    """What one model reply did. `kind` names it (the parsed action, `malformed`, `format_retry`, ...);
    a benchmark subclasses it with the fields its taxonomy and records need. An episode's `actions`
    are its records' kinds and its `turns` their JSON."""

    kind: str

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


_EPISODE_COUNTER = itertools.count()


def new_episode_id(prefix: str) -> str:
    """A process-unique episode id (agents keep per-episode state under it)."""
    return f"{prefix}#{next(_EPISODE_COUNTER)}"


def check_message(message: Message) -> None:
    if not isinstance(message, dict) or message.get("role") not in ROLES:
        raise ValueError(f"message {message!r} must be a dict with role in {ROLES}")
    if not isinstance(message.get("content"), str):
        raise ValueError(f"message content must be str, got {type(message.get('content')).__name__}")


def check_result(result: dict) -> None:
    """Raises if an episode record lacks a key of `RESULT_KEYS`; names the missing keys."""
    missing = [k for k in RESULT_KEYS if k not in result]
    if missing:
        raise KeyError(f"episode result lacks {missing}; every Episode.result() must carry {RESULT_KEYS}")


ENV_ERROR = "env_error"  # the status of an episode whose environment, not its agent, failed
ABORTED = "aborted"  # the status of an episode ended by `abort`


def describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


class EpisodeBase(abc.ABC):
    """The `Episode` life cycle, once for every benchmark. A benchmark's episode writes its hooks:

        _open()             the task's resource (a database, a session, a workspace); may raise
        _prepare()          what to set up on the open resource (optional); may raise
        initial_messages()  the context the episode opens with (called after `_open`)
        _step(text)         one reply, already counted and appended to the history: record it in
                            `_turns`, answer it (`_tell`) or end the episode (`_finish`)
        _collect()          what scoring needs from the resource before it closes (optional)
        _score()            the result: `_record(...)` with the benchmark's own keys

    and extends `_clear` with its own per-episode state. The base owns `info`, the started guard,
    turn counting, the reply's coercion to text, `env_error` for a resource that fails to open or a
    step that raises, abort, the format-retry budget, and closing the resource on every path out
    (also from `__del__`); a failure to close is recorded as the episode's error.
    """

    prefix_len: int  # opening messages that context management never drops
    open_failure: str  # the error's lead when `_open` or `_prepare` raises: "opening the workspace failed"
    close_failure: str  # ... when closing the resource raises
    collect_failure = "ending the episode failed"  # ... when `_collect` raises (the status becomes env_error)

    def __init__(self, task: Task, spec: harness.HarnessSpec, *, sample_index: int = 0):
        self.task, self.spec = task, spec.validate()
        self.info: dict[str, Any] = {
            "task_id": task.task_id, "type": task.type, "harness": spec.name, "task": task,
            "episode_id": new_episode_id(f"{task.task_id}/{spec.name}"), "sample_index": sample_index,
        }
        self._resource = None
        self._started = False
        self._clear()

    def _clear(self) -> None:
        self._history: list[Message] = []
        self._turns: list[TurnRecord] = []
        self._turn = self._format_retries = 0
        self._done = False
        self._status: str | None = None
        self._abort_reason: str | None = None
        self._error: str | None = None
        self._result: dict | None = None
        self._t0 = time.perf_counter()

    # ------------------------------------------------------------------ hooks

    @abc.abstractmethod
    def _open(self) -> Any:
        """The task's resource, with a `close()`."""

    def _prepare(self) -> None:
        """Sets up what the episode needs on the open resource (`self._resource`)."""

    @abc.abstractmethod
    def initial_messages(self) -> list[Message]:
        """The messages the episode opens with."""

    @abc.abstractmethod
    def _step(self, text: str) -> None:
        """Acts on one reply (see the class docstring)."""

    def _collect(self) -> None:
        """Takes what `_score` needs from the resource, which closes right after."""

    @abc.abstractmethod
    def _score(self) -> dict[str, Any]:
        """The episode's result, once the resource is closed."""

    def _context(self) -> list[Message]:
        """The context the model sees: the history under the harness's context management."""
        return harness.select_context(self._history, self.prefix_len, self.spec.knob("context"),
                                 self.spec.knob("context_last_n"))

    # ------------------------------------------------------------------ Episode protocol

    def reset(self) -> None:
        self._close()
        self._clear()
        self._started = True
        failure = None
        try:
            self._resource = self._open()
            self._prepare()
        except Exception as e:  # the environment, not the agent, failed
            failure = f"{self.open_failure}: {describe(e)}"
        self._history = self.initial_messages()
        if failure is not None:
            self._finish(ENV_ERROR, error=failure)

    def messages(self) -> list[Message]:
        self._require_started()
        return self._context()

    @property
    def done(self) -> bool:
        return self._done

    @property
    def turn(self) -> int:
        return self._turn

    def step(self, action_text: str) -> None:
        self._require_started()
        if self._done:
            raise RuntimeError(f"{self.info['episode_id']}: step() after the episode ended; check `done` first")
        text = action_text if isinstance(action_text, str) else ("" if action_text is None else str(action_text))
        self._turn += 1
        self._history.append({"role": "assistant", "content": text})
        try:
            self._step(text)
        except Exception as e:
            self._finish(ENV_ERROR, error=describe(e))

    def abort(self, reason: str) -> None:
        if not self._done:
            self._abort_reason = str(reason)
            self._finish(ABORTED)

    def result(self) -> dict[str, Any]:
        if not self._done:
            raise RuntimeError(f"{self.info['episode_id']}: result() before the episode ended")
        return self._result

    # ------------------------------------------------------------------ for the hooks

    def _tell(self, text: str) -> None:
        """Shows the model `text` (an observation or the harness's feedback) as the next user message."""
        self._history.append({"role": "user", "content": text})

    def _retries_format(self) -> bool:
        """Whether the harness answers this malformed reply with format feedback (`on_malformed=retry`,
        budget left; the retry is counted) rather than ending the episode."""
        if self.spec.knob("on_malformed") == "retry" and self._format_retries < self.spec.knob("max_format_retries"):
            self._format_retries += 1
            return True
        return False

    def _finish(self, status: str, error: str | None = None) -> None:
        """Ends the episode: collect, close the resource, score."""
        self._status = status
        self._error = error or self._error
        try:
            self._collect()
        except Exception as e:
            self._status, self._error = ENV_ERROR, f"{self.collect_failure}: {describe(e)}"
        finally:
            self._close()
            self._done = True
        self._result = self._score()

    def _record(self, *, success: bool, failure_mode: str, answer: Any, **extra) -> dict[str, Any]:
        """The result: the keys every benchmark shares (`RESULT_KEYS` and more), then `extra`, then
        the turn records."""
        return {
            "task_id": self.task.task_id, "type": self.task.type, "harness": self.spec.name,
            "sample_index": self.info["sample_index"], "success": bool(success), "reward": 1.0 if success else 0.0,
            "failure_mode": failure_mode, "status": self._status, "abort_reason": self._abort_reason,
            "error": self._error, "answer": answer, "num_turns": self._turn,
            "actions": [t.kind for t in self._turns], **extra, "turns": [t.to_json() for t in self._turns],
        }

    def _close(self) -> None:
        resource, self._resource = self._resource, None
        if resource is not None:
            try:
                resource.close()
            except Exception as e:
                self._error = self._error or f"{self.close_failure}: {describe(e)}"

    def _require_started(self) -> None:
        if not self._started:
            raise RuntimeError(f"{self.info['episode_id']}: call reset() before messages()/step()")

    def __del__(self):
        try:
            self._close()
        except Exception:
            pass
