"""Scripted SWE-Gym agents: the gold patch as editor calls, the oracle resolving under every harness,
and the locality matrix: each slip fails under the base harness with its failure mode and is
repaired by its own sibling and by no other harness of the pool. On the tiny cache, so it always runs;
the same matrix on the built offline cache is perf/swegym_bench.py."""
import dataclasses
import subprocess

import pytest

from harness_envs.registry import make_benchmark
from harness_envs.swegym import agents
from harness_envs.swegym.instances import Instance
from hsjax.policies.base import SamplingParams
from hsjax.rollout.runner import EpisodeRunner, Job
from tests.harness_envs.swegym.tiny_cache import make_cache

CONTEXT_CHARS = 100_000  # experiments/swegym.py's eval budget (about SWE-Gym's 32k tokens)

PATCH = """diff --git a/pkg/a.py b/pkg/a.py
index 1111111..2222222 100644
--- a/pkg/a.py
+++ b/pkg/a.py
@@ -3,4 +3,4 @@ def f():
 x = 1
-y = 2
+y = 3
 z = 4
 w = 5
@@ -20,3 +20,4 @@ def g():
 a = 1
+b = 2
 c = 3
 d = 4
diff --git a/pkg/new.py b/pkg/new.py
new file mode 100644
index 0000000..3333333
--- /dev/null
+++ b/pkg/new.py
@@ -0,0 +1,2 @@
+print(1)
+print(2)
diff --git a/old.txt b/old.txt
deleted file mode 100644
index 4444444..0000000
--- a/old.txt
+++ /dev/null
@@ -1 +0,0 @@
-gone
"""


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    cache = make_cache(tmp_path_factory.mktemp("swegym_cache"))
    with make_benchmark("swegym", backend={"cache_dir": str(cache)}) as b:
        yield b


def run(bench, agent, specs, tasks):
    runner = EpisodeRunner(bench.make_episode, agent, SamplingParams(), env_workers=4, max_context_chars=CONTEXT_CHARS)
    return runner.results([Job(s, t) for s in specs for t in tasks])


def test_a_patch_becomes_editor_calls_bottom_up():
    files = agents.parse_patch(PATCH)
    assert [(f.path, f.kind, len(f.hunks)) for f in files] == [("pkg/a.py", "modify", 2), ("pkg/new.py", "create", 1),
                                                                ("old.txt", "delete", 1)]
    assert files[0].hunks[0].target() == (4, "y = 2") and files[0].hunks[1].target() == (20, "a = 1")
    inst = Instance("i", "o/r", "c", "p", PATCH, "", ("t.py::a",), ())
    edits = agents.gold_edits(inst, "/w")
    assert [(e.command, e.path, e.line) for e in edits] == [("str_replace", "/w/pkg/a.py", 20),
                                                            ("str_replace", "/w/pkg/a.py", 3),
                                                            ("create", "/w/pkg/new.py", 0), ("delete", "/w/old.txt", 0)]
    assert edits[0].old == "a = 1\nc = 3\nd = 4" and edits[0].new == "a = 1\nb = 2\nc = 3\nd = 4"
    assert edits[2].new == "print(1)\nprint(2)\n"
    assert agents.target_line(inst, "/w") == ("/w/pkg/a.py", 4, "y = 2")
    broken = agents._break_syntax(edits[1])
    assert broken.new.split("\n")[2] == agents.SYNTAX_SLIP


def test_the_oracle_resolves_every_instance_under_every_harness(bench):
    pool = bench.load_pool()
    tasks = [t for split in bench.splits for t in bench.load_split(split)]
    results = run(bench, bench.make_agent("oracle"), list(pool.values()), tasks)
    assert all(r["success"] for r in results), [(r["task_id"], r["harness"], r["failure_mode"]) for r in results
                                                if not r["success"]]
    assert bench.summarize(results)["resolved"] == 1.0


def test_the_oracle_widens_an_old_str_that_is_not_unique(bench, tmp_path):
    task = bench.load_split("train")[0]
    repo = bench.runtime.source(task)
    core = subprocess.run(["git", "--git-dir", repo, "show", f"{task.base_commit}:textkit/core.py"],
                          capture_output=True, text=True, check=True).stdout
    lines = core.split("\n")
    _, line = [i for i, text in enumerate(lines) if text == "    values = list(values)"]  # 0-based: mean, describe
    patch = (f"diff --git a/textkit/core.py b/textkit/core.py\n--- a/textkit/core.py\n+++ b/textkit/core.py\n"
             f"@@ -{line + 1} +{line + 1} @@\n-    values = list(values)\n+    values = list(values)  # a copy\n")
    twin = dataclasses.replace(task, instance_id="tiny__textkit-1", patch=patch, test_patch="",
                               FAIL_TO_PASS=("tests/test_core.py::test_describe",))
    result = run(bench, bench.make_agent("oracle"), [bench.load_pool().base], [twin])[0]
    assert result["success"], result["failure_mode"]
    assert result["patch"].count("+    values = list(values)  # a copy") == 1
    assert f"@@ -{line - 2},7 +{line - 2},7 @@" in result["patch"]  # describe's line, not mean's


@pytest.mark.parametrize("slip", sorted(agents.SLIPS))
def test_each_slip_is_repaired_by_its_sibling_only(bench, slip):
    info = agents.SLIPS[slip]
    pool = bench.load_pool()
    task = bench.load_split("train")[0]  # the hidden-test instance; the matrix row over the whole pool
    results = run(bench, bench.make_agent("scripted", noise={slip: 1.0}), list(pool.values()), [task])
    by = {r["harness"]: r for r in results}
    assert by["base"]["failure_mode"] == info.failure_mode
    assert {h for h, r in by.items() if r["success"]} == {info.sibling}, {h: r["failure_mode"] for h, r in by.items()}
    other = bench.load_split("test")[0]  # the visible-test instance (empty test patch): base and sibling
    results = run(bench, bench.make_agent("scripted", noise={slip: 1.0}), pool.select(["base", info.sibling]), [other])
    assert [(r["success"], r["failure_mode"]) for r in results] == [(False, info.failure_mode), (True, "success")]


def test_slips_are_drawn_per_episode_and_checked():
    agent = agents.SlippingAgent({"syntax": 0.5, "indentation": 1.0}, seed=3)
    info = {"task_id": "t", "sample_index": 1}
    assert agent.slips_for(info) == agent.slips_for(dict(info)) and "indentation" in agent.slips_for(info)
    drawn = {agent.slips_for({"task_id": f"t{i}"}) for i in range(40)}
    assert len(drawn) == 2
    with pytest.raises(ValueError, match="unknown SWE-Gym slip"):
        agents.SlippingAgent({"typo": 1.0})
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        agents.SlippingAgent({"syntax": 2.0})
    with pytest.raises(KeyError, match="info\\['root'\\]"):
        agents.OracleAgent().chat([[{"role": "user", "content": "x"}]], infos=[{"task": None, "task_id": "t"}])
