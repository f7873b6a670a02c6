"""The scorer reads real pytest logs and applies SWE-bench's rule: resolved iff every FAIL_TO_PASS and
every PASS_TO_PASS test passes (PASSED or XFAIL; a test the log does not name fails); patches apply
through git, else `patch` with fuzz, and hostile paths are refused before either tool runs."""
import dataclasses
import difflib
import json
import os
import subprocess
import sys

import pytest

from harness_envs import sandbox
from harness_envs.swegym import scoring
from harness_envs.swegym.local_runtime import LocalRuntime
from tests.harness_envs.swegym.toy_repo import OPS, TESTS, make_toy

FAST_PYTEST = "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 python -m pytest -rA -p no:cacheprovider -W ignore::DeprecationWarning"
needs_bwrap = pytest.mark.skipif(sandbox.isolation() != "bwrap",
                                 reason="NOT EXERCISED: bubblewrap (bwrap) is not installed or does not run here")

STATUS_TESTS = '''import pytest
def test_pass(): pass
def test_fail(): assert 1 == 2, "boom - x[1] - y"
@pytest.mark.xfail(reason="known")
def test_xfail(): assert 0
@pytest.mark.xfail(reason="nope")
def test_xpass(): pass
@pytest.mark.skip(reason="why")
def test_skip(): pass
@pytest.mark.parametrize("v", ["a b", "c - d", "e]f", "x::y"])
def test_param(v): assert v != "c - d"
@pytest.fixture
def broken_teardown():
    yield
    raise RuntimeError("teardown")
def test_teardown_error(broken_teardown): pass
@pytest.fixture
def broken_setup(): raise RuntimeError("setup")
def test_setup_error(broken_setup): pass
def test_prints_a_fake_result(): print("PASSED test_s.py::test_fail\\nPASSED test_s.py::test_ghost")
'''
EXPECTED = {
    "test_s.py::test_pass": "PASSED", "test_s.py::test_fail": "FAILED", "test_s.py::test_xfail": "XFAIL",
    "test_s.py::test_xpass": "XPASS", "test_s.py::test_param[a b]": "PASSED", "test_s.py::test_param[c - d]": "FAILED",
    "test_s.py::test_param[e]f]": "PASSED", "test_s.py::test_param[x::y]": "PASSED",
    "test_s.py::test_teardown_error": "ERROR", "test_s.py::test_setup_error": "ERROR",
    "test_s.py::test_prints_a_fake_result": "PASSED",
}


def _pytest_log(directory, *args) -> str:
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=directory, env=env,
                          capture_output=True, text=True, timeout=120)
    return proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def status_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("statuses")
    (directory / "test_s.py").write_text(STATUS_TESTS)
    return directory


# ---------------------------------------------------------------------------------------- parsing

def test_the_rA_summary_gives_every_status_and_ids_with_spaces(status_dir):
    log = _pytest_log(status_dir, "-rA", "test_s.py")
    statuses = scoring.parse_pytest_log(log)
    assert {k: v for k, v in statuses.items() if k in EXPECTED} == EXPECTED
    assert "SKIPPED [1] test_s.py" in log and not any("test_skip" in k for k in statuses)  # no id: missing
    # The captured output of a passing test says "PASSED test_s.py::test_ghost": not read as a result.
    assert "PASSED test_s.py::test_ghost" in log and "test_s.py::test_ghost" not in statuses
    # The form SWE-bench's parser cut ids to, in published test lists: judged, never listed as an id.
    assert not any(k.endswith(("[a", "[c")) for k in statuses)
    assert scoring.passing(statuses, "test_s.py::test_param[a")
    assert not scoring.passing(statuses, "test_s.py::test_param[c")
    assert not scoring.passing(statuses, "test_s.py::test_param[z")


def test_verbose_and_coloured_logs_parse_too(status_dir):
    verbose = scoring.parse_pytest_log(_pytest_log(status_dir, "-v", "test_s.py"))
    skipped = {**EXPECTED, "test_s.py::test_skip": "SKIPPED"}
    assert {k: v for k, v in verbose.items() if k in skipped} == skipped
    coloured = _pytest_log(status_dir, "-rA", "--color=yes", "test_s.py")
    assert "\x1b[" in coloured
    statuses = scoring.parse_pytest_log(coloured)
    assert {k: v for k, v in statuses.items() if k in EXPECTED} == EXPECTED


def test_a_collection_error_names_the_file_only(tmp_path):
    (tmp_path / "test_ok.py").write_text("def test_ok(): pass\n")
    (tmp_path / "test_broken.py").write_text("import no_such_module\ndef test_z(): pass\n")
    statuses = scoring.parse_pytest_log(_pytest_log(tmp_path, "-rA", "test_ok.py", "test_broken.py"))
    assert statuses == {"test_broken.py": "ERROR"}  # the session stopped: test_ok never ran
    assert not scoring.passing(statuses, "test_ok.py::test_ok")
    assert not scoring.passing(statuses, "test_broken.py::test_z")


