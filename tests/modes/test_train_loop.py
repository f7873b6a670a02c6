"""The training loop's host-side pieces with scripted agents: DAPO draws, the hint arm's rescuer,
re-rendering, and rollouts counted by the runner (the rescue step itself: tests/harness_s/test_rescue.py)."""
import numpy as np
import pytest

from harness_envs.dbbench.agents import NoisyAgent, OracleAgent
from hsjax import builders
from hsjax.infra import experiments
from hsjax.models.tokenizer import build_tiny_tokenizer
from hsjax.harness_s import step_rollouts
from hsjax.modes import train
from hsjax.policies.scripted import ScriptedTokenPolicy
from hsjax.policies.tokens import render_prompt
from hsjax.rl.batch import GroupRollouts, pack
from hsjax.rl.task_stream import TaskStream
from hsjax.rollout.engine import Trajectory
from hsjax.rollout.runner import EpisodeRunner, Job


def config(*variants, **overrides):
    c = experiments.get_config("dbbench", ",".join(("smoke",) + variants))
    c.data.limit = 24
    for key, value in overrides.items():
        node = c
        *path, leaf = key.split(".")
        for part in path:
            node = node[part]
        node[leaf] = value
    return c


def setup(c, policy):
    """(benchmark, pool, training tasks, a runner of `policy`) of a config."""
    bench = builders.make_benchmark(c)
    pool = builders.load_pool(c, bench)
    tasks = bench.load_split(c.data.train_split, seed=c.data.task_seed, limit=c.data.limit)
    runner = EpisodeRunner(bench.make_episode, policy, builders.sampling_params(c.rollout, 0))
    return bench, pool, tasks, runner


def test_dapo_keeps_only_groups_with_reward_spread_and_caps_draws():
    c = config("dapo", **{"rollout.groups": 3, "rollout.n": 4, "dapo.max_draws": 3})
    # Each episode slips with probability 1/2, so groups of 4 are often mixed, sometimes uniform.
    bench, pool, train_tasks, runner = setup(c, NoisyAgent({"format_slip": 0.5}, seed=3))
    data = TaskStream(train_tasks, seed=0)
    tasks, groups, stats = step_rollouts.draw_groups(data, 0, runner, pool.base, c)
    assert stats["dapo/drawn_groups"] <= 3 * 3 and stats["dapo/drawn_groups"] % 3 == 0
    assert data.position == stats["dapo/drawn_groups"]
    assert len(tasks) == len(groups) <= 3
    for trajs in groups:
        assert step_rollouts.group_reward_spread(trajs) > 0
    assert stats["dapo/dropped_groups"] + len(groups) <= stats["dapo/drawn_groups"]
    if len(groups) < 3:
        assert stats["dapo/drawn_groups"] == 9  # the cap ended the search
    # The runner counted every drawn group's rollouts, the dropped ones included.
    assert runner.rollouts == stats["dapo/drawn_groups"] * 4


def test_dapo_with_an_oracle_drops_everything_after_max_draws():
    c = config("dapo", **{"rollout.groups": 2, "rollout.n": 2, "dapo.max_draws": 2})
    bench, pool, train_tasks, runner = setup(c, OracleAgent())
    tasks, groups, stats = step_rollouts.draw_groups(TaskStream(train_tasks, seed=0), 0, runner, pool.base, c)
    assert tasks == [] and groups == []
    assert stats == {"dapo/drawn_groups": 4, "dapo/dropped_groups": 4}
    assert runner.rollouts == 8


def test_plain_draw_takes_the_next_tasks_in_stream_order():
    c = config("policy_only", **{"rollout.groups": 2, "rollout.n": 2})
    bench, pool, train_tasks, runner = setup(c, OracleAgent())
    expected = TaskStream(train_tasks, seed=0).next(2)
    tasks, groups, stats = step_rollouts.draw_groups(TaskStream(train_tasks, seed=0), 0, runner, pool.base, c)
    assert [t.task_id for t in tasks] == [t.task_id for t in expected] and stats == {}
    assert all(t.result["success"] for trajs in groups for t in trajs)
    assert [[t.result["sample_index"] for t in trajs] for trajs in groups] == [[0, 1], [0, 1]]


