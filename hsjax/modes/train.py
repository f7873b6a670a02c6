"""The GRPO training loop with sibling-harness rescue (`config.mode = 'train'`).

One linear `main`, in banner sections: workdir, mesh, benchmark and harnesses, model and policy,
optimizer and state, checkpoint, update step, loop. Per step:

    tasks -> rollouts under the base harness (n per task) -> all-fail groups -> rescue under the
    rescuer's k siblings (m each) -> pack into the fixed G x (n + k*m) layout -> jitted update ->
    (every E steps) eval under the base harness on held-out tasks -> (every C steps, and at the step
    a SIGTERM ends) checkpoint.

Everything before the update is `hsjax.harness_s.step_rollouts.collect`; with `rollout.staleness=1`
step t+1's collect runs on a worker thread while step t's update runs (one step off), and the
checkpoint carries the batch so collected ahead.

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
from hsjax.harness_s import step_rollouts
from hsjax.harness_s.step_rollouts import EVAL_PHASE, MAX_DRAWS, phase_sampling, phase_seed
from hsjax.infra import checkpoint as ckpt_lib
from hsjax.infra import console, distributed, host_memory, preemption, sharding, tracking
from hsjax.infra import metrics as metrics_lib
from hsjax.infra.errors import RunStopped, UserError
from hsjax.rl import grpo, optim, reference
from hsjax.rl.losses import LossConfig
from hsjax.rl.task_stream import TaskStream
from hsjax.rollout.evaluation import evaluate_base

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
        out["router.validity_weight"] = out["router.validity_floor"] = "router.validity=off"
    if "distributed" in config and not config.distributed.enabled:
        for key in ("coordinator_address", "num_processes", "process_id", "initialization_timeout_s"):
            out[f"distributed.{key}"] = "distributed.enabled=False"
    return out


def loss_config(config) -> LossConfig:
    c = config.loss
    return LossConfig(advantage=c.advantage, success_threshold=c.success_threshold, eps_low=c.eps_low,
                      eps_high=c.eps_high, aggregation=c.aggregation, beta=c.beta, is_cap=c.is_cap,
                      is_weight=c.is_weight, rescue_baseline=c.rescue_baseline,
                      kl_estimator=c.kl_estimator, rescue_advantage=c.rescue_advantage,
                      temperature=config.rollout.temperature)


def evaluate(step, runner, bench, base, eval_sets, config, workdir):
    """`hsjax.rollout.evaluation.evaluate_base` at the step's evaluation seed."""
    return evaluate_base(step, runner, bench, base, eval_sets, workdir, num_samples=config.eval.num_samples,
                         sampling=lambda: phase_sampling(runner.policy, config.eval,
                                                         phase_seed(config.seed, step, EVAL_PHASE)))


NONFINITE_POLICIES = ("stop", "skip")
STALENESS = (0, 1)  # rollout.staleness: how many updates the sampler may be behind (docs/training.md)


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


def main(config, workdir: str) -> dict:
    # SIGTERM (a scheduler's notice before its SIGKILL) only raises a flag from here on: the loop saves
    # the step in flight and ends with `preemption.Stopped` (hsjax/infra/preemption.py). Installed
    # before start-up, so a notice that comes during compilation is taken at the first step boundary.
    with preemption.stop_on_sigterm() as stop:
        return _train(config, workdir, stop)


