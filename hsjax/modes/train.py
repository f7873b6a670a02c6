"""The GRPO training loop with sibling-harness rescue (`config.mode = 'train'`).

One linear `main`, in banner sections: workdir, mesh, benchmark and harnesses, model and policy,
optimizer and state, checkpoint, update step, loop. Per step:

    tasks -> rollouts under the base harness (n per task) -> all-fail groups -> rescue under the
    rescuer's k siblings (m each) -> pack into the fixed G x (n + k*m) layout -> jitted update ->
    (every E steps) eval under the base harness on held-out tasks -> (every C steps) checkpoint.

The loop reaches the benchmark only through `harness_envs.benchmark.Benchmark`. Everything random
is a function of (config.seed, step), and the data position and rescuer state are checkpointed,
so a run resumed from its latest checkpoint continues exactly.
"""
import contextlib
import functools
import logging
import os
import time

import jax
import numpy as np
import tqdm

from hsjax import builders, voter_servers
from hsjax.harness_s.rescue import plan_rescue, rescue_failed_groups
from hsjax.infra import checkpoint as ckpt_lib
from hsjax.infra import console, distributed, host_memory, sharding, tracking
from hsjax.infra import metrics as metrics_lib
from hsjax.infra.errors import RunStopped, UserError
from hsjax.policies.tokens import render_prompt
from hsjax.rl import batch as batch_lib
from hsjax.rl import grpo, optim, reference
from hsjax.rl.losses import LossConfig
from hsjax.rl.task_stream import TaskStream
from hsjax.rollout.evaluation import evaluate_base
from hsjax.rollout.runner import Job, episode_record
from hsjax.rollout.segments import rerender_with_prefix

log = logging.getLogger(__name__)

STEP_LINE = {"reward": "reward/mean", "rescued groups": "rescue/groups_rolled",
             "rescue ok": "rescue/rollout_success_frac", "rollouts": "rollouts/total", "loss": "loss/pg",
             "s/step": "time/step"}


def unread(config) -> dict[str, str]:
    """{key: why} for keys this config holds that its chosen kinds never read (run.py rejects
    overriding them)."""
    out = {**builders.rescue_unread(config), **builders.benchmark_unread(config), **builders.rollout_unread(config),
           **tracking.unread(config), **builders.lora_unread(config)}
    if not config.dapo.enabled:
        out["dapo.max_draws"] = "dapo.enabled=False"
    if config.model.hf_dir:
        out["model.preset"] = out["model.tokenizer"] = "model.hf_dir is set: the model comes from there"
    if "router" in config and not config.router.local_voters:
        out["router.local_timeout_s"] = "router.local_voters is empty"
    if "router" in config and config.router.selection == "thompson":
        out["router.explore"] = "router.selection=thompson draws from the posteriors instead of a bonus"
    if "router" in config and config.router.validity == "off":
        out["router.validity_weight"] = "router.validity=off"
    if "distributed" in config and not config.distributed.enabled:
        for key in ("coordinator_address", "num_processes", "process_id", "initialization_timeout_s"):
            out[f"distributed.{key}"] = "distributed.enabled=False"
    return out


# The phases of a step's sampling seeds (`phase_seed`; draw d is phase d): draws below MAX_DRAWS, RESCUE_PHASE
# and EVAL_PHASE differ modulo PHASE_STRIDE, so no two (step, phase) share a seed. Runs keep their seeds.
PHASE_STRIDE, RESCUE_PHASE, EVAL_PHASE = 101, 1000, 2000
MAX_DRAWS = min(RESCUE_PHASE % PHASE_STRIDE, EVAL_PHASE % PHASE_STRIDE)  # 81: draws 0..80


def phase_seed(seed: int, step: int, phase: int) -> int:
    """A distinct, reproducible sampling seed per (run seed, step, phase)."""
    return (seed * 1_000_003 + step * PHASE_STRIDE + phase) % (2**31 - 1)


