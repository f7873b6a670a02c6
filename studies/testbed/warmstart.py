"""The testbed's SFT warm start (`config.mode = 'sft'`): a tiny policy imitates the scripted expert.

    python run.py --config experiments/testbed.py:sft --workdir W

One linear `main`, in banner sections:
  data      roll out the expert (the synth benchmark's `expert` agent) with the episode runner, one
            harness per task family as the regime prescribes, and render each conversation into token
            streams laid out exactly as the rollout engine lays out a token policy's episodes
            (`studies.testbed.sft_data`: reply ids + end-of-turn have loss mask 1; kept in the workdir);
  model     the preset (with the config's overrides) from random weights, the tiny tokenizer
            `model.tokenizer` names; with `sft.copy_warmup_steps`, first trained to repeat lists of
            random syllable words (`copy_warmup`); or, with `sft.init_from`, a copy base that had
            that warm-up already (`copy_base`); with `sft.copy_replay_every` such rows replayed
            during SFT;
  update    masked next-token cross-entropy around the shared instruction prefix, AdamW, one jitted
            step (`hsjax.rl.sft`);
  loop      `metrics.jsonl` rows with `step`, `loss/sft`, `lr`, `tokens/per_s`; an orbax checkpoint
            of params and optimizer state in `W/checkpoints` every `sft.save_every` steps and at the
            end: the same command run again resumes exactly (the batch stream is replayed);
  save      `W/hf` (`save_pretrained`: `JaxPolicy.from_pretrained(W/hf)` and `model.hf_dir=W/hf`
            load it);
  eval      the warm policy under the base harness and each sibling, per task family, on held-out
            and training tasks, greedy (and optionally sampled): `W/eval/sft.json`.
"""
from __future__ import annotations

import collections
import logging
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from harness_envs.synth import tasks as synth_tasks
from hsjax import builders
from hsjax.infra import checkpoint as ckpt_lib
from hsjax.infra import preemption
from hsjax.infra import console
from hsjax.infra.errors import UserError
from hsjax.infra import metrics as metrics_lib
from hsjax.infra import tracking
from hsjax.models import get_preset, init_params, load_pretrained, save_pretrained
from hsjax.models.tokenizer import tiny_tokenizer
from hsjax.policies.base import SamplingParams
from hsjax.policies.jax_policy import JaxPolicy
from hsjax.rl import optim
from hsjax.rl.sft import BucketedBatches, make_train_step, pack
from hsjax.rollout.runner import EpisodeRunner, Job
from studies.testbed import copy_warmup
from studies.testbed.sft_data import cached_expert_streams, sft_jobs

log = logging.getLogger(__name__)

def evaluate_families(runner: EpisodeRunner, tasks, specs, sampling) -> dict:
    """{harness: {"success": mean, "by_type": {type: mean}, "n": episodes}} and the records."""
    out, records = {}, []
    trajs = runner.run([Job(spec, t) for spec in specs for t in tasks], sampling)
    for i, spec in enumerate(specs):
        by_type = collections.defaultdict(list)
        for traj in trajs[i * len(tasks):(i + 1) * len(tasks)]:
            by_type[traj.result["type"]].append(bool(traj.result["success"]))
            records.append({k: traj.result[k] for k in ("task_id", "type", "harness", "success",
                                                        "failure_mode", "actions", "answer")}
                           | {"replies": [t["text"] for t in traj.turns]})
        ok = [s for v in by_type.values() for s in v]
        out[spec.name] = {"success": float(np.mean(ok)) if ok else 0.0, "n": len(ok),
                          "by_type": {t: float(np.mean(v)) for t, v in sorted(by_type.items())}}
    return {"summary": out, "episodes": records}


def format_family_table(summary: dict, types) -> str:
    names = list(summary)
    width = max(8, *(len(n) + 1 for n in names))
    lines = ["type".ljust(18) + "".join(n.rjust(width) for n in names)]
    for t in types:
        cells = [summary[n]["by_type"].get(t) for n in names]
        lines.append(t.ljust(18) + "".join(("-" if c is None else f"{100 * c:.0f}").rjust(width) for c in cells))
    lines.append("all".ljust(18) + "".join(f"{100 * summary[n]['success']:.0f}".rjust(width) for n in names))
    return "\n".join(lines)


