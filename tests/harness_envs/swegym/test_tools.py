"""The tools' semantics over a real sandboxed work tree (LocalRuntime on a tiny cache): the editor's
view numbering and windows, create/str_replace/insert/undo_edit, the error observations, the hint
and the compile check; execute_bash's exit line, working directory and time-out."""
import pytest

from harness_envs.swegym import harness as swegym_harness
from harness_envs.swegym import tools
from harness_envs.swegym.instances import load_jsonl
from harness_envs.swegym.local_runtime import LocalRuntime
from tests.harness_envs.swegym.tiny_cache import make_cache


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return make_cache(tmp_path_factory.mktemp("swegym_cache"))


@pytest.fixture
def ws(cache):
    runtime = LocalRuntime(cache / "repos", cache / "venvs")
    instance = load_jsonl(cache / "instances" / "offline.jsonl")[0]
    with runtime.workspace(instance) as workspace:
        yield workspace


def core(ws) -> str:
    return f"{ws.root}/textkit/core.py"


def test_view_numbers_lines_as_cat_n_and_honours_view_range(ws):
    ed = tools.Editor(ws)
    res = ed.call({"command": "view", "path": core(ws)})
    lines = ws.read_file(core(ws)).split("\n")
    assert res.ok and res.body.split("\n")[1] == f"     1\t{lines[0]}"
    assert res.body.count("\n") == len(lines) - 1  # header + every line, no trailing empty line
    res = ed.call({"command": "view", "path": core(ws), "view_range": [3, 5]})
    assert res.body.split("\n")[1:] == [f"{n:6}\t{lines[n - 1]}" for n in (3, 4, 5)]
    tail = ed.call({"command": "view", "path": core(ws), "view_range": [50, -1]}).body
    assert tail.split("\n")[1].startswith("    50\t") and "[lines" not in tail
    assert ed.call({"command": "view", "path": core(ws), "view_range": [50, 999]}).body == tail  # end clamps
    for bad in ([0, 3], [999, 1000], [9, 4]):
        res = ed.call({"command": "view", "path": core(ws), "view_range": bad})
        assert res.error == "bad_range" and res.body.startswith("ERROR:")


def test_view_of_a_directory_lists_two_levels_without_hidden_items(ws):
    res = tools.Editor(ws).call({"command": "view", "path": ws.root})
    assert res.ok and f"{ws.root}/textkit/core.py" in res.body and f"{ws.root}/tests" in res.body
    assert "/.git" not in res.body
    res = tools.Editor(ws).call({"command": "view", "path": ws.root, "view_range": [1, 2]})
    assert res.error == "bad_range"


def test_a_view_window_shows_that_many_lines(ws):
    ed = tools.Editor(ws, view_window=10)
    res = ed.call({"command": "view", "path": core(ws)})
    numbers = [int(x.split("\t")[0]) for x in res.body.split("\n")[1:-1]]
    assert numbers == list(range(1, 11)) and res.body.endswith("see others with view_range]")
    res = ed.call({"command": "view", "path": core(ws), "view_range": [30, 31]})  # widened around its middle
    numbers = [int(x.split("\t")[0]) for x in res.body.split("\n")[1:-1]]
    assert numbers == list(range(25, 35))
    res = ed.call({"command": "view", "path": core(ws), "view_range": [2, 40]})  # cut
    assert [int(x.split("\t")[0]) for x in res.body.split("\n")[1:-1]] == list(range(2, 12))


def test_create_writes_a_new_file_and_refuses_an_existing_one(ws):
    ed = tools.Editor(ws)
    path = f"{ws.root}/repro.py"
    res = ed.call({"command": "create", "path": path, "file_text": "print('hi')\n"})
    assert res.ok and res.edited == path and ws.read_file(path) == "print('hi')\n"
    before = ws.read_file(core(ws))
    res = ed.call({"command": "create", "path": core(ws), "file_text": "x = 1\n"})
    assert res.error == "exists" and "does not overwrite" in res.body and ws.read_file(core(ws)) == before
    assert ed.call({"command": "create", "path": f"{ws.root}/b.py"}).error == "missing_parameter"
    res = ed.call({"command": "undo_edit", "path": path})
    assert res.ok and ws.exists(path) is None


def test_str_replace_needs_exactly_one_occurrence(ws):
    ed = tools.Editor(ws)
    before = ws.read_file(core(ws))
    res = ed.call({"command": "str_replace", "path": core(ws), "old_str": "return nothing", "new_str": "x"})
    assert res.error == "not_found" and "does not occur verbatim" in res.body and swegym_harness.HINT_LEAD not in res.body
    res = ed.call({"command": "str_replace", "path": core(ws), "old_str": "    values = list(values)\n", "new_str": ""})
    assert res.error == "not_unique" and "occurs 2 times" in res.body and "at lines [18, 49]" in res.body
    res = ed.call({"command": "str_replace", "path": core(ws), "old_str": "range(len(items) - size)",
                   "new_str": "range(len(items) - size)"})
    assert res.error == "no_change"
    assert ed.call({"command": "str_replace", "path": core(ws)}).error == "missing_parameter"
    assert ws.read_file(core(ws)) == before
    res = ed.call({"command": "str_replace", "path": core(ws), "old_str": "range(len(items) - size)",
                   "new_str": "range(len(items) - size + 1)"})
    assert res.ok and res.edited == core(ws) and "A snippet of it" in res.body
    assert "    28\t    return [items[i:i + size] for i in range(len(items) - size + 1)]" in res.body
    assert ws.read_file(core(ws)) == before.replace("range(len(items) - size)", "range(len(items) - size + 1)")
    res = ed.call({"command": "undo_edit", "path": core(ws)})
    assert res.ok and ws.read_file(core(ws)) == before and res.body.split("\n")[1].startswith("     1\t")
    assert ed.call({"command": "undo_edit", "path": core(ws)}).error == "no_history"


