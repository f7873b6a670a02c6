"""Rescue of all-fail groups: which sibling harnesses re-roll a group that failed under the base.

A `Rescuer` answers one question for the training loop: for a task whose every base rollout
failed, which k sibling harnesses should the same policy try next? The loop then rolls m episodes
under each and the trainer's masks decide whether they replace the base slots (see `grpo.py`).

Rescuers here are the simple baselines; the Harness-S router plugs in behind the same interface.
`hsjax.harness_s.rescue_kinds` maps each `rescue.kind` to its config and the rescuer it builds.
Every choice is a pure function of (seed, step, group index) and the rescuer's explicit state, so
a resumed run makes the same choices.
"""
import abc
import collections
import zlib
from typing import Any, Sequence

import numpy as np

from hsjax.rollout.runner import EpisodeRunner, Job


class Rescuer(abc.ABC):
    """Chooses sibling harnesses for all-fail groups; may learn from rescue outcomes."""

    k: int = 0

    @abc.abstractmethod
    def choose(self, step: int, group_index: int, task: Any, failed_results: Sequence[dict]) -> list:
        """Returns up to `k` sibling harness specs to re-roll this task under."""

    def observe(self, step: int, outcomes: Sequence[dict]) -> None:
        """Receives rescue outcomes (dicts with `harness`, `success`, `task_type`, ...)."""

    def drain_log(self) -> list[dict]:
        """Decision records since the last drain (the loop appends them to router_decisions.jsonl)."""
        return []

    def metrics(self) -> dict[str, float]:
        """Metrics of the decisions since the last call."""
        return {}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        del state

    def save_artifacts(self, workdir: str) -> None:
        """Writes what other tools read of the rescuer into `workdir` at each checkpoint (none here)."""
        del workdir


class NoRescue(Rescuer):
    """Plain GRPO: an all-fail group gives no signal."""

    def choose(self, step, group_index, task, failed_results):
        return []


class RandomSiblings(Rescuer):
    """k distinct siblings drawn uniformly from the pool for each failed group."""

    def __init__(self, pool: Sequence, k: int, seed: int = 0):
        if k > len(pool):
            raise ValueError(f"rescue.k={k} exceeds the pool size {len(pool)}")
        self.pool, self.k, self.seed = list(pool), k, seed

    def choose(self, step, group_index, task, failed_results):
        # A fresh generator per decision keeps choices independent of how many came before.
        key = zlib.crc32(f"{self.seed}/{step}/{group_index}".encode())
        rng = np.random.default_rng(key)
        picks = rng.choice(len(self.pool), size=self.k, replace=False)
        return [self.pool[i] for i in picks]


class FixedSiblings(Rescuer):
    """The same ordered sibling list for every failed group (e.g. the `hint` baseline)."""

    def __init__(self, siblings: Sequence):
        self.siblings = list(siblings)
        self.k = len(self.siblings)

    def choose(self, step, group_index, task, failed_results):
        return list(self.siblings)


# ---------------------------------------------------------------------------------------------
# The rescue step of the training loop


def is_success(result: dict, threshold: float) -> bool:
    return float(result.get("reward", 0.0)) >= threshold


def dominant_failure_mode(results: Sequence[dict]) -> str:
    """The group's most common failure mode; ties go to the first name, so reruns agree."""
    counts = collections.Counter(str(r.get("failure_mode")) for r in results)
    return min(counts, key=lambda mode: (-counts[mode], mode))


def plan_rescue(step: int, tasks: Sequence, groups: Sequence[Sequence], rescuer: Rescuer, *,
                threshold: float) -> list[tuple[int, Any]]:
    """(group index, sibling spec) for every sibling the rescuer chooses for an all-fail group
    (every base result below `threshold`), in group order."""
    plan = []
    for g, (task, trajs) in enumerate(zip(tasks, groups)):
        results = [t.result for t in trajs]
        if rescuer.k and not any(is_success(r, threshold) for r in results):
            plan.extend((g, spec) for spec in rescuer.choose(step, g, task, results))
    return plan


def rescue_failed_groups(step: int, tasks: Sequence, groups: Sequence[Sequence], rescuer: Rescuer,
                         runner: EpisodeRunner, sampling, *, m: int, threshold: float,
                         plan: Sequence[tuple[int, Any]] | None = None, check_valid=None):
    """Re-rolls each all-fail group (every base result below `threshold`) under the rescuer's
    choices, `m` rollouts per sibling, in one runner call.

    `groups[g]` holds the base trajectories of `tasks[g]`. Returns, per group, the rescue
    trajectories with their sibling's name, and one outcome record per rescue rollout (what the
    rescuer observes: harness, task, the base group's dominant failure mode, success, cost).
    `plan` (default: `plan_rescue` here) is given when the choices were made elsewhere (by the
    first process of a multi-process run). `check_valid(task, spec, trajectory)` (optional;
    `hsjax.harness_s.replay.checker`) adds `base_valid` (True, False or None: inconclusive) and
    `base_valid_reason` to the outcome of each successful rescue rollout."""
    if plan is None:
        plan = plan_rescue(step, tasks, groups, rescuer, threshold=threshold)
    rescued: list[list] = [[] for _ in groups]
    outcomes: list[dict] = []
    if not plan:
        return rescued, outcomes
    jobs = [Job(spec, tasks[g], i) for g, spec in plan for i in range(m)]
    for j, traj in enumerate(runner.run(jobs, sampling)):
        g, spec = plan[j // m]
        rescued[g].append((traj, spec.name))
        success = is_success(traj.result, threshold)
        outcomes.append({
            "harness": spec.name, "task_type": tasks[g].type, "task_id": tasks[g].task_id,
            "base_failure_mode": dominant_failure_mode([t.result for t in groups[g]]),
            "success": success, "num_turns": traj.result.get("num_turns", 0),
            "num_tokens": traj.num_generated_tokens,
        })
        if check_valid is not None and success:
            validity = check_valid(tasks[g], spec, traj)
            outcomes[-1].update(base_valid=validity.valid, base_valid_reason=validity.reason)
    return rescued, outcomes
