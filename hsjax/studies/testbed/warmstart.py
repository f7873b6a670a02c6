"""SFT mode (`config.mode = 'sft'`): warm-start a tiny policy from scripted-expert trajectories.

    python run.py --config experiments/testbed.py:sft --workdir W

One linear `main`, in banner sections:
  data      roll out the expert (`harness_envs.synth.expert`) with `rollout.collect`, one harness
            per task family as the regime prescribes, and render each conversation into token
            streams laid out exactly as the rollout engine lays out a token policy's episodes
            (`render_segments`: reply ids + end-of-turn have loss mask 1, everything else 0);
  model     the preset (with the config's overrides) from random weights, the tiny tokenizer;
  update    masked next-token cross-entropy, AdamW (`hsjax.rl.optim`), one jitted step. Every stream
            starts with the same instruction, so the step runs that shared prefix once and the
            per-example suffixes on top of its KV cache: the same loss and gradient as running
            every full row, at a fraction of the cost (`shared_prefix_len`, `sft_loss`);
  loop      `metrics.jsonl` rows with `step`, `loss/sft`, `lr`, `tokens/per_s`;
  save      `W/hf` (`save_pretrained`: `JaxPolicy.from_pretrained(W/hf)` and `model.hf_dir=W/hf`
            load it) and an orbax checkpoint of the params in `W/checkpoints`;
  eval      the warm policy under the base harness and each sibling, per task family, on held-out
            and training tasks, greedy (and optionally sampled): `W/eval/sft.json`.
"""
from __future__ import annotations

import collections
import dataclasses
import json
import logging
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from harness_envs import harness as hz
from harness_envs.dbbench.env import DBBenchEpisode
from harness_envs.dbbench.sqlite_backend import SQLiteBackend
from harness_envs.synth import expert as expert_lib
from harness_envs.synth import tasks as synth_tasks
from hsjax.infra import checkpoint as ckpt_lib
from hsjax.infra import metrics as metrics_lib
from hsjax.rl import optim
from hsjax.infra import paths
from hsjax.rollout import engine as rollout
from hsjax.models.tokenizer import IM_END
from hsjax.rollout.policy import SamplingParams, render_prompt, tokenizer_eos_ids

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------------------
# Expert conversations -> token streams


class RecordingChatPolicy:
    """Wraps a ChatPolicy and records, per episode, each context it was shown and its reply."""

    def __init__(self, inner):
        self.inner = inner
        self.turns: dict[str, list[tuple[list[dict], str]]] = collections.defaultdict(list)

    def chat(self, contexts, sampling, infos=None):
        replies = self.inner.chat(contexts, sampling, infos)
        for ctx, info, reply in zip(contexts, infos, replies):
            self.turns[info["episode_id"]].append(([dict(m) for m in ctx], reply))
        return replies


def render_segments(tokenizer, turns: list[tuple[list[dict], str]], eos_id: int) -> list[rollout.Segment]:
    """The token streams the rollout engine would record for this conversation, had a token policy
    produced each reply as `encode(reply) + [eos_id]`: same prompts, same tails between turns
    (`rollout.continuation_ids`), a new segment whenever a context does not extend the stream."""
    segments, tokens, mask = [], [], []
    prev_messages = prev_prompt_text = last = None

    def close():
        if tokens:
            segments.append(rollout.Segment(np.asarray(tokens, np.int32), np.asarray(mask, np.int32),
                                            np.zeros(len(tokens), np.float32)))

    for messages, reply in turns:
        tail = None
        if tokens:
            tail = rollout.continuation_ids(tokenizer, prev_messages, prev_prompt_text, last[0], last[1],
                                            messages)
        if tail is None:
            close()
            tokens = render_prompt(tokenizer, messages)
            mask = [0] * len(tokens)
            prompt_text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        else:
            tail_ids, prompt_text = tail
            tokens, mask = tokens + list(tail_ids), mask + [0] * len(tail_ids)
        ids = tokenizer.encode(reply, add_special_tokens=False) + [int(eos_id)]
        tokens, mask = tokens + ids, mask + [1] * len(ids)
        prev_messages, prev_prompt_text, last = messages, prompt_text, (reply, ids)
    close()
    return segments


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


