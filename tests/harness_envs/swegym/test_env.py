"""SWEGymEpisode: the Episode protocol over a sandboxed work tree, the ways an episode ends, each
knob the episode itself implements (format feedback, iterations, reproduce-first, test-after-edit,
verify, context compression), workspaces closed on every path out, and the taxonomy's order."""
import os
import pathlib
import shutil
import tempfile

import pytest

from harness_envs import sandbox
from harness_envs.base import RESULT_KEYS, Episode, check_result
from harness_envs.registry import make_benchmark
from harness_envs.swegym import harness as swegym_harness
from harness_envs.swegym import taxonomy, tools
from harness_envs.swegym.scoring import Report
from tests.harness_envs.swegym.tiny_cache import make_cache

call = swegym_harness.format_call
FIX = ("range(len(items) - size)", "range(len(items) - size + 1)")


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    cache = make_cache(tmp_path_factory.mktemp("swegym_cache"))
    with make_benchmark("swegym", backend={"cache_dir": str(cache)}) as b:
        yield b


@pytest.fixture(scope="module")
def task(bench):
    return bench.load_split("train")[0]  # textkit: window drops its last run; the test is in the test patch


def play(bench, task, spec, replies):
    """Runs `replies` (strings, or functions of the episode's root) until the episode ends."""
    ep = bench.make_episode(task, spec)
    ep.reset()
    root = ep.info["root"]
    for reply in replies:
        if ep.done:
            break
        ep.step(reply(root) if callable(reply) else reply)
    return ep, root


def edit_fix(root):
    return call("str_replace_editor", command="str_replace", path=f"{root}/textkit/core.py", old_str=FIX[0],
                new_str=FIX[1])


def bash(command):
    return call("execute_bash", command=command)


FINISH = call("finish", message="done")


def test_an_episode_fixes_the_issue_and_records_it(bench, task):
    base = bench.load_pool().base
    ep, root = play(bench, task, base, [bash("ls"), edit_fix, FINISH])
    assert isinstance(ep, Episode) and ep.done and ep.turn == 3 and not os.path.exists(root)
    r = ep.result()
    check_result(r)
    assert set(RESULT_KEYS) <= set(r) and r["success"] and r["reward"] == 1.0 and r["failure_mode"] == "success"
    assert r["status"] == "finished" and r["answer"] == "done"
    assert r["actions"] == ["execute_bash", "str_replace_editor", "finish"]
    assert "+    return [items[i:i + size] for i in range(len(items) - size + 1)]" in r["patch"]
    assert r["report"]["resolved"] and r["report"]["f2p_passed"] == 1 and r["report"]["p2p_passed"] == 8
    assert r["edits"] == [{"command": "str_replace", "path": f"{root}/textkit/core.py", "ok": True}]
    assert r["commands"] == ["ls"] and r["blind_edit"] is True and r["syntax_errors"] == {}
    messages = ep.messages()
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant", "user", "assistant"]
    assert messages[3]["content"].startswith("Result of execute_bash:\n") and "exit code 0" in messages[3]["content"]
    with pytest.raises(RuntimeError, match="after the episode ended"):
        ep.step(FINISH)


# Hiding the cache is bubblewrap's (harness_envs/swegym/local_runtime.py: without it commands read
# the whole machine); CI installs it (.ci/install_bubblewrap.sh).
@pytest.mark.skipif(sandbox.isolation() != "bwrap",
                    reason="NOT EXERCISED: bubblewrap (bwrap) is not installed or does not run here")
def test_agent_commands_cannot_read_the_cache_wherever_it_lives():
    """The cache holds the gold patches and pristine sources; here it lives outside both the checkout
    and the temp root (which the runtime hides anyway), where only the benchmark knows to hide it."""
    outside = tempfile.mkdtemp(dir="/var/tmp")
    os.chmod(outside, 0o755)  # as a cache in a shared directory is: readable by anyone but for the hiding
    try:
        cache = make_cache(pathlib.Path(outside) / "cache")
        with make_benchmark("swegym", backend={"cache_dir": str(cache)}) as b:
            task = b.load_split("train")[0]
            instances = b.instances_path
            assert "range(len(items) - size + 1)" in instances.read_text()
            ep, _ = play(b, task, b.load_pool().base, [bash(f"cat {instances}; ls {cache}"), FINISH])
            observation = ep.messages()[3]["content"]
            assert "range(len(items) - size + 1)" not in observation and "No such file" in observation
    finally:
        shutil.rmtree(outside, ignore_errors=True)


def test_malformed_replies_get_feedback_then_end_the_episode(bench, task):
    base = bench.load_pool().base
    ep, _ = play(bench, task, base, ["I am thinking."] * 5)
    r = ep.result()
    assert r["status"] == "malformed" and r["failure_mode"] == "malformed_tool_call" and ep.turn == 4
    assert r["actions"] == ["format_retry"] * 3 + ["malformed"] and r["format_retries"] == 3
    assert "no <function=...> call found" in ep.messages()[3]["content"]
    ep, _ = play(bench, task, base.with_knobs(on_malformed="fail"), ["<function=bash>ls</function>"])
    assert ep.result()["failure_mode"] == "malformed_tool_call" and ep.turn == 1


