"""The training loop's host-side pieces with scripted agents: DAPO draws, rescue, re-rendering."""
import numpy as np
import pytest

from experiments import dbbench as dbbench_config
from harness_envs.dbbench.agents import NoisyAgent, OracleAgent
from hsjax.harness_s import rescue as rescue_lib
from hsjax.modes import train
from hsjax import builders as workload
from hsjax.rl.batch import GroupRollouts, pack
from hsjax.models.tokenizer import build_tiny_tokenizer
from hsjax.rollout.policy import ScriptedTokenPolicy
from hsjax.rollout.engine import collect


def config(*variants, **overrides):
    c = dbbench_config.get_config(",".join(("smoke",) + variants))
    c.data.limit = 24
    for key, value in overrides.items():
        node = c
        *path, leaf = key.split(".")
        for part in path:
            node = node[part]
        node[leaf] = value
    return c


def harness_ids(bench):
    return {name: i for i, name in enumerate(["base"] + [s.name for s in bench.siblings])}


def test_dapo_keeps_only_groups_with_reward_spread_and_caps_draws():
    c = config("dapo", **{"rollout.groups": 3, "rollout.n": 4, "dapo.max_draws": 3})
    bench = workload.make_workload(c)
    data = workload.TaskStream(bench.train_tasks, seed=0)
    # Each episode slips with probability 1/2, so groups of 4 are often mixed, sometimes uniform.
    agent = NoisyAgent({"format_slip": 0.5}, seed=3)
    tasks, groups, stats = train.draw_groups(data, 0, agent, bench, c, harness_ids(bench))
    assert stats["dapo/drawn_groups"] <= 3 * 3 and stats["dapo/drawn_groups"] % 3 == 0
    assert data.position == stats["dapo/drawn_groups"]
    assert len(tasks) == len(groups) <= 3
    for trajs in groups:
        assert train.group_reward_spread(trajs) > 0
    assert stats["dapo/dropped_groups"] + len(groups) <= stats["dapo/drawn_groups"]
    if len(groups) < 3:
        assert stats["dapo/drawn_groups"] == 9  # the cap ended the search


def test_dapo_with_an_oracle_drops_everything_after_max_draws():
    c = config("dapo", **{"rollout.groups": 2, "rollout.n": 2, "dapo.max_draws": 2})
    bench = workload.make_workload(c)
    data = workload.TaskStream(bench.train_tasks, seed=0)
    tasks, groups, stats = train.draw_groups(data, 0, OracleAgent(), bench, c, harness_ids(bench))
    assert tasks == [] and groups == []
    assert stats == {"dapo/drawn_groups": 4, "dapo/dropped_groups": 4}


def test_plain_draw_takes_the_next_tasks_in_stream_order():
    c = config("policy_only", **{"rollout.groups": 2, "rollout.n": 2})
    bench = workload.make_workload(c)
    expected = workload.TaskStream(bench.train_tasks, seed=0).next(2)
    tasks, groups, stats = train.draw_groups(workload.TaskStream(bench.train_tasks, seed=0), 0,
                                             OracleAgent(), bench, c, harness_ids(bench))
    assert [t.task_id for t in tasks] == [t.task_id for t in expected] and stats == {}
    assert all(t.result["success"] for trajs in groups for t in trajs)


def test_fixed_sibling_rescues_all_fail_groups_only():
    c = config("policy_only", **{"rollout.groups": 2, "rollout.n": 2, "rescue.m": 2})
    bench = workload.make_workload(c)
    ids = harness_ids(bench)
    lenient = next(s for s in bench.siblings if s.name == "lenient_parse")
    rescuer = rescue_lib.FixedSiblings([lenient])
    agent = NoisyAgent({"format_slip": 1.0})  # every base episode is malformed
    tasks = bench.train_tasks[:2]
    sampling = train.sampling_from_config(c.rollout, 0)
    groups = train.rollout_groups(tasks, bench.base, 2, agent, sampling, bench, c, ids["base"])
    assert not any(t.result["success"] for trajs in groups for t in trajs)
    groups[1] = train.rollout_groups(tasks[1:], bench.base, 2, OracleAgent(), sampling, bench, c,
                                     ids["base"])[0]
    rescued, outcomes = train.rescue_failed_groups(0, tasks, groups, rescuer, agent, bench, c, ids)
    assert [len(r) for r in rescued] == [2, 0]  # only the all-fail group is re-rolled, m=2 times
    assert all(t.result["success"] and h == ids["lenient_parse"] for t, h in rescued[0])
    assert [o["harness"] for o in outcomes] == ["lenient_parse"] * 2
    assert all(o["success"] and o["base_failure_mode"] == "malformed_action" for o in outcomes)


def test_hint_arm_rescues_with_one_hint_augmented_base_harness():
    c = config("hint")
    bench = workload.make_workload(c)
    assert [s.name for s in bench.siblings] == ["hint"]
    assert bench.siblings[0].knob("hint") == c.rescue.hint
    rescuer = workload.make_rescuer(c, bench)
    assert rescuer.k == 1 and rescuer.choose(0, 0, None, []) == bench.siblings


