"""The warm start's SFT data: which expert episodes the regime plans (a harness and an expert style
per task) and their token streams, laid out exactly as the rollout engine lays out a token
policy's episodes (`hsjax.rollout.segments.render_segments`: reply ids + end-of-turn have loss
mask 1), kept in the workdir so that a resumed warm start does not roll the expert out again.
`studies.testbed.warmstart` trains on them."""
from __future__ import annotations

import collections
import hashlib
import json
import logging
import os
import random

import numpy as np
import tqdm

from harness_envs.synth import expert as expert_lib
from harness_envs.synth import tasks as synth_tasks
from hsjax.infra import console
from hsjax.models.tokenizer import IM_END
from hsjax.policies.base import SamplingParams
from hsjax.policies.recording import RecordingChatPolicy
from hsjax.policies.tokens import tokenizer_eos_ids
from hsjax.rollout.engine import Segment
from hsjax.rollout.runner import EpisodeRunner, Job
from hsjax.rollout.segments import render_segments
from studies.testbed import lookup

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


# An expert episode whose environment failed (`env_error`: the machine's fault, not the expert's, e.g.
# a sandbox start under load) is re-rolled by the runner up to this many times, with its recorded turns
# dropped, so one flake among thousands of episodes does not end a warm start; a failure that persists
# is named by `expert_streams`.
ENV_RETRIES = 2
# Expert episodes open at once. Every open AppWorld-protocol episode holds a sandbox (a leased uid of
# 4,096, a tmpfs): as one batch, the API regime's 6,400 episodes of a style ran out of uids. The
# scripted expert needs no batch for speed, and the episodes do not depend on it (seeds are per job).
EXPERT_BATCH = 256


def job_records(jobs) -> list[dict]:
    """The JSON record of each job: task id, task type, harness and expert style."""
    return [{"task_id": t.task_id, "type": t.type, "harness": h, "style": st} for t, h, st in jobs]


def expert_streams(jobs, pool, tokenizer, config, bench):
    """Rolls out the expert on `jobs` (`sft_jobs`), one expert per style; returns (segments, records)
    in the order of the jobs."""
    options = {"slip_variant": config.regime.slip_variant} if config.regime.kind == "types" else {}
    eos_id = end_of_turn_id(tokenizer)
    by_style = collections.defaultdict(list)
    for i, (_, _, style) in enumerate(jobs):
        by_style[style].append(i)
    rendered: dict[int, list] = {}
    bar = tqdm.tqdm(total=len(jobs), desc="expert episodes", unit="ep", mininterval=10,
                disable=len(jobs) <= EXPERT_BATCH)  # a bar for the long data builds only
    for style, indices in by_style.items():
        expert = RecordingChatPolicy(bench.make_agent("expert", default_style=style, **options))
        runner = EpisodeRunner(bench.make_episode, expert, SamplingParams(), batch_size=EXPERT_BATCH,
                               env_workers=config.sft.env_workers, progress=bar, env_retries=ENV_RETRIES,
                               on_rerun=lambda traj: expert.turns.pop(traj.episode_id, None))
        trajs = runner.run([Job(pool[jobs[i][1]], jobs[i][0]) for i in indices])
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
    return [seg for i in range(len(jobs)) for seg in rendered[i]], job_records(jobs)


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
    records = job_records(jobs)
    if os.path.exists(path):
        with np.load(path) as f:
            if str(f["key"]) == key:
                # Each `f[name]` decompresses the whole array again: read each once, not once a stream
                # (the 28,800 streams of v4's r0b read for over 15 minutes before this).
                lengths, tokens, loss_mask = f["lengths"], f["tokens"].astype(np.int32), f["loss_mask"].astype(np.int32)
                ends = np.cumsum(lengths)
                starts = ends - lengths
                segments = [Segment(tokens[a:b], loss_mask[a:b], np.zeros(b - a, np.float32))
                            for a, b in zip(starts, ends)]
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
