"""One training step's rollouts, made into its update's batch, and the one-step-off prefetch.

`collect(ctx, step, version)` is a step's rollout half, everything before the update:

    tasks -> base-harness groups (DAPO draws) -> rescue plan (process 0) -> rescue under the
    rescuer's siblings -> rescuer.observe -> pack into the fixed G x (n + k*m) layout -> the
    rollouts' host metrics, the router's log and (when the step logs them) the episode records.

Its `StepBatch` holds arrays and plain JSON only, so the one collected ahead of its update can ride in
a checkpoint (`to_json` / `from_json`) and a resumed run updates on exactly the batch an
uninterrupted one would. `Prefetch` runs `collect` for step t+1 on a worker thread while step t's update
runs (`rollout.staleness=1`, docs/training.md "Async rollouts"): between two `take`s the worker
alone touches the policy, the task stream and the rescuer, and the loop waits for it (`wait`) before
it evaluates or checkpoints, so no two threads share them.

Everything random is a function of (config.seed, step, phase): `phase_seed`.
"""
from __future__ import annotations

import base64
import concurrent.futures
import dataclasses
import io
import math
import time

import numpy as np

from hsjax.harness_s.rescue import plan_rescue, rescue_failed_groups
from hsjax.infra import distributed
from hsjax.policies.base import sampling_params
from hsjax.policies.tokens import render_prompt
from hsjax.rl import batch as batch_lib
from hsjax.rollout.runner import Job, env_failed, episode_record
from hsjax.rollout.segments import rerender_with_prefix

# The phases of a step's sampling seeds (`phase_seed`; draw d is phase d): draws below MAX_DRAWS, RESCUE_PHASE
# and EVAL_PHASE differ modulo PHASE_STRIDE, so no two (step, phase) share a seed. Runs keep their seeds.
PHASE_STRIDE, RESCUE_PHASE, EVAL_PHASE = 101, 1000, 2000
MAX_DRAWS = min(RESCUE_PHASE % PHASE_STRIDE, EVAL_PHASE % PHASE_STRIDE)  # 81: draws 0..80


def phase_seed(seed: int, step: int, phase: int) -> int:
    """A distinct, reproducible sampling seed per (run seed, step, phase)."""
    return (seed * 1_000_003 + step * PHASE_STRIDE + phase) % (2**31 - 1)


def phase_sampling(policy, block, seed: int):
    """The sampling settings of one phase, with the policy's key sequence restarted at its seed
    (a no-op for scripted and HTTP policies), so a resumed run draws what an uninterrupted one did."""
    sampling = sampling_params(block, seed)
    policy.reseed(sampling.seed)
    return sampling


def group_reward_spread(trajs) -> float:
    rewards = [float(t.result.get("reward", 0.0)) for t in trajs]
    return max(rewards) - min(rewards)


def draw_groups(data, step, runner, base, config):
    """Base-harness groups for one step.

    Plain GRPO takes the next G tasks. DAPO's dynamic sampling (`config.dapo.enabled`) drops groups
    whose rewards are all equal and keeps drawing G tasks at a time until G groups are kept or
    `config.dapo.max_draws` draws were made; the batch is then completed by invalid groups.
    """
    G, n = config.rollout.groups, config.rollout.n
    draws = config.dapo.max_draws if config.dapo.enabled else 1
    kept_tasks, kept_groups, drawn, dropped = [], [], 0, 0
    for draw in range(draws):
        tasks = data.next(G)
        sampling = phase_sampling(runner.policy, config.rollout, phase_seed(config.seed, step, draw))
        trajs = runner.run([Job(base, task, i) for task in tasks for i in range(n)], sampling)
        drawn += len(tasks)
        for g, task in enumerate(tasks):
            group = trajs[g * n:(g + 1) * n]
            if config.dapo.enabled and group_reward_spread(group) == 0.0:
                dropped += 1
                continue
            if len(kept_tasks) < G:
                kept_tasks.append(task)
                kept_groups.append(group)
        if len(kept_tasks) >= G:
            break
    stats = {"dapo/drawn_groups": drawn, "dapo/dropped_groups": dropped} if config.dapo.enabled else {}
    return kept_tasks, kept_groups, stats


def in_base_context(bench, base, tokenizer):
    """`rerender(task, traj)`: a rescue trajectory with its opening context replaced by the base
    harness's, so the update trains its actions "as if" taken under the base (`rescue_context='base'`)."""
    def rerender(task, traj):
        return rerender_with_prefix(traj, render_prompt(tokenizer, bench.initial_messages(task, base)))
    return rerender


