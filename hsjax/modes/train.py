"""The GRPO training loop with sibling-harness rescue (`config.mode = 'train'`).

One linear `main`, in banner sections: workdir, mesh, tasks and harnesses, model and policy,
optimizer and state, checkpoint, update step, loop. Per step:

    tasks -> rollouts under the base harness (n per task) -> all-fail groups -> rescue under the
    rescuer's k siblings (m each) -> pack into the fixed G x (n + k*m) layout -> jitted update ->
    (every E steps) eval under the base harness on held-out tasks -> (every C steps) checkpoint.

Everything random is a function of (config.seed, step), and the data position and rescuer state
are checkpointed, so a run resumed from its latest checkpoint continues exactly.
"""
import collections
import contextlib
import json
import logging
import os
import time

import jax
import numpy as np
import tqdm

from hsjax.rl import batch as batch_lib
from hsjax.infra import checkpoint as ckpt_lib
from hsjax.rl import grpo
from hsjax.infra import metrics as metrics_lib
from hsjax.rl import optim
from hsjax.rollout import engine as rollout
from hsjax.infra import sharding
from hsjax import builders as workload
from hsjax.rl.losses import LossConfig
from hsjax.rollout.policy import SamplingParams


def sampling_from_config(config, seed: int) -> SamplingParams:
    return SamplingParams(temperature=config.temperature, top_p=config.top_p, top_k=config.top_k,
                          greedy=config.greedy, max_new_tokens=config.max_new_tokens, seed=seed)


def phase_seed(seed: int, step: int, phase: int) -> int:
    """A distinct, reproducible sampling seed per (run seed, step, phase)."""
    return (seed * 1_000_003 + step * 101 + phase) % (2**31 - 1)


def loss_config(config) -> LossConfig:
    return LossConfig(advantage=config.loss.advantage,
                      success_threshold=config.loss.success_threshold,
                      eps_low=config.loss.eps_low, eps_high=config.loss.eps_high,
                      aggregation=config.loss.aggregation, beta=config.loss.beta,
                      temperature=config.rollout.temperature, is_cap=config.loss.is_cap,
                      rescue_baseline=config.loss.rescue_baseline)


def run_episodes(episodes, policy, sampling, config):
    return rollout.collect(episodes, policy, sampling, max_context_tokens=config.rollout.max_context_tokens,
                           env_workers=config.rollout.env_workers)


def rollout_groups(tasks, spec, n, policy, sampling, bench, config, harness_id):
    """Rolls n episodes of each task under one harness; returns a list of trajectory lists."""
    episodes = [bench.make_episode(task, spec, sample_index=i) for task in tasks for i in range(n)]
    trajs = run_episodes(episodes, policy, sampling, config)
    for traj in trajs:
        traj.result["harness_id"] = harness_id
    return [trajs[i * n:(i + 1) * n] for i in range(len(tasks))]


def reseed(policy, seed: int) -> None:
    """Restarts a sampling policy's key sequence; scripted and HTTP policies have none."""
    if hasattr(policy, "reseed"):
        policy.reseed(seed)


def is_success(traj, threshold: float) -> bool:
    return float(traj.result.get("reward", 0.0)) >= threshold


def group_reward_spread(trajs) -> float:
    rewards = [float(t.result.get("reward", 0.0)) for t in trajs]
    return max(rewards) - min(rewards)


def draw_groups(data, step, policy, bench, config, harness_ids):
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
        sampling = sampling_from_config(config.rollout, phase_seed(config.seed, step, draw))
        reseed(policy, sampling.seed)
        groups = rollout_groups(tasks, bench.base, n, policy, sampling, bench, config,
                                harness_ids["base"])
        drawn += len(tasks)
        for task, trajs in zip(tasks, groups):
            if config.dapo.enabled and group_reward_spread(trajs) == 0.0:
                dropped += 1
                continue
            if len(kept_tasks) < G:
                kept_tasks.append(task)
                kept_groups.append(trajs)
        if len(kept_tasks) >= G:
            break
    stats = {"dapo/drawn_groups": drawn, "dapo/dropped_groups": dropped} if config.dapo.enabled else {}
    return kept_tasks, kept_groups, stats


