"""EpisodeBase: the life cycle every benchmark's episode inherits, on a toy episode whose resource
and hooks can be made to fail."""
import dataclasses

import pytest

from harness_envs.base import RESULT_KEYS, Episode, EpisodeBase, TurnRecord, check_result
from harness_envs.harness import KnobSchema


@dataclasses.dataclass
class Task:
    task_id: str = "t1"
    type: str = "toy"
    question: str = "say done"


class Resource:
    def __init__(self, fail_close=False):
        self.closed, self.fail_close = False, fail_close

    def close(self):
        self.closed = True
        if self.fail_close:
            raise OSError("disk gone")


@dataclasses.dataclass
class EchoRecord(TurnRecord):
    reply: str = ""


class Toy(EpisodeBase):
    """`done` ends it, `boom` raises, anything else is malformed (format feedback while the budget lasts)."""

    prefix_len = 1
    open_failure = "opening the toy failed"
    close_failure = "closing the toy failed"
    collect_failure = "collecting failed"

    def __init__(self, spec, *, fail_open=False, fail_close=False, fail_collect=False):
        self.fail_open, self.fail_close, self.fail_collect = fail_open, fail_close, fail_collect
        self.opened = []
        super().__init__(Task(), spec, sample_index=2)

    def _open(self):
        if self.fail_open:
            raise ConnectionError("no server")
        self.opened.append(Resource(self.fail_close))
        return self.opened[-1]

    def initial_messages(self):
        return [{"role": "user", "content": self.task.question}]

    def _step(self, text):
        if text == "boom":
            raise ValueError("the tool crashed")
        self._turns.append(EchoRecord("done" if text == "done" else "malformed", reply=text))
        if text == "done":
            self._finish("answered")
        elif self._retries_format():
            self._tell("format, please")
        else:
            self._finish("malformed")

    def _collect(self):
        if self.fail_collect:
            raise RuntimeError("no verdict")

    def _score(self):
        ok = self._status == "answered"
        return self._record(success=ok, failure_mode="success" if ok else self._status, answer=None, own=1)


SPEC = KnobSchema("toy", {}).base()
RETRY = SPEC.schema.base(on_malformed="retry", max_format_retries=2)


def run(ep, replies):
    ep.reset()
    for reply in replies:
        if ep.done:
            break
        ep.step(reply)
    return ep.result()


def test_an_episode_runs_and_records_the_shared_keys():
    ep = Toy(RETRY)
    assert isinstance(ep, Episode)
    assert ep.info["task_id"] == "t1" and ep.info["sample_index"] == 2 and ep.info["episode_id"].startswith("t1/base#")
    with pytest.raises(RuntimeError, match="call reset"):
        ep.messages()
    r = run(ep, ["x", None, "done"])
    check_result(r)
    assert [k for k in r if k in RESULT_KEYS] == list(RESULT_KEYS)
    assert r["success"] and r["reward"] == 1.0 and r["num_turns"] == 3 and r["own"] == 1
    assert r["actions"] == ["malformed", "malformed", "done"] and r["turns"][1] == {"kind": "malformed", "reply": ""}
    assert ep.opened[-1].closed and list(r)[-1] == "turns"
    assert [m["content"] for m in ep.messages()] == ["say done", "x", "format, please", "", "format, please", "done"]
    with pytest.raises(RuntimeError, match="after the episode ended"):
        ep.step("again")


def test_format_retries_are_counted_against_the_budget():
    r = run(Toy(RETRY), ["a", "b", "c", "done"])
    assert r["status"] == "malformed" and r["num_turns"] == 3
    assert run(Toy(SPEC.schema.base(on_malformed="fail")), ["a", "done"])["num_turns"] == 1


@pytest.mark.parametrize("kind,status,error", [
    ("open", "env_error", "opening the toy failed: ConnectionError: no server"),
    ("step", "env_error", "ValueError: the tool crashed"),
    ("collect", "env_error", "collecting failed: RuntimeError: no verdict"),
    ("close", "answered", "closing the toy failed: OSError: disk gone"),
])
def test_environment_failures_end_the_episode_and_name_the_cause(kind, status, error):
    ep = Toy(SPEC, fail_open=kind == "open", fail_collect=kind == "collect", fail_close=kind == "close")
    r = run(ep, ["boom" if kind == "step" else "done"])
    assert ep.done and r["status"] == status and r["error"] == error
    assert all(res.closed for res in ep.opened)


def test_abort_reset_and_del_close_the_resource():
    ep = Toy(SPEC)
    ep.reset()
    first = ep.opened[-1]
    ep.reset()  # a second reset closes the first resource and starts afresh
    assert first.closed and not ep.opened[-1].closed and ep.turn == 0
    ep.abort("context_overflow")
    ep.abort("ignored: already done")
    r = ep.result()
    assert r["status"] == "aborted" and r["abort_reason"] == "context_overflow" and ep.opened[-1].closed
    ep = Toy(SPEC)
    ep.reset()
    resource = ep.opened[-1]
    ep.__del__()
    assert resource.closed
