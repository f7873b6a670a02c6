"""Faults x outcome: `run.py ... :eval` against hostile OpenAI-compatible servers on 127.0.0.1.

    python perf/fault_table.py            # about 2 minutes on a 2-core CPU
    python perf/fault_table.py --tasks 24

Each row is one real evaluation (DBBench dev, `--tasks` tasks, HTTP policy) whose server plays the
oracle agent except for the fault: one task's requests fail in one way, its replies are hostile, or
every request fails. Columns: the exit status, the episodes recorded (in the eval JSON, or in the
episode log when the run stopped), the failure mode of the faulty episodes, the evaluation's own
time (eval JSON `wall_s`) and the process's wall time (with the interpreter's start), the peak
resident memory of the run (the child's ru_maxrss) and the places the API key was found (stdout,
stderr and every file of the workdir). The servers are those of the fault-injection tests
(tests/faults/hostile.py). docs/reliability.md holds a measured table.
"""
from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import pathlib
import platform
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from harness_envs.dbbench.benchmark import DBBench  # noqa: E402
from tests.faults.hostile import (Hostile, dbbench_oracle, drip, echo_key, huge, ok, status,  # noqa: E402
                                  truncated)

KEY = "sk-fault-table-0123456789abcdef"
KEY_ENV = "HSJAX_FAULT_TABLE_KEY"
# Per attempt 2 s, 2 retries, backoff capped at 1 s: one request takes at most 3 * 2 + 2 * 1 = 8 s.
POLICY = ["--config.policy.timeout=2", "--config.policy.max_retries=2", "--config.policy.backoff=0.1",
          "--config.policy.max_backoff=1"]
GROW_SQL = ("Action: Operation\n```sql\nCREATE TABLE big AS WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL "
            "SELECT x + 1 FROM c LIMIT 1000000) SELECT x, randomblob(100) AS b FROM c;\n```\n")
HUGE_REPLY = "Action: Operation\n```sql\nSELECT 1;\n```\n" + "x" * (3 << 20)


def faults(tasks):
    """{name: (description, behaviour of the server)}: the first task(s) get the fault."""
    first, second = tasks[0].task_id, tasks[1].task_id
    one = lambda behaviour: dbbench_oracle(tasks, {first: behaviour})  # noqa: E731
    return {
        "none": ("healthy server (baseline)", dbbench_oracle(tasks)),
        "5xx": ("one task: HTTP 500 on every request", one(status(500, {"error": "down"}))),
        "429_retry_after_30": ("one task: 429 with Retry-After: 30",
                               one(status(429, {"error": "slow"}, {"Retry-After": "30"}))),
        "drip": ("one task: body dripped 1 byte / 0.2 s", one(drip(every_s=0.2))),
        "truncated": ("one task: body cut at half", one(truncated())),
        "huge_body": ("one task: 32 MB body", one(huge(32 << 20))),
        "non_utf8": ("one task: 200 with a non-UTF-8 body", one(status(200, b"\xff\xfe{\x80 not utf-8"))),
        "echo_key": ("two tasks: key echoed in a 200 reply and in a 500 body",
                     dbbench_oracle(tasks, {first: echo_key(200, "Action: Answer\nFinal Answer: [\"{auth}\"]"),
                                            second: echo_key(500)})),
        "db_growth": ("one task: CREATE TABLE of ~110 MB every turn", one(ok(GROW_SQL))),
        "huge_replies": ("one task: 3 MB reply every turn", one(ok(HUGE_REPLY))),
        # More tasks than the breaker's 16 failures in a row, so the run stops (EndpointDown).
        "endpoint_down": ("every request: HTTP 503 (40 tasks)", status(503, {"error": "maintenance"})),
    }


TASKS = {"endpoint_down": 40}  # faults run on more tasks than --tasks


