"""Scripted agents: the oracle under every starter-pool harness, and each noisy slip's failure mode
under the base harness and its repair by exactly one sibling."""
import collections
import pathlib

import pytest

from harness_envs import harness
from harness_envs.dbbench.benchmark import KNOBS
from harness_envs.dbbench import agents
from harness_envs.dbbench.data import is_modification, load_split
from harness_envs.dbbench.env import DBBenchEpisode
from hsjax.policies.base import ChatAgent, SamplingParams
from hsjax.rollout.engine import collect

BASE = KNOBS.base()

POOL = harness.load_pool(pathlib.Path(__file__).resolve().parents[3] / "harness_envs" / "pools" / "dbbench_siblings.json", KNOBS)
SAMPLING = SamplingParams()


@pytest.fixture
def backend(sqlite_backend):
    return sqlite_backend


@pytest.fixture(scope="module")
def dev():
    return load_split("dev")


def modes(tasks, spec, policy, backend):
    trajs = collect([DBBenchEpisode(t, spec, backend) for t in tasks], policy, SAMPLING)
    return {tr.result["task_id"]: tr.result["failure_mode"] for tr in trajs}


def test_agents_are_chat_policies():
    assert isinstance(agents.OracleAgent(), ChatAgent) and isinstance(agents.NoisyAgent(), ChatAgent)


@pytest.mark.parametrize("harness", sorted(POOL))
def test_oracle_solves_dev_under_every_pool_harness(harness, dev, backend):
    got = modes(dev, POOL[harness], agents.OracleAgent(), backend)
    assert collections.Counter(got.values()) == {"success": len(dev)}


def test_slip_table_names_pool_siblings():
    for name, slip in agents.SLIPS.items():
        assert slip.sibling in POOL, f"{name}: sibling {slip.sibling} missing from the starter pool"
    assert len({s.sibling for s in agents.SLIPS.values()}) == len(agents.SLIPS)
    assert len({s.failure_mode for s in agents.SLIPS.values()}) == len(agents.SLIPS)


def _slip_tasks(slip, dev):
    # long_output and answer_format concern answers read from results: SELECT family only.
    if slip in ("long_output", "answer_format"):
        return [t for t in dev if not is_modification(t)]
    return dev


@pytest.mark.parametrize("slip", sorted(agents.SLIPS))
def test_each_slip_fails_under_base_and_exactly_its_sibling_repairs_it(slip, dev, backend):
    tasks = _slip_tasks(slip, dev)
    expected = agents.SLIPS[slip]
    for name, spec in POOL.items():
        got = collections.Counter(modes(tasks, spec, agents.NoisyAgent({slip: 1.0}), backend).values())
        if name == expected.sibling:
            assert got == {"success": len(tasks)}, (name, got)
        else:
            assert got == {expected.failure_mode: len(tasks)}, (name, got)


def test_noisy_agent_without_slips_is_the_oracle(dev, backend):
    trajs = collect([DBBenchEpisode(t, BASE, backend) for t in dev], agents.NoisyAgent({}), SAMPLING)
    oracle = collect([DBBenchEpisode(t, BASE, backend) for t in dev], agents.OracleAgent(), SAMPLING)
    assert [t.result["turns"] for t in trajs] == [t.result["turns"] for t in oracle]
    assert all(t.result["success"] for t in trajs)


def test_slips_are_deterministic_and_harness_independent(dev):
    noise = {name: 0.5 for name in agents.SLIPS}
    a, b = agents.NoisyAgent(noise, seed=3), agents.NoisyAgent(noise, seed=3)
    infos = [{"task_id": t.task_id, "sample_index": 0, "task": t} for t in dev]
    draws = [a.slips_for(i) for i in infos]
    assert draws == [b.slips_for(i) for i in infos]
    assert draws != [agents.NoisyAgent(noise, seed=4).slips_for(i) for i in infos]
    assert draws != [a.slips_for({**i, "sample_index": 1}) for i in infos]
    # roughly half of the episodes get each slip
    for name in agents.SLIPS:
        frac = sum(name in d for d in draws) / len(draws)
        assert 0.25 < frac < 0.75, (name, frac)
    # the same replies under two harnesses while the harness accepts them
    t = dev[0]
    info_base = {"task_id": t.task_id, "task": t, "harness": "base", "episode_id": "e1"}
    info_sib = {"task_id": t.task_id, "task": t, "harness": "lenient_parse", "episode_id": "e2"}
    ctx = [{"role": "user", "content": "x"}]
    assert a.chat([ctx, ctx], SAMPLING, [info_base, info_sib]) == b.chat([ctx, ctx], SAMPLING, [info_sib, info_base])


def test_mixed_noise_on_dev(dev, backend):
    # With several slips at once, an episode under the base succeeds exactly when it drew no slip that
    # bites on its task, and otherwise fails with the mode of one of the slips it drew.
    agent = agents.NoisyAgent({name: 0.3 for name in agents.SLIPS}, seed=1)
    trajs = collect([DBBenchEpisode(t, BASE, backend) for t in dev], agent, SAMPLING)
    seen = collections.Counter()
    for tr, t in zip(trajs, dev):
        drawn = agent.slips_for({"task_id": t.task_id})
        biting = {s for s in drawn if t in _slip_tasks(s, dev)}
        fm = tr.result["failure_mode"]
        seen[fm] += 1
        assert (fm == "success") == (not biting), (t.task_id, drawn, fm)
        if biting:
            assert fm in {agents.SLIPS[s].failure_mode for s in biting}, (t.task_id, biting, fm)
    assert seen["success"] and len(seen) >= 4, seen


def test_agent_argument_errors():
    with pytest.raises(ValueError, match="unknown slip"):
        agents.NoisyAgent({"typo": 0.5})
    with pytest.raises(ValueError, match=r"must be in \[0, 1\]"):
        agents.NoisyAgent({"format_slip": 1.5})
    with pytest.raises(ValueError, match="one info dict per context"):
        agents.OracleAgent().chat([[{"role": "user", "content": "x"}]], SAMPLING, [])


def test_helpers_produce_what_they_promise(dev, backend):
    for t in dev:
        assert not agents.evaluator.is_correct(t, '["%s"]' % agents.wrong_items(t)[0], None) or is_modification(t)
        for attempt in range(3):
            col = agents.made_up_column(t, attempt)
            assert col.lower() not in {c.lower() for c in t.table.columns}
            db = backend.open(t)
            try:
                assert not db.execute(f"SELECT {col} FROM `{t.table.name}`").ok
            finally:
                db.close()
