"""Router: aggregation rules by hand, fallback, tie-break, accuracy on synthetic outcomes,
re-anchoring, decision log, and the HarnessSRescuer state round trip."""
import dataclasses
import json
import random

import pytest

from hsjax.harness_s.rescue import Rescuer
from hsjax.harness_s.router import HarnessSRescuer, Profiles, Router, VoterSpec, aggregate, combine, ranked
from hsjax.builders import build_harness_s_rescuer
from hsjax.infra import experiments
from tests.fake_openai import completion


@dataclasses.dataclass(frozen=True)
class Spec:
    name: str
    direction: str | None = None


def ranking_reply(names):
    """A reply step of the fake server (tests/fake_openai.py) that always ranks `names`."""
    return 200, completion(json.dumps({"ranking": names}))


# ---------------------------------------------------------------------------------------------
# Aggregation by hand

CANDS = ["a", "b", "c", "d"]
VOTES = {"v1": ["a", "b", "c", "d"], "v2": ["b", "a"], "v3": ["b", "d", "c"]}


def test_majority_by_hand():
    assert aggregate(VOTES, CANDS, "majority") == {"a": 1 / 3, "b": 2 / 3, "c": 0.0, "d": 0.0}


def test_borda_by_hand():
    # n=4: points 3,2,1,0 by rank, unranked 0. a: 3+2+0=5, b: 2+3+3=8, c: 1+0+1=2, d: 0+0+2=2; / (3*3).
    assert aggregate(VOTES, CANDS, "borda") == pytest.approx({"a": 5 / 9, "b": 8 / 9, "c": 2 / 9, "d": 2 / 9})


def test_weighted_by_hand():
    w = {"v1": 3.0, "v2": 1.0, "v3": 0.5}
    # a: 3*3 + 1*2 = 11, b: 3*2 + 1*3 + 0.5*3 = 10.5, c: 3*1 + 0.5*1 = 3.5, d: 0.5*2 = 1; / (4.5*3).
    assert aggregate(VOTES, CANDS, "weighted", w) == pytest.approx(
        {"a": 11 / 13.5, "b": 10.5 / 13.5, "c": 3.5 / 13.5, "d": 1 / 13.5})
    # Weights are ignored by the unweighted rules.
    assert aggregate(VOTES, CANDS, "borda", w) == aggregate(VOTES, CANDS, "borda")


def test_combine_and_deterministic_tie_break():
    prof = {"a": 0.2, "b": 0.6, "c": 0.6, "d": 0.2}
    votes = {"a": 1.0, "b": 0.6, "c": 0.6, "d": 0.2}
    scores = combine(prof, votes, 0.5)
    assert scores == pytest.approx({"a": 0.6, "b": 0.6, "c": 0.6, "d": 0.2})
    # a, b, c tie on score (a's sum in float differs in the last bit); profile breaks it, then the name.
    assert ranked(scores, prof) == ["b", "c", "a", "d"]
    assert combine(prof, None, 0.5) == prof
    assert ranked({h: 0.0 for h in "zyx"}, {}) == ["x", "y", "z"]


def test_router_without_voters_uses_profiles():
    p = Profiles(CANDS)
    p.update([{"harness": "c", "base_failure_mode": "m", "success": True}] * 3)
    router = Router(CANDS, p, k=2, explore=0.0, tie_break="name")
    d = router.top_k({"task_id": 1, "type": "select"}, [{"failure_mode": "m"}] * 4)
    assert d.fallback and d.votes == {} and d.voter_failures == 0
    assert d.harnesses == ["c", "a"]  # c learned; a, b, d tie at the prior -> by name
    assert d.scores == d.profile_scores
    assert d.reasons[0].startswith("c: score ") and "m: 3.0/3.0 rescued" in d.reasons[0]


