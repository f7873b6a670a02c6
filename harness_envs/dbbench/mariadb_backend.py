"""MariaDB backend: AgentBench's MySQL setting, faithfully, on a server reached with `pymysql`.

Either connect to a server given by URL (`mysql://admin:pw@host:3306/` or
`mysql://root@localhost/?unix_socket=/run/mysqld/mysqld.sock`; the account needs CREATE USER,
CREATE, DROP and GRANT) or start one: a socket-only `mariadbd` on a temporary data directory,
shared by the process and shut down at exit (`mariadb_server`). Each episode gets its own database
and its own user with rights on that database only (no FILE or other global privilege, no temporary tables, which
no size check could see); the episode session runs with `sql_mode=''`, `max_statement_time`,
MySQL 8's `group_concat_max_len` and an accent- and case-insensitive collation; a watchdog kills
statements that outlive the budget regardless. After every statement the episode database's size
(data and index length, InnoDB statistics refreshed first) is checked against `max_db_mb`; past
it, the result says `size_limit` and the episode ends. So one statement can overshoot the limit by
what it writes within the time budget, never more.
"""
from __future__ import annotations

import importlib.util
import secrets
import threading
import urllib.parse

from harness_envs.dbbench.backends import (
    Backend,
    EpisodeDB,
    ExecResult,
    Limits,
    TableLoadError,
    check_text,
    error_result,
    fetch_capped,
    hash_sql,
    mysql_quote_ident,
    ok_result,
    size_limit_result,
)
from harness_envs.dbbench.data import DBTask
from harness_envs.dbbench.mariadb_server import local_server

# Closest to MySQL 8's utf8mb4_0900_ai_ci (UCA 9.0, accent- and case-insensitive, NO PAD) first.
COLLATIONS = ("utf8mb4_uca1400_nopad_ai_ci", "utf8mb4_uca1400_ai_ci", "utf8mb4_unicode_520_ci", "utf8mb4_unicode_ci")
_SQLSTATES = {
    1044: "42000", 1045: "28000", 1046: "3D000", 1049: "42000", 1050: "42S01", 1051: "42S02",
    1054: "42S22", 1060: "42S21", 1062: "23000", 1064: "42000", 1065: "42000", 1136: "21S01",
    1142: "42000", 1143: "42000", 1146: "42S02", 1149: "42000", 1166: "42000", 1227: "42000",
    1241: "21000", 1242: "21000", 1264: "22003", 1265: "01000", 1292: "22007", 1305: "42000",
    1317: "70100", 1364: "HY000", 1366: "HY000", 1370: "42000", 1969: "70100",
}
_EPISODE_PREFIX = "hsjax_ep_"


def mysql_error_text(exc: Exception) -> str:
    """`errno (sqlstate): message`, the shape of the observation AgentBench's client produced."""
    args = getattr(exc, "args", ())
    if len(args) >= 2 and isinstance(args[0], int):
        errno, message = args[0], str(args[1])
        message = message.replace("MariaDB server version", "MySQL server version")
        return f"{errno} ({_SQLSTATES.get(errno, 'HY000')}): {message}"
    return f"{type(exc).__name__}: {exc}"