def rollout_metrics(groups, rescued, outcomes, rollouts: dict, dapo_stats) -> dict:
    """Host-side metrics of one step's rollouts: rewards by harness, rescue counts, executor rollouts
    spent (`rollouts`, counted by the runner: DAPO's dropped groups are rollouts too)."""
    base = [t for trajs in groups for t in trajs]
    rescue = [t for pairs in rescued for t, _ in pairs]
    metrics = {"reward/mean": float(np.mean([t.result.get("reward", 0.0) for t in base])) if base else 0.0}
    by_harness = {}
    for t in base + rescue:
        by_harness.setdefault(t.result["harness"], []).append(t.result.get("reward", 0.0))
    for name, rewards in by_harness.items():
        metrics[f"reward/by_harness/{name}"] = float(np.mean(rewards))
    metrics.update(rollouts)
    metrics["rescue/groups_rolled"] = sum(1 for pairs in rescued if pairs)
    metrics["rescue/rollout_success_frac"] = (
        float(np.mean([o["success"] for o in outcomes])) if outcomes else 0.0)
    checked = [o["base_valid"] for o in outcomes if o.get("base_valid") is not None]
    if checked:  # router.validity=replay: the share of checked successful rescues valid under base
        metrics["rescue/base_valid_frac"] = float(np.mean(checked))
    metrics["tokens/generated"] = sum(t.num_generated_tokens for t in base + rescue)
    # Environment failures (hsjax/rollout/runner.py): re-runs spent on them, and those that persisted
    # and are trained as the failures they recorded.
    metrics["rollouts/env_reruns"] = sum(t.result.get("env_reruns", 0) for t in base + rescue)
    metrics["rollouts/env_errors"] = sum(env_failed(t) for t in base + rescue)
    metrics.update(dapo_stats)
    return metrics


@dataclasses.dataclass
class StepContext:
    """What collecting any step of a run needs (built once by the training loop)."""

    config: object
    runner: object
    bench: object
    base: object
    rescuer: object
    data: object  # the TaskStream
    harness_ids: dict
    pad_id: int
    rerender: object = None  # `in_base_context(...)` when loss.rescue_context='base'
    check_valid: object = None  # router.validity=replay's check