def base_rollouts_executed(kept_rollouts: int, dapo_stats: dict, n: int) -> int:
    """Base rollouts the executor ran this step: with DAPO, every drawn group's n rollouts, the
    dropped groups' included (the budget comparisons count them); else the kept ones."""
    return int(dapo_stats["dapo/drawn_groups"]) * n if dapo_stats else int(kept_rollouts)


def rescue_failed_groups(step, tasks, groups, rescuer, policy, bench, config, harness_ids):
    """Re-rolls each all-fail group under the rescuer's k siblings, m rollouts each.

    Returns per group a list of (trajectory, harness_id) and the outcomes fed back to the rescuer.
    """
    threshold = config.loss.success_threshold
    plan = []  # (group index, spec)
    for g, (task, trajs) in enumerate(zip(tasks, groups)):
        if rescuer.k and not any(is_success(t, threshold) for t in trajs):
            for spec in rescuer.choose(step, g, task, [t.result for t in trajs]):
                plan.append((g, spec))
    rescued = [[] for _ in groups]
    outcomes = []
    if not plan:
        return rescued, outcomes
    m = config.rescue.m
    episodes = [bench.make_episode(tasks[g], spec, sample_index=i) for g, spec in plan for i in range(m)]
    sampling = sampling_from_config(config.rollout, phase_seed(config.seed, step, 1000))
    reseed(policy, sampling.seed)
    trajs = run_episodes(episodes, policy, sampling, config)
    for j, traj in enumerate(trajs):
        g, spec = plan[j // m]
        traj.result["harness_id"] = harness_ids[spec.name]
        rescued[g].append((traj, harness_ids[spec.name]))
        outcomes.append({
            "harness": spec.name, "task_type": tasks[g].type, "task_id": tasks[g].task_id,
            "base_failure_mode": dominant_failure_mode(groups[g]),
            "success": is_success(traj, threshold), "num_turns": traj.result.get("num_turns", 0),
            "num_tokens": traj.num_generated_tokens,
        })
    return rescued, outcomes


def dominant_failure_mode(trajs) -> str:
    """The group's most common failure mode; ties go to the first name, so reruns agree."""
    counts = collections.Counter(str(t.result.get("failure_mode")) for t in trajs)
    return min(counts, key=lambda mode: (-counts[mode], mode))


def to_group_rollouts(groups, rescued, base_id, bench, config):
    out = []
    for trajs, rescue in zip(groups, rescued):
        rescue_in_base = None
        if config.loss.rescue_context == "base" and rescue:
            rescue_in_base = [bench.rerender_in_base(t) for t, _ in rescue]
        out.append(batch_lib.GroupRollouts(
            base=trajs, base_harness=base_id, rescue=[t for t, _ in rescue],
            rescue_harness=[h for _, h in rescue], rescue_in_base=rescue_in_base))
    return out


def evaluate(step, policy, bench, config, workdir):
    """Success of the current policy under the base harness on the held-out tasks (`eval.split`)
    and on every set of `eval.extra_splits`; one `eval/<split>_step<N>.json` per set."""
    out = {}
    for split, tasks in [(config.eval.split, bench.eval_tasks), *bench.extra_eval_tasks.items()]:
        sampling = sampling_from_config(config.eval, phase_seed(config.seed, step, 2000))
        reseed(policy, sampling.seed)
        trajs = run_episodes([bench.make_episode(task, bench.base) for task in tasks], policy, sampling, config)
        records = [workload.episode_record(t) for t in trajs]
        summary = bench.summarize(records)
        os.makedirs(os.path.join(workdir, "eval"), exist_ok=True)
        with open(os.path.join(workdir, "eval", f"{split}_step{step:06d}.json"), "w") as f:
            json.dump({"step": step, "summary": summary, "episodes": records}, f, indent=1)
        prefix = f"eval/{split}/base"
        out[f"{prefix}/success"] = float(np.mean([r["success"] for r in records])) if records else 0.0
        out[f"{prefix}/overall_cat_accuracy"] = summary.get("overall_cat_accuracy", 0.0)
    return out


def step_metrics(groups, rescued, outcomes, update_metrics, harness_names, dapo_stats, n):
    """Host-side metrics of one step: rewards by harness, rescue counts, rollouts spent (DAPO's
    dropped groups included, `base_rollouts_executed`)."""
    metrics = {k: float(v) for k, v in jax.device_get(update_metrics).items()}
    base = [t for trajs in groups for t in trajs]
    rescue = [t for pairs in rescued for t, _ in pairs]
    metrics["reward/mean"] = float(np.mean([t.result.get("reward", 0.0) for t in base])) if base else 0.0
    by_harness = {}
    for t in base + rescue:
        by_harness.setdefault(harness_names[t.result["harness_id"]], []).append(t.result.get("reward", 0.0))
    for name, rewards in by_harness.items():
        metrics[f"reward/by_harness/{name}"] = float(np.mean(rewards))
    metrics["rollouts/base"] = base_rollouts_executed(len(base), dapo_stats, n)
    metrics["rollouts/rescue"] = len(rescue)
    metrics["rescue/groups_rolled"] = sum(1 for pairs in rescued if pairs)
    metrics["rescue/rollout_success_frac"] = (
        float(np.mean([o["success"] for o in outcomes])) if outcomes else 0.0)
    metrics["tokens/generated"] = sum(t.num_generated_tokens for t in base + rescue)
    metrics.update(dapo_stats)
    return metrics


def main(config, workdir: str) -> dict:
    # ----------------------------------------------------------------------------------------------
    # Workdir.
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, "config.json"), "w") as f:
        f.write(config.to_json_best_effort(indent=2, sort_keys=True))

    # ----------------------------------------------------------------------------------------------
    # Mesh.
    mesh = sharding.make_mesh([tuple(axis) for axis in config.mesh])
    rules = [tuple(rule) for rule in config.sharding_rules] or None

    # ----------------------------------------------------------------------------------------------
    # Tasks and harnesses.
    bench = workload.make_workload(config)
    harness_names = ["base"] + [spec.name for spec in bench.siblings]
    harness_ids = {name: i for i, name in enumerate(harness_names)}
    logging.info("train tasks: %d, eval tasks: %d, siblings: %s", len(bench.train_tasks),
                 len(bench.eval_tasks), harness_names[1:])

    # ----------------------------------------------------------------------------------------------
    # Model and policy.
    model_cfg, params, tokenizer = workload.make_model(config)
    params = sharding.shard_params(params, model_cfg, mesh, rules)
    bench.set_tokenizer(tokenizer)
    policy = workload.make_policy(config, model_cfg, params, tokenizer)

    # ----------------------------------------------------------------------------------------------
    # Optimizer and train state.
    # The schedule spans `optim.schedule_steps` (0: total_steps), so a run extended by a larger
    # total_steps can keep the schedule it started with.
    optim_settings = dict(config.optim)
    schedule_steps = optim_settings.pop("schedule_steps", 0) or config.total_steps
    optimizer = optim.make_optimizer(optim_settings, total_steps=schedule_steps)
    state = grpo.init_train_state(params, optimizer, jax.random.PRNGKey(config.seed))
    # Commit every leaf to the mesh: the update's outputs are committed, and inputs that were not
    # would make the second step compile the update again.
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    state = jax.tree.map(lambda x: x if isinstance(getattr(x, "sharding", None), jax.sharding.NamedSharding)
                         else jax.device_put(x, replicated), state)
    local_voters = workload.start_local_voters(config, workdir)
    rescuer = workload.make_rescuer(config, bench, extra_voters=local_voters.specs)
    data = workload.TaskStream(bench.train_tasks, seed=config.seed)

    # ----------------------------------------------------------------------------------------------
    # Checkpoint: resume from the latest good one.
    checkpointer = ckpt_lib.Checkpointer(workdir, keep=config.checkpoint.keep)
    writer = metrics_lib.MetricWriter(workdir, tensorboard=config.log.tensorboard)
    start_step = 0
    restored = checkpointer.restore_latest(state)
    if restored is not None:
        start_step, state = restored.step, restored.state
        data.load_state_dict(restored.host_state["data"])
        rescuer.load_state_dict(restored.host_state["rescuer"])
        logging.info("resumed from step %d", start_step)
    writer.truncate_after(start_step)
    # Router decisions carry the 0-based index of the step that made them.
    decisions_path = os.path.join(workdir, "router_decisions.jsonl")
    metrics_lib.truncate_jsonl_after(decisions_path, start_step - 1)

    # ----------------------------------------------------------------------------------------------
    # Update step.
    S = config.rollout.n + rescuer.k * config.rescue.m
    update = grpo.jit_train_step(model_cfg, loss_config(config), optimizer,
                                 num_micro_batches=config.batch.micro_batches)
    data_sharding = sharding.batch_sharding(mesh, rules)

    def place(batch):
        return jax.tree.map(lambda x: jax.device_put(x, data_sharding) if x.ndim else x, batch)

    # ----------------------------------------------------------------------------------------------
    # Loop.
    totals = {"rollouts/total": 0, "rollouts/rescue_total": 0}
    previous = metrics_lib.read_metrics(workdir)
    if previous:
        totals = {k: previous[-1].get(k, 0) for k in totals}
    progress = tqdm.trange(start_step, config.total_steps, initial=start_step, total=config.total_steps,
                           desc="train", disable=not config.log.progress)
    # The voter servers, metric writer and checkpointer are closed however the loop ends.
    with contextlib.ExitStack() as cleanup:
        cleanup.callback(local_voters.close)
        cleanup.callback(writer.close)
        cleanup.callback(checkpointer.close)
        cleanup.callback(checkpointer.wait_until_finished)
        last = {}
        if start_step == 0 and config.eval.get("at_start", False):
            writer.truncate_after(-1)  # a restart before the first checkpoint evaluates again
            last = writer.write(0, evaluate(0, policy, bench, config, workdir))
        for step in progress:
            policy.update_params(state.params)
            t0 = time.perf_counter()
            tasks, groups, dapo_stats = draw_groups(data, step, policy, bench, config, harness_ids)
            rescued, outcomes = rescue_failed_groups(step, tasks, groups, rescuer, policy, bench, config,
                                                     harness_ids)
            rescuer.observe(step, outcomes)
            t_rollout = time.perf_counter() - t0

            t0 = time.perf_counter()
            packed = batch_lib.pack(
                to_group_rollouts(groups, rescued, harness_ids["base"], bench, config),
                G=config.rollout.groups, n=config.rollout.n, R=S - config.rollout.n,
                T_buckets=list(config.batch.T_buckets), pad_id=bench.pad_id,
                rescue_context=config.loss.rescue_context, overlong=config.batch.overlong)
            state, update_metrics = update(state, place(packed))
            metrics = step_metrics(groups, rescued, outcomes, update_metrics, harness_names, dapo_stats,
                                   config.rollout.n)
            t_update = time.perf_counter() - t0

            totals["rollouts/total"] += metrics["rollouts/base"] + metrics["rollouts/rescue"]
            totals["rollouts/rescue_total"] += metrics["rollouts/rescue"]
            metrics.update(totals)
            metrics.update({"time/rollout": t_rollout, "time/update": t_update,
                            "tokens/per_s": metrics["tokens/generated"] / max(t_rollout, 1e-9)})
            done = step + 1
            if config.eval.every and (done % config.eval.every == 0 or done == config.total_steps):
                t0 = time.perf_counter()
                policy.update_params(state.params)
                metrics.update(evaluate(done, policy, bench, config, workdir))
                metrics["time/eval"] = time.perf_counter() - t0
            if config.log.episodes_every and done % config.log.episodes_every == 0:
                trajs = [t for ts in groups for t in ts] + [t for pairs in rescued for t, _ in pairs]
                metrics_lib.write_episodes(workdir, done, [workload.episode_record(t) for t in trajs])
            if hasattr(rescuer, "drain_log"):
                workload.append_jsonl(decisions_path, rescuer.drain_log())
                metrics.update(rescuer.metrics())
            last = writer.write(done, metrics)
            progress.set_postfix(reward=f"{metrics['reward/mean']:.2f}",
                                 tok_s=f"{metrics['tokens/per_s']:.0f}")
            if done % config.checkpoint.every == 0 or done == config.total_steps:
                checkpointer.save(done, state, {"data": data.state_dict(), "rescuer": rescuer.state_dict()})
    return last
