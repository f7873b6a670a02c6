"""Rollout throughput of the JAX sampler (`JaxPolicy`) and vLLM (`VllmPolicy`) side by side, on the
same model and prompts, in one process.

Default: the tiny warm-start model (assets/testbed_warmstart, ~1M params), prompt 128, 64 new
tokens, batch 8 and 64, sampling at temperature 1 with no top-k/top-p and no end-of-turn id, so
every row generates exactly 64 tokens. Each side is timed end to end (prefill + decode) through
the policy's `generate`, after one warm-up call (JAX compilation, vLLM's first-call costs); the
median of `--reps` runs is reported. Needs vLLM (requirements-vllm.txt: its own venv on a CPU):

    VLLM_CPU_KVCACHE_SPACE=1 .venv-vllm/bin/python perf/vllm_vs_jax_bench.py
    .venv-vllm/bin/python perf/vllm_vs_jax_bench.py --hf_dir /data/Qwen2.5-0.5B-Instruct --batch 64,256
"""
from __future__ import annotations

import argparse
import os
import platform
import shlex
import statistics
import sys
import time

import numpy as np

from hsjax.models import load_pretrained
from hsjax.policies.base import SamplingParams
from hsjax.policies.jax_policy import JaxPolicy
from hsjax.policies.vllm_policy import VllmOptions, VllmPolicy

WARMSTART = os.path.join(os.path.dirname(__file__), "..", "assets", "testbed_warmstart")


def timed(policy, prompts, sampling, reps):
    policy.generate(prompts, sampling)  # warm-up
    times, tokens = [], 0
    for _ in range(reps):
        t = time.perf_counter()
        gens = policy.generate(prompts, sampling)
        times.append(time.perf_counter() - t)
        tokens = sum(len(g.ids) for g in gens)
    return tokens, statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hf_dir", default=WARMSTART)
    ap.add_argument("--batch", default="8,64")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    cfg, params, tok = load_pretrained(args.hf_dir)
    batches = [int(b) for b in args.batch.split(",")]
    jax_policy = JaxPolicy(cfg, params, tok, eos_ids=(), batch_buckets=tuple(batches))
    vllm_policy = VllmPolicy(cfg, params, tok, eos_ids=(), options=VllmOptions(
        engine_kwargs=dict(max_model_len=args.prompt + args.new, max_num_seqs=max(batches))))
    sampling = SamplingParams(temperature=1.0, max_new_tokens=args.new)
    rng = np.random.default_rng(0)
    rows = []
    for b in batches:
        prompts = rng.integers(3, cfg.vocab_size, size=(b, args.prompt)).tolist()
        for name, policy in (("jax", jax_policy), ("vllm", vllm_policy)):
            tokens, seconds = timed(policy, prompts, sampling, args.reps)
            rows.append((name, b, tokens, seconds, tokens / seconds))
    print(f"model {args.hf_dir} ({cfg.num_layers} layers, d={cfg.hidden_size}, V={cfg.vocab_size}, {cfg.dtype}), "
          f"prompt {args.prompt}, {args.new} new tokens, T=1, median of {args.reps}; "
          f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores")
    print(f"{'backend':8} {'batch':>5} {'tokens':>7} {'seconds':>8} {'tokens/s':>9}")
    for name, b, tokens, seconds, tps in rows:
        print(f"{name:8} {b:5d} {tokens:7d} {seconds:8.3f} {tps:9.0f}")
    print("command:", shlex.join([os.path.basename(sys.executable), *sys.argv]))
    vllm_policy.close()


if __name__ == "__main__":
    main()
