"""Mechanism curve of the testbed: the teacher-forced log p of opening with the lookup under base.

    python -m studies.testbed.mechanism --run W/names_harness_s/seed0 [--prompts 64]

The behaviour Harness-S should internalise is a policy action the base harness accepts: on a
hidden-name task, look the name up first (`SHOW TABLES` in the names regime; in the API regime, a
cell that lists the app's APIs; the run's regime is read off its config, `lookup.roles_of`).
Sampled opening rates (the gates, the training evaluations) see a shift only in steps of 1/n; the
log p of that reply on a fixed set of prompts moves with every update. The prompts are the base harness's first-turn contexts of `--prompts`
hidden-name tasks of the run's evaluation split (its `eval.task_seed`), the reply the scripted
expert's lookup opening (`LookupRoles.look_up`) in exactly that context (its text + end-of-turn,
as the rollout engine records a reply). Every checkpoint the run kept is scored, and the warm start as step 0.

Writes `<run>/mechanism_logp.json`: {"steps": [...], "rollouts": [cumulative executor rollouts
at each step, from metrics.jsonl], "mean_logp": [...], "per_prompt": [[...], ...], "task_ids",
"reply"}; `studies.testbed.names_report` plots it when present.
"""
from __future__ import annotations

import argparse
import functools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from hsjax import builders
from hsjax.infra import checkpoint as ckpt_lib
from hsjax.infra import metrics as metrics_lib
from hsjax.models.model import forward
from hsjax.policies.base import SamplingParams
from hsjax.policies.recording import RecordingChatPolicy
from hsjax.policies.tokens import render_prompt
from hsjax.rollout.runner import ONE_BATCH, EpisodeRunner, Job
from hsjax.rl import losses
from studies.testbed import gates, lookup, runs
from studies.testbed.sft_data import end_of_turn_id

OUTPUT = "mechanism_logp.json"


def opening_pairs(bench, harness, tokenizer, tasks,
                  roles: lookup.LookupRoles = lookup.ROLES["names"]) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, reply ids) of the expert's first turn on each task under `harness`: the
    rendered first-turn context and the expert's lookup reply + end-of-turn."""
    style = roles.look_up
    expert = RecordingChatPolicy(bench.make_agent("expert", default_style=style))
    runner = EpisodeRunner(bench.make_episode, expert, SamplingParams(), batch_size=ONE_BATCH)
    eos_id = end_of_turn_id(tokenizer)
    pairs = []
    for traj in runner.run([Job(harness, task) for task in tasks]):
        messages, reply = expert.turns[traj.episode_id][0]
        if not roles.opens([reply]):
            raise RuntimeError(f"the {style} expert did not open {traj.result['task_id']} with its lookup "
                               f"(replied {reply!r}); the mechanism prompts need that reply")
        pairs.append((list(render_prompt(tokenizer, messages)),
                      tokenizer.encode(reply, add_special_tokens=False) + [int(eos_id)]))
    return pairs


@functools.lru_cache(maxsize=None)
def _token_logp_program(cfg):
    """log p of each token given the ones before it (column 0: 0), the trainer's `token_logp`."""
    return jax.jit(lambda params, tokens_BxT, positions_BxT: losses.token_logp(
        forward(cfg, params, tokens_BxT, positions_BxT)[0], tokens_BxT)[0])


def reply_logp(cfg, params, pairs, batch_size: int = 16) -> np.ndarray:
    """Sum over each reply's tokens of log p(token | prompt, earlier reply tokens), at T = 1.

    Rows are right-padded to one length (padding positions are -1: they see nothing and are not
    counted), so every batch runs one compiled program."""
    length = max(len(p) + len(r) for p, r in pairs)
    out = []
    for start in range(0, len(pairs), batch_size):
        chunk = pairs[start:start + batch_size]
        chunk = chunk + [chunk[-1]] * (batch_size - len(chunk))  # a full batch; extra rows dropped
        tokens = np.zeros((batch_size, length), np.int32)
        positions = np.full((batch_size, length), -1, np.int32)
        mask = np.zeros((batch_size, length), np.float32)
        for i, (prompt, reply) in enumerate(chunk):
            n = len(prompt) + len(reply)
            tokens[i, :n] = prompt + reply
            positions[i, :n] = np.arange(n)
            mask[i, len(prompt):n] = 1.0  # the reply's tokens
        logp = np.asarray(_token_logp_program(cfg)(params, tokens, positions))
        out.extend((logp * mask).sum(axis=1)[:len(pairs) - start])
    return np.asarray(out[:len(pairs)], np.float64)


def measure(workdir: str, num_prompts: int = 64, batch_size: int = 16) -> dict:
    run = runs.load_run(workdir)
    config = ml_collections.ConfigDict(run.config)
    bench = builders.make_benchmark(config)
    pool = builders.load_pool(config, bench)
    tasks = gates.cell_tasks(bench, config.eval.split, config.eval.task_seed, True, num_prompts)
    cfg, warm, tokenizer, _ = builders.load_model(config.model.hf_dir)
    pairs = opening_pairs(bench, pool["base"], tokenizer, tasks, lookup.roles_of(run.config))
    bench.close()
    with ckpt_lib.Checkpointer(ckpt_lib.resolve_ckpt_dir(run.workdir), keep=None, read_only=True) as ckpt:
        steps = [s for s in ckpt.all_steps() if s > 0]
    per_prompt = [reply_logp(cfg, warm, pairs, batch_size)]
    for step in steps:
        _, params, _, _ = builders.load_model(str(run.workdir), step=step)
        params = jax.tree.map(lambda w, p: jnp.asarray(p, w.dtype), warm, params)
        per_prompt.append(reply_logp(cfg, params, pairs, batch_size))
    # Cumulative executor rollouts as the report counts them (`runs.executed_rollouts`).
    rollouts = {int(r["step"]): float(r["rollouts/total"]) for r in run.metrics
                if "step" in r and "rollouts/total" in r}
    out = {"steps": [0] + steps, "rollouts": [0.0] + [rollouts.get(s, float("nan")) for s in steps],
           "mean_logp": [float(v.mean()) for v in per_prompt],
           "per_prompt": [[float(x) for x in v] for v in per_prompt],
           "task_ids": [t.task_id for t in tasks], "reply": tokenizer.decode(pairs[0][1])}
    metrics_lib.write_json(str(run.workdir / OUTPUT), out)
    return out


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", required=True, help="a names_* training workdir")
    parser.add_argument("--prompts", type=int, default=64, help="hidden-name held-out prompts")
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args(argv)
    out = measure(args.run, args.prompts, args.batch_size)
    print("| step | executor rollouts | mean log p(the expert's lookup opening) |\n|---|---|---|")
    for step, rollouts, value in zip(out["steps"], out["rollouts"], out["mean_logp"]):
        print(f"| {step} | {rollouts:.0f} | {value:.2f} |")
    return out


if __name__ == "__main__":
    main()