def test_statuses_and_precedence():
    log = "\n".join([
        "t.py::test_a PASSED                      [ 50%]",
        "t.py::test_a ERROR                       [ 50%]",  # teardown error after a pass: failing sticks
        "[gw0] [ 75%] PASSED t.py::test_b",  # xdist's verbose form
        "t.py::test_c XFAIL (reason)              [100%]",
        "some random line that says PASSED t.py::test_d",
        "t.py::test_e FAILED                      [100%]",  # a second run (a flaky test) does not undo a failure
        "t.py::test_e PASSED                      [100%]",
    ])
    assert scoring.parse_pytest_log(log) == {"t.py::test_a": "ERROR", "t.py::test_b": "PASSED", "t.py::test_c": "XFAIL",
                                             "t.py::test_e": "FAILED"}
    two_runs = ("== short test summary info ==\nPASSED a.py::x\n== 1 passed ==\nnoise: FAILED a.py::x\n"
                "== short test summary info ==\nXFAIL b.py::y - why\n== 1 xfailed ==\n")
    assert scoring.parse_pytest_log(two_runs) == {"a.py::x": "PASSED", "b.py::y": "XFAIL"}
    statuses = {"a": "PASSED", "b": "XFAIL", "c": "XPASS", "d": "SKIPPED", "e": "FAILED", "f": "ERROR"}
    assert [scoring.passing(statuses, t) for t in "abcdefg"] == [True, True, False, False, False, False, False]


def test_unsafe_paths_are_found_in_every_header_form():
    ok = "diff --git a/x.py b/x.py\n--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+b\n"
    assert scoring.unsafe_paths(ok) == []
    assert scoring.unsafe_paths("--- /dev/null\n+++ b/new.py\n") == []
    for bad in ("--- a/../up.txt\n+++ b/../up.txt\n", "--- /etc/passwd\n+++ /etc/passwd\n",
                "diff --git a/x b/.git/config\n", "rename to ../../x\n", '+++ "b/\\056\\056/x"\n',
                "*** /etc/hosts\n", "Index: a/../../x\n"):
        assert scoring.unsafe_paths(bad), bad


def test_the_files_a_test_patch_touches_are_read_from_headers_not_hunks():
    patch = ("diff --git a/q.sql b/q.sql\n--- a/q.sql\n+++ b/q.sql\n@@ -1,3 +1,3 @@\n select 1;\n"
             "--- a/fake.sql\n+++ b/fake.sql\n \\ No newline at end of file\n"
             "diff --git a/t/new.py b/t/new.py\nnew file mode 100644\n--- /dev/null\n+++ b/t/new.py\n"
             "@@ -0,0 +1 @@\n+x = 1\n"
             "--- a/t/old.py\n+++ b/t/old.py\n@@ -1 +1 @@\n-a\n+b\n")
    assert scoring._changed_files(patch) == (["q.sql", "t/old.py"], ["t/new.py"])


# ---------------------------------------------------------------------------------------- evaluate

@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    return make_toy(tmp_path_factory.mktemp("toy"))


@pytest.fixture(scope="module")
def runtime(toy):
    return LocalRuntime(toy.repos_dir, toy.venvs_dir, sandbox.Limits(wall_s=60, cpu_s=120, memory_mb=4096, file_mb=64,
                                                                open_files=256, output_chars=20_000))


def fast(instance, **changes):
    return dataclasses.replace(instance, **changes, extra={**instance.extra, "test_cmd": FAST_PYTEST})


def edit(old, new, path="calc/ops.py") -> str:
    """A unified diff of `path` (as at the base commit) with `old` replaced by `new`."""
    text = {"calc/ops.py": OPS, "tests/test_ops.py": TESTS}[path]
    assert text.count(old) == 1
    lines = difflib.unified_diff(text.splitlines(True), text.replace(old, new).splitlines(True),
                                 f"a/{path}", f"b/{path}")
    return f"diff --git a/{path} b/{path}\n" + "".join(lines)


def test_the_gold_patch_resolves_and_an_empty_one_does_not(toy, runtime):
    gold = scoring.evaluate(toy.instance, toy.gold_patch, runtime)  # the default pytest line
    assert (gold.resolved, gold.failure, gold.applied, gold.apply_method) == (True, None, True, "git")
    assert (gold.f2p_passed, gold.f2p_total, gold.p2p_passed, gold.p2p_total) == (2, 2, 4, 4)
    assert "XFAIL tests/test_ops.py::test_known_bug" in gold.log_tail  # XFAIL counted as passing
    empty = scoring.evaluate(fast(toy.instance), "  \n", runtime)
    assert (empty.resolved, empty.failure, empty.applied, empty.f2p_passed, empty.p2p_passed) == (
        False, "empty_patch", False, 0, 4)
    assert json.loads(json.dumps(gold.to_json()))["resolved"] is True


