"""Rank-1 inference: per test task the router picks the single best harness of the pool (the base
included) from the task's features and behavior profiles, and the policy runs there; reported
beside the base harness at the same number of executor rollouts per task. The mode that runs it:
`hsjax/modes/rank1.py` (`python run.py --config experiments/evolve.py:rank1 ...`).

Profiles. Unless `config.rank1.profiles` names a profiles.json, they are fitted on the profiling
split: one base probe rollout per task gives the task's base failure mode ("success" when it
succeeded); then every harness of the pool, the base included, runs each task once at the probe's
sample index. Each of those rollouts is one profile observation (`hsjax.harness_s.router.Profiles`) filed by
task type and by the probe's failure mode, so `score(h, type, mode)` estimates h's success rate for
tasks of that type (whose base probe ended in that mode). These are success rates over all tasks,
not the rescue rates over failed groups that the trainer's profiles hold.

Features and rollouts (`config.rank1.rollouts` = B per task, for both arms):
- probe=none: the router sees the task type only; rank1 runs B rollouts under its choice.
- probe=base: rank1's first rollout is under the base harness; its failure mode (or "success") is a
  feature for the choice of the other B - 1 rollouts (B >= 2). The base arm runs B base rollouts.
Rollout j of a task uses sample index j in both arms. A task counts as solved when any of its B
rollouts succeeds; the mean success over rollouts is reported too.

Writes `W/eval/<config.name>.json` (`rank1.json` with the experiments/evolve.py `rank1` variant):
per-task choice (with the router's reasons) and outcomes, the base vs rank1 table by task type,
category and overall, the choice counts, the rollout counts of both arms, and the profiles used.
"""
from __future__ import annotations

from typing import Sequence

from harness_envs.harness import HarnessSpec
from hsjax.harness_s.router import Profiles, Router
from hsjax.rollout.runner import EpisodeRunner, Job

PROBES = ("none", "base")
SUCCESS_MODE = "success"


def profile_outcomes(probe_results: Sequence[dict], harness_results: Sequence[dict]) -> list[dict]:
    """Profile observations: each harness rollout filed under the probe's task type and failure mode
    (the probe of the same task and sample index)."""
    probe = {(r["task_id"], int(r.get("sample_index", 0))): r for r in probe_results}
    out = []
    for r in harness_results:
        p = probe[(r["task_id"], int(r.get("sample_index", 0)))]
        out.append({"harness": r["harness"], "success": bool(r["success"]), "task_type": r["type"],
                    "base_failure_mode": p["failure_mode"], "num_turns": r.get("num_turns"),
                    "num_tokens": r.get("num_tokens")})
    return out


def fit_profiles(runner: EpisodeRunner, pool: Sequence[HarnessSpec], tasks: Sequence, *, base: HarnessSpec):
    """Success-rate profiles of every harness in `pool` (module docstring)."""
    probes = runner.results([Job(base, t, 0) for t in tasks])
    results = runner.results([Job(spec, t, 0) for spec in pool for t in tasks])
    profiles = Profiles.from_pool(pool)
    profiles.update(profile_outcomes(probes, results))
    return profiles


def choose(router, task, probe_result: dict | None):
    """The router's top-1 for a task: type only, or type and the base probe's failure mode."""
    failed = [] if probe_result is None else [{"task_id": task.task_id, "type": task.type,
                                                "failure_mode": probe_result["failure_mode"]}]
    return router.top_k(task, failed)


def run_rank1(runner: EpisodeRunner, router, pool, tasks: Sequence, *, rollouts: int = 1,
              probe: str = "none") -> dict:
    """Both arms on `tasks`: per-task records and the rollouts each arm spent."""
    if probe not in PROBES:
        raise ValueError(f"rank1.probe={probe!r} is not one of {PROBES}")
    if rollouts < (2 if probe == "base" else 1):
        raise ValueError(f"rank1.rollouts={rollouts}: probe={probe!r} needs at least "
                         f"{2 if probe == 'base' else 1} rollouts per task (the probe is one of them)")
    base = pool.base
    base_res = runner.results([Job(base, t, j) for t in tasks for j in range(rollouts)])
    first = 1 if probe == "base" else 0
    probes = runner.results([Job(base, t, 0) for t in tasks]) if first else [None] * len(tasks)
    decisions = [choose(router, t, p) for t, p in zip(tasks, probes)]
    chosen = [pool[d.harnesses[0]] for d in decisions]
    rest = runner.results([Job(spec, t, j) for t, spec in zip(tasks, chosen) for j in range(first, rollouts)])
    records, per_rest = [], rollouts - first
    for i, (task, spec, d) in enumerate(zip(tasks, chosen, decisions)):
        b = base_res[i * rollouts:(i + 1) * rollouts]
        r = ([probes[i]] if first else []) + rest[i * per_rest:(i + 1) * per_rest]
        records.append({
            "task_id": task.task_id, "type": task.type, "chosen": spec.name, "reason": d.reasons[0],
            "probe_failure_mode": probes[i]["failure_mode"] if first else None,
            "base_successes": sum(x["success"] for x in b), "rank1_successes": sum(x["success"] for x in r),
            "base_success": any(x["success"] for x in b), "rank1_success": any(x["success"] for x in r),
            "base_failure_modes": [x["failure_mode"] for x in b], "rank1_failure_modes": [x["failure_mode"] for x in r],
            "rank1_harnesses": [x["harness"] for x in r]})
    return {"tasks": records, "rollouts": {"base": len(base_res), "rank1": len(rest) + (len(tasks) if first else 0)}}


def table(records: Sequence[dict], rollouts: int, summarize) -> dict:
    """{arm: the benchmark's summary (`summarize`) plus `mean_success`} for the arms base and rank1."""
    out = {}
    for arm in ("base", "rank1"):
        summary = summarize([{"type": r["type"], "success": r[f"{arm}_success"]} for r in records])
        summary["mean_success"] = (sum(r[f"{arm}_successes"] for r in records) / (rollouts * len(records))
                                   if records else 0.0)
        out[arm] = summary
    return out


def build_router(pool: Sequence[HarnessSpec], profiles):
    """A profiles-only router (no voters, no exploration bonus) choosing one harness; ties go to
    the first name, as inference has nothing to explore."""
    return Router([s.name for s in pool], profiles, voters=(), k=1, explore=0.0, tie_break="name")
