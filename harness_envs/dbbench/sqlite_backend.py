"""SQLite backend: an in-memory database per episode speaking enough MySQL for DBBench agents.

Agent SQL is hostile: an authorizer denies ATTACH/DETACH, PRAGMA other than schema reads,
virtual tables and extension loading (never enabled); a progress handler aborts statements past
the time budget; results are capped in rows and bytes; only one statement runs per call. The
database lives in memory: `max_page_count` bounds it, and the database of temporary tables (an
unlinked file in the temporary directory), at `Limits.max_db_mb` each, so a statement that would
grow one further fails with SQLITE_FULL and nothing of it is kept; the result says `size_limit`.
"""
from __future__ import annotations

import re
import sqlite3
import threading
import time

from harness_envs.dbbench import mysql_functions, mysql_translate
from harness_envs.dbbench.backends import (
    Backend,
    EpisodeDB,
    ExecResult,
    Limits,
    TableLoadError,
    check_text,
    error_result,
    fetch_capped,
    hash_rows,
    ok_result,
    size_limit_result,
)
from harness_envs.dbbench.data import DBTask

_PROGRESS_EVERY = 2000  # SQLite VM instructions between deadline checks
_MAX_VALUE_BYTES = 10_000_000  # SQLITE_LIMIT_LENGTH: no string or blob larger than this
_ALLOWED_PRAGMAS = frozenset({"table_info", "table_xinfo", "table_list", "index_list", "index_info"})
_DENIED_FUNCTIONS = frozenset({"load_extension", "readfile", "writefile", "edit", "fts3_tokenizer"})
_DENIED_ACTIONS = frozenset({
    sqlite3.SQLITE_ATTACH, sqlite3.SQLITE_DETACH, sqlite3.SQLITE_CREATE_VTABLE, sqlite3.SQLITE_DROP_VTABLE,
})
_TIMEOUT_MESSAGE = "3024 (HY000): Query execution was interrupted, maximum statement execution time exceeded"


def _authorize(action, arg1, arg2, db_name, trigger):
    if action in _DENIED_ACTIONS:
        return sqlite3.SQLITE_DENY
    if action == sqlite3.SQLITE_PRAGMA:
        return sqlite3.SQLITE_OK if arg1 in _ALLOWED_PRAGMAS else sqlite3.SQLITE_DENY
    if action == sqlite3.SQLITE_FUNCTION and (arg2 or "").lower() in _DENIED_FUNCTIONS:
        return sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def mysql_error_text(exc: Exception, database: str) -> str:
    """A SQLite error in the shape of MySQL's `errno (sqlstate): message` observation."""
    msg = str(exc)
    if isinstance(exc, sqlite3.OperationalError) and msg == "interrupted":
        return _TIMEOUT_MESSAGE
    if m := re.fullmatch(r"no such table: (?:main\.)?(.+)", msg):
        return f"1146 (42S02): Table '{database}.{m.group(1)}' doesn't exist"
    if m := re.fullmatch(r"no such column: (.+)", msg):
        return f"1054 (42S22): Unknown column '{m.group(1)}' in 'field list'"
    if m := re.fullmatch(r"no such function: (.+)", msg):
        return f"1305 (42000): FUNCTION {database}.{m.group(1)} does not exist"
    if re.fullmatch(r"table .+ has \d+ columns but \d+ values were supplied|\d+ values for \d+ columns", msg):
        return "1136 (21S01): Column count doesn't match value count at row 1"
    if m := re.fullmatch(r"table (.+) already exists", msg):
        return f"1050 (42S01): Table '{m.group(1)}' already exists"
    if "syntax error" in msg or "unrecognized token" in msg or "incomplete input" in msg:
        return f"1064 (42000): You have an error in your SQL syntax; {msg}"
    if msg == "user-defined function raised exception":
        return ("1105 (HY000): A function failed on its arguments (REGEXP patterns with nested quantifiers "
                "are refused here)")
    if msg == "not authorized" or "prohibited" in msg:
        return f"1227 (42000): Access denied; this operation is not allowed in the episode database ({msg})"
    return f"1105 (HY000): {msg}"


