"""DBBench episodes played over HTTP against hostile endpoints: a failure talking to the model ends
that episode (failure mode `policy_error`, the reason recorded) and the run goes on; an endpoint
that is plainly down stops the run at once with `EndpointDown`; every bound holds in wall time."""
import json
import time
import tracemalloc

import pytest

from harness_envs.dbbench.benchmark import DBBench
from hsjax.infra import experiments
from hsjax.llm.client import ChatClient, ClientSettings, LLMError
from hsjax.modes import evaluate
from hsjax.policies.base import EndpointDown, SamplingParams
from hsjax.policies.http_chat import HttpChatPolicy
from hsjax.rollout.runner import EpisodeRunner, Job, episode_record
from tests.faults.hostile import (dbbench_oracle, drip, hostile, huge, status,  # noqa: F401 (hostile: a fixture)
                                  truncated)

# Fault -> (behaviour for every request of its task, text the record's reason holds).
FAULTS = {
    "5xx": (status(500, {"error": "down"}), "HTTP 500"),
    "429_retry_after": (status(429, {"error": "slow down"}, {"Retry-After": "30"}), "HTTP 429"),
    "400": (status(400, {"error": "bad request"}), "HTTP 400 (not retried)"),
    "drip": (drip(every_s=0.05), "timed out after 0.5s"),
    "truncated": (truncated(), "connection error"),
    "huge": (huge(5 << 20), "reply too large"),
    "non_utf8": (status(200, b"\xff\xfe{\x80 not utf-8"), "malformed reply"),
    "no_choices": (status(200, {"error": "oops"}), "malformed reply"),
}
POLICY = dict(timeout=0.5, max_retries=1, backoff=0.01, max_backoff=0.05)


@pytest.fixture(scope="module")
def bench():
    with DBBench() as b:
        yield b


def test_each_fault_ends_its_own_episode_and_the_others_succeed(bench, hostile):
    tasks = bench.load_split("dev", limit=len(FAULTS) + 4)
    faulty = dict(zip([t.task_id for t in tasks], FAULTS))
    server = hostile(dbbench_oracle(tasks, {t: FAULTS[f][0] for t, f in faulty.items()}))
    policy = HttpChatPolicy(server.base_url, "m", **POLICY)
    runner = EpisodeRunner(bench.make_episode, policy, SamplingParams(max_new_tokens=256), batch_size=64)
    t0 = time.monotonic()
    records = [episode_record(t) for t in runner.run([Job(bench.load_pool().base, t) for t in tasks])]
    took = time.monotonic() - t0
    assert len(records) == len(tasks) and runner.rollouts == len(tasks)
    for record in records:
        fault = faulty.get(record["task_id"])
        if fault is None:
            assert record["failure_mode"] == "success", record
        else:
            assert record["failure_mode"] == "policy_error" and record["abort_reason"] == "policy_error", fault
            assert FAULTS[fault][1] in record["rollout_error"], (fault, record["rollout_error"])
    # Every faulty request is over within the client's worst case; the episodes run concurrently.
    worst = policy.client.settings.worst_case_s
    assert took <= worst + 3.0, took
    policy.close()


def test_an_endpoint_that_is_down_stops_the_run_at_once(bench, hostile):
    gone = hostile()
    gone.close()
    tasks = bench.load_split("dev", limit=40)
    policy = HttpChatPolicy(gone.base_url, "m", max_consecutive_failures=16, **POLICY)
    runner = EpisodeRunner(bench.make_episode, policy, SamplingParams(), batch_size=40)
    t0 = time.monotonic()
    with pytest.raises(EndpointDown, match=rf"{gone.base_url}/chat/completions looks down: 16 requests in a "
                                           r"row failed .*connection error"):
        runner.run([Job(bench.load_pool().base, t) for t in tasks])
    assert time.monotonic() - t0 < 3.0
    policy.close()


def test_eval_records_every_episode_when_one_task_always_fails(tmp_path, hostile, monkeypatch):
    config = experiments.get_config("dbbench", "eval")
    config.limit = 8
    with DBBench() as b:
        tasks = b.load_split(config.split, limit=config.limit)
    poisoned = tasks[3].task_id
    server = hostile(dbbench_oracle(tasks, {poisoned: status(400, {"error": "this one always fails"})}))
    config.policy.kind, config.policy.base_url, config.policy.model = "http", server.base_url, "m"
    config.policy.timeout = 2.0
    out = evaluate.main(config, str(tmp_path))
    data = json.loads(open(out["path"]).read())
    modes = {e["task_id"]: e["failure_mode"] for e in data["episodes"]}
    assert len(modes) == 8 and modes.pop(poisoned) == "policy_error"
    assert set(modes.values()) == {"success"}
    (bad,) = [e for e in data["episodes"] if e["task_id"] == poisoned]
    assert "HTTP 400 (not retried)" in bad["rollout_error"] and "this one always fails" in bad["rollout_error"]


def test_an_unannounced_huge_reply_is_never_held_whole(hostile):
    """32 MB of body without a Content-Length: the client stops reading past 4 MiB."""
    server = hostile(huge(32 << 20, announce=False))
    with ChatClient(ClientSettings(server.base_url, "m", timeout_s=10.0, max_retries=0)) as client:
        tracemalloc.start()
        try:
            with pytest.raises(LLMError) as e:
                client.complete([{"role": "user", "content": "hi"}])
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert e.value.reason == "too_large" and peak < 16 << 20, peak
