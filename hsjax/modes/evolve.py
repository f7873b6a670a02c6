"""Evolve mode: a sibling pool from the base harness's failures (`hsjax.harness_s.evolve`).

    python run.py --config experiments/evolve.py:dev --workdir /tmp/hsjax/evolve

Runs the policy under the base harness of `config.pool` on `config.split`, evolves one sibling per
repair direction that has failures, writes `W/pool.json` (the base first, then the siblings, with
the evidence for each) and, with `config.analysis.enabled`, the three properties of the new pool
(`W/analysis/*.json`, `W/plots/*.png`); prints the direction table.
"""
from __future__ import annotations

import collections
import dataclasses
import logging
import pathlib
import time
from typing import Sequence

from harness_envs.harness import HarnessSpec, save_pool
from hsjax import builders
from hsjax.harness_s import analysis
from hsjax.harness_s.evolve import POOL_FILE, EvolveSettings, collect_rescues, evolution_table, evolve
from hsjax.harness_s.proposer import LLMProposer
from hsjax.policies.http_chat import HttpChatPolicy
from hsjax.rollout.runner import EpisodeRunner, Job

log = logging.getLogger(__name__)


def unread(config) -> dict[str, str]:
    """{key: why} for keys its chosen kinds never read (run.py rejects overriding them)."""
    out = {**builders.policy_unread(config.policy), **builders.benchmark_unread(config),
           **builders.policy_unread(config.analysis.compare, "analysis.compare"),
           "runner.max_record_chars": "evolve writes no episode records"}
    if not config.evolve.llm.enabled:
        out.update({f"evolve.llm.{k}": "evolve.llm.enabled=False" for k in config.evolve.llm if k != "enabled"})
    return out


def settings(cfg) -> EvolveSettings:
    return EvolveSettings(tries=int(cfg.tries), max_failures=int(cfg.max_failures),
                          min_failures=int(cfg.min_failures), max_candidates=int(cfg.max_candidates),
                          max_knobs=int(cfg.max_knobs), regression_sample=int(cfg.regression_sample),
                          regression_tolerance=float(cfg.regression_tolerance), seed=int(cfg.seed))


def build_proposer(cfg, benchmark_description: str) -> LLMProposer | None:
    """`config.evolve.llm`: enabled, base_url, model, api_key_env, n_proposals, timeout, max_retries."""
    if not cfg.enabled:
        return None
    if not cfg.base_url or not cfg.model:
        raise ValueError("config.evolve.llm.enabled needs --config.evolve.llm.base_url=... and "
                         "--config.evolve.llm.model=...")
    policy = HttpChatPolicy(cfg.base_url, cfg.model, api_key_env=cfg.api_key_env or None,
                            timeout=float(cfg.timeout), max_retries=int(cfg.max_retries))
    return LLMProposer(policy, benchmark=benchmark_description, n_proposals=int(cfg.n_proposals))


def policy_runner(config, policy_block, bench, path: str) -> EpisodeRunner:
    """The runner of the policy `policy_block` (at `path`) names."""
    policy = builders.make_policy(policy_block, bench, int(config.seed), path)
    return builders.make_runner(config, bench, policy)


def run_base(runner: EpisodeRunner, tasks: Sequence, samples: int, base: HarnessSpec) -> list[dict]:
    return runner.results([Job(base, t, j) for j in range(samples) for t in tasks])


def main(config, workdir: str) -> dict:
    t0 = time.perf_counter()
    workdir = pathlib.Path(workdir)
    bench = builders.make_benchmark(config)
    try:
        base = builders.load_pool(config, bench).base
        tasks = builders.load_split(bench, config.split, limit=config.limit)
        tasks_by_id = {t.task_id: t for t in tasks}
        runner = policy_runner(config, config.policy, bench, "policy")
        base_results = run_base(runner, tasks, int(config.evolve.base_samples), base)
        proposer = build_proposer(config.evolve.llm, f"{bench.name} ({bench.description})")
        evo = evolve(bench, base_results, tasks_by_id, runner, base=base, settings=settings(config.evolve),
                     directions=list(config.evolve.directions) or None, proposer=proposer)
        modes = collections.Counter(r["failure_mode"] for r in base_results)
        pool_path = workdir / POOL_FILE
        workdir.mkdir(parents=True, exist_ok=True)
        save_pool(pool_path, base, evo.siblings,
                  doc=f"Evolved from the base harness on {config.split} ({len(tasks)} tasks x "
                      f"{config.evolve.base_samples} samples), policy {config.policy.kind}, seed {config.seed}.",
                  base_outcomes=dict(sorted(modes.items())), settings=dataclasses.asdict(settings(config.evolve)),
                  llm_log=proposer.log if proposer else None, **evo.pool_extra())
        print(f"Directional evolution on {bench.name} {config.split} ({len(tasks)} tasks), "
              f"policy={config.policy.kind}: base {modes['success']}/{len(base_results)} successes")
        print(evolution_table(evo))
        print(f"wrote {pool_path} ({len(evo.siblings)} siblings, {runner.rollouts} rollouts)")
        out = {"pool": str(pool_path), "siblings": [s.name for s in evo.siblings], "counters": evo.counters}
        if config.analysis.enabled and evo.siblings:
            pool = [base, *evo.siblings]
            failures = [r for r in base_results if not r["success"]]
            outcomes = collect_rescues(runner, failures, pool, tasks_by_id, int(config.analysis.tries))
            second = None
            if config.analysis.compare.kind:
                runner_b = policy_runner(config, config.analysis.compare, bench, "analysis.compare")
                base_b = run_base(runner_b, tasks, int(config.evolve.base_samples), base)
                second = collect_rescues(runner_b, [r for r in base_b if not r["success"]], pool, tasks_by_id,
                                         int(config.analysis.tries))
            props = analysis.write_properties(workdir, outcomes, evo.siblings, bench.target_modes(evo.siblings),
                                              outcomes_b=second, labels=(config.policy.kind, "compare"))
            print(analysis.summary_text(props))
            out["analysis"] = {k: str(v) for k, v in props["paths"].items()}
    finally:
        bench.close()
    log.info("evolve finished in %.1fs", time.perf_counter() - t0)
    return out
