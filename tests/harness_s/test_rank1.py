"""Rank-1 inference: the router's single harness per task against the base, at equal rollouts."""
import json
import pathlib

import pytest

from harness_envs import harness
from harness_envs.dbbench.agents import NoisyAgent
from harness_envs.dbbench.benchmark import KNOBS, DBBench
from harness_envs.dbbench.data import load_split
from harness_envs.dbbench.evaluator import summarize
from hsjax.harness_s import rank1
from hsjax.infra import experiments
from hsjax.modes import rank1 as rank1_mode
from hsjax.policies.base import SamplingParams
from hsjax.rollout.runner import EpisodeRunner

REPO = pathlib.Path(__file__).resolve().parents[2]
STARTER = REPO / "harness_envs" / "pools" / "dbbench_siblings.json"
evolve_exp = experiments.load("evolve")


@pytest.fixture
def backend(sqlite_backend):
    return sqlite_backend


def _runner(noise, backend, seed=0):
    return EpisodeRunner(DBBench().make_episode, NoisyAgent(noise, seed=seed), SamplingParams(greedy=True))


@pytest.mark.parametrize("noise", [{"format_slip": 0.5}, {"format_slip": 0.3, "turn_waste": 0.3}])
def test_rank1_beats_base_at_equal_rollouts(backend, noise):
    pool = harness.load_pool(STARTER, KNOBS)
    specs = list(pool.values())
    runner = _runner(noise, backend)
    profiles = rank1.fit_profiles(runner, specs, load_split("standard_train")[:60], base=pool.base)
    router = rank1.build_router(specs, profiles)
    tasks = load_split("dev")
    run = rank1.run_rank1(runner, router, pool, tasks, rollouts=1, probe="none")
    assert run["rollouts"] == {"base": len(tasks), "rank1": len(tasks)}
    rows = rank1.table(run["tasks"], 1, summarize)
    base, r1 = rows["base"]["accuracy"], rows["rank1"]["accuracy"]
    assert r1 > base, rows
    if set(noise) == {"format_slip"}:
        # Every slip is a format slip: lenient parsing is best for every task type.
        assert {r["chosen"] for r in run["tasks"]} == {"lenient_parse"} and r1 == 1.0 and base < 0.8
    assert all(r["reason"].startswith(r["chosen"]) for r in run["tasks"])


def test_probe_features_choose_the_repairing_sibling(backend):
    pool = harness.load_pool(STARTER, KNOBS)
    specs = list(pool.values())
    runner = _runner({"format_slip": 0.3, "premature_answer": 0.3}, backend)
    profiles = rank1.fit_profiles(runner, specs, load_split("standard_train")[:80], base=pool.base)
    router = rank1.build_router(specs, profiles)
    tasks = load_split("dev")
    run = rank1.run_rank1(runner, router, pool, tasks, rollouts=2, probe="base")
    assert run["rollouts"] == {"base": 2 * len(tasks), "rank1": 2 * len(tasks)}
    chosen = {(r["probe_failure_mode"], r["chosen"]) for r in run["tasks"]
              if r["probe_failure_mode"] in ("malformed_action", "answered_without_querying")}
    assert chosen == {("malformed_action", "lenient_parse"), ("answered_without_querying", "verify_answer")}
    rows = rank1.table(run["tasks"], 2, summarize)
    assert rows["rank1"]["accuracy"] >= rows["base"]["accuracy"]
    with pytest.raises(ValueError, match="at least 2 rollouts"):
        rank1.run_rank1(runner, router, pool, tasks[:2], rollouts=1, probe="base")


def test_rank1_main_writes_the_report(tmp_path):
    c = evolve_exp.get_config("rank1,smoke")
    c.rank1.pool = str(STARTER)
    c.policy.noise.format_slip = 0.4
    c.policy.noise.turn_waste = 0.0
    c.policy.noise.premature_answer = 0.0
    out = rank1_mode.main(c, str(tmp_path))
    data = json.loads((tmp_path / "eval" / "rank1.json").read_text())
    assert out["path"] == str(tmp_path / "eval" / "rank1.json")
    assert len(data["tasks"]) == 30 and data["rollouts"] == {"base": 30, "rank1": 30}
    assert data["profiling_rollouts"] == 60 * (1 + len(data["pool"]))
    for r in data["tasks"]:
        assert r["chosen"] in data["pool"] and isinstance(r["rank1_success"], bool)
    assert set(data["table"]) == {"base", "rank1"}
    assert data["table"]["rank1"]["accuracy"] >= data["table"]["base"]["accuracy"]
    assert sum(data["choices"].values()) == 30
    # Profiles saved in the report load back and, given as a file, skip profiling.
    (tmp_path / "p.json").write_text(json.dumps(data["profiles"]))
    c.rank1.profiles = str(tmp_path / "p.json")
    again = rank1_mode.main(c, str(tmp_path / "again"))
    assert again["table"] == out["table"]


def test_profiling_split_must_not_overlap(tmp_path):
    c = evolve_exp.get_config("rank1,smoke")
    c.rank1.profile_split = "dev"
    with pytest.raises(ValueError, match="also in the profiling split"):
        rank1_mode.main(c, str(tmp_path))
