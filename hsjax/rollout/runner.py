"""The one episode runner every mode uses: jobs in, trajectories out, rollouts counted.

A `Job` is one rollout to run: a task under a harness spec, with the sample index the episode (and
a scripted agent) sees. `EpisodeRunner.run(jobs)` builds each episode with `make_episode(task,
spec, sample_index=...)`, runs them through `engine.collect` in batches of `batch_size`, and returns
the trajectories in job order; every episode result carries its `sample_index` and `num_tokens`.
`rollouts` counts the executor rollouts the runner has spent, in every mode the same way, which
the equal-budget comparisons (training arms, Rank-1) rely on.

An episode whose environment failed (result status `env_error`: a sandbox that did not start under
load, a database that went away) is the machine's fault, not the policy's: with `env_retries` the
runner runs it again, up to that many times, with its own episode seed, so a transient failure
leaves the trajectory the policy would have produced without it (a token policy samples from
(episode seed, turn), whatever else shares the batch). These re-runs are counted in `env_reruns`,
not in `rollouts`: the budget counts the policy's attempts; a re-run episode's result says how many
it took (`env_reruns`). A failure that persists (a broken task,
or an agent that breaks its own environment the same way every time) is returned as it is and
counted in `env_failures`.
"""
from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any, Callable, Sequence

from hsjax.infra import distributed
from hsjax.infra.metrics import to_python, truncate_strings
from hsjax.policies.base import SamplingParams, as_policy
from hsjax.rollout import engine

log = logging.getLogger(__name__)

# `EpisodeRunner(batch_size=ONE_BATCH)`: every call's jobs go to `engine.collect` as one batch,
# however many there are (the training loop's phases).
ONE_BATCH = None

# Re-runs of an episode whose environment failed (module docstring), in the modes built from a config
# (`runner.env_retries` / `rollout.env_retries`).
ENV_RETRIES = 2

# A record's strings are cut past this many characters: 16 turns of 5 MB replies made a 168 MB eval
# JSON for two episodes; at this default one episode's record stays under ~1 MB.
MAX_RECORD_CHARS = 20_000


@dataclasses.dataclass(frozen=True)
class Job:
    """One rollout to run: a task under a harness, with the sample index the policy sees."""

    spec: Any
    task: Any
    sample_index: int = 0


