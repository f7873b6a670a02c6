"""Eval mode: score a policy on a benchmark under one or more harnesses.

    python run.py --config experiments/dbbench.py:eval --config.policy.kind=oracle --workdir W

Builds the benchmark, its tasks, the harness specs and the policy from the config; runs every
(harness, task) episode through the episode runner; writes `W/eval/<config.name>.json` with
`config`, `harnesses`, `summary` ({harness: the benchmark's summary}) and `episodes` (one record
per episode); prints the benchmark's table (for DBBench: rows types, categories, overall; columns
harnesses).

Episodes are run in batches of `runner.batch_size`, and each finished batch is appended to
`W/eval/<config.name>.episodes.jsonl` (`hsjax.infra.episode_log`): a crash, a kill or an endpoint
that went down loses at most the batch in flight, and rerunning the same command runs only the
episodes not finished yet (the connection settings of the policy and the runner block may change
between the two runs; anything else is refused). The log is deleted once the result JSON is written.

`num_samples = k` (0: off) adds k sampled episodes of every (harness, task) beside the one the
`sampling` block gives (greedy by default): drawn with the block's temperature, top_p and top_k,
never greedy, each with the episode seed of its index in the job list (so a resumed evaluation
draws what an uninterrupted one did) and `sample_index` 1..k. The result's `sampled` holds, per
harness, the unbiased pass@1, 2, 4, ..., k and mean@k over those k (`hsjax.infra.pass_at_k`);
`summary` stays the figure of the block's own episode. Each record says whether it was `sampled`.

The result counts the episodes that ended in `policy_error` (`policy_errors`; also printed). When
their share is above `config.max_policy_error_share`, the eval has measured its endpoint rather than
the model: it writes its result, then stops with `RunStopped` (one line naming the count, the share,
the URL and the first reason; exit status 2 from run.py).
"""
from __future__ import annotations

import logging
import pathlib
import time

import ml_collections
import tqdm

from hsjax import builders
from hsjax.infra.episode_log import EpisodeLog, fingerprint
from hsjax.infra.errors import RunStopped, UserError
from hsjax.infra.metrics import write_json
from hsjax.infra.pass_at_k import format_sampled_table, sampled_summary
from hsjax.policies.base import PolicyError
from hsjax.rollout.engine import POLICY_ERROR
from hsjax.rollout.evaluation import drawn, sampled_jobs
from hsjax.rollout.runner import Job, episode_record

# Keys a resumed evaluation may change: where and how patiently the policy is reached, how episodes
# are batched. The rest defines the episodes.
RESUMABLE_CHANGES = ("policy.base_url", "policy.api_key_env", "policy.timeout", "policy.max_retries", "policy.backoff",
                     "policy.max_backoff", "policy.max_consecutive_failures", "runner", "max_policy_error_share")

log = logging.getLogger(__name__)


def unread(config) -> dict[str, str]:
    """{key: why} for keys this config holds that its chosen kinds never read (run.py rejects
    overriding them)."""
    return {**builders.policy_unread(config.policy), **builders.benchmark_unread(config)}


def policy_errors(records: list[dict]) -> dict:
    """How many episodes ended in policy_error (the policy gave no reply), overall and by harness,
    with the first such episode's reason."""
    failed = [r for r in records if r.get("abort_reason") == POLICY_ERROR]
    by_harness: dict[str, int] = {}
    for r in failed:
        by_harness[r["harness"]] = by_harness.get(r["harness"], 0) + 1
    return {"episodes": len(failed), "of": len(records), "share": len(failed) / len(records) if records else 0.0,
            "by_harness": by_harness, "first_reason": failed[0].get("rollout_error", "") if failed else ""}


def too_many_policy_errors(counts: dict, max_share: float, policy, path) -> str | None:
    """The one line that stops an eval whose share of policy_error episodes is past `max_share`:
    its score would measure the endpoint, not the model. None when the share is within bounds."""
    if counts["share"] <= max_share:
        return None
    where = f" at {policy.base_url}" if policy.get("base_url") else ""
    reason = " ".join(str(counts["first_reason"]).split())[:200]
    return (f"{counts['episodes']} of {counts['of']} episodes ({counts['share']:.0%}) ended in policy_error, more than "
            f"max_policy_error_share={max_share:g}: the {policy.kind} policy{where} gave no reply (first: {reason}). "
            f"The results are written to {path}, but measure the endpoint, not the model; check that the policy "
            "serves and rerun (or raise --config.max_policy_error_share)")


