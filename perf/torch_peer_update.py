"""A PyTorch peer of the GRPO update, at the shapes of `perf/train_bench.py`: tokens/s and MFU.

The compute path TRL's GRPO trainer uses: transformers' Qwen2 with random weights (the config of
an hsjax preset, `ModelConfig.to_hf_dict`), SDPA attention, gradient checkpointing, float32 master
weights under bfloat16 autocast, the logits of every position, log-softmax and gather, the
clipped-ratio policy loss of `hsjax/rl/losses.py` (ratio = exp(logp - old_logp), eps_low 0.2,
eps_high 0.28, token mean over the trained tokens, normalised by the whole batch's count, so the
micro-batches' gradients add up to the full batch's), global-norm clipping at 1.0 and AdamW
(fused on CUDA). The batch is `train_bench.synthetic_batch` (the same rows, rewards and mask);
advantages are group-normalised rewards (their values do not change the cost). Eager mode.

    python perf/torch_peer_update.py --gpu --out peer.json   # Qwen2-0.5B, 64 x 2,048, 4 micro
    python perf/torch_peer_update.py                          # CPU: tiny shapes, seconds

MFU uses train_bench's formula and peak (model FLOPs per token 6 * N_matmul + 6 * L * n_heads *
head_dim * T; 989 TFLOP/s dense bf16), so the two benchmarks' rows compare directly.
"""
import argparse
import json
import os
import statistics
import sys
import time

import numpy as np
import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_bench import PEAK_BF16_FLOPS, synthetic_batch  # noqa: E402

from hsjax.models.presets import get_preset  # noqa: E402
from hsjax.rl.losses import LossConfig  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gpu", action="store_true", help="Qwen2-0.5B shapes, T=2048, 4 micro-batches, CUDA")
    p.add_argument("--preset", help="hsjax model preset (default tiny, or qwen2_0p5b with --gpu)")
    p.add_argument("--T", type=int, help="tokens per row (default 128, or 2048 with --gpu)")
    p.add_argument("--groups", type=int, help="G (default 2, or 4 with --gpu)")
    p.add_argument("--n", type=int, help="base slots per group (default 2, or 8 with --gpu)")
    p.add_argument("--R", type=int, help="rescue slots per group (default 2, or 8 with --gpu)")
    p.add_argument("--micro-batches", type=int, help="default 1, or 4 with --gpu")
    p.add_argument("--steps", type=int, default=5, help="timed updates after the first one")
    p.add_argument("--peak-tflops", type=float, default=PEAK_BF16_FLOPS / 1e12)
    p.add_argument("--out", help="write the results as JSON to this file")
    return p.parse_args(argv)


def group_advantages(reward_B, group_B, num_groups, eps=1e-6):
    """(r - group mean) / (group std + eps): the GRPO estimator's shape of work, in numpy."""
    adv_B = np.zeros_like(reward_B)
    for g in range(num_groups):
        rows = group_B == g
        adv_B[rows] = (reward_B[rows] - reward_B[rows].mean()) / (reward_B[rows].std() + eps)
    return adv_B


def clipped_policy_loss(logp_BxT, old_logp_BxT, adv_B, mask_BxT, denominator, cfg: LossConfig):
    """Sum over trained tokens of max(-A ratio, -A clip(ratio)), divided by the batch's count."""
    log_ratio = torch.where(mask_BxT, logp_BxT - old_logp_BxT, torch.zeros_like(logp_BxT))
    ratio = torch.exp(log_ratio)
    clipped = torch.clamp(ratio, 1.0 - cfg.eps_low, 1.0 + cfg.eps_high)
    per_token = torch.maximum(-adv_B[:, None] * ratio, -adv_B[:, None] * clipped)
    return torch.sum(per_token * mask_BxT) / denominator