def parse_url(url: str) -> dict:
    """pymysql connection arguments from `mysql://user:pw@host:port/?unix_socket=path`."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("mysql", "mariadb"):
        raise ValueError(f"MariaDB backend: url {url!r} must start with mysql:// or mariadb://")
    query = dict(urllib.parse.parse_qsl(parts.query))
    args = {
        "user": urllib.parse.unquote(parts.username or "root"),
        "password": urllib.parse.unquote(parts.password or ""),
    }
    if "unix_socket" in query:
        args["unix_socket"] = query["unix_socket"]
        args["ssl_disabled"] = True  # no TLS over a local socket; building a TLS context costs ~30 ms
    else:
        args["host"] = parts.hostname or "localhost"
        args["port"] = parts.port or 3306
    return args


class MariaDBEpisodeDB(EpisodeDB):
    def __init__(self, backend: "MariaDBBackend", task: DBTask):
        self.task = task
        self.backend = backend
        self.limits = backend.limits
        token = secrets.token_hex(6)
        self.database = _EPISODE_PREFIX + token
        self.user = _EPISODE_PREFIX + token
        self._password = secrets.token_hex(16)
        self._conn = None
        self._closed = False
        self._lock = threading.Lock()
        table = task.table
        backend.admin(
            f"CREATE DATABASE {mysql_quote_ident(self.database)} CHARACTER SET utf8mb4 COLLATE {backend.collation}",
            f"CREATE USER '{self.user}'@'{backend.user_host}' IDENTIFIED BY '{self._password}'",
            f"GRANT ALL PRIVILEGES ON {mysql_quote_ident(self.database)}.* TO '{self.user}'@'{backend.user_host}'",
            f"REVOKE CREATE TEMPORARY TABLES ON {mysql_quote_ident(self.database)}.* "
            f"FROM '{self.user}'@'{backend.user_host}'",
        )
        columns = ",".join(f"{mysql_quote_ident(c)} TEXT" for c in table.columns)
        # pymysql %-formats statements that take parameters: a literal % in a name must be doubled.
        names = ",".join(mysql_quote_ident(c) for c in table.columns).replace("%", "%%")
        statements = [f"CREATE TABLE {mysql_quote_ident(table.name)} ({columns})"]
        params = [None]
        if table.rows:
            marks = ",".join(["(" + ",".join(["%s"] * len(table.columns)) + ")"] * len(table.rows))
            into = mysql_quote_ident(table.name).replace("%", "%%")
            statements.append(f"INSERT INTO {into} ({names}) VALUES {marks}")
            params.append([cell for row in table.rows for cell in row])
        try:
            backend.admin_in(self.database, statements, params)
        except Exception as e:
            self.close()
            raise TableLoadError(
                f"{task.task_id}: table {table.name!r} cannot be created: {mysql_error_text(e)}"
            ) from e
        try:
            self._connection()
        except Exception:
            self.close()
            raise

    def _connection(self):
        if self._closed:
            raise RuntimeError(f"episode database of {self.task.task_id} is closed; open a new one")
        if self._conn is None:
            import pymysql

            budget = self.limits.time_budget_s
            self._conn = pymysql.connect(
                **self.backend.connect_args, user=self.user, password=self._password, database=self.database,
                charset="utf8mb4", collation=self.backend.collation, autocommit=True, local_infile=False,
                init_command=(
                    f"SET SESSION sql_mode='', max_statement_time={budget:.3f}, group_concat_max_len=1024"
                ),
            )
        return self._conn

    def _drop_connection(self, cursor=None) -> None:
        """Kill the server side first, so that an unread result ends at once instead of streaming."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        self.backend.kill(conn.thread_id())
        if cursor is not None:
            # Abandon the unread result: otherwise pymysql tries to drain it from the dead socket.
            result = getattr(cursor, "_result", None)
            if result is not None:
                result.unbuffered_active = False
            cursor.connection = None
        try:
            conn.close()
        except Exception:
            pass  # the connection is dead by design

    def execute(self, sql: str) -> ExecResult:
        sql = check_text(sql)
        if isinstance(sql, ExecResult):
            return sql
        import pymysql

        with self._lock:
            try:
                conn = self._connection()
            except pymysql.MySQLError as e:
                return error_result(mysql_error_text(e))
            watchdog = threading.Timer(self.limits.time_budget_s + 2.0, self.backend.kill_query, (conn.thread_id(),))
            watchdog.daemon = True
            watchdog.start()
            try:
                cursor = conn.cursor(pymysql.cursors.SSCursor)
                cursor.execute(sql)
                if cursor.description is None:
                    rows, truncated = [], False
                else:
                    rows, truncated = fetch_capped(cursor.fetchmany, self.limits)
                if truncated:
                    self._drop_connection(cursor)
                else:
                    cursor.close()
            except pymysql.MySQLError as e:
                if isinstance(e, (pymysql.err.OperationalError, pymysql.err.InterfaceError)) and not conn.open:
                    self._conn = None
                result = error_result(mysql_error_text(e))
            else:
                result = ok_result(rows, truncated)
            finally:
                watchdog.cancel()
            return self._checked_size(result)

    def _checked_size(self, result: ExecResult) -> ExecResult:
        """`result`, or the size-limit error when the database has grown past `max_db_mb` (any
        statement may have written: a failed one on a non-transactional engine, a SELECT calling
        a stored function)."""
        import pymysql

        try:
            size = self.backend.database_bytes(self.database)
        except pymysql.MySQLError:
            return result  # the server is gone: the next statement says so
        return size_limit_result(self.limits, size) if size > self.limits.max_db_bytes else result

    def table_hash(self) -> str:
        import pymysql

        try:
            rows = self.backend.admin_in(self.database, [hash_sql(self.task.table)], [None], fetch=True)
        except pymysql.MySQLError as e:
            return mysql_error_text(e)
        return str(rows)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                self._drop_connection()
            except Exception:
                pass
            self.backend.drop_episode(self.database, self.user)


