"""AppWorld (offline world) figures: sandbox overheads, episode step times, and the scores of the
oracle and of each scripted slip under every harness of the shipped pool (the locality matrix).

    python perf/appworld_bench.py                 # everything, on the dev split
    python perf/appworld_bench.py --only sandbox --repeats 200

Sandbox: process start (first cell) and one cell's round trip per isolation mode, a cell making 10
API calls through the bridge, against `exec` of the same code in-process. docs/appworld.md quotes
the output.
"""
from __future__ import annotations

import argparse
import statistics
import time

from harness_envs import sandbox
from harness_envs.appworld import agents
from harness_envs.registry import make_benchmark
from hsjax.policies.base import SamplingParams
from hsjax.rollout.runner import EpisodeRunner, Job


def ms(values) -> str:
    return f"{1000 * statistics.median(values):.2f}"


def sandbox_figures(repeats: int) -> None:
    print("| isolation | start + first cell, ms | trivial cell, ms | cell with 10 bridge calls, ms |")
    print("|---|---|---|---|")
    for mode in ("bwrap", "unshare", "none"):
        try:
            sandbox.isolation(mode)
        except (RuntimeError, ValueError):  # isolation() refuses a mode that does not run here in one line
            print(f"| {mode} | not available here | | |")
            continue
        starts, cells, calls = [], [], []
        for _ in range(max(3, repeats // 20)):
            t0 = time.perf_counter()
            with sandbox.PythonSandbox(isolation_mode=mode, bridge="apis", on_call=lambda p, a, k: 1) as box:
                box.run("x = 1")
                starts.append(time.perf_counter() - t0)
                for _ in range(repeats // max(3, repeats // 20)):
                    t0 = time.perf_counter()
                    box.run("x += 1")
                    cells.append(time.perf_counter() - t0)
                    t0 = time.perf_counter()
                    box.run("for _ in range(10):\n    apis.a.b(k=1)")
                    calls.append(time.perf_counter() - t0)
        print(f"| {mode} | {ms(starts)} | {ms(cells)} | {ms(calls)} |")
    namespace, inproc = {"x": 0}, []
    for _ in range(repeats):
        t0 = time.perf_counter()
        exec(compile("x += 1", "<cell>", "exec"), namespace)
        inproc.append(time.perf_counter() - t0)
    print(f"| in-process exec (no sandbox) | - | {ms(inproc)} | - |")


def run(bench, agent, specs, tasks):
    runner = EpisodeRunner(bench.make_episode, agent, SamplingParams(), env_workers=2)
    t0 = time.perf_counter()
    results = runner.results([Job(s, t) for s in specs for t in tasks])
    return results, time.perf_counter() - t0


def score_figures(split: str) -> None:
    with make_benchmark("appworld") as bench:
        pool = bench.load_pool()
        tasks = bench.load_split(split)
        names = list(pool)
        print(f"\nTGC % on {split} ({len(tasks)} tasks), rows: agent, columns: harness; base failure modes\n")
        print("| agent | " + " | ".join(names) + " | base failure modes |")
        print("|---|" + "---|" * (len(names) + 1))
        results, wall = run(bench, bench.make_agent("oracle"), list(pool.values()), tasks)
        cells = sum(r["num_cells"] for r in results)
        row = [f"{100 * bench.summarize([r for r in results if r['harness'] == n])['tgc']:.0f}" for n in names]
        print("| oracle | " + " | ".join(row) + " | - |")
        oracle_step = wall / cells
        for slip, info in agents.SLIPS.items():
            results, _ = run(bench, bench.make_agent("scripted", noise={slip: 1.0}), list(pool.values()), tasks)
            row = []
            for n in names:
                tgc = 100 * bench.summarize([r for r in results if r["harness"] == n])["tgc"]
                row.append(f"**{tgc:.0f}**" if n == info.sibling else f"{tgc:.0f}")
            modes = {}
            for r in results:
                if r["harness"] == "base":
                    modes[r["failure_mode"]] = modes.get(r["failure_mode"], 0) + 1
            print(f"| {slip} | " + " | ".join(row) + " | " + ", ".join(f"{k} {v}" for k, v in modes.items()) + " |")
        print(f"\noracle: {len(tasks) * len(names)} episodes, {oracle_step * 1000:.1f} ms per cell (episode wall "
              "/ cells, 2 environment threads; each episode starts its own sandbox)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=100)
    parser.add_argument("--split", default="dev")
    parser.add_argument("--only", choices=("sandbox", "scores"), default=None)
    args = parser.parse_args()
    if args.only != "scores":
        sandbox_figures(args.repeats)
    if args.only != "sandbox":
        score_figures(args.split)


if __name__ == "__main__":
    main()
