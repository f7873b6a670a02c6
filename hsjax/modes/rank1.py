"""Rank-1 mode: per test task the router picks one harness of the pool, beside the base harness at
equal executor rollouts (`hsjax.harness_s.rank1`).

    python run.py --config experiments/evolve.py:rank1 --config.rank1.pool=W_evolve/pool.json --workdir W

Reads `config.rank1.*` plus `benchmark`, `policy`, `sampling`, `runner` and `seed`; writes
`W/eval/<config.name>.json`: per-task choice (with the router's reasons) and outcomes, the base vs
rank1 table, the choice counts, the rollout counts of both arms, and the profiles used.
"""
from __future__ import annotations

import collections
import pathlib
import time

from hsjax import builders
from hsjax.harness_s import rank1
from hsjax.harness_s.router import Profiles
from hsjax.infra import paths
from hsjax.infra.metrics import write_json


def unread(config) -> dict[str, str]:
    """{key: why} for keys its chosen kinds never read (run.py rejects overriding them)."""
    return {**builders.policy_unread(config.policy), **builders.benchmark_unread(config),
            "runner.max_record_chars": "rank1 writes no episode records"}


def main(config, workdir: str) -> dict:
    t0 = time.perf_counter()
    cfg = config.rank1
    bench = builders.make_benchmark(config)
    try:
        pool = bench.load_pool(paths.resolve(cfg.pool))
        specs = list(pool.values())
        tasks = builders.load_split(bench, cfg.split, limit=cfg.limit)
        policy = builders.make_policy(config.policy, bench, int(config.seed))
        runner = builders.make_runner(config, bench, policy)
        if cfg.profiles:
            profiles, source = Profiles.load(paths.resolve(cfg.profiles)), str(cfg.profiles)
            for s in specs:
                profiles.add(s.name, s.direction)
        else:
            profile_tasks = builders.load_split(bench, cfg.profile_split, limit=cfg.profile_limit)
            overlap = {t.task_id for t in profile_tasks} & {t.task_id for t in tasks}
            if overlap:
                raise ValueError(f"rank1: {len(overlap)} test tasks of {cfg.split} are also in the profiling "
                                 f"split {cfg.profile_split}; profile on a disjoint split (e.g. standard_train "
                                 "for dev or standard_heldout)")
            profiles = rank1.fit_profiles(runner, specs, profile_tasks, base=pool.base)
            source = f"fitted on {cfg.profile_split} ({len(profile_tasks)} tasks)"
        profiling_rollouts = runner.rollouts
        router = rank1.build_router(specs, profiles)
        run = rank1.run_rank1(runner, router, pool, tasks, rollouts=int(cfg.rollouts), probe=cfg.probe)
    finally:
        bench.close()
    rows = rank1.table(run["tasks"], int(cfg.rollouts), bench.summarize)
    out = {"config": config.to_dict(), "pool": {s.name: s.to_json() for s in specs}, "profiles_source": source,
           "probe": cfg.probe, "rollouts_per_task": int(cfg.rollouts), "rollouts": run["rollouts"],
           "profiling_rollouts": profiling_rollouts,
           "choices": dict(collections.Counter(r["chosen"] for r in run["tasks"]).most_common()),
           "table": rows, "tasks": run["tasks"], "profiles": profiles.to_dict(),
           "wall_s": time.perf_counter() - t0}
    path = write_json(pathlib.Path(workdir) / "eval" / f"{config.name}.json", out)
    print(f"Rank-1 on {bench.name} {cfg.split} ({len(tasks)} tasks), policy={config.policy.kind}, probe={cfg.probe}, "
          f"{cfg.rollouts} rollout(s) per task in each arm; profiles {source}")
    print(bench.format_table(rows))
    print(f"mean success per rollout: base {rows['base']['mean_success']:.3f}, rank1 {rows['rank1']['mean_success']:.3f}")
    print(f"choices: {out['choices']}")
    print(f"wrote {path}")
    return {"path": str(path), "table": rows}