class MariaDBBackend(Backend):
    kind = "mariadb"

    def __init__(self, url: str | None = None, time_budget_s: float = 2.0, max_rows: int = 10_000,
                 max_bytes: int = 1_000_000, collation: str | None = None, user_host: str | None = None,
                 max_db_mb: float = 64.0):
        if importlib.util.find_spec("pymysql") is None:
            raise RuntimeError("MariaDB backend needs the `pymysql` package: pip install pymysql")
        self.limits = Limits(time_budget_s=time_budget_s, max_rows=max_rows, max_bytes=max_bytes,
                             max_db_mb=max_db_mb)
        self.server = local_server() if url is None else None
        self.url = url or self.server.url
        self.connect_args = parse_url(self.url)
        admin_args = dict(self.connect_args)
        self._admin_user = {"user": admin_args.pop("user"), "password": admin_args.pop("password")}
        self.connect_args = admin_args
        self.user_host = user_host or ("localhost" if "unix_socket" in admin_args else "%")
        self._admin_lock = threading.Lock()
        self._admin_conn = None
        self.collation = collation or self._pick_collation()

    def _admin(self):
        import pymysql

        if self._admin_conn is None or not self._admin_conn.open:
            self._admin_conn = pymysql.connect(
                **self.connect_args, **self._admin_user, charset="utf8mb4", autocommit=True,
                init_command="SET SESSION sql_mode='', group_concat_max_len=1024",
            )
        return self._admin_conn

    def _pick_collation(self) -> str:
        import pymysql

        with self._admin_lock:
            cursor = self._admin().cursor()
            for name in COLLATIONS:
                try:
                    cursor.execute(f"SELECT _utf8mb4'a' COLLATE {name}")
                    cursor.fetchall()
                    return name
                except pymysql.MySQLError:
                    continue
        raise RuntimeError(f"MariaDB backend: none of the collations {COLLATIONS} exists on {self.url}")

    def admin(self, *statements: str) -> None:
        with self._admin_lock:
            with self._admin().cursor() as cursor:
                for statement in statements:
                    cursor.execute(statement)

    def admin_in(self, database: str, statements, params, fetch: bool = False):
        """Run statements in `database` on the admin connection; the last one's rows if fetch."""
        with self._admin_lock:
            conn = self._admin()
            conn.select_db(database)
            try:
                with conn.cursor() as cursor:
                    for statement, args in zip(statements, params):
                        cursor.execute(statement, args)
                    return list(cursor.fetchall()) if fetch else None
            finally:
                with conn.cursor() as cursor:
                    cursor.execute("USE mysql")

    def database_bytes(self, database: str) -> int:
        """Data and index bytes of `database`'s tables. InnoDB's statistics lag whole statements
        behind, so its tables are analyzed first (well under a millisecond each)."""
        size_sql = ("SELECT COALESCE(SUM(data_length + index_length), 0) FROM information_schema.TABLES "
                    "WHERE table_schema = %s")
        with self._admin_lock:
            with self._admin().cursor() as cursor:
                cursor.execute("SELECT table_name FROM information_schema.TABLES WHERE table_schema = %s "
                               "AND engine = 'InnoDB'", (database,))
                names = [f"{mysql_quote_ident(database)}.{mysql_quote_ident(r[0])}" for r in cursor.fetchall()]
                if names:
                    cursor.execute("ANALYZE TABLE " + ", ".join(names))
                    cursor.fetchall()
                cursor.execute(size_sql, (database,))
                return int(cursor.fetchone()[0])

    def kill(self, thread_id: int) -> None:
        self._kill("KILL CONNECTION", thread_id)

    def kill_query(self, thread_id: int) -> None:
        self._kill("KILL QUERY", thread_id)

    def _kill(self, verb: str, thread_id: int) -> None:
        import pymysql

        try:
            self.admin(f"{verb} {int(thread_id)}")
        except pymysql.MySQLError:
            pass  # already gone

    def drop_episode(self, database: str, user: str) -> None:
        import pymysql

        try:
            self.admin(
                f"DROP DATABASE IF EXISTS {mysql_quote_ident(database)}",
                f"DROP USER IF EXISTS '{user}'@'{self.user_host}'",
            )
        except pymysql.MySQLError:
            pass  # the server is gone; nothing left to clean

    def open(self, task: DBTask) -> MariaDBEpisodeDB:
        return MariaDBEpisodeDB(self, task)

    def close(self) -> None:
        with self._admin_lock:
            if self._admin_conn is not None:
                try:
                    self._admin_conn.close()
                except Exception:
                    pass
                self._admin_conn = None
