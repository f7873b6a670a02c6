"""HarnessSpec as data against a knob schema, pools with their base, and the benchmark-independent
knob functions."""
import json
import pathlib

import pytest

from harness_envs import harness
from harness_envs.dbbench.benchmark import KNOBS

POOL = pathlib.Path(__file__).resolve().parents[2] / "harness_envs" / "pools" / "dbbench_siblings.json"
BASE = KNOBS.base()


def test_defaults_are_the_published_protocol():
    d = KNOBS.defaults()
    assert d["parse_mode"] == "strict" and d["on_malformed"] == "fail"
    assert d["obs_max_chars"] == 800 and d["max_rounds"] == 15 and d["obs_page_rows"] == 0
    assert d["context"] == "all" and d["answer_normalization"] == "none" and d["instruction"] == "agentbench"
    assert d["verify_before_answer"] is False and d["schema_reminder_on_error"] is False and d["hint"] is None
    assert BASE.resolved() == d


def test_schema_is_the_generic_knobs_plus_the_benchmark_s_own():
    assert set(harness.GENERIC_KNOBS) <= set(KNOBS)
    assert set(KNOBS.own) == {"obs_page_rows", "schema_reminder_on_error", "answer_normalization"}
    assert KNOBS["instruction"].choices == ("agentbench", "schema_first", "concise")  # redefined values
    with pytest.raises(TypeError, match="not its type"):
        harness.KnobSchema("x", {"max_rounds": harness.Knob(str, "15", "a str now")})
    with pytest.raises(ValueError, match="enabled by 'nope'"):
        harness.KnobSchema("x", {"y": harness.Knob(int, 0, "y", enabled_by=("nope", (1,)))})
    generic_only = harness.KnobSchema("generic")
    with pytest.raises(ValueError, match="unknown knob"):
        generic_only.base(obs_page_rows=3)


def test_json_round_trip_is_exact():
    spec = harness.HarnessSpec("s1", parent="base", direction="turn_budget",
                          knobs={"max_rounds": 30, "hint": "look first", "verify_before_answer": True},
                          doc="a sibling", schema=KNOBS)
    blob = json.dumps(spec.to_json())
    back = harness.HarnessSpec.from_json(blob, KNOBS)
    assert back == spec
    assert back.to_json() == spec.to_json()
    assert harness.HarnessSpec.from_json(json.loads(blob), KNOBS) == spec


def test_a_spec_without_schema_cannot_be_validated():
    with pytest.raises(ValueError, match="no knob schema"):
        harness.HarnessSpec("orphan").validate()


@pytest.mark.parametrize("knobs, message", [
    ({"max_round": 3}, "unknown knob(s) ['max_round']"),
    ({"parse_mode": "loose"}, "is not one of"),
    ({"max_rounds": 0}, "below its minimum"),
    ({"obs_max_chars": 10**9}, "above its maximum"),
    ({"max_rounds": True}, "must be int"),
    ({"max_rounds": "15"}, "must be int"),
    ({"verify_before_answer": 1}, "must be bool"),
    ({"hint": 3}, "must be str or None"),
])
def test_validate_names_the_problem(knobs, message):
    with pytest.raises(ValueError) as err:
        harness.HarnessSpec("bad", knobs=knobs, schema=KNOBS).validate()
    assert message in str(err.value)


def test_from_json_rejects_unknown_fields_and_knobs():
    with pytest.raises(ValueError, match="unknown field"):
        harness.HarnessSpec.from_json({"name": "x", "knobz": {}}, KNOBS)
    with pytest.raises(ValueError, match="unknown knob"):
        harness.HarnessSpec.from_json({"name": "x", "knobs": {"nope": 1}}, KNOBS)


def test_with_knobs_and_diff():
    child = BASE.with_knobs(name="paged", direction="observation_paging", obs_page_rows=20, obs_max_chars=800)
    assert child.parent == "base" and child.direction == "observation_paging"
    assert child.knobs == {"obs_page_rows": 20}  # a default value is not stored as an override
    assert child.knob("obs_page_rows") == 20 and child.knob("max_rounds") == 15
    assert BASE.diff(child) == {"obs_page_rows": (0, 20)}
    assert child.diff(child) == {}
    grandchild = child.with_knobs(max_rounds=20)
    assert grandchild.parent == "paged" and grandchild.knobs == {"obs_page_rows": 20, "max_rounds": 20}
    assert "max_rounds=20" in grandchild.name
    with pytest.raises(ValueError, match="unknown knob"):
        BASE.with_knobs(turns=3)
    with pytest.raises(KeyError, match="unknown knob"):
        BASE.knob("turns")


