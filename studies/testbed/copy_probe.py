"""Where an SFT warm start of testbed v2 still spends its loss: per-token loss by token class.

    python -m studies.testbed.copy_probe --sft W_sft [--step 1500] [--split distinct_train]

The gates (`gates.py`) run whole episodes; this probe answers the cheaper question a running SFT
raises: has the policy learnt to *copy* names yet? It rolls out the scripted expert on `--tasks`
fresh tasks (task seed `--seed`, which SFT never used) exactly as SFT renders them, scores every
policy token of those streams teacher-forced under the checkpoint, and splits the loss by what
the token is:

    name      a syllable of one of the task's coined names (in a reply: a name being copied)
    word      other letters (SQL keywords, the protocol's words)
    number    digits
    other     punctuation, spaces, end of turn

A policy that copies spends a fraction of a nat on `name` tokens; one that has learnt the protocol
but not the copy spends about the log of the number of syllables in the context (docs/results.md,
"Testbed v2"). Prints a table; `--out` writes it as JSON.
"""
from __future__ import annotations

import argparse
import json

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from hsjax import builders
from hsjax.infra import metrics as metrics_lib
from hsjax.models.model import forward
from hsjax.rl import losses
from studies.testbed import sft_data

CLASSES = ("name", "word", "number", "other")


def name_syllables(task) -> set[str]:
    """The two-letter syllables of the task's coined names (table, columns, text cells)."""
    table = task.table
    words = {table.name, *table.columns, *(str(c) for row in table.rows for c in row if str(c).isalpha())}
    return {w[i:i + 2] for w in words for i in range(0, len(w), 2)}


def token_class(piece: str, syllables: set[str]) -> str:
    text = piece.strip()
    if text in syllables:
        return "name"
    if text.isalpha():
        return "word"
    if text.isdigit():
        return "number"
    return "other"


def probe(config, params, cfg, tokenizer, tasks, *, length: int = 1024) -> dict:
    """{class: {"n", "mean_nats", "share", "over_1_nat"}} over the policy tokens of the expert's
    SFT streams on `tasks` (the run's SFT mix of harnesses and styles)."""
    bench = builders.make_benchmark(config)
    pool = builders.load_pool(config, bench)
    jobs = sft_data.sft_jobs(tasks, config)
    score = jax.jit(lambda p, tokens_BxT, positions_BxT: losses.token_logp(
        forward(cfg, p, tokens_BxT, positions_BxT)[0], tokens_BxT)[0])
    nats = {c: [] for c in CLASSES}
    for job in jobs:
        segments, _ = sft_data.expert_streams([job], pool, tokenizer, config, bench)
        syllables = name_syllables(job[0])
        for seg in segments:
            tokens = np.asarray(seg.tokens)
            if len(tokens) > length:
                raise ValueError(f"a stream of {len(tokens)} tokens; raise length (now {length})")
            logp = np.asarray(score(params, jnp.asarray(np.pad(tokens, (0, length - len(tokens))))[None],
                                    jnp.arange(length)[None]))[0]
            for i in np.nonzero(np.asarray(seg.loss_mask))[0]:
                nats[token_class(tokenizer.decode([int(tokens[i])]), syllables)].append(-float(logp[i]))
    total = sum(sum(v) for v in nats.values())
    return {c: {"n": len(v), "mean_nats": float(np.mean(v)) if v else 0.0,
                "share": sum(v) / total if total else 0.0,
                "over_1_nat": float(np.mean(np.asarray(v) > 1.0)) if v else 0.0} for c, v in nats.items()}


def format_table(result: dict, header: str) -> str:
    lines = [header, f"{'class':<8}{'tokens':>8}{'mean nats':>11}{'share of loss':>15}{'> 1 nat':>9}"]
    for c, r in result.items():
        lines.append(f"{c:<8}{r['n']:>8}{r['mean_nats']:>11.3f}{r['share']:>15.2f}{r['over_1_nat']:>9.2f}")
    return "\n".join(lines)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sft", required=True, help="an SFT workdir (its config.json and checkpoints/)")
    parser.add_argument("--step", type=int, default=None, help="a checkpoint step (default: the latest)")
    parser.add_argument("--split", default="", help="task split (default: the run's data.train_split)")
    parser.add_argument("--seed", type=int, default=5, help="task seed; SFT used data.task_seed")
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--out", default="")
    args = parser.parse_args(argv)
    with open(f"{args.sft}/config.json") as f:
        config = ml_collections.ConfigDict(json.load(f))
    cfg, params, tokenizer, _ = builders.load_model(args.sft, step=args.step)
    split = args.split or config.data.train_split
    bench = builders.make_benchmark(config)
    tasks = builders.load_split(bench, split, seed=args.seed, limit=args.tasks)
    result = probe(config, params, cfg, tokenizer, tasks)
    step = args.step if args.step is not None else "latest"
    print(format_table(result, f"{args.sft} step {step}: {split} seed {args.seed}, {len(tasks)} tasks"))
    if args.out:
        metrics_lib.write_json(args.out, {"sft": args.sft, "step": step, "split": split, "seed": args.seed,
                                          "tasks": len(tasks), "classes": result})
    return result


if __name__ == "__main__":
    main()
