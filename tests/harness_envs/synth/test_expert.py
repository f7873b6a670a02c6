"""The scripted expert: 100% under the base harness and every starter sibling; styles fail where
the regime says they must."""
import pathlib

import pytest

from harness_envs import harness
from harness_envs.dbbench.benchmark import KNOBS
from harness_envs.dbbench import make_backend
from harness_envs.dbbench.env import DBBenchEpisode
from harness_envs.synth import expert as ex
from harness_envs.synth.tasks import by_type, make_tasks
from hsjax.policies.base import SamplingParams
from hsjax.rollout.engine import collect

BASE = KNOBS.base()

POOL = harness.load_pool(pathlib.Path(__file__).resolve().parents[3] / "harness_envs/pools/dbbench_siblings.json", KNOBS)


@pytest.fixture(scope="module")
def sample():
    return by_type(make_tasks("synth_train", 200, seed=1), 4) + by_type(make_tasks("synth_heldout", 200, seed=1), 4)


def _run(tasks, spec, expert):
    backend = make_backend("sqlite")
    return collect([DBBenchEpisode(t, spec, backend) for t in tasks], expert, SamplingParams())


@pytest.mark.parametrize("harness", sorted(POOL))
def test_protocol_expert_succeeds_under_every_harness(sample, harness):
    trajs = _run(sample, POOL[harness], ex.ScriptedExpert())
    failed = [(t.result["task_id"], t.result["failure_mode"]) for t in trajs if not t.result["success"]]
    assert not failed
    for traj in trajs:
        assert [turn["text"].split("\n")[0] for turn in traj.turns] == ["Action: Operation", "Action: Answer"]
        assert all(len(turn["text"]) < 200 for turn in traj.turns)


@pytest.mark.parametrize("style", ["format_slip", "premature_answer", "schema_recovery"])
def test_styles_fail_under_base_and_succeed_only_under_their_rescuer(sample, style):
    expected_mode = {"format_slip": "malformed_action", "premature_answer": "answered_without_querying",
                     "schema_recovery": "sql_error_loop"}[style]
    for name, spec in POOL.items():
        trajs = _run(sample, spec, ex.ScriptedExpert(default_style=style))
        success = [t.result["success"] for t in trajs]
        if name == ex.RESCUER[style]:
            assert all(success), name
        else:
            assert not any(success), name
            assert {t.result["failure_mode"] for t in trajs} == {expected_mode}


def test_styles_per_type(sample):
    expert = ex.ScriptedExpert({"UPDATE": "format_slip"})
    trajs = _run(sample, BASE, expert)
    for traj in trajs:
        assert traj.result["success"] == (traj.result["type"] != "UPDATE")


def test_answers_what_it_observed():
    assert ex.observed_items("[('oslo',), (3,)]") == ["oslo", "3"]
    assert ex.observed_items("[(12.5,)]") == ["12.5"]
    assert ex.observed_items("1054 (42S22): Unknown column 'x' in 'field list'") is None
    assert ex.observed_items("[('a',)][TRUNCATED]") is None


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="premature_answer"):
        ex.ScriptedExpert({"UPDATE": "sloppy"})
    with pytest.raises(ValueError, match="one info dict"):
        ex.ScriptedExpert().chat([[{"role": "user", "content": "q"}]], SamplingParams(), None)


def test_schema_recovery_rescue_is_valid_under_base_move_for_move(sample):
    """The rescued trajectory's moves replayed under the base harness succeed too: only the error's
    observation differs (no schema reminder), so training on them can transfer to base."""
    rescued = _run(sample, POOL["schema_reminder"], ex.ScriptedExpert(default_style="schema_recovery"))
    for traj in rescued:
        sqls = [turn["text"] for turn in traj.turns]
        assert len(sqls) == 3 and "_value" in sqls[0] and "_value" not in sqls[1]
    replies = {t.result["task_id"]: [turn["text"] for turn in t.turns] for t in rescued}

    class Replay:
        def chat(self, contexts, sampling=None, infos=None):
            return [replies[info["task_id"]][sum(m["role"] == "assistant" for m in ctx) - 1]
                    for ctx, info in zip(contexts, infos)]

    replayed = _run(sample, BASE, Replay())
    assert all(t.result["success"] for t in replayed)
    assert all(t.result["sql_errors"] == 1 for t in replayed)


def test_misnamed_sql_names_a_missing_column():
    task = make_tasks("synth_train", 10, seed=0)[0]
    assert ex.misnamed_sql(task) == task.gold_sql.replace("stock", "stock_value", 1)
