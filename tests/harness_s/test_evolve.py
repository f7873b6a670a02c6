"""Directional evolution with scripted agents, the regression check, and LLM-proposed candidates
from a real HTTP server on 127.0.0.1."""
import json
import pathlib
import subprocess
import sys

import pytest

from harness_envs import harness
from harness_envs.dbbench.agents import NoisyAgent, OracleAgent
from harness_envs.dbbench.benchmark import KNOBS, DBBench
from harness_envs.dbbench.data import is_modification, load_split
from hsjax.harness_s import candidates, evolve, proposer
from hsjax.infra import experiments
from hsjax.modes.evolve import run_base
from hsjax.policies.base import SamplingParams
from hsjax.policies.http_chat import HttpChatPolicy
from hsjax.rollout.runner import EpisodeRunner
from tests.fake_openai import completion

BASE = KNOBS.base()
BENCH = DBBench()

REPO = pathlib.Path(__file__).resolve().parents[2]
evolve_exp = experiments.load("evolve")

# The knob (and value test) that repairs each scripted slip's failure mode.
REPAIRS = {
    "parse_leniency": lambda k: k.get("parse_mode") == "lenient",
    "schema_grounding": lambda k: k.get("schema_reminder_on_error") is True,
    "answer_verification": lambda k: k.get("verify_before_answer") is True,
    "answer_normalization": lambda k: k.get("answer_normalization") in ("strip", "numeric"),
    "turn_budget": lambda k: k.get("max_rounds", 15) > 16,
    "observation_paging": lambda k: bool(k.get("obs_page_rows") or k.get("obs_max_chars", 800) > 800),
}


@pytest.fixture
def backend(sqlite_backend):
    return sqlite_backend


@pytest.fixture(scope="module")
def tasks():
    return load_split("dev")


def _runner(policy, backend):
    return EpisodeRunner(BENCH.make_episode, policy, SamplingParams(greedy=True))


def _evolve(policy, backend, tasks, **kwargs):
    runner = _runner(policy, backend)
    base = run_base(runner, tasks, 1, BASE)
    return base, evolve.evolve(BENCH, base, {t.task_id: t for t in tasks}, runner, base=BASE, **kwargs)


def test_knob_values_and_candidates():
    assert candidates.knob_values(BASE, "max_rounds") == [7, 30, 60]
    assert candidates.knob_values(BASE, "obs_page_rows") == [10, 20, 50]
    assert candidates.knob_values(BASE, "parse_mode") == ["lenient"]
    assert candidates.knob_values(BASE, "verify_before_answer") == [True]
    assert candidates.knob_values(BASE, "hint") == []
    direction = BENCH.direction(name="parse_leniency")
    cands = candidates.enumerate_candidates(BASE, direction, max_candidates=12, seed=3)
    assert cands == candidates.enumerate_candidates(BASE, direction, max_candidates=12, seed=3)
    assert len(cands) == 12 and len({json.dumps(c, sort_keys=True) for c in cands}) == 12
    # max_format_retries acts only with on_malformed=retry: alone it is a no-op and never tried.
    assert not any(set(c) == {"max_format_retries"} for c in cands)
    assert all(set(c) <= set(direction.knobs) and not candidates.is_no_op(BASE, c) for c in cands)
    for c in cands:
        BASE.with_knobs(**c)  # valid against the schema
    singles = [c for c in cands if len(c) == 1]
    assert singles == cands[:len(singles)] and {"parse_mode": "lenient"} in singles
    assert candidates.enumerate_candidates(BASE, direction, max_candidates=2, seed=0) == \
        candidates.enumerate_candidates(BASE, direction, max_candidates=2, seed=0)
    assert len(candidates.enumerate_candidates(BASE, direction, max_candidates=2, seed=0)) == 2


def test_candidates_follow_the_base_s_own_values():
    # A base whose instruction is already `concise` is not mutated to it again.
    concise = KNOBS.base(instruction="concise")
    direction = BENCH.direction(name="parse_leniency")
    assert "concise" not in candidates.knob_values(concise, "instruction") or \
        all(c.get("instruction") != "concise" for c in candidates.enumerate_candidates(concise, direction))