def random_model(config, tokenizer):
    """(cfg, params): the preset with the config's overrides, random weights from the seed."""
    overrides = {k: int(v) for k, v in config.model.overrides.items() if v}
    cfg = get_preset(config.model.preset, vocab_size=len(tokenizer), **overrides)
    return cfg, init_params(cfg, jax.random.PRNGKey(config.seed))


def build_model(config, tokenizer, key: str = "init_from"):
    """(cfg, params): `random_model`, or the model directory `sft.<key>` (`sft.init_from`: a copy
    base, `studies.testbed.copy_base`, SFT starts from; `sft.copy_base_from`: one a copy base
    continues), whose tokenizer must be `model.tokenizer`'s: rows and streams are rendered with it."""
    init_from = config.sft[key]
    if not init_from:
        return random_model(config, tokenizer)
    try:
        cfg, params, own = load_pretrained(init_from)
    except (OSError, ValueError, KeyError) as e:
        raise UserError(f"sft.{key}={init_from!r}: not a model directory hsjax can load ({e}); give "
                        "the hf directory a copy_base or SFT run wrote (W/hf)") from e
    if own.get_vocab() != tokenizer.get_vocab():
        raise UserError(f"sft.{key}={init_from!r} holds a tokenizer other than "
                        f"model.tokenizer={config.model.tokenizer!r}: start from a model of that tokenizer")
    return cfg, params


def eval_harnesses(value, pool) -> list:
    names = builders.harness_names(value)
    return list(pool.values()) if names == ["all"] else pool.select(names)


def unread(config) -> dict[str, str]:
    """{key: why} for keys this config holds that the run never reads (run.py rejects overriding them)."""
    unread = {"sft.copy_base_from": "read by the copy_base mode only"}
    if config.sft.init_from:
        for key in ("model.overrides", "model.preset"):
            unread[key] = "sft.init_from is set: the model's shape is the directory's"
        for key in ("sft.copy_warmup_steps", "sft.copy_far_steps", "sft.copy_warmup_lr", "sft.copy_table_rows"):
            unread[key] = "sft.init_from is set: its copy base had the warm-up (:copy_base runs it)"
        if not config.sft.copy_replay_every:
            unread["sft.copy_far_tokens"] = "sft.copy_replay_every=0: no copy rows replayed"
            unread["sft.copy_style"] = "sft.copy_replay_every=0: no copy rows replayed"
        return unread
    if not config.sft.copy_warmup_steps and not config.sft.copy_far_steps:
        for key in ("sft.copy_warmup_lr", "sft.copy_table_rows"):
            unread[key] = "sft.copy_warmup_steps=0 and sft.copy_far_steps=0: no copy warm-up"
        if not config.sft.copy_replay_every:
            unread["sft.copy_style"] = "no copy warm-up and sft.copy_replay_every=0: no copy rows"
    if not config.sft.copy_far_steps:
        unread["sft.copy_far_tokens"] = "sft.copy_far_steps=0: no gap copy rows"
    return unread


