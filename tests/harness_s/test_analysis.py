"""The three properties: hand-computed cases, and an evolved pool with scripted agents
(diagonal-dominant locality, complementarity, nonstationarity, router top-1 accuracy)."""
import json
import pathlib

import pytest

from harness_envs.dbbench.agents import NoisyAgent
from harness_envs.dbbench.benchmark import KNOBS, DBBench
from harness_envs.dbbench.data import load_split
from hsjax.harness_s import analysis, evolve
from hsjax.harness_s.router import Profiles, Router
from hsjax.infra import experiments
from hsjax.modes.evolve import run_base
from hsjax.policies.base import SamplingParams
from hsjax.rollout.runner import EpisodeRunner

BASE = KNOBS.base()

REPO = pathlib.Path(__file__).resolve().parents[2]
evolve_exp = experiments.load("evolve")


def _o(h, task, mode, ok, sample=0):
    return {"harness": h, "task_id": task, "sample_index": sample, "task_type": "counting",
            "base_failure_mode": mode, "success": ok}


HAND = [
    _o("a", "t1", "m1", True), _o("b", "t1", "m1", False), _o("base", "t1", "m1", True),
    _o("a", "t2", "m1", True), _o("b", "t2", "m1", True),
    _o("a", "t3", "m2", False), _o("b", "t3", "m2", True),
    _o("a", "t4", "m1", False), _o("b", "t4", "m1", False),
]


def test_locality_hand_computed():
    loc = analysis.locality(HAND, ["a", "b"], {"a": "m1", "b": "m2"})
    assert loc["modes"] == ["m1", "m2"] and loc["siblings"] == ["a", "b"]
    assert loc["rate"] == [[2 / 3, 0.0], [1 / 3, 1.0]]
    assert loc["successes"] == [[2, 0], [1, 1]] and loc["n"] == [[3, 1], [3, 1]]
    assert loc["diagonal_dominant"] is True
    assert loc["per_sibling"]["a"]["margin"] == pytest.approx(2 / 3)
    loc = analysis.locality(HAND, ["a", "b"], {"a": "m2", "b": "m1"})
    assert loc["diagonal_dominant"] is False
    assert loc["per_sibling"]["a"] == {"target_mode": "m2", "best_mode": "m1", "target_rate": 0.0,
                                       "dominant": False, "margin": -2 / 3}
    # The control (base) is not a sibling, whatever the outcomes hold.
    assert analysis.locality(HAND)["siblings"] == ["a", "b"]


def test_complementarity_hand_computed():
    comp = analysis.complementarity(HAND, ["a", "b"])
    assert comp["n_failures"] == 4 and comp["union_count"] == 3 and comp["union"] == 0.75
    assert comp["per_sibling"] == {"a": 0.5, "b": 0.5} and comp["best_single"] == 0.5
    assert comp["gain"] == 0.25
    assert comp["by_mode"]["m1"] == {"n": 3, "union": 2 / 3, "best_single": 2 / 3}
    assert comp["by_mode"]["m2"] == {"n": 1, "union": 1.0, "best_single": 1.0}


def test_nonstationarity_hand_computed():
    b_outcomes = [_o("a", "t1", "m1", False), _o("a", "t2", "m1", False), _o("b", "t1", "m1", True),
                  _o("b", "t2", "m1", True)]
    ns = analysis.nonstationarity(HAND, b_outcomes, ["a", "b"], labels=("old", "new"))
    a = ns["per_sibling"]["a"]
    assert a["overall"]["old"] == 0.5 and a["overall"]["new"] == 0.0 and a["overall"]["delta"] == -0.5
    # Beta(1, 1) means: m1 old (1 + 2) / (2 + 3) = 0.6, new (1 + 0) / (2 + 2) = 0.25.
    assert a["by_mode"]["m1"]["old"] == pytest.approx(0.6) and a["by_mode"]["m1"]["new"] == pytest.approx(0.25)
    assert a["by_mode"]["m2"]["new"] is None and a["by_mode"]["m2"]["delta"] is None
    assert a["mean_abs_delta"] == pytest.approx(0.35)
    assert ns["best_by_mode"]["m1"] == {"old": "a", "new": "b", "flipped": True}
    assert ns["flipped_modes"] == ["m1"]