def test_every_reply_counts_against_the_iteration_limit(bench, task):
    spec = bench.load_pool().base.with_knobs(max_iterations=3)
    ep, _ = play(bench, task, spec, ["no call", bash("ls"), bash("pwd"), bash("ls")])
    r = ep.result()
    assert ep.turn == 3 and r["status"] == "iteration_limit" and r["failure_mode"] == "iteration_limit"
    ep, _ = play(bench, task, bench.load_pool()["more_iterations"], [bash("ls")] * 31)
    assert ep.turn == 31 and not ep.done


def test_a_finish_without_changes_is_no_edit_unless_verify_holds_it_back(bench, task):
    base = bench.load_pool().base
    ep, _ = play(bench, task, base, [FINISH])
    r = ep.result()
    assert r["failure_mode"] == "no_edit" and r["report"]["failure"] == "empty_patch" and r["score_seconds"] < 0.5
    ep, _ = play(bench, task, base.with_knobs(verify_before_answer=True), [FINISH, edit_fix, FINISH])
    assert ep.messages()[3]["content"] == swegym_harness.VERIFY_PROMPT and ep.result()["success"]
    bad = call("str_replace_editor", command="str_replace", path="{root}", old_str="nope", new_str="x")
    ep, _ = play(bench, task, base, [lambda root: bad.replace("{root}", f"{root}/textkit/core.py"), FINISH])
    assert ep.result()["failure_mode"] == "edit_failed" and ep.result()["failed_edits"] == 1


def test_reproduce_first_refuses_edits_until_python_ran(bench, task):
    spec = bench.load_pool()["reproduce_first"]
    assert swegym_harness.REPRODUCE_RULE in bench.initial_messages(task, spec)[1]["content"]
    create = lambda root: call("str_replace_editor", command="create", path=f"{root}/repro.py",  # noqa: E731
                               file_text="from textkit.core import window\nassert len(window([1, 2, 3], 2)) == 2\n")
    ep, root = play(bench, task, spec, [edit_fix, create, bash("grep -n window textkit/core.py"), edit_fix])
    observations = [m["content"] for m in ep.messages() if m["role"] == "user"][1:]
    assert swegym_harness.REPRODUCE_REFUSAL in observations[0] and "File created" in observations[1]
    assert swegym_harness.REPRODUCE_REFUSAL in observations[3]  # grep ran no Python
    ep.step(bash("python repro.py"))
    assert "exit code 1" in ep.messages()[-1]["content"]
    ep.step(edit_fix(root))
    assert "was edited" in ep.messages()[-1]["content"]
    ep.step(FINISH)
    r = ep.result()
    assert r["success"] and r["blind_edit"] is False and [e["ok"] for e in r["edits"]] == [False, True, False, True]


def test_test_after_edit_reruns_the_failing_reproduction(bench, task):
    spec = bench.load_pool()["test_after_edit"]
    repro = "python -c 'from textkit.core import window; assert len(window([1, 2, 3], 2)) == 2'"
    guess = lambda root: call("str_replace_editor", command="insert", path=f"{root}/textkit/core.py",  # noqa: E731
                              insert_line=27, new_str="    # fixed?")
    ep, root = play(bench, task, spec, [edit_fix])
    assert swegym_harness.RETEST_LEAD not in ep.messages()[-1]["content"]  # nothing to rerun yet
    ep.step(call("str_replace_editor", command="undo_edit", path=f"{root}/textkit/core.py"))
    ep.step(bash("cd textkit && " + repro.replace("python", "python -B")))
    ep.step(bash("python -c 'print(1)'"))  # a later passing Python command does not replace the failing one
    ep.step(guess(root))
    last = ep.messages()[-1]["content"]
    assert swegym_harness.RETEST_LEAD in last and "AssertionError" in last and "exit code 1" in last
    ep.step(edit_fix(root))
    assert "exit code 0" in ep.messages()[-1]["content"].split(swegym_harness.RETEST_LEAD)[1]


def test_compression_condenses_older_observations_to_one_line(bench, task):
    spec = bench.load_pool()["compress_context"]
    view = lambda root: call("str_replace_editor", command="view", path=f"{root}/textkit/core.py")  # noqa: E731
    ep, root = play(bench, task, spec, [bash("cat CHANGES.txt"), view] * 3)
    ep.step(call("str_replace_editor", command="view", path=f"{root}/textkit/core.py"))
    full, shown = ep._history, ep.messages()
    assert len(full) == len(shown) == 2 + 2 * 7 and shown[:2] == full[:2]
    assert shown[3]["content"] == "[earlier output of `cat CHANGES.txt` condensed: 320 lines, exit code 0]"
    assert shown[5]["content"].startswith("[earlier view of")
    assert shown[-8:] == full[-8:] and all(m["role"] == f["role"] for m, f in zip(shown, full))
    assert sum(len(m["content"]) for m in shown) < sum(len(m["content"]) for m in full) // 2
    base_view = bench.make_episode(task, bench.load_pool().base)
    base_view.reset()
    base_view.step(bash("cat CHANGES.txt"))
    assert "[TRUNCATED]" in base_view.messages()[-1]["content"]  # 24,000 characters cut at 16,000
    base_view.abort("test over")


