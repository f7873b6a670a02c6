"""Backends: table loading, observations, the table hash, MySQL compatibility, threads.

Tests taking the `backend` fixture run on SQLite and on MariaDB (see conftest.py); the expected
values are MySQL's, so each one also checks that the two backends agree.
"""
import concurrent.futures
import dataclasses
import hashlib
import re

import pytest

from harness_envs.dbbench import backends, data, make_backend, mysql_functions, mysql_translate
from harness_envs.dbbench.data import Table

TABLE = Table(
    name="1st table",
    columns=("Name", "Score", "Area\\n(sq mi)", "50% share"),
    rows=(
        ("Café", "12", "1,200", "a"),
        ("cafe", "7", "30", "b"),
        ("Zoë", "21,052", "4.5", "c"),
        ("émile", "?", "", "d"),
        ("Bob", "3", "100", "e"),
    ),
)
TASK = dataclasses.replace(data.get_task("dev-0040"), table=TABLE, type="INSERT", answer_md5=None)
T = "`1st table`"


@pytest.fixture
def db(backend):
    with backend.open(TASK) as episode:
        yield episode


# (statement, MySQL's observation); each runs on a fresh copy of TABLE.
AGREED = [
    (f"SELECT COUNT(*) FROM {T}", "[(5,)]"),
    (f"SELECT COUNT(*) FROM {T} WHERE Name = 'CAFE'", "[(2,)]"),  # case- and accent-insensitive
    (f"SELECT Name FROM {T} ORDER BY Name", "[('Bob',), ('Café',), ('cafe',), ('émile',), ('Zoë',)]"),
    (f"SELECT Name FROM {T} WHERE Name LIKE 'e%'", "[('émile',)]"),
    (f"SELECT Name FROM {T} WHERE Name IN ('zoe', 'BOB') ORDER BY Name", "[('Bob',), ('Zoë',)]"),
    (f"SELECT MAX(Score), MIN(Score) FROM {T}", "[('7', '?')]"),  # punctuation sorts before digits
    (f"SELECT SUM(Score), AVG(Score) FROM {T}", "[(43.0, 8.6)]"),  # text summed as doubles
    (f"SELECT SUM(Score) / COUNT(*) FROM {T}", "[(8.6,)]"),
    (f"SELECT Name FROM {T} WHERE Score > 10 ORDER BY Name", "[('Café',), ('Zoë',)]"),  # numeric compare
    (f"SELECT Name FROM {T} WHERE 10 < Score AND Score BETWEEN 20 AND 30", "[('Zoë',)]"),
    (f"SELECT `Area\\n(sq mi)` FROM {T} WHERE Name = 'Bob'", "[('100',)]"),
    (f"SELECT `50% share` FROM {T} WHERE `Name` = \"bob\"", "[('e',)]"),  # "..." is a string
    (f"SELECT CONCAT(Name, '-', Score), CONCAT_WS(',', Name, NULL, Score) FROM {T} WHERE Name = 'bob'",
     "[('Bob-3', 'Bob,3')]"),
    (f"SELECT IF(Score > 5, 'big', 'small') FROM {T} WHERE Name = 'bob'", "[('small',)]"),
    ("SELECT LOCATE('o', 'foo'), LOCATE('o', 'foo', 3), SUBSTRING_INDEX('www.mysql.com', '.', -2), "
     "LEFT('hello', 3), RIGHT('hello', 3)", "[(2, 3, 'mysql.com', 'hel', 'llo')]"),
    ("SELECT YEAR('2019-05-01'), MONTH('2019-05-01'), 'Abc' REGEXP '^a', 'abc' RLIKE 'z'", "[(2019, 5, 1, 0)]"),
    ("SELECT MD5('abc'), UPPER('é'), LENGTH('é'), CHAR_LENGTH('é')",
     "[('900150983cd24fb0d6963f7d28e17f72', 'É', 2, 1)]"),
    ("SELECT 'It\\'s', \"dq\", 'a\\tb', 'x''y'", "[(\"It's\", 'dq', 'a\\tb', \"x'y\")]"),
    ("SELECT 'a_b' LIKE 'a\\_b', 'axb' LIKE 'a\\_b'", "[(1, 0)]"),
    ("SELECT CAST('12.7abc' AS UNSIGNED), CAST('-3' AS SIGNED), CAST('21,052' AS SIGNED)", "[(12, -3, 21)]"),
    ("SELECT 1 || 0, 1 && 0, NULL <=> NULL, 7 DIV 2", "[(1, 0, 1, 3)]"),
    (f"SELECT GROUP_CONCAT(Name SEPARATOR ';') FROM {T} WHERE Score = '3'", "[('Bob',)]"),
    (f"SELECT Name FROM {T} WHERE Score = 12 # a MySQL comment", "[('Café',)]"),
    (f"SELECT Name FROM {T} -- a comment\n WHERE Score = '7'", "[('cafe',)]"),
    (f"SELECT Name, Score FROM {T} ORDER BY CAST(Score AS UNSIGNED) DESC LIMIT 2",
     "[('Zoë', '21,052'), ('Café', '12')]"),
    ("SELECT DATE_FORMAT('2019-05-01', '%Y/%m'), DATEDIFF('2019-05-03', '2019-05-01')", "[('2019/05', 2)]"),
    ("SELECT COALESCE(NULL, 'x'), IFNULL(NULL, 1), NULLIF(1, 1)", "[('x', 1, None)]"),
    ("SELECT FORMAT(1234567.891, 2), GREATEST(1, 3, 2), LEAST('b', 'a')", "[('1,234,567.89', 3, 'a')]"),
    ("SHOW TABLES", "[('1st table',)]"),
    (f"DESCRIBE {T}", str([(c, "text", "YES", "", None, "") for c in TABLE.columns])),
    (f"SHOW COLUMNS FROM {T}", str([(c, "text", "YES", "", None, "") for c in TABLE.columns])),
    ("SELECT 1;", "[(1,)]"),
    (f"UPDATE {T} SET Score = 13 WHERE Name = 'café'", "[]"),
    (f"INSERT INTO {T} (Name, Score) VALUES ('New', 1.5)", "[]"),
]