def test_hint_arm_rescues_with_one_hint_augmented_base_harness():
    c = config("hint")
    bench = builders.make_benchmark(c)
    pool = builders.load_pool(c, bench)
    (hint,) = builders.rescue_harnesses(c, pool)
    assert hint.name == "hint" and hint.parent == pool.base.name and hint.knob("hint") == c.rescue.hint
    rescuer = builders.make_rescuer(c, pool)
    assert rescuer.k == 1 and rescuer.choose(0, 0, None, []) == [hint]


def test_rerender_in_base_swaps_the_sibling_prefix_and_keeps_the_policy_tokens():
    c = config("policy_only")
    bench, pool, train_tasks, _ = setup(c, OracleAgent())
    tokenizer = build_tiny_tokenizer()
    task = next(t for t in train_tasks if t.type == "counting")
    schema_first = pool.base.with_knobs(name="schema_first", instruction="schema_first")
    policy = ScriptedTokenPolicy(["Action: Operation\n```sql\nSELECT COUNT(*) FROM t\n```",
                                  'Action: Answer\nFinal Answer: ["3"]'],
                                 tokenizer=tokenizer, eos_id=tokenizer.convert_tokens_to_ids("<|im_end|>"))
    runner = EpisodeRunner(bench.make_episode, policy, builders.sampling_params(c.rollout, 0))
    (traj,) = runner.run([Job(schema_first, task)])
    new = step_rollouts.in_base_context(bench, pool.base, tokenizer)(task, traj)
    old_seg, new_seg = traj.segments[0], new.segments[0]
    cut = traj.turns[0]["prompt_tokens"]
    base_prompt = render_prompt(tokenizer, bench.initial_messages(task, pool.base))
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
    stream = TaskStream(list(range(5)), seed=1)
    first = stream.next(5)
    assert sorted(first) == list(range(5))
    second = stream.next(3)
    resumed = TaskStream(list(range(5)), seed=1)
    resumed.load_state_dict({"position": 5})
    assert resumed.next(3) == second
    with pytest.raises(ValueError, match="no tasks"):
        TaskStream([], seed=0)


def test_synth_runs_the_testbed_tasks_on_the_dbbench_protocol():
    c = config("policy_only", **{"benchmark.name": "synth", "data.train_split": "synth_train", "data.limit": 6})
    bench, pool, train_tasks, runner = setup(c, OracleAgent())
    eval_tasks = bench.load_split("synth_heldout", limit=4)
    assert len(train_tasks) == 6 and len(eval_tasks) == 4
    assert {t.task_id for t in train_tasks}.isdisjoint(t.task_id for t in eval_tasks)
    trajs = runner.run([Job(pool.base, t) for t in train_tasks])
    assert all(t.result["success"] for t in trajs)


def test_step_metrics_take_the_rollouts_the_runners_counted():
    def traj(reward):
        return Trajectory(result={"reward": reward, "harness": "base"}, segments=[], turns=[],
                          num_generated_tokens=3, timings={})

    kept = [[traj(1.0), traj(0.0)]]  # one kept group of n=2; DAPO drew 5 groups to find it
    dapo = {"dapo/drawn_groups": 5, "dapo/dropped_groups": 4}
    metrics = step_rollouts.rollout_metrics(kept, [[]], [], {"rollouts/base": 10, "rollouts/rescue": 0}, dapo)
    assert metrics["rollouts/base"] == 10 and metrics["dapo/dropped_groups"] == 4
    assert metrics["reward/by_harness/base"] == 0.5 and metrics["tokens/generated"] == 6


def test_unread_keys_follow_the_chosen_kinds():
    assert "dapo.max_draws" in train.unread(config("policy_only"))
    assert "dapo.max_draws" not in train.unread(config("dapo"))
    unread = train.unread(config("policy_only"))
    assert "rescue.siblings" in unread and "rescue.hint" in unread and "rescue.m" in unread
    assert "rescue.hint" not in train.unread(config("hint"))
    assert "benchmark.backend.url" in unread
    # the rollout servers' keys are read by rollout.backend=http_tokens only, the sampler's by jax only
    assert "rollout.http.base_urls" in unread and "rollout.kv_reuse" not in unread
    served = config("policy_only")
    served.rollout.backend = "http_tokens"
    unread = train.unread(served)
    assert "rollout.http.base_urls" not in unread and "rollout.kv_reuse" in unread and "rollout.vllm.weight_sync" in unread
