"""Rescue of all-fail groups (hsjax/harness_s/rescue.py): the baseline rescuers' choices, which groups
are planned for rescue, and the rescue step's rollouts and outcome records, with a stub runner and with
scripted DBBench agents."""
import dataclasses
import types

from harness_envs.dbbench.agents import NoisyAgent, OracleAgent
from harness_envs.registry import make_benchmark
from hsjax.harness_s import rescue
from hsjax.policies.base import SamplingParams
from hsjax.rollout.runner import EpisodeRunner, Job

POOL = [types.SimpleNamespace(name=f"sib{i}") for i in range(6)]


@dataclasses.dataclass
class FakeTraj:
    result: dict
    num_generated_tokens: int = 0


def group(*rewards, mode="wrong_answer"):
    return [FakeTraj({"reward": r, "success": r >= 1.0, "failure_mode": mode}) for r in rewards]


class StubRunner:
    """Answers each job with a trajectory whose reward is `reward_of(job)`; records the jobs."""

    def __init__(self, reward_of):
        self.reward_of, self.calls = reward_of, []

    def run(self, jobs, sampling):
        self.calls.append((list(jobs), sampling))
        return [FakeTraj({"reward": self.reward_of(job), "num_turns": 3}, num_generated_tokens=7) for job in jobs]


TASKS = [types.SimpleNamespace(task_id=f"t{g}", type=f"kind{g}") for g in range(3)]


# ---------------------------------------------------------------------------------------------
# The baseline rescuers


# Building each kind by name from the config, and its errors: tests/harness_s/test_rescue_kinds.py.


def test_random_siblings_are_distinct_and_a_pure_function_of_seed_step_and_group():
    rescuer = rescue.RandomSiblings(POOL, k=3, seed=1)
    picks = {(step, g): rescuer.choose(step, g, None, []) for step in range(4) for g in range(4)}
    assert all(len(p) == 3 and len({s.name for s in p}) == 3 for p in picks.values())
    # Asking again, in another order and from a fresh rescuer, gives the same choices (resume-safe).
    again = rescue.RandomSiblings(POOL, k=3, seed=1)
    assert all(again.choose(step, g, None, []) == picks[step, g] for step, g in reversed(list(picks)))
    # The choices vary across decisions and seeds.
    assert len({tuple(s.name for s in p) for p in picks.values()}) > 1
    other = rescue.RandomSiblings(POOL, k=3, seed=2)
    assert any(other.choose(step, g, None, []) != picks[step, g] for step, g in picks)


def test_the_base_rescuer_keeps_no_state_and_logs_nothing():
    rescuer = rescue.NoRescue()
    rescuer.observe(0, [{"harness": "sib0", "success": True}])
    rescuer.load_state_dict({"anything": 1})
    assert rescuer.choose(0, 0, None, []) == [] and rescuer.drain_log() == []
    assert rescuer.metrics() == {} and rescuer.state_dict() == {}


# ---------------------------------------------------------------------------------------------
# Planning and running the rescue step


def test_success_is_a_reward_at_or_above_the_threshold():
    assert rescue.is_success({"reward": 1.0}, 1.0) and rescue.is_success({"reward": 0.5}, 0.5)
    assert not rescue.is_success({"reward": 0.49}, 0.5) and not rescue.is_success({}, 0.1)


def test_dominant_failure_mode_breaks_ties_by_name():
    assert rescue.dominant_failure_mode([{"failure_mode": "wrong_answer"},
                                         {"failure_mode": "malformed_action"}]) == "malformed_action"
    assert rescue.dominant_failure_mode([{"failure_mode": m} for m in
                                         ("turn_limit", "wrong_answer", "wrong_answer")]) == "wrong_answer"


def test_plan_rescue_takes_only_groups_where_every_base_result_is_below_the_threshold():
    rescuer = rescue.FixedSiblings(POOL[:2])
    groups = [group(0.0, 0.0), group(0.0, 1.0), group(0.4, 0.6)]
    plan = rescue.plan_rescue(0, TASKS, groups, rescuer, threshold=1.0)
    assert plan == [(0, POOL[0]), (0, POOL[1]), (2, POOL[0]), (2, POOL[1])]
    # A lower threshold counts 0.6 as a success, so the third group is no longer all-fail.
    assert [g for g, _ in rescue.plan_rescue(0, TASKS, groups, rescuer, threshold=0.5)] == [0, 0]
    assert rescue.plan_rescue(0, TASKS, groups, rescue.NoRescue(), threshold=1.0) == []