# Styles whose trajectory under the base harness is a demonstration of failing (and is imitated as
# such for a share `regime.b_base_share` of the families-B tasks), so the warm policy fails there
# for lack of what the sibling supplies, not for lack of data.
GIVES_UP_UNDER_BASE = ("schema_recovery",)


def episode_harness(task, plan, config) -> str:
    """The harness a task's expert episode runs under: the plan's, except that a stable
    `regime.b_base_share` of the tasks of a style in GIVES_UP_UNDER_BASE run under the base harness."""
    style, harness = plan[task.type]
    if style in GIVES_UP_UNDER_BASE and (task.index * 0.6180339887) % 1.0 < config.regime.get("b_base_share", 0.0):
        return "base"
    return harness


def expert_streams(tasks, plan, pool, tokenizer, config, backend):
    """Rolls out the expert on `tasks` (types outside `plan` skipped); returns (segments, records)."""
    styles = {t: style for t, (style, _) in plan.items()}
    expert = RecordingChatPolicy(expert_lib.ScriptedExpert(styles, slip_variant=config.regime.slip_variant))
    episodes = [DBBenchEpisode(task, pool[episode_harness(task, plan, config)], backend)
                for task in tasks if task.type in plan]
    trajs = rollout.collect(episodes, expert, SamplingParams(), env_workers=config.sft.env_workers)
    eos_id = end_of_turn_id(tokenizer)
    segments, records = [], []
    for ep, traj in zip(episodes, trajs):
        if ep.spec.name == "base" and styles[ep.info["type"]] in GIVES_UP_UNDER_BASE:
            pass  # the demonstrated failure the regime wants: no recovery without the sibling's help
        elif not traj.result["success"]:
            raise RuntimeError(f"the expert failed {ep.info['task_id']} under {ep.spec.name} "
                               f"({traj.result['failure_mode']}); the regime pairs each style with the "
                               "harness that accepts it, so this is a bug in the expert or the tasks")
        segments.extend(render_segments(tokenizer, expert.turns[ep.info["episode_id"]], eos_id))
        records.append({"task_id": ep.info["task_id"], "type": ep.info["type"], "harness": ep.spec.name})
    return segments, records


# --------------------------------------------------------------------------------------------------
# Batches and the loss


@dataclasses.dataclass(frozen=True)
class SFTData:
    """Every stream cut after a shared prefix: `prefix_P` (common to all rows) and right-padded
    suffixes `tokens_NxU`, `mask_NxU` (loss mask), `length_N` (valid suffix length)."""

    prefix_P: np.ndarray
    tokens_NxU: np.ndarray
    mask_NxU: np.ndarray
    length_N: np.ndarray

    @property
    def num_policy_tokens(self) -> int:
        return int(self.mask_NxU.sum())


def shared_prefix_len(segments: list[rollout.Segment]) -> int:
    """Tokens every stream starts with, stopping one token before the first trained token of any
    stream: the first suffix token is then never trained, so the suffix logits predict every
    trained token and the prefix logits are not needed."""
    first = segments[0].tokens
    common = len(first)
    for seg in segments[1:]:
        n = min(common, len(seg.tokens))
        diff = np.nonzero(seg.tokens[:n] != first[:n])[0]
        common = int(diff[0]) if len(diff) else n
    first_trained = min(int(np.argmax(seg.loss_mask > 0)) for seg in segments)
    return max(0, min(common, first_trained) - 1)


