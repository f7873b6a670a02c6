"""The testbed's SFT warm start (`config.mode = 'sft'`): a tiny policy imitates the scripted expert.

    python run.py --config experiments/testbed.py:sft --workdir W

One linear `main`, in banner sections:
  data      roll out the expert (the synth benchmark's `expert` agent) with the episode runner, one
            harness per task family as the regime prescribes, and render each conversation into token
            streams laid out exactly as the rollout engine lays out a token policy's episodes
            (`hsjax.rollout.segments.render_segments`: reply ids + end-of-turn have loss mask 1);
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
import hashlib
import json
import logging
import os
import random
import time

import jax
import jax.numpy as jnp
import numpy as np
import tqdm

from harness_envs.synth import expert as expert_lib
from harness_envs.synth import tasks as synth_tasks
from hsjax import builders
from hsjax.infra import checkpoint as ckpt_lib
from hsjax.infra import console
from hsjax.infra.errors import UserError
from hsjax.infra import metrics as metrics_lib
from hsjax.infra import tracking
from hsjax.models import get_preset, init_params, load_pretrained, save_pretrained
from hsjax.models.tokenizer import IM_END, tiny_tokenizer
from hsjax.policies.base import SamplingParams
from hsjax.policies.jax_policy import JaxPolicy
from hsjax.policies.recording import RecordingChatPolicy
from hsjax.policies.tokens import tokenizer_eos_ids
from hsjax.rl import optim
from hsjax.rl.sft import BucketedBatches, make_train_step, pack
from hsjax.rollout.runner import EpisodeRunner, Job
from hsjax.rollout.engine import Segment
from hsjax.rollout.segments import render_segments
from studies.testbed import copy_warmup, lookup

log = logging.getLogger(__name__)

def end_of_turn_id(tokenizer) -> int:
    """The id that ends an assistant turn in the chat template (`<|im_end|>`)."""
    tid = tokenizer.convert_tokens_to_ids(IM_END)
    if not isinstance(tid, int) or tid == tokenizer.unk_token_id or tid not in tokenizer_eos_ids(tokenizer):
        raise ValueError(f"the tokenizer has no {IM_END} end-of-turn token among its eos ids; SFT renders "
                         "ChatML conversations (hsjax.models.tokenizer)")
    return int(tid)


def regime_plan(config) -> dict[str, tuple[str, str]]:
    """{task type: (expert style, harness name)}: families A in the base protocol under the base
    harness, families B in `regime.b_style` under the sibling that accepts that style."""
    plan = {t: ("protocol", "base") for t in config.regime.families_a}
    style = config.regime.b_style
    if style not in expert_lib.RESCUER:
        raise ValueError(f"regime.b_style={style!r} is not one of {sorted(expert_lib.RESCUER)}")
    for t in config.regime.families_b:
        if t in plan:
            raise ValueError(f"task type {t!r} is in both regime.families_a and regime.families_b")
        plan[t] = (style, expert_lib.RESCUER[style])
    return plan


def episode_harness(task, plan, config) -> str:
    """The harness a task's expert episode runs under: the plan's, except that a stable
    `regime.b_base_share` of the tasks of a style that gives up without the reminder run under the
    base harness (a demonstration of failing for lack of what the sibling supplies)."""
    style, harness = plan[task.type]
    if style in expert_lib.GIVES_UP_WITHOUT_REMINDER and (task.index * 0.6180339887) % 1.0 < config.regime.b_base_share:
        return "base"
    return harness


def _uniform(index: int, salt: str) -> float:
    return random.Random(f"sft/{salt}/{index}").random()


def names_plan(task, regime) -> tuple[str, str]:
    """(harness, style) of a lookup regime's task's expert episode (docs/testbed.md, "Testbed v2";
    `regime.kind` names or apis: `lookup.ROLES`, written here for names).

    Visible names: the protocol, a share `visible_hint_share` under tables_first so that the hint
    line alone does not change what the policy does. Hidden names: under base, tables_first or
    schema_reminder by `hidden_shares`; the expert opens with SHOW TABLES at `show_rate_hint` under
    tables_first and at `show_rate_base` otherwise (schema_reminder opens in exactly the base's
    context, so the two rates must agree), and guesses the table name the rest of the time."""
    roles = lookup.ROLES[regime.kind]
    if not task.hidden:
        return (roles.hint if _uniform(task.index, "visible") < regime.visible_hint_share else "base"), "protocol"
    base_share, hint_share, reminder_share = regime.hidden_shares
    if abs(base_share + hint_share + reminder_share - 1.0) > 1e-6:
        raise ValueError(f"regime.hidden_shares={tuple(regime.hidden_shares)} must sum to 1 (base, "
                         f"{roles.hint}, {roles.reminder})")
    u = _uniform(task.index, "harness")
    harness = "base" if u < base_share else roles.hint if u < base_share + hint_share else roles.reminder
    rate = regime.show_rate_hint if harness == roles.hint else regime.show_rate_base
    return harness, (roles.look_up if _uniform(task.index, "style") < rate else roles.guess)


def sft_jobs(tasks, config) -> list[tuple]:
    """[(task, harness name, expert style)]: the expert episodes of the SFT data."""
    if config.regime.kind in lookup.ROLES:
        return [(task, *names_plan(task, config.regime)) for task in tasks]
    if config.regime.kind != "types":
        raise ValueError(f"regime.kind={config.regime.kind!r} is not 'types', 'names' or 'apis'")
    plan = regime_plan(config)
    return [(task, episode_harness(task, plan, config), plan[task.type][0]) for task in tasks if task.type in plan]


def expected_to_fail(task, harness: str, style: str, kind: str = "types") -> bool:
    """The demonstrated failures of a regime: a style that gives up after a bare error, under a
    harness that does not show what it missed (the schema; in a lookup regime, the hidden name)."""
    if kind in lookup.ROLES:
        roles = lookup.ROLES[kind]
        return roles.expert.acts_on_hidden_name(style, task) and style == roles.guess and harness != roles.reminder
    acts = style == "schema_recovery" or expert_lib.acts_on_hidden_name(style, task)
    return acts and style in expert_lib.GIVES_UP_WITHOUT_REMINDER and harness != expert_lib.RESCUER[style]


ENV_RETRIES = 2  # re-rolls of an expert episode whose environment failed (a sandbox that did not start)
# Expert episodes open at once. Every open AppWorld-protocol episode holds a sandbox (a leased uid of
# 4,096, a tmpfs): as one batch, the API regime's 6,400 episodes of a style ran out of uids. The
# scripted expert needs no batch for speed, and the episodes do not depend on it (seeds are per job).
EXPERT_BATCH = 256


def _expert_episodes(runner: EpisodeRunner, expert, jobs: list[Job]) -> list:
    """The expert's trajectories of `jobs`, in order. An episode whose environment failed
    (`env_error`: the machine's fault, not the expert's, e.g. a sandbox start under load) is re-rolled
    up to ENV_RETRIES times, so one flake among thousands of episodes does not end a warm start;
    the failed episodes' recorded turns are dropped. A failure that persists is left to the caller."""
    trajs = runner.run(jobs)
    for attempt in range(ENV_RETRIES):
        failed = [i for i, t in enumerate(trajs) if t.result["failure_mode"] == "env_error"]
        if not failed:
            break
        for i in failed:
            log.warning("expert episode %s: the environment failed (%s); re-rolling it (%d of %d)",
                        trajs[i].result["task_id"], trajs[i].result.get("error"), attempt + 1, ENV_RETRIES)
            expert.turns.pop(trajs[i].episode_id, None)
        for i, traj in zip(failed, runner.run([jobs[i] for i in failed])):
            trajs[i] = traj
    return trajs


