"""SWE-Gym figures: the resolved rate of the oracle and of each scripted slip under every harness of
the shipped pool (the locality matrix), with the base harness's failure modes and the time per episode.

    python perf/swegym_bench.py                       # the offline cache's test split
    python perf/swegym_bench.py --split train --limit 4
    python perf/swegym_bench.py --cache-dir /tmp/tiny  # any cache laid out as .cache/swegym
    python perf/swegym_bench.py --split train --ids pypi__toolz-1,pypi__toolz-4 --slips syntax

Episodes run with a context budget of `CONTEXT_CHARS` characters (about SWE-Gym's 32k tokens), as
experiments/swegym.py's eval does, so the context_hog slip overflows it.
"""
from __future__ import annotations

import argparse
import collections
import time

from harness_envs.registry import make_benchmark
from harness_envs.swegym import agents
from hsjax.policies.base import SamplingParams
from hsjax.rollout.runner import EpisodeRunner, Job

CONTEXT_CHARS = 100_000


def run(bench, agent, specs, tasks, workers: int):
    runner = EpisodeRunner(bench.make_episode, agent, SamplingParams(), env_workers=workers,
                           max_context_chars=CONTEXT_CHARS)
    t0 = time.perf_counter()
    results = runner.results([Job(s, t) for s in specs for t in tasks])
    return results, time.perf_counter() - t0


def locality_matrix(bench, tasks, workers: int, slips=None) -> None:
    pool = bench.load_pool()
    names = list(pool)
    print(f"\nResolved % on {len(tasks)} instances, rows: agent, columns: harness; base failure modes\n")
    print("| agent | " + " | ".join(names) + " | base failure modes | s/episode |")
    print("|---|" + "---|" * (len(names) + 2))
    rows = [("oracle", bench.make_agent("oracle"))] + [
        (slip, bench.make_agent("scripted", noise={slip: 1.0})) for slip in (slips or agents.SLIPS)]
    for label, agent in rows:
        results, wall = run(bench, agent, list(pool.values()), tasks, workers)
        cells = []
        for n in names:
            rate = 100 * bench.summarize([r for r in results if r["harness"] == n])["resolved"]
            own = label in agents.SLIPS and agents.SLIPS[label].sibling == n
            cells.append(f"**{rate:.0f}**" if own else f"{rate:.0f}")
        modes = collections.Counter(r["failure_mode"] for r in results if r["harness"] == "base")
        shown = ", ".join(f"{m} {c}" for m, c in sorted(modes.items())) if label != "oracle" else "-"
        print(f"| {label} | " + " | ".join(cells) + f" | {shown} | {wall / len(results) * workers:.1f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--split", default="test")
    parser.add_argument("--limit", type=int, default=0)
    parser.add_argument("--cache-dir", default="")
    parser.add_argument("--instances", default="", help="an instance JSONL (default: the cache's offline.jsonl)")
    parser.add_argument("--ids", default="", help="comma-separated instance ids to keep")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--slips", default="", help="comma-separated slips (default: all)")
    args = parser.parse_args()
    with make_benchmark("swegym", backend={"cache_dir": args.cache_dir, "instances": args.instances}) as bench:
        tasks = bench.load_split(args.split)
        if args.ids:
            tasks = [t for t in tasks if t.task_id in args.ids.split(",")]
        tasks = tasks[:args.limit] if args.limit else tasks
        locality_matrix(bench, tasks, args.workers, [s for s in args.slips.split(",") if s] or None)


if __name__ == "__main__":
    main()
