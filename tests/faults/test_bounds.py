"""Bounds on what an episode leaves behind: episode records cut huge texts with a marker
(`runner.max_record_chars`), so replies of megabytes never make an eval JSON of hundreds of MB."""
import json

from hsjax import builders
from hsjax.infra import experiments
from hsjax.infra.metrics import truncate_strings
from hsjax.modes import evaluate
from hsjax.policies.base import SamplingParams
from hsjax.rollout.runner import MAX_RECORD_CHARS, EpisodeRunner, Job, episode_record
from harness_envs.dbbench.benchmark import DBBench


class HugeReplies:
    """A chat policy whose every reply is a valid statement followed by `pad` characters."""

    def __init__(self, pad: int):
        self.pad = pad

    def chat(self, contexts, sampling, infos=None):
        return ["Action: Operation\n```sql\nSELECT 1\n```\n" + "x" * self.pad for _ in contexts]


def test_truncate_strings_keeps_the_head_and_names_the_cut():
    record = {"reply": "a" * 30, "turns": [{"observation": "b" * 5}, {"sql": "c" * 11}], "n": 3, "ok": None}
    cut = truncate_strings(record, 10)
    assert cut["reply"] == "a" * 10 + "…[truncated 20 chars]"
    assert cut["turns"] == [{"observation": "b" * 5}, {"sql": "c" * 10 + "…[truncated 1 chars]"}]
    assert cut["n"] == 3 and cut["ok"] is None
    assert truncate_strings(record, 0) == record and record["reply"] == "a" * 30  # pure


def test_a_record_of_huge_replies_stays_small():
    """16 replies of 1 MB each: the record keeps 20k characters of each string."""
    with DBBench() as bench:
        task = bench.load_split("dev", limit=1)[0]
        runner = EpisodeRunner(bench.make_episode, HugeReplies(1_000_000), SamplingParams())
        (traj,) = runner.run([Job(bench.load_pool().base, task)])
    assert len(traj.turns) == 16  # 15 statements, then the turn limit
    full = len(json.dumps(episode_record(traj, 0)))
    cut = json.dumps(episode_record(traj))
    assert full > 30_000_000 and len(cut) < 1_000_000, (full, len(cut))
    record = json.loads(cut)
    assert all(len(r) < MAX_RECORD_CHARS + 40 and r.endswith("chars]") for r in record["replies"])
    assert record["turns"][0]["reply"].startswith("Action: Operation\n```sql\nSELECT 1")
    assert record["failure_mode"] == traj.result["failure_mode"]


def test_eval_writes_records_cut_at_runner_max_record_chars(tmp_path, monkeypatch):
    config = experiments.get_config("dbbench", "eval")
    config.limit = 2
    config.runner.max_record_chars = 1000
    monkeypatch.setattr(builders, "make_policy", lambda *args, **kwargs: HugeReplies(30_000))
    out = evaluate.main(config, str(tmp_path))
    data = json.loads(open(out["path"]).read())
    replies = [r for e in data["episodes"] for r in e["replies"]]
    assert len(data["episodes"]) == 2 and replies
    marker = f"…[truncated {len(HugeReplies(30_000).chat([[]], None)[0]) - 1000} chars]"
    assert all(r.endswith(marker) and len(r) == 1000 + len(marker) for r in replies), replies[0][-40:]

