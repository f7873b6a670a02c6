"""Success against executor rollouts: a run's evaluation read at fixed rollout budgets (issue 40).

    python -m studies.testbed.budget_curve --run W/names_harness_s/seed0 [--budgets 160,320,480,640]

Arms spend rollouts at different rates (a rescue arm pays for every rescue, policy_only at n = 6 for
its larger groups), so comparing them after the same number of steps compares different budgets.
The pre-registered endpoint of testbed v4 (docs/results.md) reads every arm at the same budgets:
for each budget B, the run's last checkpoint whose cumulative `rollouts/total` (metrics.jsonl) is at
most B is evaluated under the base harness on the run's evaluation split, exactly as the training
loop evaluates (`hsjax.rollout.evaluation.evaluate_base`, the loop's evaluation seed of that step),
so at a step the loop evaluated the two agree episode for episode. A budget below the first step's
count reads the starting model (step 0).

Writes `<run>/budget_eval/eval/<split>_step<k>.json` (the episodes) and `<run>/budget_curve.json`:
{"budgets", "steps", "rollouts" (the count at each step read), "split", "metrics" (one dict per
budget), "auc" (per metric: the trapezoid mean over budgets 0..max, the starting model at 0)}.
A run that has not reached the largest budget is read at its last checkpoint, and says so
(`"short": true`).
"""
from __future__ import annotations

import argparse
import json
import pathlib
from typing import Sequence

import jax
import jax.numpy as jnp
import ml_collections

from hsjax import builders
from hsjax.harness_s.step_rollouts import EVAL_PHASE, phase_sampling, phase_seed
from hsjax.infra import checkpoint as ckpt_lib
from hsjax.infra import metrics as metrics_lib
from hsjax.rollout.evaluation import evaluate_base
from studies.testbed import runs

OUTPUT = "budget_curve.json"
DEFAULT_BUDGETS = (160, 320, 480, 640)


def steps_at_budgets(rollouts_by_step: dict[int, float], kept: Sequence[int],
                     budgets: Sequence[int]) -> list[int]:
    """For each budget, the last kept step whose cumulative rollouts are <= it (0: the start)."""
    out = []
    for budget in budgets:
        within = [s for s in kept if rollouts_by_step.get(s, float("inf")) <= budget]
        out.append(max(within, default=0))
    return out


def trapezoid_mean(budgets: Sequence[float], values: Sequence[float]) -> float:
    """Mean of a piecewise-linear curve through (budget, value) over [budgets[0], budgets[-1]]."""
    area = sum((b1 - b0) * (v0 + v1) / 2 for b0, b1, v0, v1 in zip(budgets, budgets[1:], values, values[1:]))
    return area / (budgets[-1] - budgets[0])


def measure(workdir: str, budgets: Sequence[int] = DEFAULT_BUDGETS) -> dict:
    run = runs.load_run(workdir)
    config = ml_collections.ConfigDict(run.config)
    rollouts_by_step = {int(r["step"]): float(r["rollouts/total"]) for r in run.metrics
                        if "step" in r and "rollouts/total" in r}
    with ckpt_lib.Checkpointer(ckpt_lib.resolve_ckpt_dir(run.workdir), keep=None, read_only=True) as ckpt:
        kept = [s for s in ckpt.all_steps() if s > 0]
    steps = steps_at_budgets(rollouts_by_step, kept, [0, *budgets])
    bench = builders.make_benchmark(config)
    pool = builders.load_pool(config, bench)
    split = config.eval.split
    eval_sets = {split: builders.load_split(bench, split, seed=config.eval.task_seed, limit=config.eval.limit)}
    model_cfg, warm, tokenizer = builders.make_model(config)
    out_dir = str(run.workdir / "budget_eval")
    policy = builders.make_rollout_policy(config, model_cfg, warm, tokenizer)
    runner = builders.make_runner(config, bench, policy, runner="rollout", sampling="rollout")
    by_step: dict[int, dict] = {}
    try:
        for step in dict.fromkeys(steps):
            params = warm
            if step:
                _, saved, _, _ = builders.load_model(str(run.workdir), step=step)
                params = jax.tree.map(lambda w, p: jnp.asarray(p, w.dtype), warm, saved)
            policy.update_params(params)
            by_step[step] = evaluate_base(
                step, runner, bench, pool.base, eval_sets, out_dir, num_samples=config.eval.num_samples,
                sampling=lambda step=step: phase_sampling(policy, config.eval,
                                                          phase_seed(config.seed, step, EVAL_PHASE)))
    finally:
        policy.close()
        bench.close()
    metrics = [by_step[s] for s in steps]
    points = [0, *budgets]
    auc = {key: trapezoid_mean(points, [m[key] for m in metrics]) for key in metrics[0]}
    out = {"budgets": list(budgets), "steps": steps[1:], "split": split,
           "rollouts": [rollouts_by_step.get(s, 0.0) for s in steps[1:]],
           "metrics": metrics[1:], "start": metrics[0], "auc": auc,
           "short": bool(kept) and rollouts_by_step.get(max(kept), 0.0) < max(budgets)}
    metrics_lib.write_json(str(run.workdir / OUTPUT), out)
    return out


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", required=True, help="a training workdir that kept its checkpoints")
    parser.add_argument("--budgets", default=",".join(map(str, DEFAULT_BUDGETS)))
    parser.add_argument("--metric", default="", help="the column to print (default: the split's success)")
    args = parser.parse_args(argv)
    out = measure(args.run, [int(b) for b in args.budgets.split(",")])
    key = args.metric or f"eval/{out['split']}/base/success"
    print(f"python -m studies.testbed.budget_curve --run {args.run} --budgets {args.budgets}")
    print(f"| budget | step | executor rollouts | {key} |\n|---|---|---|---|")
    for budget, step, rollouts, m in zip(out["budgets"], out["steps"], out["rollouts"], out["metrics"]):
        print(f"| {budget} | {step} | {rollouts:.0f} | {m[key]:.4f} |")
    print(f"AUC over 0..{out['budgets'][-1]}: {out['auc'][key]:.4f}" + ("  (short run)" if out["short"] else ""))
    return out


if __name__ == "__main__":
    main()
