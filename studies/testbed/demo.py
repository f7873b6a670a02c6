"""The testbed's short demo (README's main job): from the shipped warm start, score it under the base
harness, train it with Harness-S and with plain GRPO (policy only), and print base-harness success
before and after on held-out and on unseen training-domain tasks.

    python run.py --config experiments/testbed.py:demo --workdir workdirs/demo

Each arm is an ordinary training run (`hsjax.modes.train.main`) in `W/<arm>/seed<k>/`, so the sweep report
(`python -m studies.testbed.report --root W --out DIR`) reads the demo too.
"""
from __future__ import annotations

import gc
import json
import math
import os
import time

from hsjax.infra import experiments, host_memory
from hsjax.infra import paths
from hsjax.modes import train

SPLITS = ("synth_heldout", "synth_train")


def arm_config(config, arm: str):
    """The arm's config from experiments/testbed.py with the demo's warm start, seed and length."""
    c = experiments.get_config("testbed", arm)
    c.model.hf_dir = config.model.hf_dir
    c.seed = config.seed
    if arm != "warmstart":
        c.total_steps = config.demo.total_steps
        c.eval.every = config.demo.total_steps
        c.optim.warmup_steps = min(c.optim.warmup_steps, c.total_steps - 1)
        if config.demo.groups:
            c.rollout.groups = config.demo.groups
        if config.demo.micro_batches:
            # As many as asked that divide the base rows (G x n); the testbed arms' rescue slots
            # (k x m = 4 a group) keep every arm's row count a multiple of it.
            c.batch.micro_batches = math.gcd(config.demo.micro_batches, c.rollout.groups * c.rollout.n)
    c.eval.limit = config.demo.eval_limit
    return c


def final_row(workdir: str) -> dict:
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    if not rows:
        raise RuntimeError(f"{workdir}/metrics.jsonl is empty: the run wrote no step")
    return rows[-1]


def format_table(before: dict, after: dict[str, dict], walls: dict[str, float]) -> str:
    pct = lambda row, split: f"{100 * row.get(f'eval/{split}/base/success', float('nan')):5.1f}"
    lines = ["base-harness success (%), greedy: held-out domains | unseen tasks of the training domains",
             f"{'':<14}{'held-out':>10}{'train-dom.':>12}{'rollouts':>10}{'rescue':>8}{'wall s':>8}",
             f"{'warm start':<14}{pct(before, SPLITS[0]):>10}{pct(before, SPLITS[1]):>12}{0:>10}{0:>8}"
             f"{walls.get('warmstart', 0):>8.0f}"]
    for arm, row in after.items():
        lines.append(f"{arm:<14}{pct(row, SPLITS[0]):>10}{pct(row, SPLITS[1]):>12}"
                     f"{int(row.get('rollouts/total', 0)):>10}{int(row.get('rollouts/rescue_total', 0)):>8}"
                     f"{walls[arm]:>8.0f}")
    return "\n".join(lines)


def resolve_warm_start(hf_dir: str) -> str:
    """`hf_dir` as given, or relative to the repository (the shipped assets/testbed_warmstart)."""
    repo = str(paths.REPO_ROOT)
    for path in (hf_dir, os.path.join(repo, hf_dir)):
        if hf_dir and os.path.exists(os.path.join(path, "config.json")):
            return os.path.abspath(path)
    raise FileNotFoundError(
        f"model.hf_dir={hf_dir!r} is not a warm start (no config.json); the project ships one in "
        "assets/testbed_warmstart (docs/testbed.md says how it was built)")


def main(config, workdir: str) -> dict:
    with config.unlocked():
        config.model.hf_dir = resolve_warm_start(config.model.hf_dir)
    walls, after = {}, {}
    for arm in ("warmstart", *config.demo.arms):
        t0 = time.perf_counter()
        arm_dir = os.path.join(workdir, arm, f"seed{config.seed}")
        train.main(arm_config(config, arm), arm_dir)
        walls[arm] = time.perf_counter() - t0
        gc.collect()  # the finished arm's policy, sampler and optimizer state, then their pages
        host_memory.release_free_memory()
        if arm != "warmstart":
            after[arm] = final_row(arm_dir)
        print(f"[demo] {arm}: {walls[arm]:.0f} s", flush=True)
    before = final_row(os.path.join(workdir, "warmstart", f"seed{config.seed}"))
    table = format_table(before, after, walls)
    print(table, flush=True)
    with open(os.path.join(workdir, "demo.txt"), "w") as f:
        f.write(table + "\n")
    return {"before": before, "after": after, "wall_s": walls}
