"""`DBBenchEpisode`: one DBBench task under one harness: the hooks of
`harness_envs.base.EpisodeBase`, which owns the `Episode` life cycle.

The episode opens its own database on `reset()` and closes it as soon as it ends (also when a step
raises). Scoring follows AgentBench v0.2: INSERT/UPDATE by the table hash taken at the end, whatever
the reason the episode ended; the SELECT family by the (normalized) final answer. A statement that
grows the database past the backend's size limit (`max_db_mb`) ends the episode: its observation
(MySQL's error 1114, naming the limit) is recorded and the status is `db_size_limit`.
"""
from __future__ import annotations

from typing import Any

from harness_envs import harness
from harness_envs.base import ENV_ERROR, EpisodeBase, describe
from harness_envs.dbbench import answers, evaluator, taxonomy
from harness_envs.dbbench import harness as dbbench_harness
from harness_envs.dbbench.data import DBTask, is_modification
from harness_envs.dbbench.taxonomy import ActionRecord

PREFIX_LEN = 3  # instruction, "Ok.", question: never dropped by context management
# The page note needs room inside obs_max_chars.
_PAGE_NOTE_RESERVE = 80


class DBBenchEpisode(EpisodeBase):
    """One task under one harness. `backend` is a `harness_envs.dbbench.backends.Backend`."""

    prefix_len = PREFIX_LEN
    open_failure = "opening the episode database failed"
    close_failure = "closing the episode database failed"

    def __init__(self, task: DBTask, spec: harness.HarnessSpec, backend, *, sample_index: int = 0,
                 rule: str = "v0.2"):
        self.backend = backend
        self.rule = rule
        self._modification = is_modification(task)
        super().__init__(task, spec, sample_index=sample_index)

    def _clear(self) -> None:
        super()._clear()
        self._rounds = 0
        self._verified = False
        self._answer: str | None = None
        self._initial_hash: str | None = None
        self._final_hash: str | None = None
        self._page_sql: str | None = None
        self._page_next: int | None = None

    @property
    def _db(self):
        """The episode's database, open from `reset()` until the episode ends."""
        return self._resource

    # ------------------------------------------------------------------ opening

    def _open(self):
        return self.backend.open(self.task)

    def _prepare(self) -> None:
        if self._modification:
            self._initial_hash = self._db.table_hash()

    def initial_messages(self) -> list[dict]:
        return dbbench_harness.initial_messages(self.spec, self.task.question, self.task.add_description)

    # ------------------------------------------------------------------ one reply

    def _step(self, text: str) -> None:
        spec = self.spec
        action = dbbench_harness.parse_action(text, spec)
        if self._rounds >= spec.knob("max_rounds"):
            # The budget is spent: as published, only a final answer somewhere in this reply counts.
            answer = action.answer if action.kind == "answer" else dbbench_harness.find_answer(text, spec)
            self._turns.append(ActionRecord(kind=action.kind, reply=text, sql=action.sql, error=action.error))
            if answer:
                self._answer = answer
                self._finish("answered")
            else:
                self._finish("turn_limit")
            return
        if action.kind == "sql":
            self._execute(text, action.sql)
        elif action.kind == "answer":
            if self._needs_verification(action.answer):
                self._verified = True
                self._turns.append(ActionRecord(kind="answer", reply=text, feedback="verify",
                                                observation=dbbench_harness.VERIFY_PROMPT))
                self._tell(dbbench_harness.VERIFY_PROMPT)
            else:
                self._turns.append(ActionRecord(kind="answer", reply=text))
                self._answer = action.answer
                self._finish("answered")
        else:
            if self._retries_format():
                feedback = dbbench_harness.FORMAT_FEEDBACK.format(error=action.error)
                self._turns.append(ActionRecord(kind="malformed", reply=text, error=action.error,
                                                feedback="format_retry", observation=feedback))
                self._tell(feedback)
            else:
                self._turns.append(ActionRecord(kind="malformed", reply=text, error=action.error))
                self._finish("malformed")

    def _needs_verification(self, answer: str | None) -> bool:
        """One verification prompt per episode, for an answer given before any successful statement
        or (SELECT family) an empty answer after normalization."""
        if not self.spec.knob("verify_before_answer") or self._verified:
            return False
        if not taxonomy.any_successful_statement(self._turns):
            return True
        if self._modification:
            return False
        return answers.is_empty_answer(answers.normalize_answer(answer, self.spec.knob("answer_normalization")))

    def _execute(self, text: str, sql: str) -> None:
        spec = self.spec
        res = self._db.execute(sql)
        self._rounds += 1
        max_chars = spec.knob("obs_max_chars")
        page_rows = spec.knob("obs_page_rows")
        rows = list(res.rows) if res.ok and res.rows is not None else None
        if page_rows and rows and (len(rows) > page_rows or len(res.text) > max_chars):
            offset = self._page_next if (sql == self._page_sql and self._page_next is not None) else 0
            page, nxt = harness.paginate(rows, offset, page_rows, max(1, max_chars - _PAGE_NOTE_RESERVE))
            body, truncated = harness.truncate(str(page), max_chars)
            obs = body + "\n" + dbbench_harness.page_note(offset + 1, offset + len(page), len(rows), nxt is not None)
            self._page_sql, self._page_next = (sql, nxt) if nxt is not None else (None, None)
        else:
            obs, truncated = harness.truncate(res.text if isinstance(res.text, str) else str(res.text), max_chars)
            self._page_sql = self._page_next = None
        truncated = truncated or bool(getattr(res, "truncated", False))  # the backend's row/byte caps
        if not res.ok and spec.knob("schema_reminder_on_error"):
            obs += "\n" + dbbench_harness.schema_reminder(self.task.table.name, self.task.table.columns)
        self._turns.append(ActionRecord(kind="sql", reply=text, sql=sql, ok=bool(res.ok), error=res.error,
                                        observation=obs, obs_chars=len(obs), truncated=truncated))
        self._tell(obs)
        if getattr(res, "size_limit", False):
            self._finish("db_size_limit", error=res.error)

    # ------------------------------------------------------------------ ending

    def _collect(self) -> None:
        """The table hash scores a modification whatever ended the episode; a failure to take it
        leaves the status as it is (the episode then scores as not changed)."""
        if self._modification and self._db is not None:
            try:
                self._final_hash = self._db.table_hash()
            except Exception as e:
                self._error = self._error or f"hashing the table failed: {describe(e)}"

    def _score(self) -> dict[str, Any]:
        norm_mode = self.spec.knob("answer_normalization")
        answer = answers.normalize_answer(self._answer, norm_mode)
        correct_if_normalized = False
        if self._modification:
            success = self._final_hash is not None and evaluator.is_correct(
                self.task, answer, self._final_hash, rule=self.rule)
        else:
            success = self._status == "answered" and evaluator.is_correct(self.task, answer, None, rule=self.rule)
            if not success and self._status == "answered":
                strip = answers.normalize_answer(self._answer, "strip")
                correct_if_normalized = evaluator.is_correct(self.task, strip, None, rule=self.rule)
        table_changed = None
        if self._modification and self._initial_hash is not None and self._final_hash is not None:
            table_changed = self._final_hash != self._initial_hash
        outcome = {
            "status": self._status,
            "abort_reason": self._abort_reason,
            "success": success,
            "is_modification": self._modification,
            "table_changed": table_changed,
            "correct_if_normalized": correct_if_normalized,
        }
        if self._status == ENV_ERROR:
            success = outcome["success"] = False
        failure_mode = taxonomy.assign(self._turns, outcome)
        sql_turns = [t for t in self._turns if t.kind == "sql" and t.ok is not None]  # executed
        return self._record(
            success=success, failure_mode=failure_mode, answer=answer, raw_answer=self._answer,
            num_statements=len(sql_turns), sql_errors=sum(1 for t in sql_turns if not t.ok),
            table_changed=table_changed, table_hash=self._final_hash)