@pytest.fixture(scope="module")
def evolved():
    """A pool evolved on dev from a scripted agent, and its rescue outcomes under two agents."""
    bench = DBBench()
    tasks = load_split("dev")
    by_id = {t.task_id: t for t in tasks}
    sampling = SamplingParams(greedy=True)

    def runner(noise):
        return EpisodeRunner(bench.make_episode, NoisyAgent(noise, seed=0), sampling)

    ra = runner(evolve_exp.DEV_NOISE)
    base_a = run_base(ra, tasks, 1, BASE)
    evo = evolve.evolve(bench, base_a, by_id, ra, base=BASE)
    pool = [BASE, *evo.siblings]
    out_a = evolve.collect_rescues(ra, [r for r in base_a if not r["success"]], pool, by_id)
    rb = runner(evolve_exp.COMPARE_NOISE)
    base_b = run_base(rb, tasks, 1, BASE)
    out_b = evolve.collect_rescues(rb, [r for r in base_b if not r["success"]], pool, by_id)
    yield {"bench": bench, "evo": evo, "outcomes": out_a, "outcomes_b": out_b}
    bench.close()


def test_evolved_pool_is_local_and_complementary(evolved, tmp_path):
    sibs = evolved["evo"].siblings
    props = analysis.write_properties(tmp_path, evolved["outcomes"], sibs, evolved["bench"].target_modes(sibs),
                                      evolved["outcomes_b"], labels=("mix_a", "mix_b"))
    loc, comp = props["locality"], props["complementarity"]
    assert len(sibs) >= 5 and loc["diagonal_dominant"] is True
    for name, v in loc["per_sibling"].items():
        assert v["best_mode"] == v["target_mode"] and v["margin"] > 0, (name, v)
    assert comp["union"] > comp["best_single"] > 0
    assert comp["per_sibling"][comp["best_sibling"]] == comp["best_single"]
    for name in ("locality", "complementarity", "nonstationarity"):
        assert json.loads(props["paths"][name].read_text()) == json.loads(json.dumps(props[name], default=str))
        assert props["paths"][f"{name}_png"].read_bytes()[:4] == b"\x89PNG"
    assert "locality: diagonal-dominant=True" in analysis.summary_text(props)


def test_nonstationarity_between_two_agents(evolved):
    ns = analysis.nonstationarity(evolved["outcomes"], evolved["outcomes_b"], evolved["evo"].siblings,
                                  labels=("a", "b"))
    # Under agent b most format slips come with schema slips, so repairing the format alone
    # rescues far fewer malformed actions.
    cell = ns["per_sibling"]["parse_leniency"]["by_mode"]["malformed_action"]
    assert cell["n_a"] > 0 and cell["n_b"] > 0 and cell["delta"] < -0.2
    # b makes no premature answers: that sibling's overall rescue rate collapses.
    overall = ns["per_sibling"]["answer_verification"]["overall"]
    assert overall["a"] > 0.1 and overall["b"] == 0.0
    assert ns["mean_abs_delta"] > 0


def test_router_top1_from_fitted_profiles(evolved):
    """Profiles fitted from dev rescue outcomes; all-fail groups of held-out tasks."""
    evo = evolved["evo"]
    names = [s.name for s in evo.siblings]
    profiles = Profiles.from_pool(evo.siblings)
    profiles.update(evolved["outcomes"])
    router = Router(names, profiles, k=2, explore=0.0)
    tasks = load_split("standard")[:150]
    runner = EpisodeRunner(evolved["bench"].make_episode, NoisyAgent(evolve_exp.DEV_NOISE, seed=7),
                           SamplingParams(greedy=True))
    results = run_base(runner, tasks, 2, BASE)
    by_task = {}
    for r in results:
        by_task.setdefault(r["task_id"], []).append(r)
    tasks_by_id = {t.task_id: t for t in tasks}
    sibling_for_mode = {evo.evidence[n]["failure_mode"]: n for n in names}
    # Groups of one failed rollout each: one failure mode per group.
    singles = [(tasks_by_id[r["task_id"]], [r]) for r in results if not r["success"]]
    acc = analysis.router_accuracy(router, singles, sibling_for_mode)
    assert acc["scored"] >= 100 and acc["mixed_scored"] == 0 and acc["accuracy"] >= 0.9, acc
    # All-fail groups of two rollouts: mostly two different modes (the slips are drawn per rollout);
    # the first choice must repair one of them.
    pairs = [(t, by_task[t.task_id]) for t in tasks if not any(r["success"] for r in by_task[t.task_id])]
    acc2 = analysis.router_accuracy(router, pairs, sibling_for_mode)
    assert acc2["mixed_scored"] >= 20 and acc2["mixed_accuracy"] >= 0.9, acc2
    assert acc2["accuracy"] is None or acc2["accuracy"] >= 0.9, acc2
