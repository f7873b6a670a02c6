"""Sampler throughput against `transformers` `generate`, on the same random weights.

CPU (no arguments): the ~20M `small20m` preset, prompt 256, 128 new tokens, batch 1, 8 and 64,
sampling at temperature 1 with no top-k/top-p on both sides and no end-of-sequence id, so every
row generates exactly 128 tokens. Both sides are timed end to end (prefill + decode), after a
warm-up call (JAX compilation, torch first-call costs); the median of `--reps` runs is reported.

`--hf-dir DIR` times a real model's weights instead (e.g. SmolLM2-135M-Instruct,
`.cache/models/smollm2-135m-instruct` from scripts/fetch_smollm2.sh), on the CPU, against
transformers loading the same directory.

GPU (`--gpu`): a Qwen2-0.5B-shaped random model in bf16, prompt 512, 256 new tokens, batch 64.
Reports tokens/s, the decode step time (from a 256-token and a 1-token run), and decode
throughput as a fraction of the HBM roofline: bytes read per decode step (all weights + the KV
cache of the average context) / the bandwidth of a large on-device copy measured in this script.
With torch + CUDA available, transformers `generate` runs side by side.

    python perf/rollout_bench.py                    # CPU table
    python perf/rollout_bench.py --gpu --out r.json # GPU row, JSON to r.json
    python perf/rollout_bench.py --hf-dir .cache/models/smollm2-135m-instruct --batches 8 --prompt 1024 --new 32 --reps 1
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time

import numpy as np


import jax
import jax.numpy as jnp

from hsjax.infra.model_loading import load_model
from hsjax.models import get_preset, init_params, save_pretrained
from hsjax.policies.base import SamplingParams
from hsjax.policies.sampler import Sampler


def _median_time(fn, reps):
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _prompts(vocab, batch, length, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(1, vocab, size=(batch, length)).tolist()


def time_jax(cfg, params, batch, prompt_len, new_tokens, reps, max_new_min=16, kv_dtype=""):
    sampler = Sampler(cfg, eos_ids=(), max_new_min=max_new_min, kv_dtype=kv_dtype)
    prompts = _prompts(cfg.vocab_size, batch, prompt_len)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=new_tokens)
    keys = iter(jax.random.split(jax.random.PRNGKey(0), reps + 1))

    def run():
        outs = sampler.generate(params, prompts, sampling, next(keys))
        assert all(len(o.ids) == new_tokens for o in outs)

    t0 = time.perf_counter()
    run()  # compiles
    compile_s = time.perf_counter() - t0
    return _median_time(run, reps), compile_s


def time_hf(hf_dir, batch, prompt_len, new_tokens, reps, device="cpu", dtype="float32"):
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(
        hf_dir, dtype=getattr(torch, dtype), local_files_only=True).to(device).eval()
    vocab = model.config.vocab_size
    ids = torch.tensor(_prompts(vocab, batch, prompt_len), device=device)
    mask = torch.ones_like(ids)
    kwargs = dict(attention_mask=mask, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                  pad_token_id=0, eos_token_id=None)

    def run(n=new_tokens):
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=n, min_new_tokens=n, **kwargs)
        if device != "cpu":
            torch.cuda.synchronize()
        assert out.shape == (batch, prompt_len + n)

    torch.manual_seed(0)
    run(4)  # warm-up
    return _median_time(run, reps)


# ------------------------------------------------------------------------------------- CPU


def cpu_bench(args):
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    if args.hf_dir:
        cfg, params, _, _ = load_model(args.hf_dir)
        weights = contextlib.nullcontext(args.hf_dir)
    else:
        cfg = get_preset(args.preset or "small20m")
        params = jax.jit(init_params, static_argnums=0)(cfg, jax.random.PRNGKey(0))
        weights = tempfile.TemporaryDirectory()
    rows = []
    with weights as hf_dir:
        if not args.hf_dir:
            save_pretrained(params, cfg, None, hf_dir)
        for batch in args.batches:
            jax_s, compile_s = time_jax(cfg, params, batch, args.prompt, args.new, args.reps,
                                        kv_dtype=args.kv_dtype)
            # Prefill + the first token alone: the rest of jax_s is (new - 1) decode steps.
            jax_one_s, _ = time_jax(cfg, params, batch, args.prompt, 1, args.reps, max_new_min=1,
                                    kv_dtype=args.kv_dtype)
            hf_s = hf_one_s = None
            if not args.skip_hf:
                hf_s = time_hf(hf_dir, batch, args.prompt, args.new, args.hf_reps)
                hf_one_s = time_hf(hf_dir, batch, args.prompt, 1, args.hf_reps)
            tokens = batch * args.new
            step = lambda full, one: (full - one) / (args.new - 1) * 1e3  # noqa: E731
            row = {"batch": batch, "prompt": args.prompt, "new_tokens": args.new, "kv_dtype": args.kv_dtype or "float32",
                   "jax_tokens_per_s": tokens / jax_s, "jax_s": jax_s, "jax_compile_s": compile_s,
                   "jax_prefill_s": jax_one_s, "jax_decode_step_ms": step(jax_s, jax_one_s),
                   "hf_tokens_per_s": tokens / hf_s if hf_s else None, "hf_s": hf_s,
                   "hf_prefill_s": hf_one_s, "hf_decode_step_ms": step(hf_s, hf_one_s) if hf_s else None,
                   "speedup": hf_s / jax_s if hf_s else None}
            rows.append(row)
            print(_cpu_row(row), flush=True)
    return {"mode": "cpu", "model": args.hf_dir or args.preset or "small20m", "num_params": cfg.num_params,
            "rows": rows}


def _cpu_row(r):
    dash = lambda x, fmt: format(x, fmt) if x is not None else "-"  # noqa: E731
    speed = f"{r['speedup']:.1f}x" if r["speedup"] else "-"
    return (f"| batch {r['batch']:>3} | {r['jax_tokens_per_s']:>10.0f} | {dash(r['hf_tokens_per_s'], '>10.0f')} | "
            f"{r['jax_compile_s']:>9.1f} | {speed:>8} | {r['jax_prefill_s']:>9.2f} / {dash(r['hf_prefill_s'], '.2f'):>5} | "
            f"{r['jax_decode_step_ms']:>7.1f} / {dash(r['hf_decode_step_ms'], '.1f'):>5} |")


# ------------------------------------------------------------------------------------- GPU


def measure_bandwidth(num_bytes=4 << 30, reps=10):
    """Bytes/s of `x + 1` over a large bf16 array (reads and writes every byte once)."""
    x = jnp.ones((num_bytes // 2,), jnp.bfloat16)
    f = jax.jit(lambda a: a + 1)
    f(x).block_until_ready()
    t = _median_time(lambda: f(x).block_until_ready(), reps)
    return 2 * num_bytes / t


def gpu_bench(args):
    preset = args.preset or "qwen2_0p5b"
    cfg = get_preset(preset, dtype="bfloat16", param_dtype="bfloat16", eos_token_ids=())
    params = jax.jit(init_params, static_argnums=0)(cfg, jax.random.PRNGKey(0))
    batch = args.batches[0] if args.batches_set else 64
    prompt, new = args.prompt, args.new
    print(f"{preset}: {cfg.num_params / 1e6:.0f}M params, batch {batch}, prompt {prompt}, "
          f"{new} new tokens", flush=True)
    full_s, compile_s = time_jax(cfg, params, batch, prompt, new, args.reps)
    print(f"jax: {full_s:.3f} s ({batch * new / full_s:.0f} tok/s), compile+first {compile_s:.1f} s",
          flush=True)
    one_s, _ = time_jax(cfg, params, batch, prompt, 1, args.reps, max_new_min=1)
    step_s = (full_s - one_s) / (new - 1)
    print(f"jax: prefill + 1 token {one_s:.3f} s, decode step {step_s * 1e3:.2f} ms", flush=True)
    bandwidth = measure_bandwidth(args.copy_bytes)
    print(f"copy bandwidth {bandwidth / 1e12:.2f} TB/s", flush=True)
    weight_bytes = cfg.num_params * 2
    avg_context = prompt + new / 2
    kv_bytes = 2 * cfg.num_layers * batch * avg_context * cfg.num_kv_heads * cfg.head_dim * 2
    roofline_step_s = (weight_bytes + kv_bytes) / bandwidth
    result = {"mode": "gpu", "device": str(jax.devices()[0]), "model": preset,
              "num_params": cfg.num_params, "batch": batch, "prompt": prompt, "new_tokens": new,
              "jax_tokens_per_s": batch * new / full_s, "jax_s": full_s,
              "jax_compile_s": compile_s, "prefill_plus_one_s": one_s,
              "decode_step_s": step_s, "decode_tokens_per_s": batch / step_s,
              "copy_bandwidth_bytes_per_s": bandwidth, "bytes_per_decode_step": weight_bytes + kv_bytes,
              "roofline_fraction": roofline_step_s / step_s}
    try:
        import torch

        has_cuda = torch.cuda.is_available() and not args.skip_hf
    except ImportError:
        has_cuda = False
    if has_cuda:
        try:
            with tempfile.TemporaryDirectory() as hf_dir:
                save_pretrained(params, cfg, None, hf_dir)
                hf_s = time_hf(hf_dir, batch, prompt, new, args.hf_reps, device="cuda",
                               dtype="bfloat16")
            result.update(hf_tokens_per_s=batch * new / hf_s, hf_s=hf_s, speedup=hf_s / full_s)
        except Exception as e:  # the JAX numbers stand on their own
            result["hf_error"] = f"{type(e).__name__}: {e}"
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpu", action="store_true", help="Qwen2-0.5B-shaped bf16 run")
    parser.add_argument("--out", help="also write the results as JSON here")
    parser.add_argument("--preset", help="model preset (default small20m, or qwen2_0p5b with --gpu)")
    parser.add_argument("--hf-dir", help="CPU: a real model's HF directory instead of a preset's random weights")
    parser.add_argument("--batches", type=int, nargs="+")
    parser.add_argument("--prompt", type=int)
    parser.add_argument("--new", type=int)
    parser.add_argument("--reps", type=int, default=3, help="timed JAX runs (median)")
    parser.add_argument("--hf-reps", type=int, default=1, help="timed transformers runs (median)")
    parser.add_argument("--copy-bytes", type=int, default=4 << 30)
    parser.add_argument("--skip-hf", action="store_true", help="JAX only")
    parser.add_argument("--kv-dtype", default="", help="the sampler's KV cache dtype: '' (the compute dtype) or bfloat16")
    args = parser.parse_args(argv)
    args.batches_set = args.batches is not None
    args.batches = args.batches or ([64] if args.gpu else [1, 8, 64])
    args.prompt = args.prompt or (512 if args.gpu else 256)
    args.new = args.new or (256 if args.gpu else 128)
    command = "python perf/rollout_bench.py " + " ".join(
        shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    header = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "machine": f"{platform.machine()} {os.cpu_count()} cpus, "
                         f"jax {jax.__version__} on {jax.devices()[0].platform}",
              "load_avg": os.getloadavg() if hasattr(os, "getloadavg") else None,
              "command": command.strip()}
    print(f"# {header['date']}  {header['machine']}  load {header['load_avg']}")
    if args.gpu:
        result = gpu_bench(args)
        print(json.dumps(result, indent=2))
    else:
        print(f"# KV cache {args.kv_dtype or 'float32'}; prefill = prefill + first token")
        print("| batch     | JAX tok/s  | HF tok/s   | compile s | speed-up | prefill s JAX / HF | decode step ms JAX / HF |")
        print("|-----------|------------|------------|-----------|----------|--------------------|-------------------------|")
        result = cpu_bench(args)
    result.update(header)
    print(f"reproduce: {header['command']}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
