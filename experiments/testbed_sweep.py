"""Runs testbed arms x seeds from one warm start: one `run.py` process per (arm, seed).

    python experiments/testbed_sweep.py --warm W_sft/hf --root workdirs/testbed \
        --arms warmstart,policy_only,harness_s --seeds 0,1,2 --parallel 2

Each run writes `ROOT/<arm>/seed<k>/` (its log beside it as `run.log`) and, when it exits cleanly, a
`DONE` file; a second invocation skips finished runs, runs only the missing analyses (below) of a
trained run whose analyses failed, and resumes unfinished ones from their last
checkpoint (resume is exact, docs/training.md). `warmstart` and `names_warmstart` score the warm
start once, so they run for seed 0 only. `--set key=value` passes `--config.key=value` to every run (e.g. `total_steps=30`);
`--modifiers apis` (or `v4`) appends the modifiers to every arm's config name
(`names_policy_only,apis`): `--arms` is split on commas, so a modifier cannot ride in it.
`ROOT/sweep.jsonl` records each finished run's command, exit code and wall time.
A finished `names_*` training run's mechanism curve, behaviour and success at fixed rollout budgets
are measured right after it (`studies.testbed.mechanism`, `names_behaviour`: seconds;
`budget_curve`: one evaluation a budget, minutes); `--archive DIR` then copies the files the reports
read into `DIR/<arm>/seed<k>/` (`runs.archive_run`: no checkpoints, tens of kB), e.g. into
docs/runs/ to commit them; `--drop-checkpoints` then deletes the run's checkpoints (a v4 arm keeps
one a step, 12 MB each, for its budget curve).
The report: `python -m studies.testbed.report --root ROOT --out DIR` (docs/results.md).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import fcntl
import json
import os
import pathlib
import shutil
import subprocess
import sys
import threading
import time

from studies.testbed import lookup
from studies.testbed.runs import archive_run

REPO = pathlib.Path(__file__).resolve().parents[1]
CONFIG = REPO / "experiments" / "testbed.py"
# What each analysis writes into the run's workdir (the modules' OUTPUT): an analysis whose file is
# there has run. A trained run (`DONE`) whose analyses failed or were killed is not trained again:
# the next invocation runs only the analyses whose files are missing.
OUTPUTS = {"mechanism": "mechanism_logp.json", "budget_curve": "budget_curve.json",
           "names_behaviour": "names_behaviour.json"}


def run_command(arm: str, seed: int, warm: str, workdir: pathlib.Path, overrides: list[str],
                modifiers: str = "") -> list[str]:
    """`modifiers` (e.g. `apis`, `v4`) follow the arm in the config name: `names_policy_only,apis`."""
    name = ",".join([arm, *[m.strip() for m in modifiers.split(",") if m.strip()]])
    return [sys.executable, str(REPO / "run.py"), f"--config={CONFIG}:{name}",
            f"--config.model.hf_dir={warm}", f"--config.seed={seed}", f"--workdir={workdir}",
            *[f"--config.{kv}" for kv in overrides]]


def analysis_commands(arm: str, workdir: pathlib.Path) -> list[list[str]]:
    """What a finished `names_*` run is still to be measured by after training (an analysis whose
    output file exists has run): its mechanism curve and its
    success at fixed rollout budgets (trained arms only: both read checkpoints) and, in the names
    regime, its behaviour at the last evaluation (`names_behaviour` reads SQL turns; an API-regime
    run's openings are its evaluations' `hidden/opens_docs`). The regime is the run's own
    (`lookup.regime_of` the config.json it wrote)."""
    if not arm.startswith("names_"):
        return []
    trained = arm != "names_warmstart"  # the warm start's arm keeps no checkpoints
    config_path = workdir / "config.json"
    config = json.loads(config_path.read_text()) if config_path.exists() else {}
    names_regime = lookup.regime_of(config) == "names"
    modules = (["mechanism", "budget_curve"] if trained else []) + (["names_behaviour"] if names_regime else [])
    return [[sys.executable, "-m", f"studies.testbed.{m}", f"--run={workdir}"] for m in modules
            if not (workdir / OUTPUTS[m]).exists()]


def claim(workdir: pathlib.Path):
    """An exclusive lock on `workdir` (an open file), or None when another process holds it: two
    sweeps over one root must not run the same workdir (the second's resume would truncate the
    first's metrics)."""
    workdir.mkdir(parents=True, exist_ok=True)
    handle = open(workdir / ".lock", "w")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    return handle


def plan_runs(arms: list[str], seeds: list[int]) -> list[tuple[str, int]]:
    return [(arm, seed) for arm in arms for seed in (seeds[:1] if arm in ("warmstart", "names_warmstart") else seeds)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--warm", required=True, help="the SFT warm start's HF directory (W_sft/hf)")
    parser.add_argument("--root", required=True)
    parser.add_argument("--arms", required=True, help="comma-separated arms of experiments/testbed.py")
    parser.add_argument("--modifiers", default="",
                        help="comma-separated modifiers appended to every arm's config name (apis, v4, smoke)")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--parallel", type=int, default=1)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--archive", default="", help="copy each finished run's report files here")
    parser.add_argument("--drop-checkpoints", action="store_true",
                        help="delete a finished run's checkpoints once its analyses ran (and it is archived)")
    args = parser.parse_args(argv)
    if not (pathlib.Path(args.warm) / "config.json").exists():
        parser.error(f"--warm {args.warm} is not an HF directory (no config.json); build it with "
                     "`python run.py --config experiments/testbed.py:sft --workdir W_sft`")
    root = pathlib.Path(args.root)
    root.mkdir(parents=True, exist_ok=True)
    runs = plan_runs([a.strip() for a in args.arms.split(",") if a.strip()],
                     [int(s) for s in args.seeds.split(",") if s.strip()])
    log_lock = threading.Lock()

    def one(arm: str, seed: int) -> int:
        workdir = root / arm / f"seed{seed}"
        if (workdir / "DONE").exists() and not analysis_commands(arm, workdir):
            print(f"skip {arm} seed {seed}: done", flush=True)
            return 0
        lock = claim(workdir)
        if lock is None:
            print(f"skip {arm} seed {seed}: another sweep is running it", flush=True)
            return 0
        cmd = run_command(arm, seed, args.warm, workdir, args.set, args.modifiers)
        t0 = time.perf_counter()
        with lock:
            rc = 0
            if not (workdir / "DONE").exists():  # trained already: only its analyses are left
                with open(workdir / "run.log", "a") as log:
                    rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
                if rc == 0:
                    (workdir / "DONE").write_text(f"{time.perf_counter() - t0:.1f}\n")
            for analysis in analysis_commands(arm, workdir) if rc == 0 else []:
                with open(workdir / "run.log", "a") as log:
                    rc = rc or subprocess.call(analysis, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
            if rc == 0 and args.archive:
                archive_run(workdir, pathlib.Path(args.archive) / arm / f"seed{seed}")
            if rc == 0 and args.drop_checkpoints:  # the curves are measured: 12 MB a step no longer needed
                shutil.rmtree(workdir / "checkpoints", ignore_errors=True)
        wall = time.perf_counter() - t0
        with log_lock:
            with open(root / "sweep.jsonl", "a") as f:
                f.write(json.dumps({"arm": arm, "seed": seed, "rc": rc, "wall_s": round(wall, 1),
                                    "command": " ".join(cmd), "host_cpus": os.cpu_count()}) + "\n")
            print(f"{arm} seed {seed}: rc {rc}, {wall:.0f} s", flush=True)
        return rc

    with concurrent.futures.ThreadPoolExecutor(max(1, args.parallel)) as pool:
        codes = list(pool.map(lambda run: one(*run), runs))
    failed = [run for run, rc in zip(runs, codes) if rc]
    if failed:
        print(f"failed runs: {failed}; see their run.log", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
