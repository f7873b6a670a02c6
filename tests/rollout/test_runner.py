"""The one episode runner: jobs in order, batches, rollouts counted, progress, records."""
import json

import numpy as np

from harness_envs.dbbench.agents import NoisyAgent, OracleAgent
from harness_envs.dbbench.benchmark import DBBench
from hsjax.policies.base import SamplingParams
from hsjax.policies.jax_policy import JaxPolicy
from hsjax.rollout.runner import EpisodeRunner, Job, episode_record
from tests.rollout.test_rollout import tiny_model, tokenizer  # noqa: F401


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


class FlakyEnvironments:
    """`bench` whose episodes of the tasks in `failures` ({task id: times}; an int: every task) fail
    to open that many times: a sandbox that does not start under load (or, with a large count, a
    broken task). Everything else is `bench`'s."""

    def __init__(self, bench, failures):
        self.bench, self.failures, self.opened = bench, failures, {}

    def __getattr__(self, name):
        return getattr(self.bench, name)

    def make_episode(self, task, spec, **kwargs):
        episode = self.bench.make_episode(task, spec, **kwargs)
        seen = self.opened.get(task.task_id, 0)
        self.opened[task.task_id] = seen + 1
        times = self.failures if isinstance(self.failures, int) else self.failures.get(task.task_id, 0)
        if seen < times:
            def fail():
                raise OSError("the sandbox did not start")
            episode._open = fail
        return episode


def test_an_environment_failure_is_run_again_with_its_own_seed_and_one_that_persists_is_kept():
    bench = DBBench()
    base = bench.load_pool().base
    tasks = bench.load_split("dev", limit=6)
    jobs = [Job(base, t, i) for i, t in enumerate(tasks)]
    agent = NoisyAgent({"format_slip": 0.4, "skip_schema": 0.4}, seed=3)
    clean = EpisodeRunner(bench.make_episode, agent, SamplingParams(), batch_size=4).results(jobs)
    # Task 1 fails twice (a transient failure, within the two re-runs), task 4 three times (it persists).
    flaky = FlakyEnvironments(bench, {tasks[1].task_id: 2, tasks[4].task_id: 3})
    runner = EpisodeRunner(flaky.make_episode, agent, SamplingParams(), batch_size=4, env_retries=2)
    got = runner.results(jobs)
    strip = lambda r: {k: v for k, v in r.items() if k != "env_reruns"}
    assert [strip(r) for i, r in enumerate(got) if i != 4] == [r for i, r in enumerate(clean) if i != 4]
    assert got[1]["env_reruns"] == 2 and got[4]["env_reruns"] == 2
    assert "env_reruns" not in got[0]
    assert got[4]["status"] == "env_error" and "the sandbox did not start" in got[4]["error"]
    assert runner.rollouts == 6 and runner.env_reruns == 4 and runner.env_failures == 1
    assert flaky.opened[tasks[1].task_id] == 3 and flaky.opened[tasks[0].task_id] == 1
    # Without re-runs (the default of a bare runner) the failures are returned as they came.
    flaky = FlakyEnvironments(bench, {tasks[1].task_id: 1})
    once = EpisodeRunner(flaky.make_episode, agent, SamplingParams()).results(jobs)
    assert once[1]["status"] == "env_error" and flaky.opened[tasks[1].task_id] == 1


class Bar(Counter):
    """A progress bar as the runner uses it: `update(n)` and a `total`."""

    def __init__(self, total):
        super().__init__()
        self.total = total


class StepRaises:
    """An episode whose `step` raises: an environment bug outside the episode's own error handling,
    which the engine ends as `env_error` (the episode's status says `aborted`)."""

    def __init__(self, episode):
        self.episode = episode

    def __getattr__(self, name):
        return getattr(self.episode, name)

    def step(self, text):
        raise OSError("the database went away")


def test_a_re_run_is_announced_counted_by_the_bar_and_an_engine_abort_is_an_environment_failure():
    bench = DBBench()
    base = bench.load_pool().base
    tasks = bench.load_split("dev", limit=4)
    jobs = [Job(base, t) for t in tasks]
    clean = EpisodeRunner(bench.make_episode, OracleAgent(), SamplingParams()).results(jobs)
    flaky = FlakyEnvironments(bench, {tasks[0].task_id: 1, tasks[3].task_id: 2})
    made = []

    def make_episode(task, spec, **kwargs):  # task 2's first episode raises in its first step
        made.append(task.task_id)
        episode = flaky.make_episode(task, spec, **kwargs)
        return StepRaises(episode) if made.count(task.task_id) == 1 and task is tasks[2] else episode

    announced, bar = [], Bar(total=len(jobs))
    runner = EpisodeRunner(make_episode, OracleAgent(), SamplingParams(), batch_size=2, env_retries=2,
                           progress=bar, on_rerun=lambda traj: announced.append((traj.result["task_id"], traj.episode_id)))
    got = runner.results(jobs)
    strip = lambda r: {k: v for k, v in r.items() if k != "env_reruns"}
    assert [strip(r) for r in got] == clean
    assert [task_id for task_id, _ in announced] == [tasks[0].task_id, tasks[2].task_id, tasks[3].task_id,
                                                     tasks[3].task_id]
    assert all(episode_id for _, episode_id in announced)
    # The bar counts every episode run, the re-runs too, and ends full.
    assert bar.total == len(jobs) + 4 and sum(bar.updates) == bar.total
    assert runner.rollouts == 4 and runner.env_reruns == 4 and runner.env_failures == 0


def test_a_token_policy_re_runs_a_failed_environment_to_the_tokens_it_would_have_sampled(tiny_model, tokenizer):
    # A random tiny model sampled at temperature 1: any other seed gives other tokens.
    cfg, params = tiny_model
    bench = DBBench()
    base = bench.load_pool().base
    tasks = bench.load_split("dev", limit=4)
    jobs = [Job(base, t) for t in tasks]
    sampling = SamplingParams(temperature=1.0, max_new_tokens=8)

    def tokens(make_episode, retries):
        policy = JaxPolicy(cfg, params, tokenizer, seed=0, batch_buckets=(8,))
        trajs = EpisodeRunner(make_episode, policy, sampling, env_retries=retries).run(jobs)
        return [np.concatenate([s.tokens for s in t.segments]).tolist() for t in trajs]

    clean = tokens(bench.make_episode, 0)
    flaky = FlakyEnvironments(bench, {tasks[2].task_id: 1})
    assert tokens(flaky.make_episode, 1) == clean and flaky.opened[tasks[2].task_id] == 2


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