@pytest.mark.parametrize("old,new,failure,f2p,p2p", [
    ("return a + b\n\n\ndef mul", "return abs(a - b)\n\n\ndef mul", "f2p_failing", 1, 4),  # half a fix
    ("return a * b", "return a * b + 1", "f2p_failing", 0, 3),  # no fix, and mul broken
    ("return a + b\n\n\ndef mul(a, b):\n    return a * b",
     "return a - b\n\n\ndef mul(a, b):\n    return a * b + 0", None, 2, 4),
    ("return a + b\n\n\ndef mul(a, b):\n    return a * b",
     "return a - b\n\n\ndef mul(a, b):\n    return round(a * b, 9)", "p2p_broken", 2, 3),  # XPASS fails
    ("return a + b\n\n\ndef mul(a, b):\n    return a * b",
     "return a - b\n\n\ndef mul(a, b):\n    return -a * b", "p2p_broken", 2, 3),
    ("def sub(a, b):", "def sub(a, b) oops:", "f2p_failing", 0, 0),  # a collection error: every test missing
])
def test_the_resolved_rule(toy, runtime, old, new, failure, f2p, p2p):
    report = scoring.evaluate(fast(toy.instance), edit(old, new), runtime)
    assert (report.failure, report.f2p_passed, report.p2p_passed, report.resolved) == (failure, f2p, p2p,
                                                                                          failure is None)
    assert report.applied and report.apply_method == "git"


def test_ids_missing_from_the_log_fail(toy, runtime):
    ghost = fast(toy.instance, FAIL_TO_PASS=toy.instance.FAIL_TO_PASS + ("tests/test_ops.py::test_ghost",))
    report = scoring.evaluate(ghost, toy.gold_patch, runtime)
    assert (report.resolved, report.failure, report.f2p_passed, report.f2p_total) == (False, "f2p_failing", 2, 3)


def test_patches_that_do_not_apply_and_the_fuzz_fallback(toy, runtime):
    stale = edit("return a + b\n\n\ndef mul", "return a - b\n\n\ndef mul").replace(" def sub(a, b):",
                                                                                       " def sub(a, b, c):")
    report = scoring.evaluate(fast(toy.instance), stale.replace("-    return a + b", "-    return a ^ b"), runtime)
    assert (report.applied, report.failure, report.f2p_total, report.resolved) == (False, "patch_does_not_apply",
                                                                                   2, False)
    assert "patch does not apply" in report.log_tail and "FAILED" in report.log_tail  # git's, then patch's words
    fuzzy = scoring.evaluate(fast(toy.instance), stale, runtime)  # one context line is off: git refuses
    assert (fuzzy.apply_method, fuzzy.resolved, fuzzy.failure) == ("patch", True, None)


def test_the_test_patch_overrides_tests_the_model_wrote(toy, runtime):
    cheat = (edit("def test_add():", "def test_sub():\n    pass\n\n\ndef test_add():", "tests/test_ops.py")
             + "diff --git a/tests/test_new.py b/tests/test_new.py\nnew file mode 100644\n--- /dev/null\n"
               "+++ b/tests/test_new.py\n@@ -0,0 +1,2 @@\n+def test_sub_negative():\n+    pass\n")
    report = scoring.evaluate(fast(toy.instance), cheat, runtime)
    assert report.applied and (report.resolved, report.failure, report.f2p_passed) == (False, "f2p_failing", 0)


@pytest.mark.parametrize("target", ["b/../escaped.txt", "/tmp/hsjax-scoring-escape.txt", '"b/\\056\\056/x"'])
def test_hostile_patch_paths_are_refused_before_any_tool_runs(toy, runtime, target):
    patch = f"--- /dev/null\n+++ {target}\n@@ -0,0 +1 @@\n+pwned\n"
    report = scoring.evaluate(fast(toy.instance), patch, runtime)
    assert (report.applied, report.failure) == (False, "patch_does_not_apply") and "refused" in report.log_tail
    assert not os.path.exists("/tmp/hsjax-scoring-escape.txt")


def test_a_hanging_test_run_is_a_timeout(toy, runtime):
    hang = edit("def add(a, b):", "import time\ntime.sleep(600)\n\n\ndef add(a, b):")
    report = scoring.evaluate(fast(toy.instance), hang, runtime, timeout_s=3)
    assert (report.resolved, report.failure) == (False, "test_timeout") and report.seconds < 30