class EpisodeRunner:
    """Runs jobs in batches through `engine.collect`; counts the rollouts and seconds it spent.

    `make_episode(task, spec, sample_index=...)` builds one episode (a benchmark's `make_episode`).
    `batch_size`: episodes per `engine.collect` call; `ONE_BATCH` (None): all of a call's jobs at once.
    `env_retries`: re-runs of an episode whose environment failed (module docstring; 0: none);
    `on_rerun(traj)`, if given, is called with each failed trajectory before its episode runs again
    (e.g. to drop what a recording policy kept of it).
    `progress` (optional, e.g. a tqdm bar) gets `update(n)` after each batch and each re-run; its
    `total` grows by the re-runs, so a bar counts every episode run and ends full. `max_context_tokens` and
    `max_context_chars` (chat policies) are `engine.collect`'s context budgets; 0 or None: none.
    """

    def __init__(self, make_episode: Callable, policy, sampling: SamplingParams, *, batch_size: int | None = 256,
                 env_workers: int = 4, max_context_tokens: int | None = None, max_context_chars: int | None = None,
                 progress=None, env_retries: int = 0, on_rerun: Callable[[engine.Trajectory], None] | None = None):
        self.make_episode, self.policy, self.sampling = make_episode, as_policy(policy), sampling
        self.batch_size = None if batch_size is None else max(1, int(batch_size))
        self.env_workers = int(env_workers)
        self.max_context_tokens = max_context_tokens or None
        self.max_context_chars = max_context_chars or None
        self.progress = progress
        self.env_retries = int(env_retries)
        self.on_rerun = on_rerun
        self.rollouts = 0
        self.env_reruns = 0
        self.env_failures = 0
        self.seconds = 0.0

    def run(self, jobs: Sequence[Job], sampling: SamplingParams | None = None, *,
            first_episode_seed: int = 0) -> list[engine.Trajectory]:
        """Every job's trajectory, in order; `sampling` overrides the runner's for this call. Job i
        has episode seed `first_episode_seed + i` (see `engine.collect`), whatever the batch size."""
        t0 = time.perf_counter()
        out: list[engine.Trajectory] = []
        size = self.batch_size or max(1, len(jobs))
        for start in range(0, len(jobs), size):
            chunk = jobs[start:start + size]
            seeds = [first_episode_seed + start + i for i in range(len(chunk))]
            trajectories = self._collect(chunk, seeds, sampling)
            for attempt in range(self.env_retries):
                failed = [i for i, t in enumerate(trajectories) if env_failed(t)]
                if not failed:
                    break
                # One line per attempt, not per episode: a batch past the machine's sandbox uids fails thousands.
                log.warning("%d episodes' environments failed (first: task %s under %s, %s); running them again "
                            "(%d of %d)", len(failed), chunk[failed[0]].task.task_id, chunk[failed[0]].spec.name,
                            trajectories[failed[0]].result.get("error"), attempt + 1, self.env_retries)
                if self.on_rerun is not None:
                    for i in failed:
                        self.on_rerun(trajectories[i])
                if self.progress is not None:
                    self.progress.total += len(failed)
                again = self._collect([chunk[i] for i in failed], [seeds[i] for i in failed], sampling)
                if self.progress is not None:
                    self.progress.update(len(failed))
                for i, traj in zip(failed, again):
                    traj.result["env_reruns"] = attempt + 1  # so counts survive a multi-process gather
                    trajectories[i] = traj
                self.env_reruns += len(failed)
            persisting = [i for i, t in enumerate(trajectories) if env_failed(t)]
            if persisting and self.env_retries:
                log.warning("%d episodes' environments failed again after %d re-runs (first: task %s, %s); "
                            "their results are kept as they are", len(persisting), self.env_retries,
                            chunk[persisting[0]].task.task_id, trajectories[persisting[0]].result.get("error"))
            self.env_failures += len(persisting)
            for job, traj in zip(chunk, trajectories):
                traj.result.setdefault("sample_index", job.sample_index)
                traj.result["num_tokens"] = traj.num_generated_tokens or None
            out.extend(trajectories)
            self.rollouts += len(chunk)
            if self.progress is not None:
                self.progress.update(len(chunk))
        self.seconds += time.perf_counter() - t0
        return out

    def _collect(self, jobs: Sequence[Job], seeds: list[int], sampling: SamplingParams | None):
        episodes = [self.make_episode(j.task, j.spec, sample_index=j.sample_index) for j in jobs]
        return engine.collect(episodes, self.policy, sampling or self.sampling,
                              max_context_tokens=self.max_context_tokens, env_workers=self.env_workers,
                              max_context_chars=self.max_context_chars, episode_seeds=seeds)

    def results(self, jobs: Sequence[Job], sampling: SamplingParams | None = None) -> list[dict]:
        """The result dict of every job, in order."""
        return [t.result for t in self.run(jobs, sampling)]


class ProcessShardedRunner(EpisodeRunner):
    """An `EpisodeRunner` that splits each call's jobs across the processes of a multi-process run:
    process p runs its contiguous share (`distributed.process_slice`) with its own policy copy and
    environments, and every process gets all trajectories back, in job order. Each job keeps the
    episode seed of its index in the call, so the episodes are the ones one process would run.
    `rollouts` counts the jobs of every process. Alone, it is an `EpisodeRunner`."""

    def run(self, jobs: Sequence[Job], sampling: SamplingParams | None = None, *,
            first_episode_seed: int = 0) -> list[engine.Trajectory]:
        share = distributed.process_slice(len(jobs))
        local = super().run(jobs[share], sampling, first_episode_seed=first_episode_seed + share.start)
        self.rollouts += len(jobs) - len(local)
        return distributed.gather_shares(local)


def env_failed(traj: engine.Trajectory) -> bool:
    """Whether the episode ended because its environment, not its agent, failed: the episode says so
    (its status), or the engine ended it when its `step` raised (its abort reason)."""
    return engine.ENV_ERROR in (traj.result.get("status"), traj.abort_reason)


def episode_record(traj: engine.Trajectory, max_chars: int = MAX_RECORD_CHARS) -> dict:
    """A JSON-ready record of a finished episode: its result (without the task object), the replies,
    tokens generated, timings and why the engine ended it early, if it did. Every string longer than
    `max_chars` (replies, observations, errors) keeps its head and a `…[truncated N chars]` marker;
    0 keeps everything."""
    record = {k: v for k, v in traj.result.items() if k != "task"}
    record.update(num_generated_tokens=traj.num_generated_tokens, abort_reason=traj.abort_reason,
                  replies=[turn["text"] for turn in traj.turns], timings=traj.timings)
    if traj.error:
        record["rollout_error"] = traj.error
    return truncate_strings(to_python(record), max_chars)