def test_the_rescuer_sees_the_step_group_task_and_failed_results():
    seen = []

    class Recording(rescue.Rescuer):
        k = 1

        def choose(self, step, group_index, task, failed_results):
            seen.append((step, group_index, task.task_id, [r["reward"] for r in failed_results]))
            return [POOL[group_index]]

    groups = [group(0.0, 0.2), group(1.0, 1.0), group(0.1, 0.0)]
    assert rescue.plan_rescue(7, TASKS, groups, Recording(), threshold=1.0) == [(0, POOL[0]), (2, POOL[2])]
    assert seen == [(7, 0, "t0", [0.0, 0.2]), (7, 2, "t2", [0.1, 0.0])]


def test_rescue_rolls_m_episodes_per_chosen_sibling_in_one_runner_call():
    rescuer = rescue.FixedSiblings(POOL[:2])
    groups = [group(0.0, 0.0, mode="malformed_action"), group(1.0, 0.0), group(0.0, 0.0)]
    runner = StubRunner(lambda job: 1.0 if job.spec is POOL[1] else 0.0)
    sampling = SamplingParams(max_new_tokens=5)
    rescued, outcomes = rescue.rescue_failed_groups(3, TASKS, groups, rescuer, runner, sampling, m=2, threshold=1.0)
    (jobs, used), = runner.calls
    assert used is sampling
    assert [(j.spec.name, j.task.task_id, j.sample_index) for j in jobs] == [
        ("sib0", "t0", 0), ("sib0", "t0", 1), ("sib1", "t0", 0), ("sib1", "t0", 1),
        ("sib0", "t2", 0), ("sib0", "t2", 1), ("sib1", "t2", 0), ("sib1", "t2", 1)]
    assert [len(r) for r in rescued] == [4, 0, 4]
    assert [name for _, name in rescued[0]] == ["sib0", "sib0", "sib1", "sib1"]
    assert rescued[0][2][0] is not rescued[0][3][0]
    assert outcomes[0] == {"harness": "sib0", "task_type": "kind0", "task_id": "t0",
                           "base_failure_mode": "malformed_action", "success": False, "num_turns": 3,
                           "num_tokens": 7}
    assert [o["success"] for o in outcomes] == [False, False, True, True] * 2
    assert [o["task_id"] for o in outcomes] == ["t0"] * 4 + ["t2"] * 4


def test_rescue_follows_a_given_plan_and_skips_the_runner_when_there_is_nothing_to_do():
    runner = StubRunner(lambda job: 0.0)
    groups = [group(0.0), group(0.0), group(0.0)]
    rescued, outcomes = rescue.rescue_failed_groups(0, TASKS, groups, rescue.NoRescue(), runner, None, m=1,
                                                    threshold=1.0, plan=[(1, POOL[4])])
    assert [[name for _, name in r] for r in rescued] == [[], ["sib4"], []]
    assert [o["harness"] for o in outcomes] == ["sib4"]
    runner.calls.clear()
    assert rescue.rescue_failed_groups(0, TASKS, groups, rescue.NoRescue(), runner, None, m=1,
                                       threshold=1.0) == ([[], [], []], [])
    assert runner.calls == []


def test_fixed_sibling_rescues_all_fail_dbbench_groups_only():
    # Scripted DBBench agents: every base episode of the slipping agent is malformed, and the
    # lenient-parse sibling accepts its replies.
    bench = make_benchmark("dbbench", backend={"kind": "sqlite"})
    pool = bench.load_pool(None)
    tasks = bench.load_split("standard_train", seed=0, limit=24)[:2]
    sampling = SamplingParams(max_new_tokens=24, seed=0)
    runner = EpisodeRunner(bench.make_episode, NoisyAgent({"format_slip": 1.0}), sampling)
    groups = [runner.run([Job(pool.base, task, i) for i in range(2)]) for task in tasks]
    assert not any(t.result["success"] for trajs in groups for t in trajs)
    oracle = EpisodeRunner(bench.make_episode, OracleAgent(), sampling)
    groups[1] = oracle.run([Job(pool.base, tasks[1], i) for i in range(2)])
    before = runner.rollouts
    rescued, outcomes = rescue.rescue_failed_groups(0, tasks, groups, rescue.FixedSiblings([pool["lenient_parse"]]),
                                                    runner, sampling, m=2, threshold=1.0)
    assert [len(r) for r in rescued] == [2, 0]  # only the all-fail group is re-rolled, m=2 times
    assert runner.rollouts - before == 2
    assert all(t.result["success"] and name == "lenient_parse" for t, name in rescued[0])
    assert [o["harness"] for o in outcomes] == ["lenient_parse"] * 2
    assert all(o["success"] and o["base_failure_mode"] == "malformed_action" for o in outcomes)