def test_fallback_when_every_voter_fails(openai_server):
    p = Profiles(CANDS)
    p.update([{"harness": "d", "base_failure_mode": "m", "success": True}])
    gone = openai_server()
    gone.close()
    url = gone.base_url
    voters = [VoterSpec(f"v{i}", url, "m", timeout_s=0.5, max_retries=0) for i in range(2)]
    router = Router(CANDS, p, voters, k=2, aggregation="weighted", explore=0.0, tie_break="name")
    d = router.top_k({"task_id": 1}, [{"failure_mode": "m"}])
    assert d.fallback and d.voter_failures == 2
    assert d.failures == {"v0": "connection_error", "v1": "connection_error"}
    assert d.harnesses == ["d", "a"] and d.scores == d.profile_scores
    assert "profiles only (no voter answered)" in d.reasons[0]
    m = router.metrics()
    assert m["router/total/voter_fail_frac"] == 1.0 and m["router/total/fallbacks"] == 1.0
    assert m["router/total/voter/connection_error"] == 2.0
    step = router.pop_step_metrics()
    assert step["router/decisions"] == 1.0 and step["router/fallback_frac"] == 1.0
    assert step["router/voter_failures"] == 2.0 and step["router/latency_s"] > 0
    assert router.pop_step_metrics()["router/decisions"] == 0.0


def test_mixed_failure_modes_weigh_profile_scores():
    p = Profiles(["x", "y"])
    p.update([{"harness": "x", "base_failure_mode": "m1", "success": True}] * 8
             + [{"harness": "y", "base_failure_mode": "m2", "success": True}] * 8)
    router = Router(["x", "y"], p, k=1, explore=0.0)
    group = [{"failure_mode": "m1"}] + [{"failure_mode": "m2"}] * 3
    d = router.top_k({"task_id": 1}, group)
    assert d.harnesses == ["y"]
    expected = 0.25 * p.score("x", None, "m1") + 0.75 * p.score("x", None, "m2")
    assert d.profile_scores["x"] == pytest.approx(expected)


def test_weighted_voters_earn_weight_from_rescues(openai_server):
    good = openai_server(ranking_reply(["x", "z", "y"]))
    bad = openai_server(ranking_reply(["y", "z", "x"]))
    voters = [VoterSpec("good", good.base_url, "m"), VoterSpec("bad", bad.base_url, "m")]
    router = Router(["x", "y", "z"], Profiles(["x", "y", "z"]), voters, k=2, aggregation="weighted",
                    profile_weight=0.0, tie_break="name")
    d = router.top_k({"task_id": "t1"}, [{"failure_mode": "m"}])
    # Borda, n=3: x 2+0, y 0+2, z 1+1, over 2 voters * 2 points: a tie, broken by name.
    assert d.scores == {"x": 0.5, "y": 0.5, "z": 0.5} and d.harnesses == ["x", "y"]
    router.observe([{"task_id": "t1", "harness": "x", "success": True},
                    {"task_id": "t1", "harness": "y", "success": False}])
    assert router.voter_stats == {"good": [1.0, 0.0], "bad": [0.0, 1.0]}
    assert router.voter_weights() == pytest.approx({"good": 2 / 3, "bad": 1 / 3})
    d = router.top_k({"task_id": "t2"}, [{"failure_mode": "m"}])
    # x: (2/3*2)/2, y: (1/3*2)/2, z: (2/3 + 1/3)/2.
    assert d.scores == pytest.approx({"x": 2 / 3, "y": 1 / 3, "z": 1 / 2})
    assert d.harnesses == ["x", "z"]
    assert not router.pending.get("t1")


# ---------------------------------------------------------------------------------------------
# Cold start and exploration


def cold_start_firsts(router, groups=60):
    return [router.top_k({"task_id": f"t{g}"}, [{"failure_mode": "m"}], step=0, group_index=g).harnesses[0]
            for g in range(groups)]


def test_cold_start_ties_spread_over_the_pool_not_to_the_first_names():
    """Testbed v3's alphabetical ties sent every early rescue to the same decoys; the seeded shuffle
    spreads them, reproducibly, and differs between seeds."""
    names = [f"s{i}" for i in range(6)]
    firsts = cold_start_firsts(Router(names, k=2, seed=0))
    assert set(firsts) == set(names)  # 60 groups: every sibling is somebody's first choice
    assert firsts == cold_start_firsts(Router(names, k=2, seed=0))
    assert firsts != cold_start_firsts(Router(names, k=2, seed=1))
    assert set(cold_start_firsts(Router(names, k=2, tie_break="name"))) == {"s0"}


