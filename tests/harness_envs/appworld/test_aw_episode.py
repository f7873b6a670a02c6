"""AppWorld through the benchmark interface: the oracle solves the whole offline world in the sandbox,
each scripted slip fails under the base harness with its mode and is repaired by exactly its sibling
(locality), and the protocol, observations, taxonomy and TGC/SGC rules hold."""
import os

import pytest

from harness_envs.appworld import agents, evaluator, taxonomy
from harness_envs.appworld import harness as appworld_harness
from harness_envs.appworld.benchmark import AppWorld
from harness_envs.registry import make_benchmark
from hsjax.policies.base import SamplingParams
from hsjax.rollout.runner import EpisodeRunner, Job


@pytest.fixture(scope="module")
def bench():
    with make_benchmark("appworld") as b:
        yield b


def run(bench, agent, specs, tasks):
    runner = EpisodeRunner(bench.make_episode, agent, SamplingParams(), env_workers=2)
    return runner.results([Job(s, t) for s in specs for t in tasks])


def test_the_oracle_solves_every_task_of_the_offline_world(bench):
    pool = bench.load_pool()
    tasks = [t for split in bench.splits for t in bench.load_split(split)]
    results = run(bench, bench.make_agent("oracle"), [pool.base], tasks)
    summary = bench.summarize(results)
    assert summary["tgc"] == 1.0 and summary["sgc"] == 1.0 and summary["scenarios"] == 62
    assert all(r["num_cells"] == 1 and r["failure_mode"] == "success" for r in results)


def test_the_oracle_confirms_under_every_harness(bench):
    pool = bench.load_pool()
    tasks = bench.load_split("dev", limit=4)
    results = run(bench, bench.make_agent("oracle"), list(pool.values()), tasks)
    assert all(r["success"] for r in results), [(r["harness"], r["failure_mode"]) for r in results if not r["success"]]
    held = [r for r in results if r["harness"] in ("verify_answer", "review_changes")]
    assert all(r["num_cells"] == 2 and r["turns"][0]["held"] for r in held)


@pytest.mark.parametrize("slip", sorted(agents.SLIPS))
def test_each_slip_is_repaired_by_its_sibling_only(bench, slip):
    info = agents.SLIPS[slip]
    pool = bench.load_pool()
    tasks = [t for t in bench.load_split("dev") if slip != "hasty_answer" or t.kind == "question"][:3]
    decoy = "api_list" if info.sibling != "api_list" else "verify_answer"
    results = run(bench, bench.make_agent("scripted", noise={slip: 1.0}), pool.select(["base", info.sibling, decoy]),
                  tasks)
    by = {h: [r for r in results if r["harness"] == h] for h in ("base", info.sibling, decoy)}
    assert {r["failure_mode"] for r in by["base"]} == {info.failure_mode}
    assert all(r["success"] for r in by[info.sibling])
    assert not any(r["success"] for r in by[decoy])


def test_code_extraction_strict_and_lenient(bench):
    base = bench.load_pool().base
    lenient = base.with_knobs(parse_mode="lenient")
    reply = "I'll look.\n```py\nprint(1)\n```"
    assert appworld_harness.extract_code(reply, base) == reply.strip()  # published: no python block, the whole reply
    assert appworld_harness.extract_code(reply, lenient) == "print(1)"
    assert appworld_harness.extract_code("x\n```python\na = 1\n```\n```python\nb = 2\n```", base) == "a = 1"
    assert appworld_harness.extract_code("```python\na = 1\n```\n```\nb = 2\n```", lenient) == "a = 1\nb = 2"
    assert appworld_harness.extract_code("print(2)", base) == "print(2)"


class Script:
    def __init__(self, *replies):
        self.replies = list(replies)

    def chat(self, contexts, sampling=None, infos=None):
        return [self.replies.pop(0) for _ in contexts]


def test_observations_follow_the_protocol_and_the_knobs(bench):
    task = bench.load_split("dev")[0]
    base = bench.load_pool().base
    ep = bench.make_episode(task, base)
    ep.reset()
    assert ep.messages()[0]["role"] == "system" and task.question in ep.messages()[1]["content"]
    ep.step("```python\nx = 1\n```")
    assert ep.messages()[-1]["content"] == appworld_harness.SUCCESS_OUTPUT
    ep.step("```python\nprint(x + 1)\nprint(apis.notes.nope())\n```")
    obs = ep.messages()[-1]["content"]
    assert obs.startswith("2\n" + appworld_harness.FAILED_LEAD) and "404 Not Found" in obs and 'File "<cell' in obs
    ep.step("")
    assert ep.messages()[-1]["content"] == appworld_harness.NO_CODE
    ep.abort("context_overflow")
    assert ep.result()["failure_mode"] == "context_overflow"

    helpful = base.with_knobs(api_list_on_unknown=True, api_doc_on_bad_args=True, credentials_reminder=True,
                              traceback_summary=True, obs_max_chars=2000)
    ep = bench.make_episode(task, helpful)
    ep.reset()
    ep.step("```python\napis.notes.nope()\n```")
    obs = ep.messages()[-1]["content"]
    assert "Error summary: ApiError" in obs and appworld_harness.APP_LIST_LEAD.format(app="notes") in obs
    assert "apis.notes.search_notes(" in obs
    ep.step("```python\napis.notes.login(user='a', password='b')\n```")
    assert appworld_harness.API_DOC_LEAD.format(app="notes", api="login") in ep.messages()[-1]["content"]
    ep.step("```python\napis.notes.login(username='a', password='b')\n```")
    assert appworld_harness.CREDENTIALS_REMINDER in ep.messages()[-1]["content"]
    ep.abort("done")