def test_rerender_in_base_swaps_the_sibling_prefix_and_keeps_the_policy_tokens():
    c = config("policy_only")
    bench = workload.make_workload(c)
    tokenizer = build_tiny_tokenizer()
    bench.set_tokenizer(tokenizer)
    task = next(t for t in bench.train_tasks if t.type == "counting")
    schema_first = bench.base.with_knobs(name="schema_first", instruction="schema_first")
    policy = ScriptedTokenPolicy(["Action: Operation\n```sql\nSELECT COUNT(*) FROM t\n```",
                                  'Action: Answer\nFinal Answer: ["3"]'],
                                 tokenizer=tokenizer, eos_id=tokenizer.convert_tokens_to_ids("<|im_end|>"))
    sampling = train.sampling_from_config(c.rollout, 0)
    (traj,) = collect([bench.make_episode(task, schema_first)], policy, sampling)
    new = bench.rerender_in_base(traj)
    old_seg, new_seg = traj.segments[0], new.segments[0]
    cut = traj.turns[0]["prompt_tokens"]
    from hsjax.rollout.policy import render_prompt
    base_prompt = render_prompt(tokenizer, bench.initial_messages(task, bench.base))
    assert list(new_seg.tokens[:len(base_prompt)]) == base_prompt
    np.testing.assert_array_equal(new_seg.tokens[len(base_prompt):], old_seg.tokens[cut:])
    np.testing.assert_array_equal(new_seg.loss_mask[len(base_prompt):], old_seg.loss_mask[cut:])
    assert new_seg.loss_mask[:len(base_prompt)].sum() == 0
    assert new_seg.loss_mask.sum() == old_seg.loss_mask.sum() > 0
    assert new.result is traj.result
    # It packs as a re-contextualised rescue row.
    batch = pack([GroupRollouts(base=[traj], base_harness=0, rescue=[traj], rescue_harness=[1],
                                rescue_in_base=[new])], G=1, n=1, R=1, T_buckets=64, pad_id=0,
                 rescue_context="base")
    assert list(np.asarray(batch.recontext_B)) == [False, True]


def test_task_stream_is_a_reproducible_permutation_per_epoch():
    stream = workload.TaskStream(list(range(5)), seed=1)
    first = stream.next(5)
    assert sorted(first) == list(range(5))
    second = stream.next(3)
    resumed = workload.TaskStream(list(range(5)), seed=1)
    resumed.load_state_dict({"position": 5})
    assert resumed.next(3) == second
    with pytest.raises(ValueError, match="no tasks"):
        workload.TaskStream([], seed=0)


def test_synth_workload_runs_the_testbed_tasks_on_the_dbbench_protocol():
    c = config("policy_only", **{"benchmark": "synth", "data.train_split": "synth_train",
                                 "eval.split": "synth_heldout", "data.limit": 6, "eval.limit": 4})
    bench = workload.make_workload(c)
    assert len(bench.train_tasks) == 6 and len(bench.eval_tasks) == 4
    assert {t.task_id for t in bench.train_tasks}.isdisjoint(t.task_id for t in bench.eval_tasks)
    sampling = train.sampling_from_config(c.rollout, 0)
    trajs = collect([bench.make_episode(t, bench.base) for t in bench.train_tasks], OracleAgent(), sampling)
    assert all(t.result["success"] for t in trajs)


def test_dominant_failure_mode_breaks_ties_by_name():
    class T:
        def __init__(self, mode):
            self.result = {"failure_mode": mode}

    assert train.dominant_failure_mode([T("wrong_answer"), T("malformed_action")]) == "malformed_action"
    assert train.dominant_failure_mode([T("turn_limit"), T("wrong_answer"), T("wrong_answer")]) == "wrong_answer"


def test_dapo_counts_the_rollouts_of_dropped_groups():
    assert train.base_rollouts_executed(16, {"dapo/drawn_groups": 24, "dapo/dropped_groups": 20}, 4) == 96
    assert train.base_rollouts_executed(32, {}, 4) == 32


def test_step_metrics_count_dapos_drawn_groups_and_keep_its_stats():
    from hsjax.rollout.engine import Trajectory

    def traj(reward):
        return Trajectory(result={"reward": reward, "harness_id": 0}, segments=[], turns=[],
                          num_generated_tokens=3, timings={})

    kept = [[traj(1.0), traj(0.0)]]  # one kept group of n=2; DAPO drew 5 groups to find it
    dapo = {"dapo/drawn_groups": 5, "dapo/dropped_groups": 4}
    metrics = train.step_metrics(kept, [[]], [], {}, ["base"], dapo, 2)
    assert metrics["rollouts/base"] == 10 and metrics["dapo/dropped_groups"] == 4
    assert train.step_metrics(kept, [[]], [], {}, ["base"], {}, 2)["rollouts/base"] == 2