def test_aborts_and_failures_close_the_workspace_and_name_the_mode(bench, task, monkeypatch):
    base = bench.load_pool().base
    ep, root = play(bench, task, base, [bash("ls")])
    ep.abort("context_overflow")
    assert ep.done and ep.result()["failure_mode"] == "context_overflow" and not os.path.exists(root)
    ep, root = play(bench, task, base, [edit_fix])
    ep.abort("policy_error")  # SWE-bench scores the final patch, however the episode ended
    assert ep.result()["failure_mode"] == "success" and ep.result()["status"] == "aborted"
    ep, root = play(bench, task, base, [lambda root: call("str_replace_editor", command="insert",
                                                          path=f"{root}/textkit/core.py", insert_line=0, new_str="#")])
    ep.abort("policy_error")
    assert ep.result()["failure_mode"] == "policy_error" and ep.result()["patch"]
    ep, root = play(bench, task, base, [])
    monkeypatch.setattr(tools.Bash, "run", lambda *a, **k: 1 / 0)
    ep.step(bash("ls"))
    r = ep.result()
    assert r["status"] == "env_error" and r["failure_mode"] == "env_error" and "ZeroDivisionError" in r["error"]
    assert not os.path.exists(root)

    def broken(instance):
        raise OSError("no disk")
    ep = type(ep)(task, base, broken, bench.score)
    ep.reset()
    assert ep.done and ep.result()["failure_mode"] == "env_error" and "no disk" in ep.result()["error"]


def test_a_patch_that_breaks_syntax_is_a_syntax_error(bench, task):
    base = bench.load_pool().base
    broken = lambda root: call("str_replace_editor", command="str_replace", path=f"{root}/textkit/core.py",  # noqa
                               old_str=FIX[0], new_str=FIX[1] + "(")
    ep, _ = play(bench, task, base, [broken, FINISH])
    r = ep.result()
    assert r["failure_mode"] == "syntax_error" and "textkit/core.py" in r["syntax_errors"]


def _report(resolved=False, failure="f2p_failing", p2p=(8, 8)):
    return Report("x", True, "git", 0, 1, p2p[0], p2p[1], resolved, None if resolved else failure, 0.0, "")


@pytest.mark.parametrize("trace,report,mode", [
    (taxonomy.Trace("iteration_limit", patch="p"), _report(resolved=True), "success"),
    (taxonomy.Trace("aborted", "context_overflow", patch="p", syntax_errors={"a.py": "x"}), _report(),
     "context_overflow"),
    (taxonomy.Trace("aborted", "policy_error"), None, "policy_error"),
    (taxonomy.Trace("aborted", "env_error"), None, "env_error"),
    (taxonomy.Trace("finished"), None, "env_error"),
    (taxonomy.Trace("malformed", patch="p", syntax_errors={"a.py": "x"}), _report(), "malformed_tool_call"),
    (taxonomy.Trace("iteration_limit", patch="p", syntax_errors={"a.py": "x"}), _report(), "iteration_limit"),
    (taxonomy.Trace("finished", patch="p", syntax_errors={"a.py": "x"}, blind=True), _report(), "syntax_error"),
    (taxonomy.Trace("finished", failed_edits=2), _report(failure="empty_patch"), "edit_failed"),
    (taxonomy.Trace("finished"), _report(failure="empty_patch"), "no_edit"),
    (taxonomy.Trace("finished", patch="p", blind=True), _report(failure="test_patch_does_not_apply"),
     "patch_does_not_apply"),
    (taxonomy.Trace("finished", patch="p", blind=True), _report(failure="test_infrastructure", p2p=(0, 8)),
     "test_tampering"),
    (taxonomy.Trace("finished", patch="p"), _report(failure="test_run_tampered", p2p=(0, 8)), "test_tampering"),
    (taxonomy.Trace("finished", patch="p"), _report(failure="no_test_report", p2p=(0, 8)), "p2p_broken"),
    (taxonomy.Trace("finished", patch="p", blind=True), _report(p2p=(7, 8)), "blind_edit"),
    (taxonomy.Trace("finished", patch="p"), _report(failure="p2p_broken", p2p=(7, 8)), "p2p_broken"),
    (taxonomy.Trace("finished", patch="p"), _report(p2p=(7, 8)), "p2p_broken"),
    (taxonomy.Trace("finished", patch="p"), _report(), "f2p_failing"),
    (taxonomy.Trace("finished", patch="p"), _report(failure="test_timeout"), "f2p_failing"),
])
def test_the_first_cause_names_the_failure_mode(trace, report, mode):
    assert taxonomy.assign(trace, report) == mode and mode in taxonomy.FAILURE_MODES
