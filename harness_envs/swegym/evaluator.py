"""SWE-Gym's scores: the resolved rate (SWE-bench's number), overall and per repository.

An instance is resolved by an episode iff the scorer resolved its patch (every FAIL_TO_PASS and
PASS_TO_PASS test passes). With several rollouts of an instance (training, pass@k-style evaluation)
the instance counts by its mean, so every instance weighs the same whatever its number of rollouts.
"""
from __future__ import annotations

from typing import Iterable, Sequence

from harness_envs.benchmark import percent_table


def summarize(records: Iterable[dict]) -> dict:
    """`resolved`, `<repo>_resolved`, `counts` ({repo: episodes}), `instances`, `patch_rate` (episodes
    that left a non-empty patch) and `failure_modes` ({mode: episodes}). Records need `type` and
    `success`."""
    by_task: dict[str, list[bool]] = {}
    task_type: dict[str, str] = {}
    modes: dict[str, int] = {}
    patched = episodes = 0
    for r in records:
        if "type" not in r or "success" not in r:
            raise ValueError(f"episode record lacks 'type' or 'success': {sorted(r)}")
        tid = r.get("task_id") or f"{r['type']}#{len(by_task)}"
        by_task.setdefault(tid, []).append(bool(r["success"]))
        task_type[tid] = r["type"]
        episodes += 1
        patched += bool((r.get("patch") or "").strip())
        mode = r.get("failure_mode")
        if mode:
            modes[mode] = modes.get(mode, 0) + 1
    rate = {t: sum(v) / len(v) for t, v in by_task.items()}
    out: dict = {}
    for ty in sorted(set(task_type.values())):
        tids = [t for t in rate if task_type[t] == ty]
        out[f"{ty}_resolved"] = sum(rate[t] for t in tids) / len(tids)
    out["resolved"] = sum(rate.values()) / len(rate) if rate else 0.0
    out["instances"] = len(rate)
    out["patch_rate"] = patched / episodes if episodes else 0.0
    out["counts"] = {ty: sum(len(by_task[t]) for t in by_task if task_type[t] == ty) for ty in set(task_type.values())}
    out["failure_modes"] = dict(sorted(modes.items()))
    return out


def slice_metrics(records: Sequence[dict]) -> dict[str, float]:
    """Shares of episodes that left a patch, called finish, and needed format feedback."""
    if not records:
        return {}
    n = len(records)
    return {"patch_rate": sum(bool((r.get("patch") or "").strip()) for r in records) / n,
            "finish_rate": sum(r.get("status") == "finished" for r in records) / n,
            "format_retry_rate": sum(bool(r.get("format_retries")) for r in records) / n}


def format_table(summaries: dict[str, dict]) -> str:
    """Resolved % per repository, then overall (rows), for each summary (columns)."""
    types = sorted({k.removesuffix("_resolved") for s in summaries.values() for k in s
                    if k.endswith("_resolved")} - {""})
    rows = [(ty, f"{ty}_resolved") for ty in types] + [("resolved", "resolved")]
    return percent_table(summaries, rows, rule_before=("resolved",))