def run_eval(base_url: str, n_tasks: int, workdir: pathlib.Path, logs: pathlib.Path) -> dict:
    cmd = [sys.executable, str(REPO / "run.py"), "--config", f"{REPO}/experiments/dbbench.py:eval",
           "--config.policy.kind=http", f"--config.policy.base_url={base_url}", "--config.policy.model=m",
           f"--config.policy.api_key_env={KEY_ENV}", f"--config.limit={n_tasks}", *POLICY, f"--workdir={workdir}"]
    env = {**os.environ, KEY_ENV: KEY, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
    with open(logs / "stdout", "w") as out, open(logs / "stderr", "w") as err:
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=err)
        _, status_, usage = os.wait4(proc.pid, 0)
        wall = time.monotonic() - t0
    return {"rc": os.waitstatus_to_exitcode(status_), "wall_s": wall, "peak_rss_mb": usage.ru_maxrss / 1024}


def eval_seconds(workdir: pathlib.Path) -> float | None:
    """The evaluation's own time (the eval JSON's wall_s: without the interpreter's start), if it finished."""
    final = workdir / "eval" / "dbbench.json"
    return json.loads(final.read_text())["wall_s"] if final.exists() else None


def recorded(workdir: pathlib.Path) -> list[dict]:
    """The episode records the run left: its eval JSON, or its episode log when it stopped."""
    final = workdir / "eval" / "dbbench.json"
    if final.exists():
        return json.loads(final.read_text())["episodes"]
    log = workdir / "eval" / "dbbench.episodes.jsonl"
    if not log.exists():
        return []
    return [json.loads(line)["record"] for line in log.read_text().splitlines()[1:] if line.strip()]


def keys_found(*roots: pathlib.Path) -> int:
    """Files under `roots` (or the files themselves) that hold the key."""
    files = [p for root in roots for p in ([root] if root.is_file() else root.rglob("*")) if p.is_file()]
    return sum(KEY.encode() in p.read_bytes() for p in files)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=12)
    parser.add_argument("--only", default="", help="comma-separated fault names")
    args = parser.parse_args()
    with DBBench() as bench:
        tasks = bench.load_split("dev", limit=args.tasks)
    table = faults(tasks)
    names = [n for n in table if not args.only or n in args.only.split(",")]
    print(f"# {' '.join(sys.argv)}  ({datetime.date.today()}, {platform.node()}, {os.cpu_count()} CPUs)")
    print(f"{'fault':<20} {'rc':>3} {'recorded':>9} {'faulty episodes':<36} {'eval s':>7} {'wall s':>7} "
          f"{'peak MB':>8} {'keys':>5}")
    rows = []
    for name in names:
        description, behaviour = table[name]
        server = Hostile(behaviour)
        with tempfile.TemporaryDirectory() as tmp:
            workdir, logs = pathlib.Path(tmp) / "w", pathlib.Path(tmp) / "logs"
            logs.mkdir()
            try:
                n_tasks = TASKS.get(name, len(tasks))
                result = run_eval(server.base_url, n_tasks, workdir, logs)
            finally:
                server.close()
            records, seconds = recorded(workdir), eval_seconds(workdir)
            modes = collections.Counter(r["failure_mode"] for r in records if r["failure_mode"] != "success")
            keys = keys_found(workdir, logs)
            stderr_tail = (logs / "stderr").read_text().strip().splitlines()[-1:]
        faulty = ", ".join(f"{m} x{c}" for m, c in sorted(modes.items())) or "-"
        shown = f"{seconds:.1f}" if seconds is not None else "-"
        print(f"{name:<20} {result['rc']:>3} {len(records):>4}/{n_tasks:<4} {faulty:<36} {shown:>7} "
              f"{result['wall_s']:>7.1f} {result['peak_rss_mb']:>8.0f} {keys:>5}")
        rows.append({"fault": name, "description": description, **result, "eval_s": seconds, "recorded": len(records),
                     "failure_modes": dict(modes), "keys_found": keys, "stderr_last": stderr_tail})
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
