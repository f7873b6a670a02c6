"""Which rescues are valid base trajectories (hsjax/harness_s/replay.py), on the testbed's names
regime: schema_reminder's rescues name a table only its reminder showed; tables_first's and the base
copy's find it with SHOW TABLES, which the base harness shows too. The router then prefers the
sibling whose rescues are valid."""
import pytest

from harness_envs.harness import load_pool
from harness_envs.synth import names
from harness_envs.synth.benchmark import SynthNames
from hsjax.harness_s import replay
from hsjax.harness_s.rescue import FixedSiblings, rescue_failed_groups
from hsjax.harness_s.router import HarnessSRescuer, Profiles, Router
from hsjax.policies.base import SamplingParams
from hsjax.rollout.runner import EpisodeRunner, Job


@pytest.fixture(scope="module")
def bench():
    with SynthNames() as b:
        yield b


@pytest.fixture(scope="module")
def pool(bench):
    return load_pool("harness_envs/pools/testbed_names.json", bench.knobs)


@pytest.fixture(scope="module")
def hidden():
    return [t for t in names.make_tasks("names_train", 60, seed=0) if t.hidden][:8]


def expert_runner(bench, style):
    return EpisodeRunner(bench.make_episode, bench.make_agent("expert", default_style=style), SamplingParams(),
                         batch_size=64)


def rescues(bench, pool, tasks, style, harness):
    trajs = expert_runner(bench, style).run([Job(pool[harness], t) for t in tasks])
    assert all(t.result["success"] for t in trajs), harness  # every one is a successful rescue
    return trajs


@pytest.mark.parametrize("style, harness, valid", [("guess_table", "schema_reminder", False),
                                                   ("show_tables", "tables_first", True),
                                                   ("show_tables", "base_copy", True),
                                                   ("show_tables", "schema_reminder", True)])
def test_a_rescue_is_valid_iff_it_replays_under_base_on_what_base_shows(bench, pool, hidden, style, harness,
                                                                         valid):
    check = replay.checker(bench, pool.base, threshold=1.0)
    for task, traj in zip(hidden, rescues(bench, pool, hidden, style, harness)):
        verdict = check(task, pool[harness], traj)
        assert verdict.valid is valid, (task.task_id, verdict.reason)
        if not valid:  # the reply that names the table, which only the reminder showed
            assert task.table.name.lower() in verdict.reason and "schema_reminder" in verdict.reason


def test_a_guessed_rescue_replays_to_success_under_base_yet_is_invalid(bench, pool, hidden):
    """Condition 1 alone would pass schema_reminder's rescue: the replies do succeed under base."""
    task = hidden[0]
    (traj,) = rescues(bench, pool, [task], "guess_table", "schema_reminder")
    replies = [t["text"] for t in traj.turns]
    base = replay.replay(bench, task, pool.base, replies)
    assert base.done and base.result["success"]
    sibling = replay.replay(bench, task, pool["schema_reminder"], replies)
    leaks = replay.leaked(sibling, base, replies)
    assert list(leaks) == [1] and task.table.name.lower() in leaks[1]


def test_replies_that_fail_under_base_or_run_out_are_invalid_or_inconclusive(bench, pool, hidden):
    task = hidden[0]
    (traj,) = rescues(bench, pool, [task], "show_tables", "tables_first")
    replies = [t["text"] for t in traj.turns]
    unfinished = replay.base_validity(bench, task, pool["tables_first"], pool.base, replies[:1], 1.0)
    assert unfinished.valid is None and "had not ended" in unfinished.reason
    wrong = replies[:-1] + ['Action: Answer\nFinal Answer: ["not the answer"]']
    failed = replay.base_validity(bench, task, pool["tables_first"], pool.base, wrong, 1.0)
    assert failed.valid is False and "do not succeed under base" in failed.reason


def test_rescue_records_validity_and_the_router_learns_to_prefer_valid_siblings(bench, pool, hidden):
    """Both siblings rescue every group; with validity_weight=1 the one whose rescues leak loses."""
    names_ = ["schema_reminder", "tables_first"]
    specs = [pool[n] for n in names_]
    router = Router(names_, Profiles(names_), k=1, explore=0.0, validity_weight=1.0)
    rescuer = HarnessSRescuer(specs, router)
    check = replay.checker(bench, pool.base, threshold=1.0)
    base_groups = expert_runner(bench, "guess_table").run([Job(pool.base, t) for t in hidden])
    groups = [[traj] for traj in base_groups]
    assert not any(t.result["success"] for t in base_groups)

    # Each sibling's rescues as the expert style that succeeds under it: schema_reminder recovers a
    # failed guess from its reminder, tables_first's rescues open with the SHOW TABLES it asks for.
    for harness, style in (("schema_reminder", "guess_table"), ("tables_first", "show_tables")):
        fixed = FixedSiblings([pool[harness]])
        _, outcomes = rescue_failed_groups(0, hidden, groups, fixed, expert_runner(bench, style),
                                           SamplingParams(), m=1, threshold=1.0, check_valid=check)
        assert all(o["success"] for o in outcomes) and len(outcomes) == len(hidden)
        assert {o["base_valid"] for o in outcomes} == {harness == "tables_first"}
        rescuer.observe(0, outcomes)
    assert router.profiles.validity("tables_first") > 0.8 > 0.2 > router.profiles.validity("schema_reminder")
    # Equal rescue rates; validity decides.
    assert router.profiles.score("tables_first") == router.profiles.score("schema_reminder")
    decision = router.top_k({"task_id": "new"}, [{"failure_mode": "wrong_answer"}], step=1, group_index=0)
    assert decision.harnesses == ["tables_first"] and "base-valid" in decision.reasons[0]
    assert "valid base trajectories among checked rescues: 0.10" in router.profiles.card("schema_reminder")
