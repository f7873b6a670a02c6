"""The testbed's API regime on AppWorld's protocol: per-task apps from disjoint coined words, hidden API
names that no message of the base harness leaks, held-out wordings of their own, and expert styles
whose episodes do what the regime needs (docs/testbed.md, "The API regime")."""
import re

import pytest

from harness_envs.appworld import harness as appworld_harness
from harness_envs.registry import make_benchmark
from harness_envs.synth import apis, apis_expert, names
from hsjax.policies.base import SamplingParams
from hsjax.rollout.runner import EpisodeRunner, Job


@pytest.fixture(scope="module")
def bench():
    with make_benchmark("synth_apis") as b:
        yield b


@pytest.fixture(scope="module")
def pool(bench):
    return bench.load_pool()


@pytest.fixture(scope="module")
def tasks():
    return apis.make_tasks("apis_train", 8) + apis.make_tasks("apis_heldout", 8)


def words_of(task):
    return {task.app, *(n for pair in task.apis for n in pair), *(item for item, _ in task.items)}


def run(bench, agent, specs, tasks):
    runner = EpisodeRunner(bench.make_episode, agent, SamplingParams(), env_workers=2)
    return runner.run([Job(s, t) for s in specs for t in tasks])


def test_tasks_are_deterministic_and_their_words_disjoint_by_kind():
    assert apis.make_task("apis_train", 3, 17) == apis.make_task("apis_train", 3, 17)
    assert apis.make_task("apis_train", 0, 1) != apis.make_task("apis_train", 1, 1)
    for split, heldout in (("apis_train", False), ("apis_heldout", True)):
        for task in apis.make_tasks(split, 200):
            words = words_of(task)
            assert len(words) == 1 + 2 * apis.ATTRIBUTES + apis.ITEMS
            assert all(names.is_heldout_word(w) == heldout for w in words)
            syllables = [s for w in words for s in re.findall("..", w)]
            assert len(syllables) == len(set(syllables))  # no syllable serves two names of a task
            assert task.answer == dict(task.items)[task.item][[a for _, a in task.apis].index(task.attribute)]
    with pytest.raises(ValueError, match="unknown API-regime split"):
        apis.make_task("names_train", 0, 0)


def test_hidden_tasks_name_no_api_and_wordings_are_disjoint():
    for split, kind in (("apis_train", "train"), ("apis_heldout", "heldout")):
        other = "heldout" if kind == "train" else "train"
        for task in apis.make_tasks(split, 60):
            api_names = {n for n, _ in task.apis}
            named = {w for w in re.findall(r"\w+", task.question) if w in api_names}
            assert task.hidden == apis.is_hidden(task.index) == (task.index % 2 == 1)
            assert named == (set() if task.hidden else {task.api})
            assert any(task.question.endswith(t) for t in apis.TRIGGERS[kind]) == task.hidden
            assert not any(t in task.question for t in apis.TRIGGERS[other])
            assert task.attribute in task.question and task.item in task.question and task.app in task.question


def test_the_registry_serves_the_task_app_and_the_shared_ones(tasks):
    task = tasks[1]
    registry = apis.task_registry(task)
    assert set(registry.apps) == {"supervisor", "api_docs", task.app}
    listed = {a["name"]: a["description"] for a in registry.api_list(task.app)}
    assert listed[task.api] == f"the {task.attribute} of an item"
    assert registry.call(None, task.app, task.api, [], {"item": task.item}) == task.answer
    with pytest.raises(Exception, match="no item named"):
        registry.call(None, task.app, task.api, [], {"item": "nothing"})
    with pytest.raises(Exception, match="has no API named"):
        registry.call(None, task.app, apis.guessed_api(task), [], {"item": task.item})


def test_the_oracle_and_the_lookup_solve_every_task_under_every_harness(bench, pool, tasks):
    specs = pool.select(["base", "docs_first", "api_list", "more_rounds"])
    tasks = tasks[:4] + tasks[-4:]
    oracle = run(bench, bench.make_agent("oracle"), specs, tasks)
    assert all(t.result["success"] for t in oracle)
    lookup = run(bench, bench.make_agent("expert", default_style="docs_first"), specs, tasks)
    assert all(t.result["success"] for t in lookup)
    for traj in lookup:  # the lookup is two cells on a hidden task, one on a visible one
        hidden = apis.is_hidden(names.task_index(traj.result["task_id"]))
        assert len(traj.turns) == (2 if hidden else 1)
        assert apis.opens_with_docs([t["text"] for t in traj.turns]) == hidden