def pack(segments: list[rollout.Segment], pad_id: int, multiple: int = 32, max_len: int = 0) -> SFTData:
    if not segments:
        raise ValueError("no SFT streams: the regime selected no task family present in the data")
    too_long = [len(s.tokens) for s in segments if max_len and len(s.tokens) > max_len]
    if too_long:
        raise ValueError(f"{len(too_long)} streams exceed sft.max_len={max_len} tokens (longest "
                         f"{max(too_long)}); raise sft.max_len")
    p = shared_prefix_len(segments)
    u = max(len(s.tokens) for s in segments) - p
    u = -(-u // multiple) * multiple
    tokens = np.full((len(segments), u), pad_id, np.int32)
    mask = np.zeros((len(segments), u), np.int32)
    length = np.zeros((len(segments),), np.int32)
    for i, seg in enumerate(segments):
        n = len(seg.tokens) - p
        tokens[i, :n], mask[i, :n], length[i] = seg.tokens[p:], seg.loss_mask[p:], n
    return SFTData(np.asarray(segments[0].tokens[:p], np.int32), tokens, mask, length)


def sft_loss(params, prefix_P, tokens_BxU, mask_BxU, length_B, *, cfg):
    """Masked next-token cross-entropy (sum, count) of rows `prefix_P + tokens_BxU[b, :length_B[b]]`.

    The prefix runs once (batch 1) into a KV cache broadcast to the batch; gradients flow through it.
    """
    from hsjax.models import forward, init_cache

    P, (B, U) = prefix_P.shape[0], tokens_BxU.shape
    cache = init_cache(cfg, 1, P + U)
    if P:
        _, cache = forward(cfg, params, prefix_P[None], jnp.arange(P, dtype=jnp.int32)[None], cache=cache)
    cache = jax.tree.map(lambda x: jnp.broadcast_to(x, x.shape[:1] + (B,) + x.shape[2:]) if x.ndim == 5
                         else (jnp.broadcast_to(x, (B,) + x.shape[1:]) if x.ndim == 2 else x), cache)
    steps_U = jnp.arange(U, dtype=jnp.int32)
    positions_BxU = jnp.where(steps_U[None] < length_B[:, None], P + steps_U[None], -1)
    logits_BxUxV, _ = forward(cfg, params, tokens_BxU, positions_BxU, cache=cache)
    logp_BxUxV = jax.nn.log_softmax(logits_BxUxV[:, :-1].astype(jnp.float32), axis=-1)
    target_logp_BxU = jnp.take_along_axis(logp_BxUxV, tokens_BxU[:, 1:, None], axis=-1)[..., 0]
    trained_BxU = mask_BxU[:, 1:].astype(jnp.float32)
    return -jnp.sum(target_logp_BxU * trained_BxU), jnp.sum(trained_BxU)


class BucketedBatches:
    """Batches of `batch_size` rows drawn from one length bucket at a time, so a batch of short
    streams is not padded to the longest stream of the data. Buckets: suffix lengths up to the
    `split_quantile` quantile and the rest, each rounded up to `multiple` (two compiled shapes).
    Each bucket is walked in a fresh permutation per pass; the bucket of each step is drawn in
    proportion to its size. Deterministic given `seed`."""

    def __init__(self, data: SFTData, batch_size: int, seed: int, split_quantile: float = 0.8,
                 multiple: int = 32):
        lengths = data.length_N
        cut = int(-(-np.quantile(lengths, split_quantile) // multiple) * multiple)
        self.data, self.batch_size = data, batch_size
        self.buckets = [(cut, np.nonzero(lengths <= cut)[0]),
                        (data.tokens_NxU.shape[1], np.nonzero(lengths > cut)[0])]
        self.buckets = [(u, idx) for u, idx in self.buckets if len(idx)]
        self.rng = np.random.default_rng(seed)
        self._orders = [self.rng.permutation(idx) for _, idx in self.buckets]
        self._cursors = [0] * len(self.buckets)

    def next(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        sizes = np.array([len(idx) for _, idx in self.buckets], np.float64)
        b = int(self.rng.choice(len(self.buckets), p=sizes / sizes.sum()))
        u, idx = self.buckets[b]
        if self._cursors[b] + self.batch_size > len(self._orders[b]):
            self._orders[b], self._cursors[b] = self.rng.permutation(idx), 0
        rows = self._orders[b][self._cursors[b]:self._cursors[b] + self.batch_size]
        if len(rows) < self.batch_size:  # a bucket smaller than a batch: repeat rows
            rows = self.rng.choice(idx, self.batch_size)
        self._cursors[b] += self.batch_size
        d = self.data
        return d.tokens_NxU[rows, :u], d.mask_NxU[rows, :u], d.length_N[rows]


def make_train_step(cfg, tx):
    def step(params, opt_state, prefix_P, tokens_BxU, mask_BxU, length_B):
        def loss_fn(p):
            total, count = sft_loss(p, prefix_P, tokens_BxU, mask_BxU, length_B, cfg=cfg)
            return total / jnp.maximum(count, 1.0), count

        (loss, count), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, {"loss/sft": loss, "tokens/trained": count,
                                                                 "grad_norm": optax.tree.norm(grads)}

    return jax.jit(step, donate_argnums=(0, 1))


# --------------------------------------------------------------------------------------------------
# Evaluation per family


def evaluate_families(policy, tasks, specs, sampling, backend, *, batch_size: int = 64,
                      max_context_tokens: int | None = None) -> dict:
    """{harness: {"success": mean, "by_type": {type: mean}, "n": episodes}} and the records."""
    out, records = {}, []
    for spec in specs:
        episodes = [DBBenchEpisode(t, spec, backend) for t in tasks]
        trajs = []
        for i in range(0, len(episodes), batch_size):
            trajs.extend(rollout.collect(episodes[i:i + batch_size], policy, sampling,
                                         max_context_tokens=max_context_tokens))
        by_type = collections.defaultdict(list)
        for traj in trajs:
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


# --------------------------------------------------------------------------------------------------


def build_model(config, tokenizer):
    from hsjax.models import get_preset, init_params

    overrides = {k: int(v) for k, v in config.model.overrides.items() if v}
    cfg = get_preset(config.model.preset, vocab_size=len(tokenizer), **overrides)
    return cfg, init_params(cfg, jax.random.PRNGKey(config.seed))


def main(config, workdir: str) -> dict:
    from hsjax.models import save_pretrained
    from hsjax.models.tokenizer import build_tiny_tokenizer
    from hsjax.rollout.policy import JaxPolicy

    # ----------------------------------------------------------------------------------------------
    # Workdir.
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, "config.json"), "w") as f:
        f.write(config.to_json_best_effort(indent=2, sort_keys=True))
    t_start = time.perf_counter()

    # ----------------------------------------------------------------------------------------------
    # Data: expert streams.
    tokenizer = build_tiny_tokenizer()
    pool = hz.load_pool(_repo_path(config.pool))
    backend = SQLiteBackend()
    plan = regime_plan(config)
    train_tasks = synth_tasks.make_tasks(config.data.train_split, config.data.num_train_tasks, config.data.task_seed)
    sft_tasks = train_tasks[: config.sft.num_tasks]
    segments, sft_records = expert_streams(sft_tasks, plan, pool, tokenizer, config, backend)
    data = pack(segments, pad_id=tokenizer.pad_token_id, max_len=config.sft.max_len)
    log.info("SFT data: %d streams from %d tasks, shared prefix %d tokens, suffixes padded to %d, "
             "%d policy tokens", len(segments), len(sft_records), len(data.prefix_P), data.tokens_NxU.shape[1],
             data.num_policy_tokens)
    t_data = time.perf_counter() - t_start

    # ----------------------------------------------------------------------------------------------
    # Model, optimizer, update step.
    cfg, params = build_model(config, tokenizer)
    optimizer = optim.make_optimizer(dict(config.optim), total_steps=config.sft.steps)
    opt_state = optimizer.tx.init(params)
    step_fn = make_train_step(cfg, optimizer.tx)
    prefix = jnp.asarray(data.prefix_P)

    # ----------------------------------------------------------------------------------------------
    # Loop.
    writer = metrics_lib.MetricWriter(workdir, tensorboard=config.log.tensorboard)
    batches = BucketedBatches(data, config.sft.batch_size, config.seed)
    t_loop = t_last = time.perf_counter()
    last, tokens_since = {}, 0
    for step in range(config.sft.steps):
        tokens, mask, length = batches.next()
        params, opt_state, m = step_fn(params, opt_state, prefix, jnp.asarray(tokens), jnp.asarray(mask),
                                       jnp.asarray(length))
        tokens_since += len(data.prefix_P) + int(length.sum())
        done = step + 1
        if done % config.log.every == 0 or done == config.sft.steps or step == 0:
            m = {k: float(v) for k, v in jax.device_get(m).items()}
            now = time.perf_counter()
            m.update({"lr": float(optimizer.lr_schedule(step)), "tokens/per_s": tokens_since / (now - t_last),
                      "time/elapsed": now - t_loop})
            t_last, tokens_since = now, 0
            last = writer.write(done, m)
            log.info("sft step %d: loss %.4f", done, m["loss/sft"])
    t_train = time.perf_counter() - t_loop

    # ----------------------------------------------------------------------------------------------
    # Save: HF directory and checkpoint.
    hf_dir = os.path.join(workdir, "hf")
    save_pretrained(params, cfg, tokenizer, hf_dir)
    with ckpt_lib.Checkpointer(workdir, keep=1) as checkpointer:
        checkpointer.save(config.sft.steps, {"params": params}, {"sft_streams": len(segments)})

    # ----------------------------------------------------------------------------------------------
    # Eval: per family, base harness and each sibling.
    t0 = time.perf_counter()
    policy = JaxPolicy(cfg, params, tokenizer, seed=config.seed, prompt_step=config.eval.prompt_step)
    specs = [pool[n] for n in _names(config.eval.harnesses, pool)]
    splits = {config.eval.split: config.eval.num_tasks, config.data.train_split: config.data.num_train_tasks}
    modes = [("greedy", SamplingParams(greedy=True, max_new_tokens=config.eval.max_new_tokens, seed=config.seed))]
    if config.eval.sampled:
        modes.append(("t1", SamplingParams(temperature=1.0, max_new_tokens=config.eval.max_new_tokens,
                                           seed=config.seed)))
    results = {}
    for split, n in (splits.items() if config.eval.per_type else ()):
        # Training tasks the SFT data did not use, when there are enough of them.
        pool_tasks = synth_tasks.make_tasks(split, n, config.data.task_seed)
        if split == config.data.train_split and len(pool_tasks) > config.sft.num_tasks:
            pool_tasks = pool_tasks[config.sft.num_tasks:]
        tasks = synth_tasks.by_type(pool_tasks, config.eval.per_type)
        for mode, sampling in modes:
            res = evaluate_families(policy, tasks, specs, sampling, backend, batch_size=config.eval.batch_size)
            results[f"{split}/{mode}"] = res
            print(f"SFT warm policy, {split}, {mode}: success in % per family (columns: harnesses)")
            print(format_family_table(res["summary"], synth_tasks.TYPES))
    t_eval = time.perf_counter() - t0

    out = {
        "regime": {t: {"style": s, "harness": h} for t, (s, h) in plan.items()},
        "sft": {"streams": len(segments), "tasks": len(sft_records), "steps": config.sft.steps,
                "prefix_tokens": int(len(data.prefix_P)), "policy_tokens": data.num_policy_tokens,
                "final_loss": last.get("loss/sft")},
        "time_s": {"data": t_data, "train": t_train, "eval": t_eval},
        "summary": {k: v["summary"] for k, v in results.items()},
        "episodes": {k: v["episodes"] for k, v in results.items()},
    }
    os.makedirs(os.path.join(workdir, "eval"), exist_ok=True)
    with open(os.path.join(workdir, "eval", "sft.json"), "w") as f:
        json.dump(metrics_lib.to_python(out), f, indent=1)
    writer.close()
    print(f"SFT: data {t_data:.0f}s, train {t_train:.0f}s ({config.sft.steps} steps), eval {t_eval:.0f}s; "
          f"wrote {hf_dir} and {os.path.join(workdir, 'eval', 'sft.json')}")
    return out


def _names(value, pool) -> list[str]:
    # A command-line override of a tuple field arrives as a one-item tuple holding "a,b,c".
    from hsjax.modes.evaluate import harness_names

    names = harness_names(value)
    if names == ["all"]:
        return list(pool)
    missing = [n for n in names if n not in pool]
    if missing:
        raise ValueError(f"eval.harnesses names {missing}, not in the pool; known: {sorted(pool)}")
    return names


def _repo_path(path: str) -> str:
    if os.path.isabs(path) or os.path.exists(path):
        return path
    return str(paths.resolve(path))