def run(args) -> dict:
    gpu = args.gpu
    pick = lambda value, cpu, accel: value if value is not None else (accel if gpu else cpu)  # noqa: E731
    preset = pick(args.preset, "tiny", "qwen2_0p5b")
    T, G = pick(args.T, 128, 2048), pick(args.groups, 2, 4)
    n, R, micro = pick(args.n, 2, 8), pick(args.R, 2, 8), pick(args.micro_batches, 1, 4)
    device = torch.device("cuda" if gpu else "cpu")
    if gpu and not torch.cuda.is_available():
        raise SystemExit("--gpu asked for, but torch sees no CUDA device")
    cfg = get_preset(preset)
    hf = transformers.Qwen2Config(**{k: v for k, v in cfg.to_hf_dict().items()
                                     if k not in ("architectures", "torch_dtype", "dtype")})
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM._from_config(hf, attn_implementation="sdpa",
                                                       torch_dtype=torch.float32).to(device)
    if hasattr(model, "activation_checkpointing_enable"):  # its name from transformers 5.2x on
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.01, fused=gpu)
    loss_cfg = LossConfig()

    batch = synthetic_batch(G, n, R, T, cfg.vocab_size)
    B = G * (n + R)
    tensor = lambda x: torch.as_tensor(np.asarray(x)).to(device)  # noqa: E731
    tokens, positions = tensor(batch.tokens_BxT).long(), tensor(batch.positions_BxT).long()
    old_logp = tensor(batch.old_logp_BxT)
    # Trained: the loss mask, never position 0 (no prediction), as hsjax's target_mask.
    mask_np = batch.loss_mask_BxT & (np.arange(T) > 0)
    mask = tensor(mask_np)
    adv = tensor(group_advantages(batch.reward_B, batch.group_B, G)).float()
    denominator = float(mask_np.sum())

    def step():
        optimizer.zero_grad(set_to_none=True)
        for m in range(micro):
            rows = slice(m, B, micro)  # strided, as hsjax's micro-batches
            with torch.autocast(device.type, dtype=torch.bfloat16):
                out = model(input_ids=tokens[rows], position_ids=positions[rows])
            logits = out.logits.float()  # B x T x V; the prediction of token t sits at t - 1
            logp = torch.log_softmax(logits[:, :-1], dim=-1).gather(
                -1, tokens[rows][:, 1:, None])[..., 0]
            logp = torch.nn.functional.pad(logp, (1, 0))
            loss = clipped_policy_loss(logp, old_logp[rows], adv[rows], mask[rows], denominator,
                                       loss_cfg)
            loss.backward()
            del out, logits, logp
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        return loss

    sync = torch.cuda.synchronize if gpu else (lambda: None)
    t0 = time.perf_counter()
    step()
    sync()
    first_s = time.perf_counter() - t0
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - t0)
    n_params = sum(p.numel() for p in model.parameters())
    n_matmul = n_params if cfg.tie_embeddings else n_params - cfg.vocab_size * cfg.hidden_size
    flops_per_token = 6.0 * n_matmul + 6 * cfg.num_layers * cfg.num_heads * cfg.head_dim * T
    step_s = statistics.median(times)
    tokens_per_step = B * T
    peak = args.peak_tflops * 1e12
    return dict(preset=preset, T=T, G=G, n=n, R=R, rows=B, micro_batches=micro, device=str(
        torch.cuda.get_device_name() if gpu else "cpu"), torch=torch.__version__,
        transformers=transformers.__version__, n_matmul_params=n_matmul, first_step_s=first_s,
        step_s_median=step_s, step_s_all=times, tokens_per_s=tokens_per_step / step_s,
        mfu=flops_per_token * tokens_per_step / step_s / peak if gpu else None,
        peak_memory_gib=torch.cuda.max_memory_allocated() / 2**30 if gpu else None)


def main(argv=None):
    args = parse_args(argv)
    command = " ".join(["python", "perf/torch_peer_update.py"] + (sys.argv[1:] if argv is None else argv))
    r = run(args)
    r["command"] = command
    mfu = "n/a (CPU)" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%"
    print(f"\nPyTorch peer update ({r['device']}, torch {r['torch']}, transformers {r['transformers']})")
    print(f"  {r['preset']}: {r['rows']} rows x T={r['T']}, {r['micro_batches']} micro-batches, "
          f"step {r['step_s_median'] * 1e3:.1f} ms (median of {len(r['step_s_all'])}), "
          f"{r['tokens_per_s']:,.0f} tokens/s, MFU {mfu}")
    print(f"  command: {command}\n")
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(r, f, indent=2)


if __name__ == "__main__":
    main()