def test_a_guess_fails_under_base_and_only_the_api_list_repairs_it(bench, pool, tasks):
    hidden = [t for t in tasks if t.hidden]
    specs = list(pool.values())
    trajs = run(bench, bench.make_agent("expert", default_style="guess_api"), specs, hidden)
    by_harness = {}
    for traj in trajs:
        by_harness.setdefault(traj.result["harness"], []).append(traj.result["success"])
    assert all(by_harness["api_list"])
    assert not any(ok for h, oks in by_harness.items() if h != "api_list" for ok in oks)
    base = [t for t in trajs if t.result["harness"] == "base"]
    assert {t.result["failure_mode"] for t in base} == {"gave_up"}


def test_no_base_observation_leaks_a_hidden_api_name(bench, pool, tasks):
    """After a guess, the base harness shows the world's 404, which names no API of the app; the
    api_list sibling's observation lists them (that is its rescue)."""
    for task in (t for t in tasks if t.hidden):
        guess = apis_expert.fence(apis.gold_cell(task, apis.guessed_api(task)))
        for harness, leaks in (("base", False), ("traceback_summary", False), ("api_list", True)):
            episode = bench.make_episode(task, pool[harness])
            episode.reset()
            episode.step(guess)
            observation = episode.messages()[-1]["content"]
            assert "404 Not Found" in observation
            assert (task.api in observation) == leaks, (harness, observation)
            episode.abort("test over")


def test_answers_are_checked_and_a_wrong_one_fails(bench, pool, tasks):
    task = tasks[0]
    for code, ok in ((task.solution, True), (f"apis.supervisor.complete_task(answer={task.answer + 1})", False),
                     ('apis.supervisor.complete_task(status="fail")', False)):
        episode = bench.make_episode(task, pool.base)
        episode.reset()
        episode.step(apis_expert.fence(code))
        assert episode.done and episode.result()["success"] == ok, code


def test_the_base_prompt_says_nothing_of_docs_and_the_hint_does(bench, pool, tasks):
    base = bench.initial_messages(tasks[1], pool.base)[0]["content"]
    hinted = bench.initial_messages(tasks[1], pool["docs_first"])[0]["content"]
    assert "api_docs" not in base and "login" not in base
    assert hinted.startswith(base) and "show_api_descriptions" in hinted[len(base):]
    assert pool.base.knob("instruction") == "brief" and not pool.base.knob("few_shot")


def test_slice_metrics_split_hidden_and_visible_and_count_the_lookup(bench):
    lookup = apis_expert.fence('print(apis.api_docs.show_api_descriptions(app_name="x"))')
    records = [{"task_id": "apis_train-s0-00001", "success": True, "replies": [lookup, "..."]},
               {"task_id": "apis_train-s0-00003", "success": False, "replies": ["```python\nx\n```"]},
               {"task_id": "apis_train-s0-00002", "success": True, "replies": ["```python\nx\n```"]}]
    assert bench.slice_metrics(records) == {"hidden/success": 0.5, "hidden/opens_docs": 0.5,
                                            "visible/success": 1.0, "visible/opens_docs": 0.0}
    assert not apis.opens_with_docs([]) and apis.opens_with_docs(["apis.api_docs.show_api_doc(app_name='a')"])


def test_the_expert_reads_the_api_from_either_listing(tasks):
    task = next(t for t in tasks if t.hidden)
    listing = str(apis.task_registry(task).api_list(task.app))
    signatures = appworld_harness.app_list_note(task.app, apis.task_registry(task).signatures(task.app))
    assert apis_expert.read_api(task, listing) == task.api == apis_expert.read_api(task, signatures)
    assert apis_expert.read_api(task, "Execution successful.") is None
    with pytest.raises(ValueError, match="style"):
        apis_expert.ApisExpert("show_tables")


def test_only_the_offline_world_serves_the_regime():
    with pytest.raises(ValueError, match="offline world only"):
        make_benchmark("synth_apis", backend={"kind": "appworld"})
