"""Throughput of the GRPO update (`hsjax.rl.grpo.train_step`): tokens/s and MFU.

The batch is synthetic (random tokens, every row filled to T, a prompt of T/8 untrained tokens,
rewards that leave some groups all-failed and rescued) and the parameters random: the update's
cost does not depend on their values. Nothing is downloaded.

    python perf/train_bench.py                  # CPU: tiny model, about a minute
    python perf/train_bench.py --gpu --out train_bench.json
        # Qwen2-0.5B shapes, T=2048, remat, cuDNN attention, bf16 compute, f32 master weights

MFU = model FLOPs per step / step time / peak, with model FLOPs per token (every token of B x T)
    6 * N_matmul + 6 * L * n_heads * head_dim * T
where N_matmul counts the weights used in matrix products (all parameters but the input embedding
table; with tied embeddings the table is the LM head and counts once) and the second term is
causal attention (QK^T and AV, forward 2 * 2 * T/2 * n_heads * head_dim per token and layer, times 3
for forward + backward). Rematerialisation is not counted (MFU, not HFU). Peak: 989 TFLOP/s, the
H200 SXM datasheet's dense bf16 figure. CPU runs report no MFU.
"""
import argparse
import json
import os
import platform
import statistics
import sys
import time

import jax
import numpy as np

from hsjax.rl import grpo
from hsjax.rl.batch import TrainBatch
from hsjax.rl.losses import LossConfig
from hsjax.models.model import init_params
from hsjax.models.presets import get_preset
from hsjax.rl.optim import make_optimizer

PEAK_BF16_FLOPS = 989e12
PEAK_SOURCE = "H200 SXM datasheet, dense bf16"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gpu", action="store_true",
                   help="Qwen2-0.5B shapes, T=2048, remat, cuDNN attention, bf16 compute")
    p.add_argument("--preset", help="model preset (default: tiny, or qwen2_0p5b with --gpu)")
    p.add_argument("--T", type=int, help="tokens per row (default 128, or 2048 with --gpu)")
    p.add_argument("--groups", type=int, help="G (default 2, or 4 with --gpu)")
    p.add_argument("--n", type=int, help="base slots per group (default 2, or 8 with --gpu)")
    p.add_argument("--R", type=int, help="rescue slots per group (default 2, or 8 with --gpu)")
    p.add_argument("--micro-batches", type=int, help="micro-batches per update (default 1, or 4 with --gpu)")
    p.add_argument("--steps", type=int, default=5, help="timed updates after the compiling one")
    p.add_argument("--attention", choices=("xla", "cudnn"), help="attention_impl (default cudnn with --gpu)")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), help="compute dtype")
    p.add_argument("--no-remat", action="store_true", help="turn rematerialisation off")
    p.add_argument("--peak-tflops", type=float, default=PEAK_BF16_FLOPS / 1e12,
                   help="peak used for MFU on an accelerator")
    p.add_argument("--out", help="write the results as JSON to this file")
    return p.parse_args(argv)


def settings(args) -> dict:
    gpu = args.gpu
    pick = lambda value, cpu, accel: value if value is not None else (accel if gpu else cpu)
    return dict(
        preset=pick(args.preset, "tiny", "qwen2_0p5b"), T=pick(args.T, 128, 2048),
        G=pick(args.groups, 2, 4), n=pick(args.n, 2, 8), R=pick(args.R, 2, 8),
        micro_batches=pick(args.micro_batches, 1, 4),
        attention_impl=pick(args.attention, "xla", "cudnn"),
        dtype=pick(args.dtype, "float32", "bfloat16"), remat=gpu and not args.no_remat,
        steps=args.steps,
    )


