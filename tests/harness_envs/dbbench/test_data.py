"""The DBBench loader: counts as published (PROTOCOL.md), typed fields, a stable held-out split."""
import collections
import hashlib
import re

import pytest

from harness_envs.dbbench import data

STANDARD_COUNTS = {
    "INSERT": 100, "UPDATE": 100, "other": 17, "counting": 17, "comparison": 17, "ranking": 17,
    "aggregation-SUM": 8, "aggregation-MIN": 8, "aggregation-MAX": 8, "aggregation-AVG": 8,
}
DEV_COUNTS = {
    "INSERT": 20, "UPDATE": 20, "other": 4, "counting": 3, "comparison": 4, "ranking": 3,
    "aggregation-SUM": 2, "aggregation-MIN": 1, "aggregation-MAX": 2, "aggregation-AVG": 1,
}
HELDOUT_COUNTS = {
    "INSERT": 20, "UPDATE": 20, "other": 3, "counting": 3, "comparison": 3, "ranking": 3,
    "aggregation-SUM": 2, "aggregation-MIN": 2, "aggregation-MAX": 2, "aggregation-AVG": 2,
}
# sha256 of the sorted held-out ids joined by ",": changes only if the split rule changes.
HELDOUT_DIGEST = "bb51de9b4b07fd0eeda5d8a249a9f54e08ec0525a74d5e120366aaaadbc7eeda"


def _counts(tasks):
    return dict(collections.Counter(t.type for t in tasks))


@pytest.mark.parametrize("split,counts", [("standard", STANDARD_COUNTS), ("dev", DEV_COUNTS)])
def test_counts_per_type_match_protocol(split, counts):
    tasks = data.load_split(split)
    assert _counts(tasks) == counts
    assert len(tasks) == sum(counts.values())


def test_standard_sources_and_label_shapes():
    tasks = data.load_split("standard")
    assert dict(collections.Counter(t.source for t in tasks)) == {
        "wikisql": 109, "hybridqa": 68, "wikitq": 66, "fetaqa": 45, "sqa": 12,
    }
    select = [t for t in tasks if not data.is_modification(t)]
    assert len(select) == 100
    assert sum(len(t.label) == 1 for t in select) == 97
    for t in select:
        assert t.answer_md5 is None and t.type in data.SELECT_TYPES
    for t in tasks:
        if data.is_modification(t):
            assert len(t.label) == 1 and t.label[0].upper().startswith(t.type)
            assert re.fullmatch(r"\[\('[0-9a-f]{32}',\)\]", t.answer_md5)


def test_fields_are_typed_and_ids_follow_the_source_line():
    tasks = data.load_split("dev")
    for i, t in enumerate(tasks):
        assert t.task_id == f"dev-{i:04d}" and t.index == i and t.split == "dev"
        assert isinstance(t.table, data.Table) and isinstance(t.label, tuple)
        assert all(isinstance(c, str) for row in t.table.rows for c in row)
        assert all(len(row) == len(t.table.columns) for row in t.table.rows)
        assert t.question and t.add_description.startswith("The name of this table is")
    assert data.get_task("dev-0005") == tasks[5]
    assert tasks[5].table.columns[0] == ""  # the empty column name MariaDB cannot load


def test_table_shapes_and_literal_backslash_n():
    tasks = data.load_split("dev") + data.load_split("standard")
    assert min(len(t.table.columns) for t in tasks) == 3 and max(len(t.table.columns) for t in tasks) == 17
    assert min(len(t.table.rows) for t in tasks) == 7 and max(len(t.table.rows) for t in tasks) == 105
    assert sum("\\n" in c for t in tasks for c in t.table.columns) == 12
    assert sum("\\n" in c for t in tasks for r in t.table.rows for c in r) == 471
    # Non-string cells (a handful of ints/floats upstream) are loaded as str.
    assert data.get_task("standard-0180").table.name == "1952_British_Grand_Prix_0"


def test_heldout_split_is_stratified_deterministic_and_disjoint():
    train = data.load_split("standard_train")
    heldout = data.load_split("standard_heldout")
    assert _counts(heldout) == HELDOUT_COUNTS
    assert len(train) == 240 and len(heldout) == 60
    train_ids = {t.task_id for t in train}
    heldout_ids = {t.task_id for t in heldout}
    assert not train_ids & heldout_ids
    assert train_ids | heldout_ids == {t.task_id for t in data.load_split("standard")}
    assert all(t.split == "standard_heldout" for t in heldout) and all(t.split == "standard_train" for t in train)
    assert hashlib.sha256(",".join(sorted(heldout_ids)).encode()).hexdigest() == HELDOUT_DIGEST
    assert [t.task_id for t in data.load_split("standard_heldout")] == [t.task_id for t in heldout]


def test_bad_names_give_clear_errors():
    with pytest.raises(ValueError, match="unknown DBBench split 'nope'"):
        data.load_split("nope")
    with pytest.raises(ValueError, match="malformed DBBench task id"):
        data.get_task("standard42")
    with pytest.raises(ValueError, match="only 60 items"):
        data.get_task("dev-0060")


def test_parse_item_rejects_ragged_rows():
    raw = {
        "description": "q", "add_description": "d", "type": ["other"], "label": ["1"], "source": "x",
        "table": {"table_name": "t", "table_info": {"columns": [{"name": "a"}, {"name": "b"}], "rows": [["1"]]}},
    }
    with pytest.raises(ValueError, match="row 0 has 1 cells for 2 columns"):
        data.parse_item(raw, "dev", 0)