def test_thompson_explores_the_untried_and_exploits_the_proven():
    names = ["proven", "bad", "untried"]
    p = Profiles(names)
    p.update([{"harness": "proven", "base_failure_mode": "m", "success": True}] * 30
             + [{"harness": "proven", "base_failure_mode": "m", "success": False}] * 10
             + [{"harness": "bad", "base_failure_mode": "m", "success": False}] * 40)
    router = Router(names, p, k=1, selection="thompson")
    firsts = cold_start_firsts(router, groups=400)
    share = {h: firsts.count(h) / len(firsts) for h in names}
    # P(Beta(1, 1) > Beta(31, 11)-ish) is about 0.26: the untried sibling is tried, the proven
    # one wins most decisions, the refuted one almost never.
    assert share["proven"] > 0.6 and 0.1 < share["untried"] < 0.4 and share["bad"] < 0.02, share
    assert "a Thompson draw" in router.drain_log()[0]["reasons"][0]
    assert router.exploration_bonus("untried", "m") == 0.0  # no bonus on top of the draw


def test_thompson_decisions_resume_exactly():
    """A decision's draws depend on (seed, step, group, task) only: a router restored from a
    checkpoint decides as the one that never stopped, whatever came before."""
    def make():
        return HarnessSRescuer(POOL, k=2, selection="thompson", seed=7, reanchor_every=3, decay=0.8)

    original = make()
    run_online(original, random.Random(4), steps=6, groups_per_step=3)
    resumed = make()
    resumed.load_state_dict(json.loads(json.dumps(original.state_dict())))
    original.router.drain_log()
    decisions = []
    for rescuer in (original, resumed):
        run_online(rescuer, random.Random(5), steps=4, groups_per_step=3)
        decisions.append([(r["harnesses"], r["scores"]) for r in rescuer.router.drain_log()])
    assert decisions[0] == decisions[1]
    other_seed = HarnessSRescuer(POOL, k=2, selection="thompson", seed=8, reanchor_every=3, decay=0.8)
    other_seed.load_state_dict(json.loads(json.dumps(original.state_dict())))
    run_online(other_seed, random.Random(5), steps=1, groups_per_step=3)
    assert [r["scores"] for r in other_seed.router.drain_log()] != [s for _, s in decisions[0][:3]]


def test_validity_weight_scales_scores_by_the_valid_share():
    p = Profiles(["leaky", "clean"])
    p.update([{"harness": "leaky", "success": True, "base_valid": False}] * 8
             + [{"harness": "clean", "success": True, "base_valid": True}] * 2
             + [{"harness": "clean", "success": False}] * 6)
    assert p.validity("leaky") == pytest.approx(1 / 10) and p.validity("clean") == pytest.approx(3 / 4)
    plain = Router(["leaky", "clean"], Profiles.from_dict(p.to_dict()), k=1, explore=0.0)
    assert plain.top_k({"task_id": 1}, [{}]).harnesses == ["leaky"]  # 9/10 rescued vs 3/10
    weighted = Router(["leaky", "clean"], p, k=1, explore=0.0, validity_weight=1.0)
    d = weighted.top_k({"task_id": 1}, [{}])
    assert d.harnesses == ["clean"]
    assert d.profile_scores["leaky"] == pytest.approx(0.9 * 0.1)
    p.decay(0.5)
    assert p["leaky"].valid == [0.0, 4.0]


