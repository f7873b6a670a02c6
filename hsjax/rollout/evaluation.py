"""The training loop's evaluation: success of the current policy under the base harness on each
evaluation set (`eval.split` and `eval.extra_splits`), every `eval.every` steps.

Each task is played once with the `eval` block's sampling (greedy by default): the figure every
run reports, `eval/<split>/base/success`. With `eval.num_samples = k > 0` each task is also played k
times, drawn at the block's temperature, top_p and top_k (never greedy), and the unbiased pass@1,
2, 4, ..., k and mean@k of those draws are reported beside it (`eval/<split>/base/pass@k`,
`hsjax.infra.pass_at_k`). The draws take the step's evaluation seed with episode seeds after the
greedy episodes' (a token policy's draws are a function of its seed, the sampling seed, the
episode seed and the turn), so a resumed run draws what an uninterrupted one did.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Callable

import numpy as np

from hsjax.infra import distributed
from hsjax.infra import metrics as metrics_lib
from hsjax.infra.pass_at_k import rates, sampled_summary
from hsjax.policies.base import SamplingParams
from hsjax.rollout.runner import Job, episode_record


def sampled_jobs(specs, tasks, num_samples: int) -> list[Job]:
    """The jobs of a sampled evaluation: `num_samples` of every (harness, task), in that order, with
    `sample_index` 1..k (0 is the episode of the block's own sampling)."""
    return [Job(s, t, sample_index=j + 1) for s in specs for t in tasks for j in range(num_samples)]


def drawn(sampling: SamplingParams) -> SamplingParams:
    """The sampling of the drawn episodes: the block's temperature, top_p and top_k, never greedy."""
    return dataclasses.replace(sampling, greedy=False)


def sampled_episodes(runner, base, tasks, sampling: SamplingParams, num_samples: int) -> list[dict]:
    """`num_samples` drawn episodes of every task (records marked `sampled`; [] when 0), with episode
    seeds after the greedy episodes' 0..len(tasks)-1, so no draw repeats one of theirs."""
    if not num_samples:
        return []
    trajectories = runner.run(sampled_jobs([base], tasks, num_samples), drawn(sampling),
                              first_episode_seed=len(tasks))
    return [{**episode_record(t), "sampled": True} for t in trajectories]


def evaluate_base(step: int, runner, bench, base, eval_sets: dict, workdir: str, *,
                  sampling: Callable[[], SamplingParams], num_samples: int = 0) -> dict[str, float]:
    """The evaluation metrics of `step`; one `eval/<split>_step<N>.json` per set (its summary, the
    sampled summary when `num_samples > 0`, and every episode record). `sampling()` gives the
    step's evaluation sampling with the policy's key sequence restarted (called once per set)."""
    out = {}
    for split, tasks in eval_sets.items():
        params = sampling()
        records = [episode_record(t) for t in runner.run([Job(base, task) for task in tasks], params)]
        drawn = sampled_episodes(runner, base, tasks, params, int(num_samples))
        sampled = sampled_summary(drawn, int(num_samples)) if drawn else {}
        summary = bench.summarize(records)
        if distributed.is_main():
            metrics_lib.write_json(os.path.join(workdir, "eval", f"{split}_step{step:06d}.json"),
                                   {"step": step, "summary": summary, "sampled": sampled, "episodes": records + drawn})
        prefix = f"eval/{split}/base"
        out[f"{prefix}/success"] = float(np.mean([r["success"] for r in records])) if records else 0.0
        out[f"{prefix}/{bench.headline}"] = summary.get(bench.headline, 0.0)
        out.update({f"{prefix}/{name}": float(v) for name, v in bench.slice_metrics(records).items()})
        out.update({f"{prefix}/{name}": float(v) for name, v in rates(sampled).items()})
    return out
