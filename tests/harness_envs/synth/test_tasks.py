"""Synthetic tasks: deterministic, labels and hashes right, split disjoint, every type present."""
import collections
import re

import pytest

from harness_envs.dbbench.benchmark import KNOBS
from harness_envs.dbbench.agents import OracleAgent
from harness_envs.dbbench import make_backend
from harness_envs.dbbench.backends import hash_rows
from harness_envs.dbbench.data import DBTask, MODIFY_TYPES
from harness_envs.dbbench.env import DBBenchEpisode
from harness_envs.synth import tasks as st
from harness_envs.synth.questions import TEMPLATES, TYPES
from harness_envs.synth.tables import DOMAINS
from hsjax.policies.base import SamplingParams
from hsjax.rollout.engine import collect

BASE = KNOBS.base()

N = 60


@pytest.fixture(scope="module")
def train():
    return st.make_tasks("synth_train", N, seed=3)


@pytest.fixture(scope="module")
def heldout():
    return st.make_tasks("synth_heldout", N, seed=3)


def test_deterministic_and_prefix_stable(train):
    fresh = [st.make_task("synth_train", 3, i) for i in range(N)]  # bypasses the cache
    assert fresh == train
    assert st.make_tasks("synth_train", 20, seed=3) == train[:20]
    other_seed = st.make_tasks("synth_train", N, seed=4)
    assert [t.question for t in other_seed] != [t.question for t in train]
    assert len({t.task_id for t in train}) == N


def test_every_type_and_valid_shapes(train, heldout):
    for tasks in (train, heldout):
        assert collections.Counter(t.type for t in tasks) == {t: N // len(TYPES) for t in TYPES}
        for t in tasks:
            assert isinstance(t, DBTask)
            assert 3 <= len(t.table.columns) <= 6 and 5 <= len(t.table.rows) <= 20
            assert len({row[0] for row in t.table.rows}) == len(t.table.rows)  # unique keys
            assert t.add_description == (f"The name of this table is {t.table.name}, and the headers of "
                                         f"this table are {','.join(t.table.columns)}.")
            assert (t.answer_md5 is not None) == (t.type in MODIFY_TYPES)


def test_labels_match_a_fresh_backend(train, heldout):
    backend = make_backend("sqlite")
    for t in train + heldout:
        with backend.open(t) as db:
            res = db.execute(t.gold_sql)
            assert res.ok, (t.task_id, res.error)
            if t.type in MODIFY_TYPES:
                assert t.label == (t.gold_sql,)
                assert db.table_hash() == t.answer_md5
                assert t.answer_md5 != hash_rows(t.table.rows)  # the statement changes the table
            else:
                assert t.label == tuple(str(c) for row in res.rows for c in row)


def _num(text):
    return float(text)


def test_labels_recomputed_in_python(train, heldout):
    """Independent of SQL: a few families recomputed from the table rows."""
    checked = collections.Counter()
    for t in train + heldout:
        cols, rows = t.table.columns, t.table.rows
        where = re.search(r"WHERE (\w+) = '([^']*)'", t.gold_sql)
        if t.type == "counting":
            col, v = where.groups()
            assert float(t.label[0]) == sum(r[cols.index(col)] == v for r in rows)
        elif t.type in ("aggregation-SUM", "aggregation-MAX", "aggregation-MIN"):
            col, v = where.groups()
            num = re.search(r"(SUM|MAX|MIN)\((\w+)\)", t.gold_sql).group(2)
            vals = [r[cols.index(num)] for r in rows if r[cols.index(col)] == v]
            if t.type == "aggregation-SUM":
                assert _num(t.label[0]) == sum(int(x) for x in vals)
            else:  # fixed-width values: text order is numeric order
                pick = max if t.type == "aggregation-MAX" else min
                assert t.label[0] == pick(vals)
                assert _num(t.label[0]) == pick(_num(x) for x in vals) if "-" not in vals[0] else True
        elif t.type == "comparison":
            num, x = re.search(r"WHERE (\w+) > (\d+)", t.gold_sql).groups()
            want = {r[0] for r in rows if int(r[cols.index(num)]) > int(x)}
            assert set(t.label) == want and 1 <= len(want) <= 3
        elif t.type == "INSERT":
            new = tuple(re.findall(r"'([^']*)'", t.gold_sql))
            assert t.answer_md5 == hash_rows(list(rows) + [new])
        elif t.type == "UPDATE":
            col, v, key = re.search(r"SET (\w+) = '([^']*)' WHERE \w+ = '([^']*)'", t.gold_sql).groups()
            j = cols.index(col)
            updated = [r[:j] + (v,) + r[j + 1:] if r[0] == key else r for r in rows]
            assert t.answer_md5 == hash_rows(updated)
        else:
            continue
        checked[t.type] += 1
    assert len(checked) == 7


def test_oracle_scores_100_percent(train, heldout):
    backend = make_backend("sqlite")
    episodes = [DBBenchEpisode(t, BASE, backend) for t in train + heldout]
    trajs = collect(episodes, OracleAgent(), SamplingParams())
    assert all(tr.result["success"] for tr in trajs), [tr.result["task_id"] for tr in trajs
                                                       if not tr.result["success"]]


def _template_regex(template: str) -> re.Pattern:
    text = template.partition("|")[0]
    return re.compile(re.sub(r"\\\{\w+\\\}", ".+?", re.escape(text)) + "$")


def test_split_is_disjoint_in_domains_values_and_phrasing(train, heldout):
    doms = {name: st.SPLITS[name].domains for name in st.SPLITS}
    assert not set(doms["synth_train"]) & set(doms["synth_heldout"])

    def vocab(domains):
        words = set()
        for d in domains:
            dom = DOMAINS[d]
            words |= {dom.table, dom.key.name, *dom.key.pool}
            for c in dom.columns:
                words |= {c.name, *c.pool}
        return words

    assert not vocab(doms["synth_train"]) & vocab(doms["synth_heldout"])
    assert {t.domain for t in train} == set(doms["synth_train"])
    assert {t.domain for t in heldout} == set(doms["synth_heldout"])
    for task_type, sets in TEMPLATES.items():
        assert not set(sets["train"]) & set(sets["heldout"])
    for t, phrasing, other in [(t, "train", "heldout") for t in train] + [(t, "heldout", "train") for t in heldout]:
        own = TEMPLATES[t.type][phrasing]
        assert t.template.startswith(f"{t.type}/{phrasing}/")
        assert _template_regex(own[int(t.template.rsplit("/", 1)[1])]).match(t.question), t.question
        # No question reads as a template of the other split.
        assert not any(_template_regex(x).match(t.question) for x in TEMPLATES[t.type][other]), t.question


def test_unknown_split_names_the_known_ones():
    with pytest.raises(ValueError, match="synth_heldout"):
        st.make_tasks("synth_dev", 3)