def test_validity_floor_keeps_a_leaking_sibling_out_of_the_top_k_even_when_few_siblings_rescue():
    # testbed v3's case: two siblings rescue, k = 2, and one of them leaks. Down-weighting leaves it
    # second of two; the floor takes it out and the group gets the one valid sibling.
    names_ = ["leaky", "clean", "decoy"]
    p = Profiles(names_)
    p.update([{"harness": "leaky", "success": True, "base_valid": False}] * 8
             + [{"harness": "clean", "success": True, "base_valid": True}] * 8
             + [{"harness": "decoy", "success": False}] * 8)
    weighted = Router(names_, Profiles.from_dict(p.to_dict()), k=2, explore=0.0, validity_weight=1.0)
    assert weighted.top_k({"task_id": 1}, [{}]).harnesses == ["clean", "leaky"]
    floored = Router(names_, Profiles.from_dict(p.to_dict()), k=2, explore=0.0, validity_weight=1.0,
                     validity_floor=0.5)
    assert floored.top_k({"task_id": 1}, [{}], step=0, group_index=0).harnesses == ["clean", "decoy"]
    assert floored.drain_log()[0]["excluded"] == ["leaky"]
    assert floored.metrics()["router/total/excluded"] == 1.0
    # With nothing checked every sibling's validity is 0.5: the floor excludes none.
    fresh = Router(names_, Profiles(names_), k=3, validity_floor=0.5)
    assert sorted(fresh.top_k({"task_id": 2}, [{}]).harnesses) == sorted(names_)
    # One invalid rescue more than valid ones (2 of 5): out, back once a valid one evens it.
    q = Profiles(["x"])
    q.update([{"harness": "x", "success": True, "base_valid": v} for v in (True, True, False, False, False)])
    assert Router(["x"], q, k=1, validity_floor=0.5).top_k({"task_id": 3}, [{}]).harnesses == []
    q.update([{"harness": "x", "success": True, "base_valid": True}])
    assert Router(["x"], q, k=1, validity_floor=0.5).top_k({"task_id": 3}, [{}]).harnesses == ["x"]


def test_the_config_s_validity_floor_reaches_the_router_only_with_replay():
    block = experiments.load("common").router()
    block.validity, block.validity_floor = "replay", 0.4
    assert build_harness_s_rescuer(block, [Spec("x"), Spec("y")], 1).router.validity_floor == 0.4
    block.validity = "off"
    assert build_harness_s_rescuer(block, [Spec("x"), Spec("y")], 1).router.validity_floor == 0.0


# ---------------------------------------------------------------------------------------------
# Accuracy on synthetic outcomes

MODES = ["malformed_action", "sql_error_loop", "answered_without_querying", "wrong_answer",
         "turn_limit", "no_modification"]
POOL = [Spec(f"fix_{m}", m) for m in MODES]
TYPES = ["select", "counting", "insert", "update"]


def rescue_success(rng, sibling, mode, task_type, match=0.7, other=0.1):
    p = match if sibling == f"fix_{mode}" else other
    p += {"select": 0.05, "counting": 0.0, "insert": -0.05, "update": 0.0}[task_type]  # type noise
    return rng.random() < p


def noisy_group(rng, mode, n=4):
    """A failed group whose dominant failure mode is `mode`, with one off-mode rollout half the time."""
    modes = [mode] * n
    if rng.random() < 0.5:
        modes[-1] = rng.choice(MODES)
    return [{"task_id": None, "failure_mode": m, "num_turns": rng.randint(2, 9)} for m in modes]


def test_top1_accuracy_from_learned_profiles():
    rng = random.Random(1)
    profiles = Profiles.from_pool(POOL)
    outcomes = []
    for _ in range(600):
        sib, mode, tt = rng.choice(POOL).name, rng.choice(MODES), rng.choice(TYPES)
        outcomes.append({"harness": sib, "task_type": tt, "base_failure_mode": mode,
                         "success": rescue_success(rng, sib, mode, tt)})
    profiles.update(outcomes)
    router = Router([s.name for s in POOL], profiles, k=2)  # default exploration bonus included
    hits = 0
    for i in range(300):
        mode, tt = rng.choice(MODES), rng.choice(TYPES)
        hits += router.top_k({"task_id": i, "type": tt}, noisy_group(rng, mode)).harnesses[0] == f"fix_{mode}"
    assert hits / 300 >= 0.9, hits


def run_online(rescuer, rng, steps, groups_per_step, match_of=None):
    """Trainer-like loop: choose for failed groups, roll m=2 rescues per sibling, observe."""
    hits = []
    for step in range(steps):
        outcomes = []
        for g in range(groups_per_step):
            mode, tt = rng.choice(MODES), rng.choice(TYPES)
            task = {"task_id": f"{step}/{g}", "type": tt, "question": "q"}
            group = [dict(r, task_id=task["task_id"], type=tt, harness="base")
                     for r in noisy_group(rng, mode)]
            specs = rescuer.choose(step, g, task, group)
            target = (match_of or (lambda m: f"fix_{m}"))(mode)
            hits.append(specs[0].name == target)
            for spec in specs:
                for _ in range(2):
                    ok = rng.random() < (0.7 if spec.name == target else 0.1)
                    outcomes.append({"task_id": task["task_id"], "type": tt, "harness": spec.name,
                                     "success": ok, "failure_mode": "success" if ok else "wrong_answer",
                                     "num_turns": rng.randint(2, 9)})
        outcomes.append({"task_id": "x", "harness": "base", "success": True})  # not a sibling: ignored
        rescuer.observe(step, outcomes)
    return hits


