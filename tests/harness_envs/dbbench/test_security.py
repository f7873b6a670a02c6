"""Hostile agent SQL: every case ends in a clean observation or error result, fast, with no file
written and nothing reached outside the episode's own database. Runs on SQLite and MariaDB."""
import os
import random
import time

import pytest

from harness_envs.dbbench import data, evaluator, make_backend
from harness_envs.dbbench.backends import gold_hash, mysql_quote_ident

BUDGET_S = 0.5
# MariaDB: max_statement_time stops most statements at the budget; the watchdog (budget + 2 s)
# stops the rest. Both ends are well inside this bound on a loaded 2-core machine.
DEADLINE_S = BUDGET_S + 4.0
TASK = data.get_task("dev-0020")  # an INSERT item
T = mysql_quote_ident(TASK.table.name)


@pytest.fixture(scope="module")
def fast_sqlite():
    return make_backend("sqlite", time_budget_s=BUDGET_S)


@pytest.fixture(scope="module")
def fast_mariadb(mariadb_backend):
    backend = make_backend("mariadb", url=mariadb_backend.url, time_budget_s=BUDGET_S)
    yield backend
    backend.close()


@pytest.fixture(params=["sqlite", "mariadb"])
def kind(request):
    return request.param


@pytest.fixture
def fast_backend(kind, request):
    return request.getfixturevalue(f"fast_{kind}")


@pytest.fixture
def db(fast_backend):
    with fast_backend.open(TASK) as episode:
        yield episode


def timed(db, sql):
    start = time.monotonic()
    result = db.execute(sql)
    return result, time.monotonic() - start


def assert_intact(db):
    result = db.execute(f"SELECT COUNT(*) FROM {T}")
    assert result.ok and result.rows == [(len(TASK.table.rows),)], result.text


def test_attach_is_refused_and_writes_no_file(db, tmp_path):
    target = tmp_path / "x.db"
    result = db.execute(f"ATTACH DATABASE '{target}' AS y")
    assert not result.ok and result.text.startswith(("1227", "1064"))
    assert not target.exists() and list(tmp_path.iterdir()) == []
    assert_intact(db)


def test_load_extension_is_refused(db):
    result = db.execute("SELECT load_extension('/usr/lib/x86_64-linux-gnu/libc.so.6')")
    assert not result.ok and "load_extension" in result.text


def test_infinite_recursive_cte_ends_within_budget(db, kind):
    if kind == "mariadb":  # lift MariaDB's own recursion cap so that only the time limit can stop it
        assert db.execute("SET SESSION max_recursive_iterations = 4294967295").ok
    cte = "WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r) SELECT COUNT(*) FROM r"
    result, elapsed = timed(db, cte)
    assert not result.ok and elapsed < DEADLINE_S
    assert "interrupted" in result.text or "max_statement_time" in result.text, result.text
    assert_intact(db)


def test_huge_cross_join_is_stopped_or_capped(db):
    count, elapsed = timed(db, f"SELECT COUNT(*) FROM {T} a, {T} b, {T} c, {T} d, {T} e, {T} f, {T} g")
    assert not count.ok and elapsed < DEADLINE_S and "interrupted" in count.text
    rows, elapsed = timed(db, f"SELECT * FROM {T} a, {T} b, {T} c, {T} d")
    assert elapsed < DEADLINE_S
    assert (rows.ok and rows.truncated and len(rows.text) <= 1_000_000) or "interrupted" in rows.text
    assert_intact(db)


def test_statement_timeout_cannot_be_switched_off(db, kind):
    # MariaDB lets a user change its own session limit; the watchdog still kills the statement.
    db.execute("SET SESSION max_statement_time = 0")
    result, elapsed = timed(db, f"SELECT COUNT(*) FROM {T} a, {T} b, {T} c, {T} d, {T} e, {T} f, {T} g")
    assert not result.ok and elapsed < DEADLINE_S
    assert_intact(db)  # and the episode keeps working (a fresh connection on MariaDB)


def test_drop_table_then_scoring_fails_cleanly(db):
    assert db.execute(f"DROP TABLE {T}").ok
    digest = db.table_hash()
    assert digest.startswith("1146 (42S02)") and not evaluator.is_correct(TASK, "", digest)
    assert db.execute(f"SELECT * FROM {T}").text.startswith("1146")


def test_multi_statement_strings_execute_nothing(db):
    for sql in (f"INSERT INTO {T} VALUES ({', '.join(['1'] * len(TASK.table.columns))}); DROP TABLE {T}",
                "SELECT 1; SELECT 2", f"DELETE FROM {T};DELETE FROM {T};"):
        result = db.execute(sql)
        assert not result.ok and result.text.startswith("1064 (42000)"), result.text
    assert_intact(db)
    assert db.table_hash() == gold_hash(TASK)


