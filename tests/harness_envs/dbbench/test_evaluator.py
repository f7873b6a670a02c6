"""AgentBench v0.2 scoring rules (and the lenient rule) on hand-made cases."""
import dataclasses

import pytest

from harness_envs.dbbench import data
from harness_envs.dbbench.evaluator import clean_lenient, is_correct, parse_answer_list, summarize

BASE = data.get_task("standard-0000")  # a SELECT-family item; only type/label/answer_md5 matter here


def select_task(*label, type="aggregation-SUM"):
    return dataclasses.replace(BASE, type=type, label=tuple(label), answer_md5=None)


def modify_task(md5="[('0123456789abcdef0123456789abcdef',)]", type="INSERT"):
    return dataclasses.replace(BASE, type=type, label=("INSERT INTO t VALUES ('x')",), answer_md5=md5)


@pytest.mark.parametrize("answer,label,expected", [
    # one answer vs one label: floats when both parse
    ('["1"]', ("1.0",), True),
    (' ["1"]', ("1.0",), True),   # raw text after "Final Answer:" keeps its leading space
    ("1", ("1.0",), True),        # not a list: list(1) fails -> ["1"]
    ("[1]", ("1.0",), True),
    ('["1.5"]', ("1.50",), True),
    ('["1.05"]', ("1.0",), False),  # exact float equality, no tolerance
    ('["12"]', ("12.0",), True),
    ('["True"]', ("1",), False),
    ("[True]", ("1",), True),      # float(True) == 1.0, as upstream
    # else exact, case-sensitive strings
    ('["Vienna"]', ("Vienna",), True),
    ('["vienna"]', ("Vienna",), False),
    ('"Vienna"', ("Vienna",), False),   # a bare string literal lists into characters
    ("['Vienna']", ("Vienna",), True),
    # several answers: set equality, order and duplicates ignored
    ('["b", "a"]', ("a", "b"), True),
    ('["a", "b", "b"]', ("a", "b"), True),
    ('["a"]', ("a", "b"), False),
    ('[1, 2]', ("1", "2"), False),  # ints are not the label strings under the set rule
    ('[["a"], "b"]', ("a", "b"), False),  # unhashable items: incorrect, no crash
    # malformed / hostile answers never evaluate code
    ('["a", ', ("a",), False),
    ("__import__('os').system('touch /tmp/hsjax_pwned')", ("0",), False),
    ("(lambda: 1)()", ("1",), False),
    ("[" * 5000 + "]" * 5000, ("1",), False),
    ("", ("",), True),
])
def test_v02_select_rule(answer, label, expected):
    assert is_correct(select_task(*label), answer, None) is expected


def test_special_cases_of_the_select_rule():
    # "Vienna" parses as neither literal nor list: falls back to ["Vienna"] and matches exactly.
    assert is_correct(select_task("Vienna"), "Vienna", None)
    # ['Vienna', 'Vienna'] has two items against one label, so the set rule applies and matches.
    assert is_correct(select_task("Vienna"), '["Vienna", "Vienna"]', None)
    assert not is_correct(select_task("1"), None, None)
    assert is_correct(select_task(""), None, None)  # a missing answer is scored as ""
    assert not is_correct(select_task("1"), "[" + "9" * 400 + "]", None)  # float() overflow is no crash
    assert parse_answer_list("{'a': 1}") == ["a"]
    assert parse_answer_list("__import__('os')") == ["__import__('os')"]


def test_eval_injection_is_harmless(tmp_path):
    marker = tmp_path / "pwned"
    answer = f"__import__('pathlib').Path({str(marker)!r}).touch()"
    assert not is_correct(select_task("1"), answer, None)
    assert not is_correct(select_task("1"), answer, None, rule="lenient")
    assert not marker.exists()


def test_modification_rule_compares_the_hash_string():
    task = modify_task()
    assert is_correct(task, "anything", task.answer_md5)
    assert is_correct(task, None, task.answer_md5)
    assert not is_correct(task, task.answer_md5, "[('ffffffffffffffffffffffffffffffff',)]")
    assert not is_correct(task, None, None)
    assert not is_correct(task, None, "1146 (42S02): Table 't.t' doesn't exist")
    assert not is_correct(task, None, task.answer_md5.replace("'", '"'))  # exact string, not its meaning


@pytest.mark.parametrize("answer,label,v02,lenient", [
    ('["12.001"]', ("12.0",), False, True),
    ('["45%"]', ("45",), False, True),
    ('["1,234"]', ("1234",), False, True),
    ('["None"]', ("0",), False, True),
    ('["1.0", "2.0"]', ("2", "1"), False, True),
    ('["1", "1", "2"]', ("1", "2"), True, False),  # lenient compares numbers as multisets
    ("'Vienna'", ("Vienna",), False, True),
    ('["vienna"]', ("Vienna",), False, False),
    ("[a, b]", ("a", "b"), False, True),  # lenient splits a list that is no literal
])
def test_lenient_rule(answer, label, v02, lenient):
    task = select_task(*label)
    assert is_correct(task, answer, None, rule="v0.2") is v02
    assert is_correct(task, answer, None, rule="lenient") is lenient


def test_clean_lenient_and_unknown_rule():
    assert clean_lenient(None) == ["0"]
    assert clean_lenient(" ['a', ' b '] ") == ["a", "b"]
    with pytest.raises(ValueError, match="unknown DBBench scoring rule"):
        is_correct(select_task("1"), "1", None, rule="strict")


def test_summarize_per_type_category_and_overall():
    records = (
        [{"type": "INSERT", "success": True}] * 3 + [{"type": "INSERT", "success": False}]
        + [{"type": "UPDATE", "success": True}] * 2
        + [{"type": "counting", "success": True}, {"type": "ranking", "success": False}]
    )
    s = summarize(records)
    assert s["INSERT_accuracy"] == 0.75 and s["UPDATE_accuracy"] == 1.0
    assert s["counting_accuracy"] == 1.0 and s["ranking_accuracy"] == 0.0
    assert s["SELECT_accuracy"] == 0.5
    assert s["overall_cat_accuracy"] == pytest.approx((0.75 + 1.0 + 0.5) / 3)
    assert s["accuracy"] == pytest.approx(6 / 8)
    assert s["counts"]["SELECT"] == 2 and s["counts"]["INSERT"] == 4
    only_select = summarize([{"type": "other", "success": True}, {"type": "other", "success": False}])
    assert only_select["overall_cat_accuracy"] == 0.5 and "INSERT_accuracy" not in only_select
    with pytest.raises(ValueError, match="lacks 'type' or 'success'"):
        summarize([{"type": "other"}])