def stretches(indices: list[int], first_sampled: int) -> list[list[int]]:
    """`indices` (ascending job indices) cut into runs of consecutive indices on one side of
    `first_sampled`: each run is one runner call with one sampling and the episode seeds of its
    indices."""
    runs: list[list[int]] = []
    for i in indices:
        if runs and i == runs[-1][-1] + 1 and (i >= first_sampled) == (runs[-1][-1] >= first_sampled):
            runs[-1].append(i)
        else:
            runs.append([i])
    return runs


def main(config: ml_collections.ConfigDict, workdir: str) -> dict:
    t0 = time.perf_counter()
    bench = builders.make_benchmark(config)
    try:
        pool = builders.load_pool(config, bench)
        specs = pool.select(builders.harness_names(config.harnesses))
        tasks = builders.load_split(bench, config.split, seed=config.task_seed, limit=config.limit)
        policy = builders.make_policy(config.policy, bench, int(config.seed))
        r = config.runner
        num_samples = int(config.get("num_samples", 0))
        jobs = [Job(s, t) for s in specs for t in tasks]
        first_sampled = len(jobs)
        jobs += sampled_jobs(specs, tasks, num_samples)
        own = builders.sampling_params(config.sampling, config.seed)
        draws = drawn(own)
        episodes = EpisodeLog(pathlib.Path(workdir) / "eval" / f"{config.name}.episodes.jsonl",
                              fingerprint(config.to_dict(), RESUMABLE_CHANGES))
        done = episodes.load()
        if done:
            log.info("resuming: %d of %d episodes finished before", len(done), len(jobs))
            print(f"resuming {episodes.path}: {len(done)} of {len(jobs)} episodes were finished")
        episodes.start(done)
        todo = [i for i in range(len(jobs)) if i not in done]
        with tqdm.tqdm(total=len(jobs), initial=len(done), desc=f"{bench.name}/{config.split}", unit="ep") as bar:
            runner = builders.make_runner(config, bench, policy, progress=bar)
            for start in range(0, len(todo), runner.batch_size):
                batch = todo[start:start + runner.batch_size]
                try:
                    trajectories = [t for run in stretches(batch, first_sampled)
                                    for t in runner.run([jobs[i] for i in run], draws if run[0] >= first_sampled else own,
                                                        first_episode_seed=run[0])]
                except PolicyError as e:  # the run-level stop of a policy (e.g. its endpoint is down)
                    raise UserError(f"{e}. The {len(done)} finished episodes are kept in {episodes.path}; "
                                    "rerun the same command to run the rest") from e
                finished = {i: {**episode_record(t, r.max_record_chars), "sampled": i >= first_sampled}
                            for i, t in zip(batch, trajectories)}
                episodes.append(finished)
                done.update(finished)
    finally:
        bench.close()
    records = [done[i] for i in range(len(jobs))]
    own_records = records[:first_sampled]
    summary = {s.name: bench.summarize([r for r in own_records if r["harness"] == s.name]) for s in specs}
    drawn_records = records[first_sampled:]
    sampled = ({s.name: sampled_summary([r for r in drawn_records if r["harness"] == s.name], num_samples)
                for s in specs} if num_samples else {})
    errors = policy_errors(records)
    out = {"config": config.to_dict(), "harnesses": {s.name: s.to_json() for s in specs}, "summary": summary,
           "sampled": sampled, "policy_errors": errors, "rollouts": runner.rollouts, "wall_s": time.perf_counter() - t0,
           "episodes": records}
    path = write_json(pathlib.Path(workdir) / "eval" / f"{config.name}.json", out, indent=None)
    episodes.remove()
    print(f"{bench.name} {config.split} ({len(tasks)} tasks), policy={config.policy.kind}: "
          f"{bench.headline} and its parts in %")
    print(bench.format_table(summary))
    if sampled:
        print(f"{num_samples} samples of every task at temperature {draws.temperature:g} (top_p {draws.top_p:g}, "
              f"top_k {draws.top_k}), in %:")
        print(format_sampled_table(sampled))
    print(f"policy_error: {errors['episodes']} of {errors['of']} episodes"
          + "".join(f"; {name} {n}" for name, n in errors["by_harness"].items()))
    print(f"wrote {path}")
    log.info("eval written to %s in %.1fs", path, out["wall_s"])
    stop = too_many_policy_errors(errors, config.max_policy_error_share, config.policy, path)
    if stop:
        raise RunStopped(stop)
    return {"path": str(path), "summary": summary, "sampled": sampled, "policy_errors": errors}


