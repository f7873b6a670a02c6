"""The GRPO update with rows grouped by length (`batch.group_by_length`) against the padded one.

The batch mixes lengths the way the testbed's names arms do (docs/results.md, "the learning-rate
pilot"): G groups x (n base + R rescue) slots, most rows a few hundred tokens, a few past 512 so
the padded update runs every row at the 1,024 bucket, and half the rescue slots empty (groups
that were not rescued). Both updates run side by side, alternating, on the same batch; the table
gives the median step time of each, their ratio, and the gradient norms (equal up to float
reordering). The model is the names warm start's shape (`--hf-dir`, default the shipped asset)
with random weights: the cost does not depend on their values. Nothing is downloaded.

    python perf/length_grouping_bench.py                  # about 3 minutes on 2 CPU cores
"""
import argparse
import json
import platform
import statistics
import sys
import time

import jax
import numpy as np

from hsjax.models.hf import load_config
from hsjax.models.model import init_params
from hsjax.rl import grpo
from hsjax.rl.batch import TrainBatch, bucket_length, group_by_length
from hsjax.rl.losses import LossConfig
from hsjax.rl.optim import make_optimizer


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hf-dir", default="assets/testbed_names_warmstart", help="model shape")
    p.add_argument("--groups", type=int, default=8)
    p.add_argument("--n", type=int, default=4)
    p.add_argument("--R", type=int, default=4)
    p.add_argument("--micro-batches", type=int, default=2)
    p.add_argument("--buckets", default="256,512,1024")
    p.add_argument("--long-rows", type=int, default=3, help="rows of 600-700 tokens")
    p.add_argument("--steps", type=int, default=4, help="timed updates of each kind")
    p.add_argument("--out", help="write the results as JSON to this file")
    return p.parse_args(argv)


def mixed_batch(G, n, R, long_rows, T_buckets, vocab_size, seed=0) -> TrainBatch:
    """Base rows of 300-520 tokens (`long_rows` of them 600-700), the rescue slots of every other
    group filled the same way, the rest empty; a prompt of 200 untrained tokens per row."""
    rng = np.random.default_rng(seed)
    S, B = n + R, G * (n + R)
    slot_B = np.tile(np.arange(S, dtype=np.int32), G)
    group_B = np.repeat(np.arange(G, dtype=np.int32), S)
    is_rescue_B = slot_B >= n
    valid_B = ~is_rescue_B | (group_B % 2 == 1)
    length_B = np.where(valid_B, rng.integers(300, 521, B), 0)
    length_B[rng.choice(np.flatnonzero(~is_rescue_B), long_rows, replace=False)] = rng.integers(600, 701, long_rows)
    T = bucket_length(int(length_B.max()), T_buckets)
    filled_BxT = np.arange(T) < length_B[:, None]
    loss_mask_BxT = filled_BxT & (np.arange(T) >= 200)
    reward_B = np.where(valid_B, rng.integers(0, 2, B), 0).astype(np.float32)
    return TrainBatch(
        tokens_BxT=np.where(filled_BxT, rng.integers(1, vocab_size, (B, T)), 0).astype(np.int32),
        positions_BxT=np.where(filled_BxT, np.arange(T), -1).astype(np.int32),
        segment_ids_BxT=filled_BxT.astype(np.int32), loss_mask_BxT=loss_mask_BxT,
        old_logp_BxT=np.where(loss_mask_BxT, -rng.random((B, T)) * 4, 0).astype(np.float32),
        reward_B=reward_B, group_B=group_B, slot_B=slot_B,
        harness_B=np.where(valid_B, is_rescue_B.astype(np.int32), -1).astype(np.int32),
        is_rescue_B=is_rescue_B, valid_B=valid_B, recontext_B=np.zeros(B, bool),
        overlong_B=np.zeros(B, bool), num_groups=G)


def run(args) -> dict:
    cfg = load_config(args.hf_dir)
    buckets = [int(b) for b in args.buckets.split(",")]
    optimizer = make_optimizer(learning_rate=1e-6, warmup_steps=1, total_steps=1000)
    state = grpo.init_train_state(init_params(cfg, jax.random.key(0)), optimizer, jax.random.key(1))
    batch = mixed_batch(args.groups, args.n, args.R, args.long_rows, buckets, cfg.vocab_size)
    grouped, micro_T = group_by_length(batch, args.micro_batches, buckets)
    step = grpo.jit_train_step(cfg, LossConfig(), optimizer, num_micro_batches=args.micro_batches)
    kinds = {"padded": (jax.device_put(batch), None), "grouped": (jax.device_put(grouped), micro_T)}
    times = {k: [] for k in kinds}
    compile_s, grad_norm = {}, {}
    for i in range(args.steps + 1):
        for kind, (b, mt) in kinds.items():
            t0 = time.perf_counter()
            new_state, metrics = step(jax.tree.map(lambda x: x.copy(), state), b, micro_T=mt)
            jax.block_until_ready((new_state, metrics))
            elapsed = time.perf_counter() - t0
            if i == 0:
                compile_s[kind], grad_norm[kind] = elapsed, float(metrics["grad_norm"])
            else:
                times[kind].append(elapsed)
    median = {k: statistics.median(v) for k, v in times.items()}
    length_B = (batch.positions_BxT >= 0).sum(1)
    return dict(hf_dir=args.hf_dir, rows=int(batch.shape[0]), T=int(batch.shape[1]),
                filled_rows=int((length_B > 0).sum()), tokens=int(length_B.sum()),
                micro_batches=args.micro_batches, micro_T=list(micro_T), buckets=buckets,
                compile_and_first_step_s=compile_s, step_s_median=median, step_s_all=times,
                speedup=median["padded"] / median["grouped"], grad_norm=grad_norm,
                device=str(jax.devices()[0].device_kind), node=platform.node(), jax=jax.__version__)


def main(argv=None):
    args = parse_args(argv)
    command = " ".join(["python", "perf/length_grouping_bench.py"] + (sys.argv[1:] if argv is None else argv))
    r = run(args)
    print(f"\nGRPO update, padded vs grouped by length ({r['device']}, jax {r['jax']})")
    print(f"  batch: {r['rows']} rows ({r['filled_rows']} filled, {r['tokens']:,} tokens) x T={r['T']}, "
          f"{r['micro_batches']} micro-batches; grouped lengths {r['micro_T']}")
    print(f"  {'update':<8} {'compile+1st s':>13} {'step s (median)':>16} {'grad norm':>10}")
    for kind in ("padded", "grouped"):
        print(f"  {kind:<8} {r['compile_and_first_step_s'][kind]:>13.1f} "
              f"{r['step_s_median'][kind]:>16.2f} {r['grad_norm'][kind]:>10.4f}")
    print(f"  speed-up (padded / grouped): {r['speedup']:.2f}x")
    print(f"  command: {command}\n")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(r | {"command": command}, f, indent=2)


if __name__ == "__main__":
    main()