def loss_config(config) -> LossConfig:
    c = config.loss
    return LossConfig(advantage=c.advantage, success_threshold=c.success_threshold, eps_low=c.eps_low,
                      eps_high=c.eps_high, aggregation=c.aggregation, beta=c.beta, is_cap=c.is_cap,
                      is_weight=c.is_weight, rescue_baseline=c.rescue_baseline,
                      kl_estimator=c.kl_estimator, temperature=config.rollout.temperature)


def phase_sampling(policy, block, seed: int):
    """The sampling settings of one phase, with the policy's key sequence restarted at its seed
    (a no-op for scripted and HTTP policies), so a resumed run draws what an uninterrupted one did."""
    sampling = builders.sampling_params(block, seed)
    policy.reseed(sampling.seed)
    return sampling


def evaluate(step, runner, bench, base, eval_sets, config, workdir):
    """`hsjax.rollout.evaluation.evaluate_base` at the step's evaluation seed."""
    return evaluate_base(step, runner, bench, base, eval_sets, workdir, num_samples=config.eval.num_samples,
                         sampling=lambda: phase_sampling(runner.policy, config.eval,
                                                         phase_seed(config.seed, step, EVAL_PHASE)))


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


NONFINITE_POLICIES = ("stop", "skip")


def nonfinite_cause(metrics) -> str:
    """Which part of an update flagged `train/nonfinite` was not finite, from its metrics."""
    loss, grad_norm = metrics.get("loss/total"), metrics.get("grad_norm")
    if not np.isfinite(loss):
        return f"the loss is {loss}"
    if not np.isfinite(grad_norm):
        return f"the gradient norm is {grad_norm}"
    return f"the updated parameters overflowed (learning rate {metrics.get('lr'):.3g})"


def nonfinite_stop(done: int, metrics, saved_steps) -> RunStopped:
    """The one line that ends a run whose update at step `done` was not finite."""
    kept = (f"the latest checkpoint, step {saved_steps[-1]}, is intact" if saved_steps
            else "no checkpoint was saved yet")
    return RunStopped(
        f"step {done}: the update was not finite ({nonfinite_cause(metrics)}); it was not applied, "
        f"nothing of it was saved, and {kept}. Lower optim.learning_rate or check the rewards, or "
        "set --config.loss.nonfinite=skip to skip such steps and count them (train/nonfinite_steps)")


def in_base_context(bench, base, tokenizer):
    """`rerender(task, traj)`: a rescue trajectory with its opening context replaced by the base
    harness's, so the update trains its actions "as if" taken under the base (`rescue_context='base'`)."""
    def rerender(task, traj):
        return rerender_with_prefix(traj, render_prompt(tokenizer, bench.initial_messages(task, base)))
    return rerender


def step_metrics(groups, rescued, outcomes, update_metrics, rollouts: dict, dapo_stats):
    """Host-side metrics of one step: rewards by harness, rescue counts, executor rollouts spent
    (`rollouts`, counted by the runners: DAPO's dropped groups are rollouts too)."""
    metrics = {k: float(v) for k, v in jax.device_get(update_metrics).items()}
    base = [t for trajs in groups for t in trajs]
    rescue = [t for pairs in rescued for t, _ in pairs]
    metrics["reward/mean"] = float(np.mean([t.result.get("reward", 0.0) for t in base])) if base else 0.0
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
    metrics.update(dapo_stats)
    return metrics