def synthetic_batch(G, n, R, T, vocab_size, seed=0) -> TrainBatch:
    """Full rows of random tokens; group g's base slots succeed iff g is even, its rescue slots
    half succeed, so the batch has ordinary groups, rescued groups and masked rescue slots."""
    rng = np.random.default_rng(seed)
    S = n + R
    B = G * S
    slot_B = np.tile(np.arange(S, dtype=np.int32), G)
    group_B = np.repeat(np.arange(G, dtype=np.int32), S)
    is_rescue_B = slot_B >= n
    reward_B = np.where(is_rescue_B, slot_B % 2, (group_B % 2 == 0) * (slot_B % 2)).astype(np.float32)
    loss_mask_BxT = np.broadcast_to(np.arange(T) >= T // 8, (B, T)).copy()
    return TrainBatch(
        tokens_BxT=rng.integers(1, vocab_size, (B, T)).astype(np.int32),
        positions_BxT=np.broadcast_to(np.arange(T, dtype=np.int32), (B, T)).copy(),
        segment_ids_BxT=np.ones((B, T), np.int32), loss_mask_BxT=loss_mask_BxT,
        old_logp_BxT=np.where(loss_mask_BxT, -rng.random((B, T)) * 8, 0).astype(np.float32),
        reward_B=reward_B, group_B=group_B, slot_B=slot_B,
        harness_B=np.where(is_rescue_B, 1, 0).astype(np.int32), is_rescue_B=is_rescue_B,
        valid_B=np.ones(B, bool), recontext_B=np.zeros(B, bool), overlong_B=np.zeros(B, bool),
        num_groups=G)


def model_flops_per_token(cfg, params, T) -> tuple[float, int]:
    """(training FLOPs per token, N_matmul) by the formula in the module docstring."""
    total = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
    n_matmul = total if cfg.tie_embeddings else total - int(np.prod(params["embed"].shape))
    attention = 6 * cfg.num_layers * cfg.num_heads * cfg.head_dim * T
    return 6.0 * n_matmul + attention, n_matmul


def run(s: dict, peak_flops: float) -> dict:
    backend = jax.default_backend()
    cfg = get_preset(s["preset"], dtype=s["dtype"], param_dtype="float32", remat=s["remat"],
                     attention_impl=s["attention_impl"])
    if s["attention_impl"] == "cudnn" and backend != "gpu":
        raise SystemExit(f"attention_impl='cudnn' needs a GPU; jax sees '{backend}'. Install the "
                         "CUDA build of jax, or pass --attention xla.")
    params = init_params(cfg, jax.random.key(0))
    optimizer = make_optimizer(learning_rate=1e-6, warmup_steps=1, total_steps=1000)
    state = grpo.init_train_state(params, optimizer, jax.random.key(1))
    batch = jax.device_put(synthetic_batch(s["G"], s["n"], s["R"], s["T"], cfg.vocab_size))
    step = grpo.jit_train_step(cfg, LossConfig(), optimizer, num_micro_batches=s["micro_batches"])

    t0 = time.perf_counter()
    state, metrics = step(state, batch)
    jax.block_until_ready((state, metrics))
    compile_s = time.perf_counter() - t0
    times = []
    for _ in range(s["steps"]):
        t0 = time.perf_counter()
        state, metrics = step(state, batch)
        jax.block_until_ready((state, metrics))
        times.append(time.perf_counter() - t0)

    B = s["G"] * (s["n"] + s["R"])
    tokens = B * s["T"]
    step_s = statistics.median(times)
    flops_per_token, n_matmul = model_flops_per_token(cfg, params, s["T"])
    accelerator = backend != "cpu"
    result = dict(s, backend=backend, device=str(jax.devices()[0].device_kind),
                  jax=jax.__version__, rows=B, tokens_per_step=tokens, n_matmul_params=n_matmul,
                  compile_and_first_step_s=compile_s, step_s_median=step_s,
                  step_s_all=times, tokens_per_s=tokens / step_s,
                  model_tflops_per_step=flops_per_token * tokens / 1e12,
                  achieved_tflops=flops_per_token * tokens / step_s / 1e12,
                  peak_tflops=peak_flops / 1e12 if accelerator else None,
                  mfu=flops_per_token * tokens / step_s / peak_flops if accelerator else None,
                  loss_pg=float(metrics["loss/pg"]), grad_norm=float(metrics["grad_norm"]))
    return result


def print_table(r: dict, command: str) -> None:
    rows = [
        ("device", f"{r['device']} ({r['backend']}), jax {r['jax']}"),
        ("model", f"{r['preset']}: {r['n_matmul_params'] / 1e6:.1f}M matmul params, "
                  f"dtype {r['dtype']}, remat {r['remat']}, attention {r['attention_impl']}"),
        ("batch", f"G={r['G']} x (n={r['n']} + R={r['R']}) = {r['rows']} rows x T={r['T']}, "
                  f"{r['micro_batches']} micro-batches"),
        ("compile + first step", f"{r['compile_and_first_step_s']:.1f} s"),
        ("step (median of %d)" % len(r["step_s_all"]), f"{r['step_s_median'] * 1e3:.1f} ms"),
        ("tokens/s", f"{r['tokens_per_s']:,.0f}"),
        ("model TFLOP/s", f"{r['achieved_tflops']:.2f}"),
        ("MFU", "n/a (CPU run: no MFU is reported)" if r["mfu"] is None
         else f"{100 * r['mfu']:.1f}% of {r['peak_tflops']:.0f} TFLOP/s ({PEAK_SOURCE})"),
    ]
    width = max(len(k) for k, _ in rows)
    print("\nGRPO update throughput (hsjax.rl.grpo.train_step)")
    for key, value in rows:
        print(f"  {key:<{width}}  {value}")
    print(f"  {'command':<{width}}  {command}\n")


def main(argv=None):
    args = parse_args(argv)
    s = settings(args)
    command = " ".join(["python", "perf/train_bench.py"] + (sys.argv[1:] if argv is None else argv))
    if args.gpu and jax.default_backend() != "gpu":
        raise SystemExit(f"--gpu asked for, but jax sees backend '{jax.default_backend()}' "
                         f"({jax.devices()}). Install jax with the CUDA plugin on a GPU machine.")
    print(f"train_bench: {s} on {jax.devices()[0].device_kind} ({platform.node()})", flush=True)
    result = run(s, args.peak_tflops * 1e12)
    result["command"] = command
    print_table(result, command)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
