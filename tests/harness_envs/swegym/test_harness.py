"""The SWE-Gym protocol's texts and call parsing: the published text format (strict), what lenient
parsing repairs, and a clear error for every malformed reply."""
import pytest

from harness_envs.swegym import harness as swegym_harness
from harness_envs.swegym.benchmark import KNOBS


@pytest.fixture(scope="module")
def base():
    return KNOBS.base()


@pytest.fixture(scope="module")
def lenient(base):
    return base.with_knobs(parse_mode="lenient")


def test_a_call_parses_with_its_thought_and_typed_parameters(base):
    reply = ("I should look at the file first.\n<function=str_replace_editor>\n<parameter=command>view</parameter>\n"
             "<parameter=path>/repo/a.py</parameter>\n<parameter=view_range>[3, 9]</parameter>\n</function>")
    call = swegym_harness.parse_call(reply, base)
    assert call.name == "str_replace_editor" and call.thought == "I should look at the file first."
    assert call.params == {"command": "view", "path": "/repo/a.py", "view_range": [3, 9]}
    call = swegym_harness.parse_call("<function=execute_bash>\n<parameter=command>ls</parameter>\n"
                          "<parameter=timeout>30</parameter>\n</function>", base)
    assert call.params == {"command": "ls", "timeout": 30.0}


def test_values_keep_their_whitespace_but_one_newline_at_each_end(base):
    old = "    if x:\n        return 1\n"
    reply = swegym_harness.format_call("str_replace_editor", command="str_replace", path="/r/a.py", old_str=old, new_str="")
    call = swegym_harness.parse_call(reply, base)
    assert call.params["old_str"] == old and call.params["new_str"] == ""
    call = swegym_harness.parse_call("<function=finish>\n<parameter=message>\n\n two\n\n</parameter>\n</function>", base)
    assert call.params["message"] == "\n two\n"


def test_the_closing_function_tag_may_be_cut_by_a_stop_word(base):
    call = swegym_harness.parse_call("<function=execute_bash>\n<parameter=command>pwd</parameter>\n", base)
    assert call.name == "execute_bash" and call.params == {"command": "pwd"}
    assert swegym_harness.parse_call("text\n<function=finish>", base).name == "finish"


@pytest.mark.parametrize("reply,kind,words", [
    ("I think the bug is in line 3.", "no_call", "no <function"),
    ("<function=finish>\n</function>\n<function=finish>\n</function>", "two_calls", "one call per reply"),
    ("<function=run_python>\n<parameter=code>1</parameter>\n</function>", "unknown_function",
     "no function 'run_python'"),
    ("<function=execute_bash>\n</function>", "missing_parameter", "needs the parameter(s) command"),
    ("<function=str_replace_editor>\n<parameter=command>view</parameter>\n</function>", "missing_parameter", "path"),
    ("<function=execute_bash>\n<parameter=cmd>ls</parameter>\n</function>", "unknown_parameter", "no parameter(s) cmd"),
    ("<function=execute_bash>\n<parameter=command>ls</parameter>\n<parameter=command>pwd</parameter>\n</function>",
     "repeated_parameter", "given twice"),
    ("<function=execute_bash>\n<parameter=command>ls</parameter>\n<parameter=timeout>soon</parameter>\n</function>",
     "bad_value", "positive number"),
    ("<function=str_replace_editor>\n<parameter=command>view</parameter>\n<parameter=path>/a</parameter>\n"
     "<parameter=view_range>1-5</parameter>\n</function>", "bad_value", "two integers"),
    ("<function=str_replace_editor>\n<parameter=command>insert</parameter>\n<parameter=path>/a</parameter>\n"
     "<parameter=insert_line>two</parameter>\n</function>", "bad_value", "an integer"),
    ('{"name": "execute_bash", "arguments": {"command": "ls"}}', "no_call", "no <function"),
    ("<function name=\"execute_bash\">\n<parameter name=\"command\">ls</parameter>\n</function>", "no_call", ""),
])
def test_malformed_replies_name_what_is_wrong(base, reply, kind, words):
    with pytest.raises(swegym_harness.CallError) as err:
        swegym_harness.parse_call(reply, base)
    assert err.value.kind == kind and words in str(err.value)
    assert err.value.kind in swegym_harness.CALL_ERRORS


def test_lenient_parsing_repairs_common_slips_and_says_so(lenient):
    call = swegym_harness.parse_call('```json\n{"name": "str_replace_editor", "arguments": {"command": "view", "path": "/r", '
                          '"view_range": [1, 4]}}\n```', lenient)
    assert call.params == {"command": "view", "path": "/r", "view_range": [1, 4]} and call.repaired == "JSON call"
    call = swegym_harness.parse_call("<function name=\"execute_bash\">\n<parameter name='command'>ls</parameter>\n</function>",
                          lenient)
    assert call.params == {"command": "ls"} and "tag attributes" in call.repaired
    call = swegym_harness.parse_call("<function=execute_bash>\n<parameter=command>ls -la\n</function>", lenient)
    assert call.params == {"command": "ls -la"} and "closed parameter" in call.repaired
    call = swegym_harness.parse_call("<function=execute_bash>\n<parameter=command>ls</parameter>\n</function>"
                          "<function=finish>\n</function>", lenient)
    assert call.name == "execute_bash" and "first of 2 calls" in call.repaired
    with pytest.raises(swegym_harness.CallError, match="no <function"):
        swegym_harness.parse_call("no call here, {not json}", lenient)
    # what lenient parsing still checks
    with pytest.raises(swegym_harness.CallError, match="no function 'bash'"):
        swegym_harness.parse_call('{"name": "bash", "arguments": {"command": "ls"}}', lenient)


def test_a_published_call_parses_the_same_in_both_modes(base, lenient):
    reply = swegym_harness.format_call("str_replace_editor", command="str_replace", path="/r/a.py", old_str="a = 1\nb = 2",
                            new_str="a = 2")
    assert swegym_harness.parse_call(reply, base) == swegym_harness.parse_call(reply, lenient)


def test_the_opening_context(base):
    system, user = swegym_harness.initial_messages(base, "/work/calc", "sub() adds.")
    assert system["role"] == "system" and all(t in system["content"] for t in swegym_harness.TOOLS)
    assert "<function=NAME>" in system["content"] and "one function call per reply" in system["content"]
    text = user["content"]
    assert "<uploaded_files>\n/work/calc\n</uploaded_files>" in text
    assert "<pr_description>\nsub() adds.\n</pr_description>" in text and "non-test files" in text
    assert swegym_harness.REPRODUCE_RULE not in text
    strict = base.with_knobs(reproduce_first=True, hint="look at ops.py")
    text = swegym_harness.initial_messages(strict, "/w", "x")[1]["content"]
    assert swegym_harness.REPRODUCE_RULE in text and text.endswith("Hint: look at ops.py")
    short = swegym_harness.initial_messages(base.with_knobs(instruction="concise"), "/w", "x")
    assert len(short[0]["content"]) < len(system["content"]) // 5 and "<pr_description>" in short[1]["content"]


def test_which_commands_run_python():
    for command in ("python repro.py", "cd /r && python3 -m pytest -q", "pytest tests/", "/venv/bin/python x.py",
                    "(python -c 'print(1)')", "timeout 60 python -m pytest", "X=1 python a.py", "ls; pytest"):
        assert swegym_harness.runs_python(command), command
    for command in ("ls", "cat pythonic.txt", "grep -rn python .", "git diff", "echo pytest", "cat python"):
        assert not swegym_harness.runs_python(command), command
