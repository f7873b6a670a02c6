"""Finished testbed runs on disk: a sweep root of `ROOT/<arm>/seed<k>/` training workdirs.

`load_sweep` reads every workdir's config, metrics rows and evaluation files (`eval/<split>_step<k>.json`)
into `Run`s; training episodes are read lazily (`Run.episodes`). The tables and plots over them are
studies.testbed.report; the warm start's `warmstart` arm is scored once, at step 0.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
import re
import shutil
from typing import Iterator, Sequence

HEADLINE, TRAIN_SPLIT = "synth_heldout", "synth_train"
WARMSTART = "warmstart"


# Mirrors experiments/testbed.py (FAMILIES_A/B, TRAIN_ARMS; tests check they agree): the report reads
# finished workdirs and must not break while that config file changes. A run's config.json
# `regime.families_*`, when present, wins.
FAMILIES_A = ("other", "counting", "ranking", "aggregation-SUM", "aggregation-MAX", "INSERT")
FAMILIES_B = ("comparison", "aggregation-MIN", "aggregation-AVG", "UPDATE")
ARM_ORDER = ("warmstart", "policy_only", "dapo", "hint", "harness_s", "harness_s_k1", "harness_s_k3",
             "harness_s_profiles_only", "harness_s_no_reanchor", "random_routing",
             # testbed v2 (the names regime)
             "names_warmstart", "names_policy_only", "names_policy_only_n6", "names_harness_s",
             "names_harness_s_base", "names_tables_first", "names_tables_first_base", "names_schema_reminder",
             "names_base_reroll", "names_dapo", "names_random", "names_tables_first_base_is", "names_harness_s_router",
             "names_harness_s_floor", "names_sft_hinted")


@dataclasses.dataclass
class Run:
    workdir: pathlib.Path
    arm: str
    seed: int
    config: dict
    metrics: list[dict]
    evals: dict[tuple[str, int], dict]  # (split, step) -> {"step", "summary", "episodes"}

    def eval_steps(self, split: str) -> list[int]:
        return sorted(step for s, step in self.evals if s == split)

    def final_eval(self, split: str) -> dict | None:
        steps = self.eval_steps(split)
        return self.evals[(split, steps[-1])] if steps else None

    def episode_steps(self) -> list[int]:
        return sorted(int(p.stem.split("_")[1]) for p in (self.workdir / "episodes").glob("step_*.jsonl"))

    def episodes(self, step: int | None = None) -> Iterator[dict]:
        """Training rollouts (base and rescue), read lazily: one step's, or every logged step's."""
        for s in ([step] if step is not None else self.episode_steps()):
            with open(self.workdir / "episodes" / f"step_{s:06d}.jsonl") as f:
                yield from (json.loads(line) for line in f if line.strip())

    def last(self, key: str, default=None):
        """The value of `key` in the last metrics row that has it."""
        return next((row[key] for row in reversed(self.metrics) if key in row), default)


def executed_rollouts(metrics: list[dict], n: int) -> list[dict]:
    """Rows whose cumulative `rollouts/total` counts every rollout the executor ran. Today the episode
    runner counts them as it runs them; runs logged before DAPO's dropped groups were counted kept
    only the kept groups' rollouts in `rollouts/base`, and their totals are rebuilt here from
    `dapo/drawn_groups` (this rule exists only for those old logs)."""
    if not n or not any("dapo/drawn_groups" in r and r.get("rollouts/base") != r["dapo/drawn_groups"] * n
                        for r in metrics):
        return metrics
    out, total = [], 0
    for row in metrics:
        row = dict(row)
        if "rollouts/base" in row:
            base = row["dapo/drawn_groups"] * n if "dapo/drawn_groups" in row else row["rollouts/base"]
            total += base + row.get("rollouts/rescue", 0)
            row["rollouts/base"], row["rollouts/total"] = base, total
        out.append(row)
    return out


def load_run(workdir) -> Run:
    workdir = pathlib.Path(workdir)
    if not (workdir / "metrics.jsonl").exists():
        raise FileNotFoundError(f"{workdir} has no metrics.jsonl: not a training workdir, or the run never logged a step")
    config = json.loads((workdir / "config.json").read_text()) if (workdir / "config.json").exists() else {}
    with open(workdir / "metrics.jsonl") as f:
        metrics = [json.loads(line) for line in f if line.strip()]
    metrics = executed_rollouts(metrics, int(config.get("rollout", {}).get("n", 0)))
    evals = {}
    for p in sorted((workdir / "eval").glob("*_step*.json")):
        m = re.fullmatch(r"(.+)_step(\d+)", p.stem)
        if m:
            evals[(m.group(1), int(m.group(2)))] = json.loads(p.read_text())
    m = re.fullmatch(r"seed(\d+)", workdir.name)
    seed = int(m.group(1)) if m else int(config.get("seed", 0))
    arm = workdir.parent.name if m else workdir.name
    return Run(workdir, arm, seed, config, metrics, evals)


# What the reports read of a run (studies.testbed.names_report, mechanism curves, behaviour
# summaries, the router's decisions and profiles): a few tens of kB a run, small enough to keep in the repository.
ARCHIVED = ("config.json", "metrics.jsonl", "DONE", "mechanism_logp.json", "names_behaviour.json",
            "router_decisions.jsonl", "profiles.json", "budget_curve.json")


def archive_run(workdir, dest) -> list[pathlib.Path]:
    """Copies a finished run's `ARCHIVED` files to `dest` (a `ROOT/<arm>/seed<k>/` of its own), so
    a sweep's numbers outlive the machine that ran it and `load_sweep` reads the copy as it reads
    the run. Checkpoints, training episodes and evaluation episodes stay behind."""
    workdir, dest = pathlib.Path(workdir), pathlib.Path(dest)
    if not (workdir / "metrics.jsonl").exists():
        raise FileNotFoundError(f"{workdir} has no metrics.jsonl: nothing to archive")
    dest.mkdir(parents=True, exist_ok=True)
    return [pathlib.Path(shutil.copy2(workdir / name, dest / name))
            for name in ARCHIVED if (workdir / name).exists()]


def _arm_order(arm: str) -> tuple[int, str]:
    return (ARM_ORDER.index(arm) if arm in ARM_ORDER else len(ARM_ORDER), arm)


def load_sweep(root) -> list[Run]:
    """Every `ROOT/<arm>/seed<k>/` workdir with a metrics.jsonl, in the order of TRAIN_ARMS, then seed."""
    root = pathlib.Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"sweep root {root} does not exist; pass the --workdir parent of the arm runs")
    runs = [load_run(p.parent) for p in root.glob("*/seed*/metrics.jsonl")]
    if not runs:
        raise FileNotFoundError(f"no ROOT/<arm>/seed<k>/metrics.jsonl under {root}: run the arms first "
                                "(experiments/testbed.py docstring)")
    return sorted(runs, key=lambda r: (_arm_order(r.arm), r.seed))


def by_arm(runs: Sequence[Run]) -> dict[str, list[Run]]:
    out: dict[str, list[Run]] = {}
    for r in runs:
        out.setdefault(r.arm, []).append(r)
    return out


def families(run: Run) -> tuple[tuple[str, ...], tuple[str, ...]]:
    regime = run.config.get("regime") or {}
    return tuple(regime.get("families_a", FAMILIES_A)), tuple(regime.get("families_b", FAMILIES_B))