def test_insert_goes_after_the_given_line(ws):
    ed = tools.Editor(ws)
    before = ws.read_file(core(ws)).split("\n")
    res = ed.call({"command": "insert", "path": core(ws), "insert_line": 0, "new_str": "# top"})
    assert res.ok and ws.read_file(core(ws)).split("\n")[:2] == ["# top", before[0]]
    n = len(ws.read_file(core(ws)).rstrip("\n").split("\n"))
    assert ed.call({"command": "insert", "path": core(ws), "insert_line": n, "new_str": "# end\n# really"}).ok
    assert ws.read_file(core(ws)).endswith("# end\n# really\n")
    res = ed.call({"command": "insert", "path": core(ws), "insert_line": n + 10, "new_str": "x"})
    assert res.error == "bad_range" and f"between 0 and {n + 2}" in res.body
    assert ed.call({"command": "insert", "path": core(ws), "new_str": "x"}).error == "missing_parameter"


@pytest.mark.parametrize("params,error,words", [
    ({"command": "view", "path": "textkit/core.py"}, "not_absolute", "Did you mean {root}/textkit/core.py?"),
    ({"command": "view", "path": "/etc/passwd"}, "outside", "outside the repository"),
    ({"command": "view", "path": "{root}/../../etc"}, "outside", "outside the repository"),
    ({"command": "view", "path": "{root}/nope.py"}, "missing", "does not exist"),
    ({"command": "str_replace", "path": "{root}/textkit", "old_str": "a"}, "is_directory", "only `view`"),
    ({"command": "delete", "path": "{root}/textkit/core.py"}, "bad_command", "view, create, str_replace"),
])
def test_bad_calls_get_an_error_observation(ws, params, error, words):
    params = {k: v.format(root=ws.root) if isinstance(v, str) else v for k, v in params.items()}
    res = tools.Editor(ws).call(params)
    assert res.error == error and res.body.startswith("ERROR:") and words.format(root=ws.root) in res.body


def test_the_hint_shows_the_real_lines_after_a_failed_str_replace(ws):
    ed = tools.Editor(ws, hint=True)
    wrong = "      if value > high:\n          return high"  # two spaces too deep
    res = ed.call({"command": "str_replace", "path": core(ws), "old_str": wrong, "new_str": "x"})
    assert res.error == "not_found" and swegym_harness.HINT_LEAD in res.body
    assert "lines 37-38 hold the same text with different whitespace" in res.body
    assert "    37\t    if value > high:\n    38\t        return high" in res.body
    res = ed.call({"command": "str_replace", "path": core(ws), "old_str": "    if value > hihg:\n        return hgih",
                   "new_str": "x"})
    assert "Closest lines in the file to old_str" in res.body and "    37\t    if value > high:" in res.body
    res = ed.call({"command": "str_replace", "path": core(ws), "old_str": "qqqq zzzz wwww", "new_str": "x"})
    assert "none is close to old_str" in res.body
    res = ed.call({"command": "str_replace", "path": core(ws), "old_str": "    values = list(values)\n", "new_str": ""})
    assert "each place where old_str occurs" in res.body and "    17\t" in res.body and "    50\t" in res.body


def test_the_compile_check_reports_or_refuses_a_broken_edit(ws):
    broken = {"command": "str_replace", "path": core(ws), "old_str": "    return default\n",
              "new_str": "    return default(\n"}
    before = ws.read_file(core(ws))
    assert tools.Editor(ws).call(broken).ok  # off: nothing said
    tools.Editor(ws).workspace.write_file(core(ws), before)
    res = tools.Editor(ws, lint="report").call(broken)
    assert res.ok and swegym_harness.LINT_LEAD in res.body and "SyntaxError" in res.body and ws.read_file(core(ws)) != before
    ws.write_file(core(ws), before)
    res = tools.Editor(ws, lint="refuse").call(broken)
    assert res.error == "lint" and "edit refused" in res.body and swegym_harness.LINT_LEAD in res.body
    assert ws.read_file(core(ws)) == before
    ed = tools.Editor(ws, lint="refuse")
    assert ed.call({"command": "create", "path": f"{ws.root}/notes.txt", "file_text": "def (\n"}).ok  # not Python
    assert ed.call({"command": "create", "path": f"{ws.root}/bad.py", "file_text": "def (\n"}).error == "lint"
    ws.write_file(f"{ws.root}/old_bad.py", "def (\nx = 1\n")  # already broken: an edit of it is not refused
    assert ed.call({"command": "str_replace", "path": f"{ws.root}/old_bad.py", "old_str": "x = 1",
                    "new_str": "x = 2"}).ok


def test_bash_shows_the_exit_code_and_keeps_the_working_directory(ws):
    bash = tools.Bash(ws)
    res = bash.run("echo hi; exit 3")
    assert res.body == "hi\n[The command finished with exit code 3.]" and res.returncode == 3
    assert bash.run("cd textkit && ls").body.startswith("__init__.py")
    assert bash.run("pwd").body.split("\n")[0] == f"{ws.root}/textkit"
    assert bash.run("cd /nonexistent-dir; true").returncode == 0
    res = bash.run("sleep 5", timeout_s=1)
    assert res.timed_out and "stopped after 1 seconds" in res.body
    assert bash.run("   ").error == "empty_command"
    assert "__HSJAX" not in bash.run("printf 'no newline'").body
