"""Eval writes finished episodes batch by batch; a run stopped by its policy keeps them, and the
same command run again runs only the rest."""
import json

import pytest

from harness_envs.dbbench.benchmark import DBBench
from hsjax import builders
from hsjax.infra import experiments
from hsjax.infra.episode_log import EpisodeLog, fingerprint
from hsjax.infra.errors import UserError
from hsjax.modes import evaluate
from hsjax.policies.base import PolicyError


class CountingPolicy:
    """DBBench's oracle agent, counting the episodes it is asked for; it raises `PolicyError` (as a
    policy whose endpoint went down does) on the first call after `fail_after` contexts."""

    def __init__(self, fail_after=None):
        self.agent = DBBench().make_agent("oracle", seed=0)
        self.fail_after, self.contexts, self.tasks = fail_after, 0, set()

    def chat(self, contexts, sampling, infos=None):
        if self.fail_after is not None and self.contexts >= self.fail_after:
            raise PolicyError("endpoint http://127.0.0.1:9/v1 is down: 16 requests failed in a row")
        self.contexts += len(contexts)
        self.tasks.update(info["task_id"] for info in infos)
        return self.agent.chat(contexts, sampling, infos)


def eval_config(tmp_path):
    config = experiments.load("dbbench").get_config("eval")
    config.limit = 10
    config.runner.batch_size = 4
    config.lock()
    return config


def test_a_stopped_eval_keeps_its_batches_and_resumes(tmp_path, monkeypatch):
    config = eval_config(tmp_path)
    down = CountingPolicy(fail_after=8)  # the oracle answers in one turn: batches 1 and 2 finish
    monkeypatch.setattr(builders, "make_policy", lambda *a, **k: down)
    with pytest.raises(UserError, match="8 finished episodes are kept"):
        evaluate.main(config, str(tmp_path))
    log_path = tmp_path / "eval" / "dbbench.episodes.jsonl"
    assert len(log_path.read_text().splitlines()) == 1 + 8
    assert not (tmp_path / "eval" / "dbbench.json").exists()

    up = CountingPolicy()
    monkeypatch.setattr(builders, "make_policy", lambda *a, **k: up)
    out = evaluate.main(config, str(tmp_path))
    assert len(up.tasks) == 2 and not up.tasks & down.tasks  # only the two unfinished episodes ran
    data = json.loads((tmp_path / "eval" / "dbbench.json").read_text())
    assert [e["success"] for e in data["episodes"]] == [True] * 10
    assert len({e["task_id"] for e in data["episodes"]}) == 10
    assert out["summary"]["base"]["overall_cat_accuracy"] == 1.0
    assert not log_path.exists()  # removed once the result is written: a later run starts afresh


def test_the_log_refuses_another_config_and_drops_a_torn_line(tmp_path):
    log = EpisodeLog(tmp_path / "e.jsonl", "abc")
    log.start({})
    log.append({0: {"x": 1}, 1: {"x": 2}})
    with open(log.path, "a") as f:
        f.write('{"job": 2, "rec')  # killed mid-write
    assert log.load() == {0: {"x": 1}, 1: {"x": 2}}
    with pytest.raises(UserError, match="another config"):
        EpisodeLog(log.path, "def").load()


def test_fingerprint_ignores_only_the_named_keys():
    a = {"policy": {"kind": "http", "base_url": "http://a"}, "runner": {"batch_size": 4}, "limit": 3}
    b = {"policy": {"kind": "http", "base_url": "http://b"}, "runner": {"batch_size": 8}, "limit": 3}
    ignore = ("policy.base_url", "runner")
    assert fingerprint(a, ignore) == fingerprint(b, ignore)
    assert fingerprint(a, ignore) != fingerprint({**a, "limit": 4}, ignore)
    assert fingerprint(a) != fingerprint(b)