def main(config, workdir: str) -> dict:
    if config.loss.nonfinite not in NONFINITE_POLICIES:
        raise UserError(f"loss.nonfinite={config.loss.nonfinite!r} is not one of {NONFINITE_POLICIES}: "
                        "'stop' ends the run at a non-finite update, 'skip' skips it and counts it")
    if config.dapo.enabled and config.dapo.max_draws > MAX_DRAWS:
        raise UserError(f"dapo.max_draws={config.dapo.max_draws} is more than {MAX_DRAWS}: further draws "
                        "would sample with the seeds of other steps' draws, rescues or evaluations; lower it")
    host_memory.release_after_compiles()  # the compiler's working memory, before a program runs
    # ----------------------------------------------------------------------------------------------
    # Mesh.
    mesh = sharding.make_mesh([tuple(axis) for axis in config.mesh])
    rules = [tuple(rule) for rule in config.sharding_rules] or None

    # ----------------------------------------------------------------------------------------------
    # Benchmark, tasks and harnesses.
    bench = builders.make_benchmark(config)
    pool = builders.load_pool(config, bench)
    base = pool.base
    train_tasks = builders.load_split(bench, config.data.train_split, seed=config.data.task_seed,
                                      limit=config.data.limit)
    eval_sets = {split: builders.load_split(bench, split, seed=config.eval.task_seed, limit=config.eval.limit)
                 for split in dict.fromkeys([config.eval.split, *config.eval.extra_splits])}

    # ----------------------------------------------------------------------------------------------
    # Model and policy.
    model_cfg, params, tokenizer = builders.make_model(config)
    params = sharding.shard_params(params, model_cfg, mesh, rules)
    # LoRA (lora.rank > 0): the update trains adapters on the frozen `params`; the policy plays the merge.
    adapters, merge = builders.make_lora(config, params)
    playable = (lambda trainable: trainable) if merge is None else functools.partial(jax.jit(merge), params)

    # ----------------------------------------------------------------------------------------------
    # Workdir: the config is written only now that what it names (benchmark, pool, splits, model) has
    # loaded, so a launch with a bad value leaves a resumable workdir's config.json as it was.
    # The metric writer (hsjax/infra/tracking.py) writes config.json and opens the W&B run, if any.
    writer = tracking.from_config(config, workdir, enabled=distributed.is_main())
    # Each process samples with its own full copy of the params (`distributed.local_copy`), with
    # the JAX sampler or a vLLM engine (`rollout.backend`).
    policy = builders.make_rollout_policy(config, model_cfg, distributed.local_copy(params), tokenizer)
    # Each phase (base draws, rescue, evaluation) runs its episodes in one batch (no rollout.batch_size),
    # split across the processes of a multi-process run; the runner counts the rollouts of every phase.
    runner = builders.make_runner(config, bench, policy, runner="rollout", sampling="rollout", sharded=True)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    rerender = in_base_context(bench, base, tokenizer) if config.loss.rescue_context == "base" else None

    # ----------------------------------------------------------------------------------------------
    # Optimizer and train state.
    # The schedule spans `optim.schedule_steps` (0: total_steps), so a run extended by a larger
    # total_steps can keep the schedule it started with.
    optim_settings = dict(config.optim)
    schedule_steps = optim_settings.pop("schedule_steps", 0) or config.total_steps
    optimizer = optim.make_optimizer(optim_settings, total_steps=schedule_steps)
    state = grpo.init_train_state(params if adapters is None else adapters, optimizer, jax.random.PRNGKey(config.seed))
    # Commit every leaf to the mesh: the update's outputs are committed, and inputs that were not
    # would make the second step compile the update again.
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    state = jax.tree.map(lambda x: x if isinstance(getattr(x, "sharding", None), jax.sharding.NamedSharding)
                         else jax.device_put(x, replicated), state)
    # Router decisions are made by process 0 alone (LLM votes need not repeat), so only it starts
    # the voter servers.
    local_voters = voter_servers.start_for_run(config, workdir, start=distributed.is_main())
    rescuer = builders.make_rescuer(config, pool, extra_voters=local_voters.specs)
    check_valid = builders.make_validity_check(config, bench, base)  # None unless router.validity=replay
    harness_ids = {spec.name: i for i, spec in enumerate([base, *builders.rescue_harnesses(config, pool)])}
    data = TaskStream(train_tasks, seed=config.seed)
    log.info("train tasks: %d, eval sets: %s, rescue harnesses: %s", len(train_tasks),
             {k: len(v) for k, v in eval_sets.items()}, list(harness_ids)[1:])

    # ----------------------------------------------------------------------------------------------
    # Checkpoint: resume from the latest good one.
    checkpointer = ckpt_lib.Checkpointer(workdir, keep=config.checkpoint.keep)
    start_step = 0
    restored = checkpointer.restore_latest(state)
    if restored is not None:
        start_step, state = restored.step, restored.state
        data.load_state_dict(restored.host_state["data"])
        rescuer.load_state_dict(restored.host_state["rescuer"])
        console.say(f"resumed from step {start_step}")
    writer.truncate_after(start_step)
    # Router decisions carry the 0-based index of the step that made them.
    decisions_path = os.path.join(workdir, "router_decisions.jsonl")
    if distributed.is_main():
        metrics_lib.truncate_jsonl_after(decisions_path, start_step - 1)

    # ----------------------------------------------------------------------------------------------
    # Update step.
    S = config.rollout.n + rescuer.k * config.rescue.m
    update = grpo.jit_train_step(model_cfg, loss_config(config), optimizer,
                                 num_micro_batches=config.batch.micro_batches, materialize=merge)
    update = update if merge is None else functools.partial(update, frozen=params)
    data_sharding = sharding.batch_sharding(mesh, rules)
    # The KL term's reference (rl/reference.py): the starting parameters, loaded again on resume.
    with_reference = (reference.filler(params, model_cfg, temperature=config.rollout.temperature,
                                       num_micro_batches=config.batch.micro_batches, copy=merge is None)
                      if config.loss.beta > 0 else None)

    def place(batch):
        return jax.tree.map(lambda x: jax.device_put(x, data_sharding) if x.ndim else x, batch)

    # ----------------------------------------------------------------------------------------------
    # Loop.
    totals = {"rollouts/total": 0, "rollouts/rescue_total": 0, "train/nonfinite_steps": 0}
    previous = metrics_lib.read_metrics(workdir)
    if previous:
        totals = {k: previous[-1].get(k, 0) for k in totals}
    progress = tqdm.trange(start_step, config.total_steps, initial=start_step, total=config.total_steps,
                           desc="train", disable=not (config.log.progress and distributed.is_main()))
    # The voter servers, metric writer, checkpointer and benchmark are closed however the loop ends.
    with contextlib.ExitStack() as cleanup:
        cleanup.callback(bench.close)
        cleanup.callback(policy.close)
        cleanup.callback(local_voters.close)
        cleanup.callback(writer.close)
        cleanup.callback(checkpointer.close)
        cleanup.callback(checkpointer.wait_until_finished)
        last = {}
        if start_step == 0 and config.eval.at_start:
            writer.truncate_after(-1)  # a restart before the first checkpoint evaluates again
            last = writer.write(0, evaluate(0, runner, bench, base, eval_sets, config, workdir))
            console.say(console.step_line(0, config.total_steps, last, _eval_keys(last)))
        for step in progress:
            t_step = time.perf_counter()
            policy.update_params(distributed.local_copy(playable(state.params)))
            before = runner.rollouts
            tasks, groups, dapo_stats = draw_groups(data, step, runner, base, config)
            drawn = runner.rollouts
            plan = distributed.from_main(lambda: plan_rescue(
                step, tasks, groups, rescuer, threshold=config.loss.success_threshold))
            rescued, outcomes = rescue_failed_groups(
                step, tasks, groups, rescuer, runner,
                phase_sampling(policy, config.rollout, phase_seed(config.seed, step, RESCUE_PHASE)),
                m=config.rescue.m, threshold=config.loss.success_threshold, plan=plan, check_valid=check_valid)
            rescuer.observe(step, outcomes)
            rollouts = {"rollouts/base": drawn - before, "rollouts/rescue": runner.rollouts - drawn}
            t_rollout = time.perf_counter() - t_step

            t0 = time.perf_counter()
            packed = batch_lib.pack(
                batch_lib.group_rollouts(tasks, groups, rescued, harness_ids[base.name], harness_ids, rerender),
                G=config.rollout.groups, n=config.rollout.n, R=S - config.rollout.n,
                T_buckets=list(config.batch.T_buckets), pad_id=int(pad_id),
                rescue_context=config.loss.rescue_context, overlong=config.batch.overlong)
            micro_T = None
            if config.batch.group_by_length:
                packed, micro_T = batch_lib.group_by_length(packed, config.batch.micro_batches,
                                                            list(config.batch.T_buckets))
            packed = with_reference(place(packed)) if with_reference else packed
            host_memory.release_free_memory()  # what the rollouts freed, before the update's peak
            state, update_metrics = update(state, place(packed), micro_T=micro_T)
            metrics = step_metrics(groups, rescued, outcomes, update_metrics, rollouts, dapo_stats)
            # The padded row length the update ran at (its longest micro-batch when grouped): what
            # its time and memory scale with.
            metrics["batch/T"] = max(micro_T) if micro_T else int(packed.tokens_BxT.shape[1])
            t_update = time.perf_counter() - t0
            # The update was not applied if it was not finite (grpo.train_step); stop before
            # anything of this step is written, or go on and count it.
            if metrics["train/nonfinite"]:
                if config.loss.nonfinite == "stop":
                    raise nonfinite_stop(step + 1, metrics, checkpointer.all_steps())
                totals["train/nonfinite_steps"] += 1
                log.warning("step %d skipped: %s", step + 1, nonfinite_cause(metrics))

            totals["rollouts/total"] += metrics["rollouts/base"] + metrics["rollouts/rescue"]
            totals["rollouts/rescue_total"] += metrics["rollouts/rescue"]
            metrics.update(totals)
            metrics.update({"time/rollout": t_rollout, "time/update": t_update,
                            "tokens/per_s": metrics["tokens/generated"] / max(t_rollout, 1e-9)})
            done = step + 1
            if config.eval.every and (done % config.eval.every == 0 or done == config.total_steps):
                t0 = time.perf_counter()
                policy.update_params(distributed.local_copy(playable(state.params)))
                metrics.update(evaluate(done, runner, bench, base, eval_sets, config, workdir))
                metrics["time/eval"] = time.perf_counter() - t0
            if config.log.episodes_every and done % config.log.episodes_every == 0 and distributed.is_main():
                trajs = [t for ts in groups for t in ts] + [t for pairs in rescued for t, _ in pairs]
                metrics_lib.write_episodes(workdir, done, [episode_record(t) for t in trajs])
            if distributed.is_main():
                metrics_lib.append_jsonl(decisions_path, rescuer.drain_log())
            metrics.update(rescuer.metrics())
            # Freed heap pages back to the system each step, or the resident set ratchets up
            # through a run (hsjax/infra/host_memory.py); the host's memory, logged after it.
            host_memory.release_free_memory()
            metrics["memory/host_gib"] = host_memory.resident_gib()
            metrics["memory/host_peak_gib"] = host_memory.peak_resident_gib()
            metrics["time/step"] = time.perf_counter() - t_step
            last = writer.write(done, metrics)
            progress.set_postfix(reward=f"{metrics['reward/mean']:.2f}",
                                 tok_s=f"{metrics['tokens/per_s']:.0f}")
            if done % config.log.print_every == 0 or done == config.total_steps:
                console.say(console.step_line(done, config.total_steps, metrics, {**STEP_LINE, **_eval_keys(metrics)}))
            if done % config.checkpoint.every == 0 or done == config.total_steps:
                # Every process takes part in the save; the host state is process 0's (its
                # rescuer made the decisions).
                checkpointer.save(done, state, {"data": data.state_dict(), "rescuer": rescuer.state_dict()})
                if distributed.is_main():
                    rescuer.save_artifacts(workdir)
    return last


def _eval_keys(metrics) -> dict[str, str]:
    return {k.removeprefix("eval/").removesuffix("/base/success"): k for k in metrics
            if k.startswith("eval/") and k.endswith("/base/success")}