@pytest.mark.parametrize("sql,expected", AGREED, ids=[s[:50] for s, _ in AGREED])
def test_mysql_observations(db, sql, expected):
    result = db.execute(sql)
    assert result.ok, result.text
    assert result.text == expected and result.error is None and str(result.rows) == result.text


def test_modifications_are_visible_and_stored_as_text(db):
    assert db.execute(f"UPDATE {T} SET Score = 13 WHERE Name = 'café'").ok
    assert db.execute(f"SELECT Score FROM {T} WHERE Name = 'Café'").text == "[('13',), ('13',)]"
    assert db.execute(f"INSERT INTO {T} (Name, Score) VALUES ('New', 1.5)").ok
    assert db.execute(f"SELECT Score, `Area\\n(sq mi)` FROM {T} WHERE Name = 'New'").text == "[('1.5', None)]"


@pytest.mark.parametrize("sql,prefix", [
    ("SELECT * FROM nope", "1146 (42S02): Table '"),
    (f"SELECT nope FROM {T}", "1054 (42S22): Unknown column 'nope'"),
    ("SELEC 1", "1064 (42000): You have an error in your SQL syntax"),
    ('SELECT * FROM "1st table"', "1064 (42000)"),  # a string is no table name in MySQL
    ("SELECT [Name] FROM `1st table`", "1064 (42000)"),  # nor are [brackets] quotes
    (f"INSERT INTO {T} VALUES ('x')", "1136 (21S01): Column count doesn't match value count"),
    ("   ", "1065 (42000): Query was empty"),
])
def test_errors_read_like_mysql(db, sql, prefix):
    result = db.execute(sql)
    assert not result.ok and result.rows is None
    assert result.text.startswith(prefix) and result.error == result.text