def expert_streams(jobs, pool, tokenizer, config, bench):
    """Rolls out the expert on `jobs` (`sft_jobs`), one expert per style; returns (segments, records)
    in the order of the jobs."""
    options = {"slip_variant": config.regime.slip_variant} if config.regime.kind == "types" else {}
    eos_id = end_of_turn_id(tokenizer)
    by_style = collections.defaultdict(list)
    for i, (_, _, style) in enumerate(jobs):
        by_style[style].append(i)
    rendered: dict[int, list] = {}
    bar = tqdm.tqdm(total=len(jobs), desc="expert episodes", unit="ep", mininterval=10)
    for style, indices in by_style.items():
        expert = RecordingChatPolicy(bench.make_agent("expert", default_style=style, **options))
        runner = EpisodeRunner(bench.make_episode, expert, SamplingParams(), batch_size=EXPERT_BATCH,
                               env_workers=config.sft.env_workers, progress=bar)
        trajs = _expert_episodes(runner, expert, [Job(pool[jobs[i][1]], jobs[i][0]) for i in indices])
        for i, traj in zip(indices, trajs):
            task, harness, _ = jobs[i]
            if not traj.result["success"] and not expected_to_fail(task, harness, style, config.regime.kind):
                error = f": {traj.result['error']}" if traj.result.get("error") else ""
                raise RuntimeError(f"the expert failed {task.task_id} under {harness} in style {style} "
                                   f"({traj.result['failure_mode']}{error}); the regime pairs each style with "
                                   "the harness that accepts it, so this is a bug in the expert, the tasks or "
                                   "(after re-rolls) the environment")
            rendered[i] = render_segments(tokenizer, expert.turns[traj.episode_id], eos_id)
    bar.close()
    segments = [seg for i in range(len(jobs)) for seg in rendered[i]]
    records = [{"task_id": t.task_id, "type": t.type, "harness": h, "style": st} for t, h, st in jobs]
    return segments, records