def _train(config, workdir: str, stop: preemption.StopFlag) -> dict:
    if config.loss.nonfinite not in NONFINITE_POLICIES:
        raise UserError(f"loss.nonfinite={config.loss.nonfinite!r} is not one of {NONFINITE_POLICIES}: "
                        "'stop' ends the run at a non-finite update, 'skip' skips it and counts it")
    if config.dapo.enabled and config.dapo.max_draws > MAX_DRAWS:
        raise UserError(f"dapo.max_draws={config.dapo.max_draws} is more than {MAX_DRAWS}: further draws "
                        "would sample with the seeds of other steps' draws, rescues or evaluations; lower it")
    if config.rollout.staleness not in STALENESS:
        raise UserError(f"rollout.staleness={config.rollout.staleness!r} is not one of {STALENESS}: 0 collects each "
                        "step's rollouts before its update, 1 collects step t+1's during step t's update")
    if config.rollout.staleness and jax.process_count() > 1:
        raise UserError("rollout.staleness=1 runs one process only: the rollouts' collectives on a worker thread "
                        "would interleave with the update's across processes; use rollout.staleness=0")
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
    # the JAX sampler or a vLLM engine; or separate servers get the params pushed (`rollout.backend`).
    policy = builders.make_rollout_policy(config, model_cfg, distributed.local_copy(params), tokenizer, workdir)
    # Each phase (base draws, rescue, evaluation) runs its episodes in one batch (no rollout.batch_size),
    # split across the processes of a multi-process run; the runner counts the rollouts of every phase.
    runner = builders.make_runner(config, bench, policy, runner="rollout", sampling="rollout", sharded=True)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

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
    rerender = step_rollouts.in_base_context(bench, base, tokenizer) if config.loss.rescue_context == "base" else None
    # One step's rollouts, packed into its batch (hsjax/harness_s/step_rollouts.py); with
    # rollout.staleness=1 the next step's are collected on a worker thread during this step's update.
    collect_ctx = step_rollouts.StepContext(config, runner, bench, base, rescuer, data, harness_ids, int(pad_id),
                                            rerender, check_valid)
    prefetch = step_rollouts.Prefetch(collect_ctx)
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
        if restored.host_state.get("collected_ahead"):  # a one-step-off run's batch of its next step
            prefetch.put(step_rollouts.StepBatch.from_json(restored.host_state["collected_ahead"]))
        console.say(f"resumed from step {start_step}")
    writer.truncate_after(start_step)
    # Router decisions carry the 0-based index of the step that made them.
    decisions_path = os.path.join(workdir, "router_decisions.jsonl")
    if distributed.is_main():
        metrics_lib.truncate_jsonl_after(decisions_path, start_step - 1)

    # ----------------------------------------------------------------------------------------------
    # Update step.
    update = grpo.jit_train_step(model_cfg, loss_config(config), optimizer,
                                 num_micro_batches=config.batch.micro_batches, materialize=merge)
    update = update if merge is None else functools.partial(update, frozen=params)
    data_sharding = sharding.batch_sharding(mesh, rules)
    # The KL term's reference (rl/reference.py): the starting parameters, loaded again on resume.
    with_reference = (reference.filler(params, model_cfg, temperature=config.rollout.temperature,
                                       num_micro_batches=config.batch.micro_batches, copy=merge is None)
                      if config.loss.beta > 0 else None)

    def push(state, version: int) -> None:
        """The policy plays the params of `version` updates from now on (once per version). One step
        off, the policy gets its own copy: the update donates the state's buffers while the next
        step's rollouts still sample."""
        nonlocal pushed
        if pushed != version:
            playing = playable(state.params)
            if config.rollout.staleness and merge is None:
                playing = jax.tree.map(jax.numpy.copy, playing)
            policy.update_params(distributed.local_copy(playing))
            pushed = version

    pushed = None  # the params version the policy plays

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
        cleanup.callback(prefetch.close)
        last = {}
        push(state, start_step)  # separate rollout servers start from what they loaded: the run's params
        if start_step == 0 and config.eval.at_start:
            writer.truncate_after(-1)  # a restart before the first checkpoint evaluates again
            last = writer.write(0, evaluate(0, runner, bench, base, eval_sets, config, workdir))
            console.say(console.step_line(0, config.total_steps, last, _eval_keys(last)))
        for step in progress:
            t_step = time.perf_counter()
            ready = prefetch.take(step)  # collected during the last update (rollout.staleness=1)
            t_wait = time.perf_counter() - t_step
            push(state, step)
            if ready is None:
                ready = step_rollouts.collect(collect_ctx, step, version=step)
            if config.rollout.staleness and step + 1 < config.total_steps:
                prefetch.start(step + 1, version=step)

            t0 = time.perf_counter()
            packed = place(ready.batch)
            packed = with_reference(packed) if with_reference else packed
            host_memory.release_free_memory()  # what the rollouts freed, before the update's peak
            state, update_metrics = update(state, packed, micro_T=ready.micro_T)
            metrics = {k: float(v) for k, v in jax.device_get(update_metrics).items()}
            metrics.update(ready.metrics)
            # The padded row length the update ran at (its longest micro-batch when grouped): what
            # its time and memory scale with.
            metrics["batch/T"] = max(ready.micro_T) if ready.micro_T else int(packed.tokens_BxT.shape[1])
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
            # How many updates behind the trained params the batch's sampler was, and how long the
            # loop waited for a batch collected ahead.
            metrics.update({"time/update": t_update, "rollout/staleness": step - ready.version,
                            "time/rollout_wait": t_wait})
            done = step + 1
            if config.eval.every and (done % config.eval.every == 0 or done == config.total_steps):
                t0 = time.perf_counter()
                prefetch.wait()  # the policy is the evaluation's once the next step's rollouts are in
                push(state, done)
                metrics.update(evaluate(done, runner, bench, base, eval_sets, config, workdir))
                metrics["time/eval"] = time.perf_counter() - t0
            if ready.episodes is not None and distributed.is_main():
                metrics_lib.write_episodes(workdir, done, ready.episodes)
            if distributed.is_main():
                metrics_lib.append_jsonl(decisions_path, ready.decisions)
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
            # Stopping on SIGTERM is agreed by every process (any one signalled stops all at this
            # step), since the save below is collective.
            stopping = distributed.any_process(stop.requested)
            if done % config.checkpoint.every == 0 or done == config.total_steps or stopping:
                # Every process takes part in the save; the host state is process 0's (its
                # rescuer made the decisions). A batch collected ahead is saved with the task stream and
                # rescuer that already drew it, so a resumed run updates on it as this one will.
                ahead = prefetch.wait()
                checkpointer.save(done, state, {"data": data.state_dict(), "rescuer": rescuer.state_dict(),
                                                **({"collected_ahead": ahead.to_json()} if ahead else {})})
                if distributed.is_main():
                    rescuer.save_artifacts(workdir)
            if stopping and done < config.total_steps:
                console.say(f"SIGTERM: saved step {done}; the same command resumes from it")
                raise preemption.Stopped(done)
    return last


def _eval_keys(metrics) -> dict[str, str]:
    return {k.removeprefix("eval/").removesuffix("/base/success"): k for k in metrics
            if k.startswith("eval/") and k.endswith("/base/success")}
