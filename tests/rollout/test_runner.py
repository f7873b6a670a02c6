"""The one episode runner: jobs in order, batches, rollouts counted, progress, records."""
import json

from harness_envs.dbbench.agents import NoisyAgent, OracleAgent
from harness_envs.dbbench.benchmark import DBBench
from hsjax.policies.base import SamplingParams
from hsjax.rollout.runner import EpisodeRunner, Job, episode_record


class Counter:
    def __init__(self):
        self.updates = []

    def update(self, n):
        self.updates.append(n)


def test_jobs_run_in_order_in_batches_and_are_counted():
    bench = DBBench()
    pool = bench.load_pool()
    tasks = bench.load_split("dev", limit=5)
    progress = Counter()
    runner = EpisodeRunner(bench.make_episode, OracleAgent(), SamplingParams(), batch_size=2, progress=progress)
    jobs = [Job(spec, t, i) for spec in (pool.base, pool["lenient_parse"]) for i, t in enumerate(tasks)]
    trajs = runner.run(jobs)
    assert [(t.result["harness"], t.result["task_id"], t.result["sample_index"]) for t in trajs] == \
        [(j.spec.name, j.task.task_id, j.sample_index) for j in jobs]
    assert progress.updates == [2, 2, 2, 2, 2] and runner.rollouts == 10 and runner.seconds > 0
    assert all(t.episode_id and t.result["num_tokens"] is None for t in trajs)  # a chat policy counts no tokens
    assert runner.results(jobs[:3]) == [t.result for t in trajs[:3]] and runner.rollouts == 13


def test_a_scripted_agent_replays_its_slips_per_sample_index():
    bench = DBBench()
    base = bench.load_pool().base
    tasks = bench.load_split("dev", limit=10)
    runner = EpisodeRunner(bench.make_episode, NoisyAgent({"format_slip": 0.5}, seed=1), SamplingParams())
    first = [r["failure_mode"] for r in runner.results([Job(base, t, 3) for t in tasks])]
    again = [r["failure_mode"] for r in runner.results([Job(base, t, 3) for t in tasks])]
    assert first == again and "malformed_action" in first and "success" in first


def test_episode_record_is_json_without_the_task_object():
    bench = DBBench()
    base = bench.load_pool().base
    (traj,) = EpisodeRunner(bench.make_episode, OracleAgent(), SamplingParams()).run(
        [Job(base, bench.load_split("dev", limit=1)[0])])
    record = episode_record(traj)
    assert "task" not in record and record["replies"] == [t["text"] for t in traj.turns]
    assert set(record) >= {"task_id", "type", "harness", "success", "failure_mode", "num_generated_tokens",
                           "abort_reason", "timings", "sample_index"}
    assert json.loads(json.dumps(record)) == record
