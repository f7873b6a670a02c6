"""AppWorld's scores: TGC (task goal completion) and SGC (scenario goal completion), per type too.

TGC is the share of tasks whose tests all pass; SGC the share of scenarios all of whose tasks pass,
as AppWorld reports them. With several rollouts of a task (training, pass@k-style evaluation), a
task counts by its mean success and a scenario passes only if every rollout of every one of its
tasks passed, so SGC never rewards luck. Records without `scenario_id` (a caller that keeps only
type and success, such as Rank-1's table) get no SGC rather than a TGC in disguise.
"""
from __future__ import annotations

from typing import Iterable

from harness_envs.benchmark import percent_table


def summarize(records: Iterable[dict]) -> dict:
    """`tgc`, `sgc`, `<type>_tgc`, `counts` ({type: episodes}), `scenarios`, and `failure_modes`
    ({mode: episodes}). Records need `type` and `success`; `sgc` needs `task_id` and `scenario_id`
    in every record."""
    by_task: dict[str, list[bool]] = {}
    task_type: dict[str, str] = {}
    task_scenario: dict[str, str] = {}
    modes: dict[str, int] = {}
    have_scenarios = True
    for r in records:
        if "type" not in r or "success" not in r:
            raise ValueError(f"episode record lacks 'type' or 'success': {sorted(r)}")
        tid = r.get("task_id") or f"{r['type']}#{len(by_task)}"
        by_task.setdefault(tid, []).append(bool(r["success"]))
        task_type[tid] = r["type"]
        task_scenario[tid] = r.get("scenario_id") or tid
        have_scenarios = have_scenarios and bool(r.get("task_id")) and bool(r.get("scenario_id"))
        mode = r.get("failure_mode")
        if mode:
            modes[mode] = modes.get(mode, 0) + 1
    out: dict = {}
    rate = {t: sum(v) / len(v) for t, v in by_task.items()}
    for ty in sorted(set(task_type.values())):
        tids = [t for t in rate if task_type[t] == ty]
        out[f"{ty}_tgc"] = sum(rate[t] for t in tids) / len(tids)
    scenarios: dict[str, bool] = {}
    for t, oks in by_task.items():
        scenarios[task_scenario[t]] = scenarios.get(task_scenario[t], True) and all(oks)
    out["tgc"] = sum(rate.values()) / len(rate) if rate else 0.0
    if have_scenarios:
        out["sgc"] = sum(scenarios.values()) / len(scenarios) if scenarios else 0.0
    out["counts"] = {ty: sum(len(by_task[t]) for t in by_task if task_type[t] == ty) for ty in set(task_type.values())}
    out["scenarios"] = len(scenarios) if have_scenarios else None
    out["failure_modes"] = dict(sorted(modes.items()))
    return out


def format_table(summaries: dict[str, dict]) -> str:
    """TGC per type, then TGC and SGC overall, in % (rows), for each summary (columns)."""
    types = sorted({k.removesuffix("_tgc") for s in summaries.values() for k in s if k.endswith("_tgc")} - {""})
    rows = [(ty, f"{ty}_tgc") for ty in types] + [("TGC", "tgc"), ("SGC", "sgc")]
    return percent_table(summaries, rows, rule_before=("tgc",))