def test_evolution_repairs_each_slip_and_is_deterministic(backend, tasks, tmp_path):
    noise = evolve_exp.DEV_NOISE
    base, evo = _evolve(NoisyAgent(noise, seed=0), backend, tasks)
    modes = {r["failure_mode"] for r in base if not r["success"]}
    assert {s.direction for s in evo.siblings} == {BENCH.direction(failure_mode=m).name for m in modes}
    for sib in evo.siblings:
        ev = evo.evidence[sib.name]
        assert sib.parent == "base" and sib.name == sib.direction
        assert REPAIRS[sib.direction](sib.knobs), (sib.name, sib.knobs)
        assert set(sib.knobs) <= set(BENCH.direction(name=sib.direction).knobs)
        assert ev["rescue"]["rescued"] > ev["control"]["rescued"] == 0  # scripted agents replay their slips
        assert ev["regression"]["drop"] <= ev["regression_tolerance"]
        statuses = [c["status"] for c in ev["candidates_tried"]]
        assert statuses.count("kept") == 1 and len(statuses) == len(ev["candidates_tried"]) > 1
    path = tmp_path / "pool.json"
    harness.save_pool(path, BASE, evo.siblings, **evo.pool_extra())
    pool = harness.load_pool(path, KNOBS)
    assert sorted(pool) == sorted(["base", *[s.name for s in evo.siblings]])
    assert json.loads(path.read_text())["evidence"].keys() == evo.evidence.keys()
    _, again = _evolve(NoisyAgent(noise, seed=0), backend, tasks)
    assert json.dumps(again.pool_extra(), sort_keys=True) == json.dumps(evo.pool_extra(), sort_keys=True)
    assert [s.to_json() for s in again.siblings] == [s.to_json() for s in evo.siblings]


class ConciseBreaksModifications:
    """Slips answer formats on SELECT tasks; under the concise instruction it botches every
    INSERT/UPDATE task (a harness change that rescues one thing and breaks another)."""

    def __init__(self):
        self.agent = NoisyAgent({"answer_format": 0.6}, seed=1)

    def chat(self, contexts, sampling, infos):
        out = self.agent.chat(contexts, sampling, infos)
        for i, (ctx, info) in enumerate(zip(contexts, infos)):
            if ctx[0]["content"].startswith("Answer a question about a MySQL table") and is_modification(info["task"]):
                out[i] = "I am not sure what to do."
        return out


def test_regressing_candidate_is_rejected(backend, tasks):
    bad = {"answer_normalization": "strip", "instruction": "concise"}
    good = {"answer_normalization": "strip"}
    _, evo = _evolve(ConciseBreaksModifications(), backend, tasks, directions=["answer_normalization"],
                     candidates={"answer_normalization": [bad, good]},
                     settings=evolve.EvolveSettings(regression_sample=30, regression_tolerance=0.05))
    ev = evo.evidence["answer_normalization"]
    tried = {json.dumps(c["knobs"], sort_keys=True): c for c in ev["candidates_tried"]}
    b, g = tried[json.dumps(bad, sort_keys=True)], tried[json.dumps(good, sort_keys=True)]
    assert b["rescue"] == g["rescue"] and b["rescue"]["rescued"] == ev["n_failures"] > 0
    assert b["status"] == "regressed" and b["regression"]["drop"] > 0.05
    assert g["status"] == "kept" and g["regression"]["drop"] == 0.0
    assert evo.siblings[0].knobs == good and evo.counters["rejected_regression"] == 1
    # With only the regressing candidate nothing is kept, and the mode is reported unrepaired.
    _, evo = _evolve(ConciseBreaksModifications(), backend, tasks, directions=["answer_normalization"],
                     candidates={"answer_normalization": [bad]},
                     settings=evolve.EvolveSettings(regression_sample=30))
    assert not evo.siblings and "answer_format" in evo.unrepaired
    assert evo.unrepaired["answer_format"]["candidates_tried"][0]["status"] == "regressed"


def test_parse_and_validate_proposals():
    assert proposer.parse_proposals('{"candidates": [{"knobs": {"parse_mode": "lenient"}}]}') == \
        [{"knobs": {"parse_mode": "lenient"}}]
    assert proposer.parse_proposals('Here:\n```json\n[{"knobs": {"a": 1}}]\n```') == [{"knobs": {"a": 1}}]
    assert proposer.parse_proposals('I suggest {"candidates": []} and more') == []
    assert proposer.parse_proposals("lenient parsing, definitely") is None
    d = BENCH.direction(name="parse_leniency")
    v = proposer.validate_proposal
    assert v({"knobs": {"parse_mode": "lenient", "hint": "x"}}, BASE, d) == (
        {"hint": "x", "parse_mode": "lenient"}, "valid")
    assert v({"knobs": {"nope": 1}}, BASE, d) == (None, "unknown_knob")
    assert v({"knobs": {"max_format_retries": 99}}, BASE, d) == (None, "bad_value")
    assert v({"knobs": {"max_format_retries": True}}, BASE, d) == (None, "bad_value")
    assert v({"knobs": {"max_rounds": 30}}, BASE, d) == (None, "off_direction")
    assert v({"knobs": {"parse_mode": "strict"}}, BASE, d) == (None, "no_op")
    assert v({"parse_mode": "lenient"}, BASE, d) == (None, "invalid_shape")