@pytest.mark.parametrize("sql", [
    b"SELECT '\xff\xfe'",
    "SELECT 'caf\udce9'",
    "SELECT '\ud800'",
    "SELECT 'a\x00b'",
    b"\x00\x01\x02",
    12345,
    "SELECT '" + "x" * 1_000_001 + "'",
], ids=["bytes_ff", "surrogate_dce9", "surrogate_d800", "nul", "bytes_nul", "not_text", "over_1MB"])
def test_bad_text_is_a_clean_error(db, sql):
    result = db.execute(sql)
    assert not result.ok and isinstance(result.text, str) and result.text
    assert_intact(db)


def test_other_episodes_are_out_of_reach(fast_backend, kind):
    with fast_backend.open(TASK) as a, fast_backend.open(TASK) as b:
        assert a.execute(f"DELETE FROM {T}").ok
        assert_intact(b)
        if kind == "mariadb":
            other = mysql_quote_ident(a.database)
            for sql in (f"SELECT * FROM {other}.{T}", f"DROP TABLE {other}.{T}", f"USE {other}",
                        f"CREATE TABLE {other}.x (a TEXT)"):
                result = b.execute(sql)
                assert not result.ok and result.text.startswith(("1142", "1044")), result.text
            assert sorted(b.execute("SHOW DATABASES").rows) == [(b.database,), ("information_schema",)]
        else:
            result = b.execute(f"SELECT * FROM other.{T}")
            assert not result.ok
        assert b.table_hash() == gold_hash(TASK) != a.table_hash()


def test_sqlite_refuses_pragma_writes_and_file_writes(fast_sqlite, tmp_path):
    with fast_sqlite.open(TASK) as db:
        for sql in ("PRAGMA writable_schema = ON", "PRAGMA journal_mode = WAL", "PRAGMA query_only = 0",
                    f"VACUUM INTO '{tmp_path / 'copy.db'}'", f"SELECT writefile('{tmp_path / 'w'}', 'x')",
                    "SELECT readfile('/etc/passwd')", "CREATE VIRTUAL TABLE v USING fts5(a)"):
            result = db.execute(sql)
            assert not result.ok, sql
        assert list(tmp_path.iterdir()) == []
        assert db.execute(f"PRAGMA table_info({T})").ok  # schema reads stay allowed
        assert db.execute("SELECT length(zeroblob(100000000))").text.startswith("1105")  # over the size cap
        assert_intact(db)


def test_sqlite_regexp_refuses_catastrophic_patterns(fast_sqlite):
    with fast_sqlite.open(TASK) as db:
        result, elapsed = timed(db, "SELECT 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa!' REGEXP '(a+)+$'")
        assert not result.ok and elapsed < 1.0 and "nested quantifiers" in result.text


def test_mariadb_user_has_no_file_or_global_rights(fast_mariadb, tmp_path):
    os.chmod(tmp_path, 0o777)
    with fast_mariadb.open(TASK) as db:
        out = tmp_path / "out.txt"
        result = db.execute(f"SELECT 'x' INTO OUTFILE '{out}'")
        assert not result.ok and result.text.startswith("1227") and "FILE privilege" in result.text
        assert not out.exists()
        assert db.execute("SELECT LOAD_FILE('/etc/passwd')").rows == [(None,)]
        for sql in ("SET GLOBAL max_connections = 1", "CREATE USER 'x'@'%'", "SHUTDOWN",
                    "GRANT ALL ON *.* TO CURRENT_USER()", "SELECT * FROM mysql.user",
                    f"LOAD DATA INFILE '/etc/passwd' INTO TABLE {T}"):
            result = db.execute(sql)
            assert not result.ok, sql
        name, user = db.database, db.user
    leftovers = fast_mariadb.admin_in("mysql", ["SELECT COUNT(*) FROM mysql.user WHERE User = %s"], [(user,)],
                                      fetch=True)
    assert leftovers == [(0,)]
    assert fast_mariadb.admin_in("mysql", ["SHOW DATABASES LIKE %s"], [(name,)], fetch=True) == []


def test_random_hostile_strings_never_crash(db):
    rng = random.Random(0)
    alphabet = "'\"`\\;#-/*()%_\n\t SELECTFROMWHERE\x00\u00e9\ud800" + "".join(map(chr, range(32, 127)))
    for _ in range(200):
        sql = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60)))
        result = db.execute(sql)
        assert isinstance(result.text, str) and result.ok == (result.error is None)
    for _ in range(50):
        result = db.execute(bytes(rng.randrange(256) for _ in range(rng.randint(0, 40))))
        assert isinstance(result.text, str)
    assert db.table_hash().startswith("[(")