def test_top1_accuracy_learned_online_through_the_rescuer():
    rng = random.Random(2)
    rescuer = HarnessSRescuer(POOL, k=2, reanchor_every=10, decay=0.95)
    assert isinstance(rescuer, Rescuer) and rescuer.k == 2
    hits = run_online(rescuer, rng, steps=40, groups_per_step=10)
    late = hits[-150:]
    assert sum(late) / len(late) >= 0.9, sum(late)
    # The base outcomes were ignored; re-anchoring ran at steps 10, 20, 30.
    assert rescuer.router.counters["outcomes_ignored"] == 40
    assert rescuer.router.counters["reanchors"] == 3 and rescuer.router.last_reanchor_step == 30
    # Outcomes got the base group's failure mode from the decision, not the rescue rollout's own mode.
    p = rescuer.router.profiles["fix_turn_limit"]
    assert "turn_limit" in p.by_mode and "success" not in p.by_mode


def test_reanchoring_follows_a_policy_shift():
    """After the policy changes which sibling rescues each mode, decayed profiles follow it."""
    shifted = lambda m: f"fix_{MODES[(MODES.index(m) + 1) % len(MODES)]}"

    def late_accuracy_after_shift(decay):
        rng = random.Random(3)
        rescuer = HarnessSRescuer(POOL, k=2, reanchor_every=2, decay=decay)
        run_online(rescuer, rng, steps=30, groups_per_step=10)
        hits = run_online(rescuer, rng, steps=20, groups_per_step=10, match_of=shifted)
        return sum(hits[-60:]) / 60

    with_decay, without = late_accuracy_after_shift(0.5), late_accuracy_after_shift(1.0)
    assert with_decay >= 0.75 and with_decay - without >= 0.25, (with_decay, without)


def test_reanchor_decays_once_per_step_and_accepts_probes():
    router = Router(["x", "y"], k=1, decay=0.5, reanchor_every=5)
    router.observe([{"harness": "x", "success": True, "base_failure_mode": "m"}] * 4)
    assert router.profiles["x"].overall == [4.0, 0.0]
    assert not router.reanchor_due(0) and not router.reanchor_due(3) and router.reanchor_due(5)
    probes = [{"harness": "y", "type": "select", "base_failure_mode": "m", "success": True},
              {"harness": "zzz", "success": True}]  # not in the pool: dropped
    assert router.reanchor(5, probe_outcomes=probes) == 1
    assert router.profiles["x"].overall == [2.0, 0.0]
    assert router.profiles["y"].by_type == {"select": [1.0, 0.0]}
    assert router.reanchor(5, recent_outcomes=[{"harness": "x", "success": False}]) == 1
    assert router.profiles["x"].overall == [2.0, 1.0]  # no second decay at the same step
    assert not router.reanchor_due(5)
    # online=False: observed outcomes wait for the next re-anchoring.
    buffered = Router(["x"], k=1, decay=1.0, online=False)
    buffered.observe([{"harness": "x", "success": True}])
    assert buffered.profiles["x"].n == 0 and len(buffered.recent) == 1
    buffered.reanchor(1)
    assert buffered.profiles["x"].overall == [1.0, 0.0] and buffered.recent == []


def test_every_decision_is_logged_and_drained():
    router = Router(["x", "y"], k=1, tie_break="name")
    for i in range(3):
        router.top_k({"task_id": i, "type": "select"}, [{"failure_mode": "m"}], step=7, group_index=i)
    log = router.drain_log()
    assert [r["group_index"] for r in log] == [0, 1, 2] and router.drain_log() == []
    rec = json.loads(json.dumps(log[0]))
    assert rec["step"] == 7 and rec["harnesses"] == ["x"] and rec["fallback"] is True
    assert set(rec) >= {"task_id", "task_type", "failure_modes", "scores", "votes", "voter_failures",
                        "reasons", "latency_s", "aggregation"}