def test_table_hash_matches_python_reference(backend):
    for task in (data.get_task("standard-0100"), data.get_task("standard-0200"), TASK):
        with backend.open(task) as episode:
            assert episode.table_hash() == backends.gold_hash(task)
            assert re.fullmatch(r"\[\('[0-9a-f]{32}',\)\]", episode.table_hash())
            episode.execute(f"DELETE FROM {backends.mysql_quote_ident(task.table.name)}")
            assert episode.table_hash() == "[(None,)]" == backends.hash_rows([])
    with backend.open(TASK) as episode:  # past group_concat_max_len (1024 bytes, ~170 rows)
        values = ", ".join(f"('r{i}', '{i}', NULL, 'x')" for i in range(300))
        assert episode.execute(f"INSERT INTO {T} VALUES {values}").ok
        rows = list(TABLE.rows) + [(f"r{i}", str(i), None, "x") for i in range(300)]
        assert episode.table_hash() == backends.hash_rows(rows)


def test_hash_rows_follows_the_agentbench_rule():
    # Row order and column names do not matter; NULLs are skipped; duplicates count.
    rows = [("a", "b"), ("c", None)]
    assert backends.hash_rows(rows) == backends.hash_rows(list(reversed(rows)))
    assert backends.hash_rows([("c",), ("a", "b")]) == backends.hash_rows(rows)
    assert backends.hash_rows(rows + [("a", "b")]) != backends.hash_rows(rows)
    # group_concat stops at MySQL 8's default of 1024 bytes: rows past ~170 no longer count.
    many = [(str(i),) for i in range(400)]  # 400 rowhashes: 2399 bytes joined
    rowhash = lambda s: hashlib.md5(s.encode()).hexdigest()[:5]
    late = next(s for s in map(str, range(1000, 100000)) if rowhash(s) > "ff")
    early = next(s for s in map(str, range(1000, 100000)) if rowhash(s) < "01")
    assert backends.hash_rows(many + [(late,)]) == backends.hash_rows(many)
    assert backends.hash_rows(many + [(early,)]) != backends.hash_rows(many)
    assert "md5(group_concat(rowhash order by rowhash))" in backends.hash_sql(TABLE)


def test_episodes_are_isolated_and_threads_are_safe(backend):
    def run(i):
        with backend.open(TASK) as episode:
            for j in range(i % 3 + 1):
                assert episode.execute(f"INSERT INTO {T} (Name) VALUES ('n{i}-{j}')").ok
            count = episode.execute(f"SELECT COUNT(*) FROM {T}").rows[0][0]
            return count, episode.table_hash()

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(run, range(16)))
    for i, (count, digest) in enumerate(results):
        assert count == len(TABLE.rows) + i % 3 + 1
        expected = backends.hash_rows(list(TABLE.rows) + [(f"n{i}-{j}",) for j in range(i % 3 + 1)])
        assert digest == expected


def test_row_and_byte_caps_truncate(backend):
    kind = backend.kind
    options = {"url": backend.url} if kind == "mariadb" else {}
    small = make_backend(kind, max_rows=3, **options)
    with small.open(TASK) as episode:
        result = episode.execute(f"SELECT Name FROM {T} ORDER BY Name")
        assert result.ok and result.truncated and len(result.rows) == 3
        assert episode.execute(f"SELECT COUNT(*) FROM {T}").text == "[(5,)]"  # usable afterwards
    tiny = make_backend(kind, max_bytes=40, **options)
    with tiny.open(TASK) as episode:
        result = episode.execute(f"SELECT * FROM {T}")
        assert result.truncated and len(result.text) <= 40
    small.close()
    tiny.close()


def test_close_is_idempotent_and_closed_db_is_an_error(backend):
    episode = backend.open(TASK)
    episode.close()
    episode.close()
    with pytest.raises(RuntimeError, match="closed"):
        episode.execute("SELECT 1")


