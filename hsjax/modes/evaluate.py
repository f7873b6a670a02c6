"""Eval mode: score a policy on a benchmark under one or more harnesses.

    python run.py --config experiments/dbbench.py:eval --config.policy.kind=oracle --workdir W

Builds the benchmark, its tasks, the harness specs and the policy from the config; runs every
(harness, task) episode through the episode runner; writes `W/eval/<config.name>.json` with
`config`, `harnesses`, `summary` ({harness: the benchmark's summary}) and `episodes` (one record
per episode); prints the benchmark's table (for DBBench: rows types, categories, overall; columns
harnesses).
"""
from __future__ import annotations

import logging
import pathlib
import time

import ml_collections
import tqdm

from hsjax import builders
from hsjax.infra.metrics import write_json
from hsjax.rollout.runner import EpisodeRunner, Job, episode_record

log = logging.getLogger(__name__)


def unread(config) -> dict[str, str]:
    """{key: why} for keys this config holds that its chosen kinds never read (run.py rejects
    overriding them)."""
    return {**builders.policy_unread(config.policy), **builders.benchmark_unread(config)}


def main(config: ml_collections.ConfigDict, workdir: str) -> dict:
    t0 = time.perf_counter()
    bench = builders.make_benchmark(config)
    try:
        pool = builders.load_pool(config, bench)
        specs = pool.select(builders.harness_names(config.harnesses))
        tasks = bench.load_split(config.split, seed=config.task_seed, limit=config.limit)
        policy = builders.make_policy(config.policy, bench, int(config.seed))
        r = config.runner
        with tqdm.tqdm(total=len(tasks) * len(specs), desc=f"{bench.name}/{config.split}", unit="ep") as bar:
            runner = EpisodeRunner(bench.make_episode, policy, builders.sampling_params(config.sampling, config.seed),
                                   batch_size=r.batch_size, env_workers=r.env_workers,
                                   max_context_tokens=r.max_context_tokens, progress=bar)
            records = [episode_record(t) for t in runner.run([Job(s, t) for s in specs for t in tasks])]
    finally:
        bench.close()
    summary = {s.name: bench.summarize([r for r in records if r["harness"] == s.name]) for s in specs}
    out = {"config": config.to_dict(), "harnesses": {s.name: s.to_json() for s in specs}, "summary": summary,
           "rollouts": runner.rollouts, "wall_s": time.perf_counter() - t0, "episodes": records}
    path = write_json(pathlib.Path(workdir) / "eval" / f"{config.name}.json", out, indent=None)
    print(f"{bench.name} {config.split} ({len(tasks)} tasks), policy={config.policy.kind}: "
          f"{bench.headline} and its parts in %")
    print(bench.format_table(summary))
    print(f"wrote {path}")
    log.info("eval written to %s in %.1fs", path, out["wall_s"])
    return {"path": str(path), "summary": summary}