def test_build_rescuer_from_a_run_config(openai_server):
    server = openai_server(ranking_reply(["fix_turn_limit"]))
    router_block = experiments.load("common").router()
    router_block.update({"aggregation": "majority", "reanchor_every": 4, "decay": 0.7, "explore": 0.0,
                         "voters": [{"name": "local", "base_url": server.base_url, "model": "m", "timeout_s": 2.0}]})
    rescuer = build_harness_s_rescuer(router_block, POOL, 3)
    assert rescuer.k == 3 and rescuer.router.aggregation == "majority" and rescuer.router.decay == 0.7
    specs = rescuer.choose(0, 0, {"task_id": "t", "type": "select"}, [{"failure_mode": "wrong_answer"}])
    assert [s.name for s in specs][0] == "fix_turn_limit" and all(isinstance(s, Spec) for s in specs)
    assert len(rescuer.drain_log()) == 1 and rescuer.metrics()["router/decisions"] == 1.0
    router_block.voters = [{"name": "x", "base_url": server.base_url, "model": "m", "api_key": "oops"}]
    with pytest.raises(ValueError, match="unknown keys \\['api_key'\\]"):
        build_harness_s_rescuer(router_block, POOL, 3)


def test_bad_configs_name_the_problem():
    with pytest.raises(ValueError, match="k=3"):
        Router(["x", "y"], k=3)
    with pytest.raises(ValueError, match="aggregation"):
        Router(["x"], k=1, aggregation="plurality")
    with pytest.raises(ValueError, match="selection='greedy'"):
        Router(["x"], k=1, selection="greedy")
    with pytest.raises(ValueError, match="tie_break='alpha'"):
        Router(["x"], k=1, tie_break="alpha")
    with pytest.raises(ValueError, match="validity_weight=-1"):
        Router(["x"], k=1, validity_weight=-1)
    with pytest.raises(ValueError, match="validity_floor=0.6"):
        Router(["x"], k=1, validity_floor=0.6)
    with pytest.raises(ValueError, match="not in the pool"):
        HarnessSRescuer([Spec("x")], Router(["x", "y"], k=1))
    with pytest.raises(ValueError, match="lacks 'router'"):
        HarnessSRescuer([Spec("x")], k=1).load_state_dict({})


# ---------------------------------------------------------------------------------------------
# State round trip


def test_rescuer_state_round_trip_gives_identical_decisions(openai_server):
    server = openai_server(ranking_reply(["fix_wrong_answer", "fix_turn_limit", "fix_malformed_action"]))

    def make():
        return HarnessSRescuer(POOL, k=2, aggregation="weighted", profile_weight=0.6, reanchor_every=3,
                               decay=0.8, voters=[VoterSpec("v", server.base_url, "m", timeout_s=2.0)])

    original = make()
    run_online(original, random.Random(4), steps=7, groups_per_step=3)
    state = json.loads(json.dumps(original.state_dict()))
    # A pending decision (chosen, not yet observed) is part of the state too.
    original.choose(7, 0, {"task_id": "open", "type": "insert"}, [{"failure_mode": "turn_limit"}])
    state = json.loads(json.dumps(original.state_dict()))
    assert "open" in dict(state["router"]["pending"])
    resumed = make()
    resumed.load_state_dict(state)
    assert resumed.state_dict() == state

    def continue_run(rescuer):
        rescuer.router.drain_log()
        rescuer.observe(7, [{"task_id": "open", "harness": "fix_turn_limit", "success": True}])
        run_online(rescuer, random.Random(5), steps=5, groups_per_step=3)
        return [{k: r[k] for k in ("harnesses", "scores", "vote_scores", "votes")}
                for r in rescuer.router.drain_log()], rescuer.state_dict()

    decisions_a, state_a = continue_run(original)
    decisions_b, state_b = continue_run(resumed)
    assert decisions_a == decisions_b  # exact floats, not approx
    assert json.dumps(state_a, sort_keys=True) == json.dumps(state_b, sort_keys=True)
    assert any(d["votes"] for d in decisions_a) and state_a["router"]["voter_stats"]["v"] != [0.0, 0.0]