def test_make_backend_names_the_choices():
    with pytest.raises(ValueError, match="choose one of sqlite, mariadb"):
        make_backend("postgres")
    with pytest.raises(ValueError, match="Limits must be positive"):
        make_backend("sqlite", time_budget_s=0)


def test_sqlite_loads_what_mariadb_cannot():
    task = data.get_task("dev-0005")  # empty column name: SQLite accepts it, MySQL/MariaDB refuse
    with make_backend("sqlite").open(task) as episode:
        assert episode.execute("SELECT COUNT(*) FROM `%s`" % task.table.name).rows == [(len(task.table.rows),)]


def test_mariadb_refuses_the_empty_column_name(mariadb_backend):
    with pytest.raises(backends.TableLoadError, match="dev-0005"):
        mariadb_backend.open(data.get_task("dev-0005"))


@pytest.mark.parametrize("sql,expected", [
    ("SELECT * FROM t WHERE a = 'x\\'y'", "SELECT * FROM t WHERE a = 'x''y'"),
    ("SELECT \"a\\nb\"", "SELECT 'a\nb'"),
    ("SELECT 'x\\%'", "SELECT 'x\\%'"),
    ("INSERT INTO 1952_British_Grand_Prix_0 (Pos) VALUES (22)",
     'INSERT INTO `1952_British_Grand_Prix_0` (Pos) VALUES (22)'),
    ("SELECT 1e+5, 1.5e3, 0x1F, 12", "SELECT 1e+5, 1.5e3, 0x1F, 12"),
    ("SELECT `a``b` FROM t", "SELECT `a``b` FROM t"),
    ("UPDATE t SET a = 1 WHERE b = 2", 'UPDATE t SET a = 1 WHERE MYSQL_NUM(b) = 2'),
    ("SELECT 'b = 2' FROM t", "SELECT 'b = 2' FROM t"),
    ("SELECT a / 2 FROM t", "SELECT a  * 1.0 /  2 FROM t"),
    ("SELECT LEFT(a, 2) FROM t LEFT JOIN u ON 1", "SELECT mysql_left(a, 2) FROM t LEFT JOIN u ON 1"),
])
def test_translate(sql, expected):
    assert mysql_translate.translate(sql) == expected


@pytest.mark.parametrize("sql,shim", [
    ("show tables", mysql_translate.Shim("show_tables")),
    ("SHOW TABLES LIKE 'a%';", mysql_translate.Shim("show_tables", None, "a%")),
    ("DESC `my table`", mysql_translate.Shim("describe", "my table")),
    ("SHOW FULL COLUMNS FROM t FROM db", mysql_translate.Shim("describe", "t")),
    ("SHOW CREATE TABLE `t`", mysql_translate.Shim("show_create_table", "t")),
])
def test_shims_are_recognized(sql, shim):
    assert mysql_translate.translate(sql) == shim


def test_collation_folds_case_and_accents_but_not_padding():
    assert mysql_functions.collate_ai_ci("Émile", "emile") == 0
    assert mysql_functions.collate_ai_ci("Straße", "STRASSE") == 0
    assert mysql_functions.collate_ai_ci("a ", "a") != 0  # NO PAD, like utf8mb4_0900_ai_ci
    assert mysql_functions.collate_ai_ci("?", "7") < 0 < mysql_functions.collate_ai_ci("b", "A")


def test_unknown_backticked_column_is_an_error_not_a_string(sqlite_backend):
    """SQLite reads an unknown "name" as a string; a backticked name must stay an identifier."""
    from harness_envs.dbbench.data import load_split

    task = load_split("dev")[0]
    with sqlite_backend.open(task) as db:
        result = db.execute(f"SELECT `no_such_column` FROM `{task.table.name}` LIMIT 1")
    assert not result.ok
    assert result.text.startswith("1054")
