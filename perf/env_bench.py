"""DBBench environment speed: episode set-up (create + load a table) and one SQL step, per backend.

    python perf/env_bench.py                       # SQLite, and MariaDB when installed
    python perf/env_bench.py --backends sqlite --repeats 500

Set-up is timed on the table of median size (cells) over dev + standard and, separately, over
every table; a step is one `EpisodeDB.execute` of a typical agent statement on the median table.
Targets (SQLite): set-up <= 5 ms and step <= 1 ms median.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import time


from harness_envs.dbbench import data, make_backend
from harness_envs.dbbench.backends import mysql_quote_ident
from harness_envs.dbbench.mariadb_server import is_available as mariadb_available


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def median_task(tasks):
    ranked = sorted(tasks, key=lambda t: (len(t.table.rows) * len(t.table.columns), t.task_id))
    return ranked[len(ranked) // 2]


def typical_statements(task):
    t = mysql_quote_ident(task.table.name)
    first, last = (mysql_quote_ident(c) for c in (task.table.columns[0], task.table.columns[-1]))
    value = task.table.rows[len(task.table.rows) // 2][0].replace("'", "''")
    return [
        f"SELECT * FROM {t} LIMIT 5",
        f"SELECT {last} FROM {t} WHERE {first} = '{value}'",
        f"SELECT COUNT(*) FROM {t} WHERE {first} LIKE '%a%'",
        f"SELECT {first}, {last} FROM {t} ORDER BY {last} DESC LIMIT 3",
        f"SELECT MAX({last}), SUM({last}) FROM {t}",
        f"DESCRIBE {t}",
        f"UPDATE {t} SET {last} = 'x' WHERE {first} = '{value}'",
    ]


def percentile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def bench(kind, tasks, repeats):
    backend = make_backend(kind)
    task = median_task(tasks)
    setup_ms, close_ms, step_ms = [], [], []
    for _ in range(repeats):
        start = time.perf_counter()
        db = backend.open(task)
        setup_ms.append((time.perf_counter() - start) * 1e3)
        for sql in typical_statements(task):
            start = time.perf_counter()
            result = db.execute(sql)
            step_ms.append((time.perf_counter() - start) * 1e3)
            assert result.ok, (sql, result.text)
        start = time.perf_counter()
        db.close()
        close_ms.append((time.perf_counter() - start) * 1e3)
    all_setup_ms = []
    for t in tasks:
        start = time.perf_counter()
        try:
            db = backend.open(t)
        except Exception:  # a table this backend cannot load (dev-0005 on MariaDB)
            continue
        all_setup_ms.append((time.perf_counter() - start) * 1e3)
        db.close()
    backend.close()
    return task, {
        "set-up, median table": setup_ms,
        "set-up, every table": all_setup_ms,
        "SQL step": step_ms,
        "close": close_ms,
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", default="sqlite,mariadb")
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args(argv)
    tasks = data.load_split("dev") + data.load_split("standard")
    print(f"# {time.strftime('%Y-%m-%d')} · {cpu_name()} · "
          f"{os.cpu_count()} CPUs · Python {platform.python_version()}")
    print(f"# command: python perf/env_bench.py --backends {args.backends} --repeats {args.repeats}")
    print("| backend | measure | n | median ms | p90 ms |")
    print("| --- | --- | --- | --- | --- |")
    for kind in args.backends.split(","):
        if kind == "mariadb" and not mariadb_available():
            print("| mariadb | (not installed: skipped) | | | |")
            continue
        task, timings = bench(kind, tasks, args.repeats)
        for name, values in timings.items():
            if "median" in name:
                name = f"{name} ({task.task_id}: {len(task.table.rows)}x{len(task.table.columns)})"
            median, p90 = statistics.median(values), percentile(values, 0.9)
            print(f"| {kind} | {name} | {len(values)} | {median:.3f} | {p90:.3f} |")


if __name__ == "__main__":
    main()