def test_results_and_the_step_limit(bench):
    task = bench.load_split("dev")[0]
    spec = bench.load_pool().base.with_knobs(max_rounds=2)
    results = run(bench, Script("```python\nprint(1)\n```", "```python\nprint(2)\n```"), [spec], [task])
    r = results[0]
    assert r["failure_mode"] == "step_limit" and r["num_cells"] == 2 and r["scenario_id"] == task.scenario_id
    assert set(r) >= {"task_id", "type", "harness", "success", "reward", "failure_mode", "answer", "num_turns",
                      "actions", "tests"}


def test_taxonomy_rules():
    done = {"status": "completed", "success": False, "kind": "question",
            "tests": {"complete_task was called with status 'success'": True, "the answer": False,
                      "no collateral changes": True}}
    assert taxonomy.assign([None], done) == "wrong_answer"
    assert taxonomy.assign([None], {**done, "tests": {"a": True, "no collateral changes": False}}) == \
        "collateral_change"
    assert taxonomy.assign(["auth_failure", "auth_failure", None], done) == "auth_failure"
    assert taxonomy.assign(["code_error", "syntax_error", "syntax_error"], done) == "syntax_error"
    assert taxonomy.assign([None, "unknown_api"], {**done, "status": "step_limit"}) == "unknown_api"
    assert taxonomy.assign([None], {**done, "status": "step_limit"}) == "step_limit"
    assert taxonomy.assign([None], {**done, "gave_up": True}) == "gave_up"
    assert taxonomy.assign([None], {**done, "sandbox_limit": True}) == "sandbox_limit"
    assert taxonomy.assign([], {**done, "kind": "action", "tests": {"x": False}}) == "wrong_state"
    assert taxonomy.cell_category("ApiError", ["not_found"]) == "code_error"
    assert taxonomy.cell_category("ApiError", ["invalid", "auth"]) == "auth_failure"


def test_tgc_and_sgc():
    records = [{"task_id": f"s{s}_{v}", "scenario_id": f"s{s}", "type": "t", "success": ok}
               for s, oks in enumerate([(1, 1, 1), (1, 0, 1), (0, 0, 0)]) for v, ok in enumerate(oks)]
    summary = evaluator.summarize(records)
    assert summary["tgc"] == pytest.approx(5 / 9) and summary["sgc"] == pytest.approx(1 / 3)
    repeated = evaluator.summarize(records[:3] + [{**records[0], "success": False}])
    assert repeated["tgc"] == pytest.approx((0.5 + 1 + 1) / 3) and repeated["sgc"] == 0.0  # every rollout counts
    assert "SGC" in evaluator.format_table({"a": summary})
    bare = evaluator.summarize([{"type": "t", "success": True}, {"type": "t", "success": False}])
    assert bare["tgc"] == 0.5 and "sgc" not in bare  # no scenarios named: no SGC


def test_options_and_errors():
    with pytest.raises(ValueError, match="backend kind 'docker'"):
        AppWorld(backend={"kind": "docker"})
    with pytest.raises(ValueError, match="unknown appworld backend option"):
        AppWorld(backend={"kind": "offline", "nope": 1})
    with pytest.raises(ValueError, match="unknown AppWorld slip"):
        AppWorld().make_agent("scripted", noise={"format_slip": 1.0})
    with pytest.raises(ValueError, match="not one of"):
        AppWorld().load_split("test_normal")
    assert AppWorld(backend={"kind": "appworld", "python": "/x"}).splits[-1] == "test_challenge"


def test_the_concise_pool_has_the_same_siblings(bench):
    full = bench.load_pool()
    concise = bench.load_pool(bench.default_pool.with_name("appworld_concise.json"))
    assert list(concise) == list(full)
    assert all(set(concise[n].diff(full[n])) == {"instruction", "few_shot"} for n in full)
    assert all(s.direction == full[s.name].direction for s in concise.siblings)


def test_hostile_cells_are_contained_and_scored():
    with AppWorld(backend={"kind": "offline", "wall_s": 0.5}) as bench:
        task = bench.load_split("dev")[0]
        cells = ["import socket", "open('/tmp/hsjax-aw-escape', 'w').write('x')", "import sqlite3", "while True: pass",
                 "print('still here')"]
        agent = Script(*[f"```python\n{c}\n```" for c in cells])
        spec = bench.load_pool().base.with_knobs(max_rounds=len(cells))
        r = run(bench, agent, [spec], [task])[0]
    observations = [t["observation"] for t in r["turns"]]
    assert "PermissionError" in observations[0] and "PermissionError" in observations[1]
    assert "TimeoutError" in observations[3] and observations[4] == "still here"
    assert r["failure_mode"] == "sandbox_limit" and not r["success"]
    assert not os.path.exists("/tmp/hsjax-aw-escape")