@dataclasses.dataclass
class StepBatch:
    """A step's update input and what the loop logs of its rollouts.

    `version`: how many updates the weights that sampled it had seen (the step itself when
    synchronous, one less one step off). `metrics`: `rollout_metrics` plus `time/rollout`,
    `tokens/per_s` and the rescuer's metrics right after it observed the step. `decisions`: the
    router's log of the step. `episodes`: the episode records, when the step logs them, else None.
    """

    step: int
    version: int
    batch: batch_lib.TrainBatch
    micro_T: tuple | None
    metrics: dict
    decisions: list
    episodes: list | None

    def to_json(self) -> dict:
        """Plain JSON (the arrays as one base64 npz), for a checkpoint's host state."""
        arrays = {f.name: getattr(self.batch, f.name) for f in dataclasses.fields(self.batch)
                  if f.name != "num_groups" and getattr(self.batch, f.name) is not None}
        buffer = io.BytesIO()
        np.savez_compressed(buffer, **{k: np.asarray(v) for k, v in arrays.items()})
        return {"step": self.step, "version": self.version, "num_groups": int(self.batch.num_groups),
                "arrays": base64.b64encode(buffer.getvalue()).decode("ascii"),
                "micro_T": list(self.micro_T) if self.micro_T else None, "metrics": _plain(self.metrics),
                "decisions": _plain(self.decisions), "episodes": _plain(self.episodes)}

    @classmethod
    def from_json(cls, data: dict) -> StepBatch:
        with np.load(io.BytesIO(base64.b64decode(data["arrays"])), allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
        batch = batch_lib.TrainBatch(num_groups=int(data["num_groups"]), **arrays)
        return cls(step=int(data["step"]), version=int(data["version"]), batch=batch,
                   micro_T=tuple(data["micro_T"]) if data["micro_T"] else None, metrics=_unplain(data["metrics"]),
                   decisions=_unplain(data["decisions"]), episodes=_unplain(data["episodes"]))


NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
_NONFINITE_TAG = "__float__"


def _plain(value):
    """`value` with NumPy scalars as Python's and non-finite floats tagged, so a checkpoint's strict JSON
    holds it and `_unplain` gives it back."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return {_NONFINITE_TAG: repr(value)}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _unplain(value):
    if isinstance(value, dict):
        if set(value) == {_NONFINITE_TAG}:
            return NONFINITE[value[_NONFINITE_TAG]]
        return {k: _unplain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unplain(v) for v in value]
    return value


def collect(ctx: StepContext, step: int, version: int) -> StepBatch:
    """Step `step`'s rollouts (base draws, rescue) as its update's batch; the policy plays the weights
    of `version` updates (module docstring)."""
    config, runner, rescuer = ctx.config, ctx.runner, ctx.rescuer
    t0 = time.perf_counter()
    before = runner.rollouts
    tasks, groups, dapo_stats = draw_groups(ctx.data, step, runner, ctx.base, config)
    drawn = runner.rollouts
    plan = distributed.from_main(lambda: plan_rescue(
        step, tasks, groups, rescuer, threshold=config.loss.success_threshold))
    rescued, outcomes = rescue_failed_groups(
        step, tasks, groups, rescuer, runner,
        phase_sampling(runner.policy, config.rollout, phase_seed(config.seed, step, RESCUE_PHASE)),
        m=config.rescue.m, threshold=config.loss.success_threshold, plan=plan, check_valid=ctx.check_valid)
    rescuer.observe(step, outcomes)
    rollouts = {"rollouts/base": drawn - before, "rollouts/rescue": runner.rollouts - drawn}
    t_rollout = time.perf_counter() - t0

    n = config.rollout.n
    packed = batch_lib.pack(
        batch_lib.group_rollouts(tasks, groups, rescued, ctx.harness_ids[ctx.base.name], ctx.harness_ids,
                                 ctx.rerender),
        G=config.rollout.groups, n=n, R=rescuer.k * config.rescue.m, T_buckets=list(config.batch.T_buckets),
        pad_id=ctx.pad_id, rescue_context=config.loss.rescue_context, overlong=config.batch.overlong)
    micro_T = None
    if config.batch.group_by_length:
        packed, micro_T = batch_lib.group_by_length(packed, config.batch.micro_batches,
                                                    list(config.batch.T_buckets))
    metrics = rollout_metrics(groups, rescued, outcomes, rollouts, dapo_stats)
    metrics.update({"time/rollout": t_rollout, "tokens/per_s": metrics["tokens/generated"] / max(t_rollout, 1e-9)})
    metrics.update(rescuer.metrics())
    every = config.log.episodes_every
    episodes = None
    if every and (step + 1) % every == 0:
        trajs = [t for ts in groups for t in ts] + [t for pairs in rescued for t, _ in pairs]
        episodes = [episode_record(t) for t in trajs]
    return StepBatch(step=step, version=version, batch=packed, micro_T=tuple(micro_T) if micro_T else None,
                     metrics=metrics, decisions=list(rescuer.drain_log()), episodes=episodes)


class Prefetch:
    """At most one `collect` in flight on a worker thread (module docstring)."""

    def __init__(self, ctx: StepContext):
        self.ctx = ctx
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rollouts")
        self._pending: concurrent.futures.Future | None = None
        self._ready: StepBatch | None = None

    def start(self, step: int, version: int) -> None:
        """Collects `step` in the background with the policy's current weights (`version` updates)."""
        assert self._pending is None and self._ready is None, "one step in flight at most"
        self._pending = self._pool.submit(collect, self.ctx, step, version)

    def put(self, ready: StepBatch) -> None:
        """A batch collected earlier (a checkpoint's), handed out by the next `take`."""
        self._ready = ready

    def wait(self) -> StepBatch | None:
        """Waits for the step in flight, if any (re-raising its error); the batch ready, or None."""
        if self._pending is not None:
            future, self._pending = self._pending, None
            self._ready = future.result()
        return self._ready

    def take(self, step: int) -> StepBatch | None:
        """The batch of `step` if it was collected ahead (waiting for it), else None."""
        ready = self.wait()
        self._ready = None
        if ready is not None and ready.step != step:
            raise RuntimeError(f"the batch collected ahead is step {ready.step}'s, not step {step}'s")
        return ready

    def close(self) -> None:
        """Lets a collect in flight finish (a rollout cannot be cut short) and stops the worker."""
        self._pool.shutdown(wait=True, cancel_futures=True)