class SQLiteEpisodeDB(EpisodeDB):
    def __init__(self, task: DBTask, limits: Limits):
        self.task = task
        self.limits = limits
        # DBBench names the database after the table; a task may name it (the testbed's names
        # regime calls every database `main`, so no error message leaks a hidden table name).
        self.database = getattr(task, "database", "") or task.table.name
        self._lock = threading.Lock()
        self._deadline = float("inf")
        self._conn: sqlite3.Connection | None = sqlite3.connect(
            ":memory:", check_same_thread=False, isolation_level=None
        )
        conn = self._conn
        conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
        conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, _MAX_VALUE_BYTES)
        max_pages = max(1, limits.max_db_bytes // conn.execute("PRAGMA page_size").fetchone()[0])
        for schema in ("main", "temp"):  # set before the authorizer, which denies the agent PRAGMA writes
            conn.execute(f"PRAGMA {schema}.max_page_count = {max_pages}")
        mysql_functions.install(conn, self.database)
        # A task may bring other tables (the testbed's v4 regime); DBBench tasks hold one.
        for table in (task.table, *getattr(task, "extra_tables", ())):
            columns = ", ".join(f"{_quote(c)} TEXT COLLATE {mysql_functions.COLLATION}" for c in table.columns)
            try:
                conn.execute(f"CREATE TABLE {_quote(table.name)} ({columns})")
                if table.rows:
                    marks = ", ".join("?" * len(table.columns))
                    conn.executemany(f"INSERT INTO {_quote(table.name)} VALUES ({marks})", table.rows)
            except sqlite3.Error as e:
                self.close()
                raise TableLoadError(f"{task.task_id}: table {table.name!r} cannot be created: {e}") from e
        conn.set_authorizer(_authorize)
        conn.set_progress_handler(self._over_budget, _PROGRESS_EVERY)

    def _over_budget(self) -> int:
        return int(time.monotonic() > self._deadline)

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise RuntimeError(f"episode database of {self.task.task_id} is closed; open a new one")
        return self._conn

    def execute(self, sql: str) -> ExecResult:
        sql = check_text(sql)
        if isinstance(sql, ExecResult):
            return sql
        try:
            statement = mysql_translate.translate(sql)
        except mysql_translate.SQLSyntaxError as e:
            return error_result(str(e))
        with self._lock:
            conn = self._connection()
            if isinstance(statement, mysql_translate.Shim):
                return self._shim(conn, statement)
            self._deadline = time.monotonic() + self.limits.time_budget_s
            try:
                cursor = conn.execute(statement)
                rows, truncated = fetch_capped(cursor.fetchmany, self.limits)
                cursor.close()
            except (sqlite3.Error, ValueError, OverflowError, MemoryError) as e:
                if getattr(e, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL:
                    return size_limit_result(self.limits)
                return error_result(mysql_error_text(e, self.database))
            finally:
                self._deadline = float("inf")
        return ok_result(rows, truncated)

    def _table_names(self, conn) -> list[str]:
        rows = conn.execute(
            "SELECT name FROM sqlite_master WHERE type IN ('table', 'view') AND name NOT LIKE 'sqlite_%' "
            "ORDER BY name"
        ).fetchall()
        return [r[0] for r in rows]

    def _columns(self, conn, name: str) -> list[str] | None:
        tables = {t.lower(): t for t in self._table_names(conn)}
        if name.lower() not in tables:
            return None
        return [r[1] for r in conn.execute(f"PRAGMA table_info({_quote(tables[name.lower()])})")]

    def _shim(self, conn, shim: mysql_translate.Shim) -> ExecResult:
        like = (lambda s: mysql_functions.mysql_like(shim.like, s)) if shim.like else (lambda s: True)
        if shim.kind == "show_tables":
            return ok_result([(t,) for t in self._table_names(conn) if like(t)])
        if shim.kind == "show_databases":
            return ok_result([("information_schema",), (self.database,)])
        if shim.kind == "use":
            if shim.name in (self.database, "`" + self.database + "`"):
                return ok_result([])
            return error_result(f"1049 (42000): Unknown database '{shim.name}'")
        columns = self._columns(conn, shim.name or "")
        if columns is None:
            return error_result(f"1146 (42S02): Table '{self.database}.{shim.name}' doesn't exist")
        if shim.kind == "describe":
            return ok_result([(c, "text", "YES", "", None, "") for c in columns if like(c)])
        body = ",\n".join(f"  `{c}` text" for c in columns)
        create = (
            f"CREATE TABLE `{shim.name}` (\n{body}\n) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 "
            "COLLATE=utf8mb4_0900_ai_ci"
        )
        return ok_result([(shim.name, create)])

    def table_hash(self) -> str:
        table = self.task.table
        columns = ", ".join(_quote(c) for c in table.columns)
        with self._lock:
            conn = self._connection()
            conn.set_authorizer(None)
            try:
                rows = conn.execute(f"SELECT {columns} FROM {_quote(table.name)}").fetchall()
            except sqlite3.Error as e:
                return mysql_error_text(e, self.database)
            finally:
                conn.set_authorizer(_authorize)
        return hash_rows([[mysql_functions.to_text(c) for c in row] for row in rows])

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


class SQLiteBackend(Backend):
    kind = "sqlite"

    def __init__(self, time_budget_s: float = 2.0, max_rows: int = 10_000, max_bytes: int = 1_000_000,
                 max_db_mb: float = 64.0):
        self.limits = Limits(time_budget_s=time_budget_s, max_rows=max_rows, max_bytes=max_bytes,
                             max_db_mb=max_db_mb)

    def open(self, task: DBTask) -> SQLiteEpisodeDB:
        return SQLiteEpisodeDB(task, self.limits)