PROPOSALS = {
    "parse_leniency": json.dumps({"candidates": [
        {"knobs": {"parse_mode": "lenient", "on_malformed": "retry"}, "why": "accept and explain"},
        {"knobs": {"no_such_knob": 1}},
        {"knobs": {"max_format_retries": "many"}},
        {"knobs": {"max_rounds": 30}},
        {"knobs": {"parse_mode": "lenient"}},  # already enumerated
    ]}),
    "answer_verification": "Verification would help here, surely.",  # no JSON
}


def propose_by_direction(request):
    """Answers by the direction named in the prompt; a direction without a reply gets a 500."""
    direction = request.body["messages"][-1]["content"].split("Repair direction: ")[1].split(":")[0]
    if direction not in PROPOSALS:
        return 500, "overloaded"
    return 200, completion(PROPOSALS[direction])


def test_llm_proposals_over_http(backend, tasks, openai_server):
    server = openai_server(propose_by_direction)
    policy = HttpChatPolicy(server.base_url, "proposer", max_retries=0, timeout=5.0)
    llm_proposer = proposer.LLMProposer(policy, benchmark="dbbench", n_proposals=5)
    noise = {"format_slip": 0.3, "premature_answer": 0.3, "skip_schema": 0.3}
    _, evo = _evolve(NoisyAgent(noise, seed=0), backend, tasks, proposer=llm_proposer,
                     directions=["parse_leniency", "answer_verification", "schema_grounding"],
                     settings=evolve.EvolveSettings(max_candidates=3))
    requested = [r.body["messages"][-1]["content"].split("Repair direction: ")[1].split(":")[0]
                 for r in server.requests]
    assert sorted(requested) == ["answer_verification", "parse_leniency", "schema_grounding"]
    assert "dbbench" in server.requests[0].body["messages"][0]["content"]  # the benchmark is named
    c = evo.counters
    assert (c["llm/requests"], c["llm/request_failed"], c["llm/malformed_reply"]) == (3, 1, 1)
    assert (c["llm/received"], c["llm/valid"], c["llm/unknown_knob"], c["llm/bad_value"],
            c["llm/off_direction"], c["llm/duplicate"]) == (5, 1, 1, 1, 1, 1)
    tried = evo.evidence["parse_leniency"]["candidates_tried"]
    llm = [t for t in tried if t["source"] == "llm"]
    assert [t["knobs"] for t in llm] == [{"on_malformed": "retry", "parse_mode": "lenient"}]
    assert llm[0]["rescue"]["rescued"] > 0  # it was run like any candidate
    # Directions whose request failed or came back malformed still evolved from enumeration.
    assert {s.name for s in evo.siblings} == {"parse_leniency", "answer_verification", "schema_grounding"}
    log = {e["direction"]: e for e in llm_proposer.log}
    assert "error" in log["schema_grounding"] and log["answer_verification"]["error"] == "malformed_reply"


def test_evolve_mode_end_to_end(tmp_path):
    cmd = [sys.executable, str(REPO / "run.py"), "--config", f"{REPO}/experiments/evolve.py:dev,smoke",
           "--workdir", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=120,
                          env={**__import__("os").environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "wrote" in proc.stdout and "complementarity: union" in proc.stdout
    pool = harness.load_pool(tmp_path / "pool.json", KNOBS)
    data = json.loads((tmp_path / "pool.json").read_text())
    assert len(pool) > 2 and set(data["evidence"]) == set(pool) - {"base"}
    for name in ("locality", "complementarity", "nonstationarity"):
        assert json.loads((tmp_path / "analysis" / f"{name}.json").read_text())
        assert (tmp_path / "plots" / f"{name}.png").read_bytes()[:4] == b"\x89PNG"


def test_oracle_has_nothing_to_repair(backend, tasks):
    base, evo = _evolve(OracleAgent(), backend, tasks[:20])
    assert all(r["success"] for r in base) and evo.siblings == [] and evo.evidence == {}


def test_unknown_direction_is_an_error(backend, tasks):
    with pytest.raises(ValueError, match="unknown direction"):
        _evolve(OracleAgent(), backend, tasks[:2], directions=["parse_lenincy"])