def main(config, workdir: str) -> dict:
    t_start = time.perf_counter()
    tokenizer = tiny_tokenizer(config.model.tokenizer)
    bench = builders.make_benchmark(config)
    pool = builders.load_pool(config, bench)
    train_tasks = builders.load_split(bench, config.data.train_split, seed=config.data.task_seed,
                                      limit=config.data.num_train_tasks)
    # Written once the benchmark, pool and split named by the config have loaded.
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, "config.json"), "w") as f:
        f.write(config.to_json_best_effort(indent=2, sort_keys=True))

    # ----------------------------------------------------------------------------------------------
    # Data: expert streams.
    sft_tasks = train_tasks[: config.sft.num_tasks]
    jobs = sft_jobs(sft_tasks, config)
    segments, sft_records = cached_expert_streams(jobs, pool, tokenizer, config, bench, workdir)
    data = pack(segments, pad_id=tokenizer.pad_token_id, max_len=config.sft.max_len)
    console.say(f"SFT data: {len(segments)} streams from {len(sft_records)} tasks, shared prefix "
                f"{len(data.prefix_P)} tokens, suffixes padded to {data.tokens_NxU.shape[1]}, "
                f"{data.num_policy_tokens} policy tokens")
    t_data = time.perf_counter() - t_start

    # ----------------------------------------------------------------------------------------------
    # Model, optimizer, update step.
    cfg, params = build_model(config, tokenizer)
    # A copy replay step is an update of the same optimizer: the schedule spans both kinds, and
    # before SFT step k the optimizer has made k + k // replay_every updates.
    replay_every = config.sft.copy_replay_every
    # Replay draws gap rows when the warm-up had them, here or in the copy base SFT starts from.
    far_tokens = config.sft.copy_far_tokens if config.sft.init_from or config.sft.copy_far_steps else 0
    replays_before = (lambda k: k // replay_every) if replay_every else (lambda k: 0)
    optimizer = optim.make_optimizer(dict(config.optim), total_steps=config.sft.steps + replays_before(config.sft.steps))
    opt_state = optimizer.tx.init(params)
    step_fn = make_train_step(cfg, optimizer.tx)
    prefix = jnp.asarray(data.prefix_P)

    # ----------------------------------------------------------------------------------------------
    # Resume: params, optimizer state and the batch stream of the latest checkpoint; the data are
    # rebuilt deterministically from the config, so the stream position is the step count.
    checkpointer = ckpt_lib.Checkpointer(workdir, keep=1)
    writer = tracking.metric_writer(workdir, tensorboard=config.log.tensorboard)
    batches = BucketedBatches(data, config.sft.batch_size, config.seed)
    start_step = 0
    restored = checkpointer.restore_latest({"params": params, "opt_state": opt_state})
    if restored is not None:
        if restored.host_state.get("sft_streams") != len(segments):
            raise UserError(f"{checkpointer.directory} holds an SFT run over "
                            f"{restored.host_state.get('sft_streams')} streams, this config makes "
                            f"{len(segments)}: use a fresh --workdir for a different SFT config.")
        start_step, params, opt_state = restored.step, restored.state["params"], restored.state["opt_state"]
        batches.skip(start_step)
        console.say(f"resumed from step {start_step}")
    elif not config.sft.init_from and (config.sft.copy_warmup_steps or config.sft.copy_far_steps):
        # A fresh run from random weights only: a resumed one restored params that went through
        # it, a copy base (`sft.init_from`) had it.
        params, report = copy_warmup.warm_up(
            cfg, params, tokenizer, steps=config.sft.copy_warmup_steps, batch_size=config.sft.batch_size,
            learning_rate=config.sft.copy_warmup_lr, seed=config.seed,
            far_steps=config.sft.copy_far_steps, far_tokens=far_tokens, report_every=config.log.every,
            style=config.sft.copy_style,
            on_report=lambda kind, step, total, loss: console.say(
                f"copy warm-up {step}/{total} | {kind} rows | loss {loss:.3g}"))
        report.update(copy_warmup.gap_tables(cfg, params, tokenizer, config.sft.copy_table_rows))
        metrics_lib.write_json(os.path.join(workdir, "copy_warmup.json"), report)
        for kind in ("repeat", "gap"):
            if report[kind]:
                console.say(f"copy warm-up, {kind} rows: loss {report[kind][0][1]:.3g} (step "
                            f"{report[kind][0][0]}) -> {report[kind][-1][1]:.3g} (step {report[kind][-1][0]})")
        for line in copy_warmup.gap_lines(report):
            console.say(line)
    writer.truncate_after(start_step)

    # ----------------------------------------------------------------------------------------------
    # Loop.
    t_loop = t_last = time.perf_counter()
    last, tokens_since = {}, 0
    copy_step = copy_warmup.make_copy_step(cfg, optimizer.tx) if replay_every else None
    # SIGTERM (a scheduler ending the job) is taken at the next step boundary: hsjax/infra/preemption.py.
    with preemption.stop_on_sigterm() as stop:
        for step in range(start_step, config.sft.steps):
            tokens, mask, length = batches.next()
            params, opt_state, m = step_fn(params, opt_state, prefix, jnp.asarray(tokens), jnp.asarray(mask),
                                           jnp.asarray(length))
            if replay_every and (step + 1) % replay_every == 0:
                copy_tokens, copy_mask = copy_warmup.replay_batch(tokenizer, config.seed, step, config.sft.batch_size,
                                                                     far_tokens, config.sft.copy_style)
                params, opt_state, m["loss/copy_replay"] = copy_step(params, opt_state, jnp.asarray(copy_tokens),
                                                                     jnp.asarray(copy_mask))
            tokens_since += len(data.prefix_P) + int(length.sum())
            done = step + 1
            if done % config.log.every == 0 or done == config.sft.steps or step == 0:
                m = {k: float(v) for k, v in jax.device_get(m).items()}
                now = time.perf_counter()
                m.update({"lr": float(optimizer.lr_schedule(step + replays_before(step))), "tokens/per_s": tokens_since / (now - t_last),
                          "time/elapsed": now - t_loop})
                t_last, tokens_since = now, 0
                last = writer.write(done, m)
                console.say(console.step_line(done, config.sft.steps, m, {"loss": "loss/sft", "lr": "lr",
                                                                           "tok/s": "tokens/per_s"}))
            # SIGTERM: this step is saved whatever save_every says, then the run ends.
            if done % config.sft.save_every == 0 or done == config.sft.steps or stop.requested:
                checkpointer.save(done, {"params": params, "opt_state": opt_state}, {"sft_streams": len(segments)})
            if stop.requested and done < config.sft.steps:
                checkpointer.close()
                console.say(f"SIGTERM: saved step {done}; the same command resumes from it")
                raise preemption.Stopped(done)
    t_train = time.perf_counter() - t_loop

    # ----------------------------------------------------------------------------------------------
    # Save: HF directory and checkpoint.
    hf_dir = os.path.join(workdir, "hf")
    save_pretrained(params, cfg, tokenizer, hf_dir)
    checkpointer.close()

    # ----------------------------------------------------------------------------------------------
    # Eval: per family, base harness and each sibling.
    t0 = time.perf_counter()
    policy = JaxPolicy(cfg, params, tokenizer, seed=config.seed, prompt_step=config.eval.prompt_step)
    runner = EpisodeRunner(bench.make_episode, policy, SamplingParams(), batch_size=config.eval.batch_size)
    specs = eval_harnesses(config.eval.harnesses, pool)
    splits = {config.eval.split: config.eval.num_tasks, config.data.train_split: config.data.num_train_tasks}
    modes = [("greedy", SamplingParams(greedy=True, max_new_tokens=config.eval.max_new_tokens, seed=config.seed))]
    if config.eval.sampled:
        modes.append(("t1", SamplingParams(temperature=1.0, max_new_tokens=config.eval.max_new_tokens,
                                           seed=config.seed)))
    results = {}
    for split, n in (splits.items() if config.eval.per_type else ()):
        # Training tasks the SFT data did not use, when there are enough of them.
        pool_tasks = bench.load_split(split, seed=config.data.task_seed, limit=n)
        if split == config.data.train_split and len(pool_tasks) > config.sft.num_tasks:
            pool_tasks = pool_tasks[config.sft.num_tasks:]
        tasks = synth_tasks.by_type(pool_tasks, config.eval.per_type)
        for mode, sampling in modes:
            res = evaluate_families(runner, tasks, specs, sampling)
            results[f"{split}/{mode}"] = res
            print(f"SFT warm policy, {split}, {mode}: success in % per family (columns: harnesses)")
            print(format_family_table(res["summary"], list(dict.fromkeys(t.type for t in tasks))))
    t_eval = time.perf_counter() - t0
    bench.close()

    out = {
        "regime": dict(collections.Counter(f"{r['harness']}/{r['style']}" for r in sft_records)),
        "sft": {"streams": len(segments), "tasks": len(sft_records), "steps": config.sft.steps,
                "prefix_tokens": int(len(data.prefix_P)), "policy_tokens": data.num_policy_tokens,
                "final_loss": last.get("loss/sft")},
        "time_s": {"data": t_data, "train": t_train, "eval": t_eval},
        "summary": {k: v["summary"] for k, v in results.items()},
        "episodes": {k: v["episodes"] for k, v in results.items()},
    }
    metrics_lib.write_json(os.path.join(workdir, "eval", "sft.json"), metrics_lib.to_python(out))
    writer.close()
    print(f"SFT: data {t_data:.0f}s, train {t_train:.0f}s ({config.sft.steps} steps), eval {t_eval:.0f}s; "
          f"wrote {hf_dir} and {os.path.join(workdir, 'eval', 'sft.json')}")
    return out