STREAMS_FILE = "sft_streams.npz"


def streams_key(jobs, pool, tokenizer, config) -> str:
    """What the expert streams depend on: the jobs (tasks, harnesses, styles), those harnesses'
    specs, the benchmark block and the tokenizer."""
    h = hashlib.sha256()
    h.update(json.dumps([[t.task_id, hz, st] for t, hz, st in jobs]).encode())
    h.update(json.dumps({name: pool[name].to_json() for name in sorted({hz for _, hz, _ in jobs})},
                        sort_keys=True, default=str).encode())
    h.update(json.dumps(config.benchmark.to_dict(), sort_keys=True, default=str).encode())
    h.update(f"{config.model.tokenizer}:{len(tokenizer)}".encode())
    return h.hexdigest()


def cached_expert_streams(jobs, pool, tokenizer, config, bench, workdir: str):
    """`expert_streams`, kept in `workdir/STREAMS_FILE` so that a resumed warm start does not roll
    the expert out again (the API regime's 12,800 sandboxed episodes took 35 minutes). The file is
    read only when its key (`streams_key`) matches; the streams' logprobs are zeros (SFT)."""
    path, key = os.path.join(workdir, STREAMS_FILE), streams_key(jobs, pool, tokenizer, config)
    records = [{"task_id": t.task_id, "type": t.type, "harness": h, "style": st} for t, h, st in jobs]
    if os.path.exists(path):
        with np.load(path) as f:
            if str(f["key"]) == key:
                ends = np.cumsum(f["lengths"])
                starts = ends - f["lengths"]
                segments = [Segment(f["tokens"][a:b].astype(np.int32), f["loss_mask"][a:b].astype(np.int32),
                                    np.zeros(b - a, np.float32)) for a, b in zip(starts, ends)]
                console.say(f"SFT data: {len(segments)} expert streams read from {path}")
                return segments, records
        log.warning("%s was made for other jobs or harnesses; rolling the expert out again", path)
    segments, records = expert_streams(jobs, pool, tokenizer, config, bench)
    tmp = path + ".tmp.npz"
    np.savez_compressed(tmp, key=np.asarray(key), lengths=np.asarray([len(x.tokens) for x in segments], np.int64),
                        tokens=np.concatenate([x.tokens for x in segments]).astype(np.int32),
                        loss_mask=np.concatenate([x.loss_mask for x in segments]).astype(np.int8))
    os.replace(tmp, path)
    return segments, records


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
        if done % config.sft.save_every == 0 or done == config.sft.steps:
            checkpointer.save(done, {"params": params, "opt_state": opt_state}, {"sft_streams": len(segments)})
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