def test_starter_pool_siblings_differ_only_in_knobs(tmp_path):
    pool = harness.load_pool(POOL, KNOBS)
    assert pool.base.knobs == {} and pool.base.name == "base" and list(pool)[0] == "base" and len(pool) >= 7
    directions = set()
    for spec in pool.siblings:
        assert spec.parent == "base" and spec.direction and spec.doc
        assert spec.diff(BASE), f"{spec.name} is identical to the base"
        directions.add(spec.direction)
    assert len(directions) == len(pool) - 1, "one repair direction per sibling"
    # save/load round trip
    out = tmp_path / "pool.json"
    harness.save_pool(out, pool.base, pool.siblings, doc="copy")
    back = harness.load_pool(out, KNOBS)
    assert dict(back) == dict(pool) and back.base == pool.base and back.doc == "copy"


def test_the_base_comes_from_the_pool_file(tmp_path):
    path = tmp_path / "pool.json"
    path.write_text(json.dumps({"benchmark": "dbbench", "harnesses": [
        {"name": "base", "parent": None, "knobs": {"instruction": "concise"}},
        {"name": "more_rounds", "parent": "base", "direction": "turn_budget", "knobs": {"max_rounds": 30}}]}))
    pool = harness.load_pool(path, KNOBS)
    assert pool.base.knob("instruction") == "concise" and pool["more_rounds"].knob("max_rounds") == 30
    assert pool.select(["more_rounds", "base"]) == [pool["more_rounds"], pool.base]
    with pytest.raises(ValueError, match=r"\['nope'\] are not in the pool"):
        pool.select(["nope"])


def test_load_pool_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        harness.load_pool(tmp_path / "missing.json", KNOBS)
    bad = tmp_path / "bad.json"
    base = {"name": "base", "parent": None, "knobs": {}}

    def check(harnesses, message, benchmark="dbbench"):
        bad.write_text(json.dumps({"benchmark": benchmark, "harnesses": harnesses}))
        with pytest.raises(ValueError, match=message):
            harness.load_pool(bad, KNOBS)

    check([base, {"name": "x", "parent": "ghost", "knobs": {}}], "names parent 'ghost'")
    check([base, {"name": "x", "parent": "base"}, {"name": "x", "parent": "base", "knobs": {"max_rounds": 3}}],
          "defined twice")
    check([{"name": "x", "parent": "base", "knobs": {}}], "exactly one base harness")
    check([base, dict(base, name="other")], "exactly one base harness")
    check([base], "a pool of benchmark 'appworld', not 'dbbench'", benchmark="appworld")
    check([base, {"name": "x", "parent": "base", "knobs": {"max_rounds": 0}}], "below its minimum")


def test_truncate_is_the_800_char_rule():
    assert harness.truncate("a" * 800, 800) == ("a" * 800, False)
    text, cut = harness.truncate("a" * 801, 800)
    assert cut and text == "a" * 800 + "[TRUNCATED]"


def test_paginate_by_rows_and_chars():
    rows = [(str(i),) for i in range(45)]
    page, nxt = harness.paginate(rows, 0, 20, 10_000)
    assert page == rows[:20] and nxt == 20
    page, nxt = harness.paginate(rows, 40, 20, 10_000)
    assert page == rows[40:] and nxt is None
    wide = [("x" * 100,) for _ in range(10)]
    page, nxt = harness.paginate(wide, 0, 10, 350)
    assert 1 <= len(page) < 10 and len(str(page)) <= 350 and nxt == len(page)
    page, nxt = harness.paginate([("y" * 1000,)], 0, 10, 100)  # never an empty page
    assert len(page) == 1 and nxt is None


def _history(n_turns):
    h = [{"role": "user", "content": "instr"}, {"role": "assistant", "content": "Ok."},
         {"role": "user", "content": "question"}]
    for i in range(n_turns):
        h += [{"role": "assistant", "content": f"a{i}"}, {"role": "user", "content": f"obs{i}" * 10}]
    return h


def test_select_context_modes():
    h = _history(5)
    assert harness.select_context(h, 3, "all", 2) == h
    last = harness.select_context(h, 3, "last_n", 2)
    assert last == h[:3] + h[-4:]
    comp = harness.select_context(h, 3, "compress", 2)
    assert len(comp) == len(h)
    assert [m["content"] for m in comp if m["role"] == "assistant"] == [m["content"] for m in h if m["role"] == "assistant"]
    assert comp[4]["content"] == harness.elide_observation(h[4]["content"]) and comp[-1] == h[-1] and comp[-3] == h[-3]
    assert harness.select_context(_history(1), 3, "last_n", 2) == _history(1)
    with pytest.raises(ValueError, match="context mode"):
        harness.select_context(h, 3, "summarize", 2)
