"""Whole multi-turn episodes: the JAX policy with and without KV reuse across turns, and
`transformers` `generate` doing the same turns, side by side on the same random weights.

An episode is DBBench-shaped at the token level: an instruction of `--instruction` tokens, then
`--turns` turns of (a reply of exactly `--new` sampled tokens, an observation of `--obs` tokens).
Every row of a batch is one episode; turn t's prompt is turn t-1's prompt + its reply + the next
observation, exactly the token stream the rollout engine hands the policy (`engine.collect`), so
the policy's KV reuse (`hsjax.policies.kv_reuse`) sees what it sees in training. Sampling at T = 1
with no top-k/top-p and no end-of-sequence id on every side, so every side generates the same
number of tokens.

Sides:
  jax full    `JaxPolicy(kv_reuse=False)`: every turn prefills the whole conversation (the engine
              before KV reuse);
  jax reuse   `JaxPolicy(kv_reuse=True)`: every turn prefills only its new tokens;
  hf          `generate` on the whole conversation every turn (what an agent loop over
              transformers does);
  hf cache    `generate` continuing the previous turn's `past_key_values` (transformers' own
              prefix reuse).
Each side runs one warm-up batch of episodes (JAX compiles a program per turn shape), then
`--reps` timed ones (median; transformers `--hf-reps`).

    python perf/multiturn_bench.py                       # batch 32 and 64, 8 turns
    python perf/multiturn_bench.py --batches 8 --turns 4 --skip-hf
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time

import jax
import numpy as np

from hsjax.models import get_preset, init_params, save_pretrained
from hsjax.policies.base import SamplingParams
from hsjax.policies.jax_policy import JaxPolicy


class _NoTokenizer:
    """The policy needs a tokenizer only for stop strings (none here) and reply text."""

    pad_token_id = 0

    def encode(self, text, add_special_tokens=False):
        return []

    def decode(self, ids, skip_special_tokens=False):
        return ""


def episode_tokens(vocab: int, batch: int, args, seed: int = 0):
    """(instructions BxI, observations TxBxO): the fixed, non-generated tokens of every episode."""
    rng = np.random.default_rng(seed)
    instruction = rng.integers(1, vocab, size=(batch, args.instruction))
    observations = rng.integers(1, vocab, size=(args.turns, batch, args.obs))
    return instruction, observations


def run_jax(policy, instruction, observations, new: int, seed: int) -> int:
    """One batch of episodes through `policy`; returns the generated token count."""
    sampling = SamplingParams(temperature=1.0, max_new_tokens=new, seed=seed)
    policy.reseed(seed)
    prompts = [list(map(int, row)) for row in instruction]
    generated = 0
    for turn in range(len(observations)):
        prompts = [p + list(map(int, o)) for p, o in zip(prompts, observations[turn])]
        gens = policy.generate(prompts, sampling, turn_seeds=[(i, turn) for i in range(len(prompts))])
        assert all(len(g.ids) == new for g in gens)
        prompts = [p + g.ids for p, g in zip(prompts, gens)]
        generated += sum(len(g.ids) for g in gens)
    policy.end_rollout()
    return generated


def run_hf(model, instruction, observations, new: int, reuse_cache: bool) -> int:
    import torch

    ids = torch.tensor(instruction)
    generated, cache = 0, None
    kwargs = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, pad_token_id=0,
                  eos_token_id=None, max_new_tokens=new, min_new_tokens=new)
    with torch.no_grad():
        for turn in range(len(observations)):
            ids = torch.cat([ids, torch.tensor(observations[turn])], dim=1)
            if reuse_cache:
                out = model.generate(ids, attention_mask=torch.ones_like(ids), cache=cache,
                                     return_dict_in_generate=True, **kwargs)
                ids, cache = out.sequences, out.cache
            else:
                ids = model.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)
            generated += new * ids.shape[0]
    return generated


def median_time(fn, reps: int) -> tuple[float, int]:
    times, tokens = [], 0
    for _ in range(reps):
        t0 = time.perf_counter()
        tokens = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), tokens


def bench(args) -> list[dict]:
    cfg = get_preset(args.preset, eos_token_ids=())
    params = jax.jit(init_params, static_argnums=0)(cfg, jax.random.PRNGKey(0))
    rows = []
    hf_dir = tempfile.mkdtemp()
    if not args.skip_hf:
        import torch
        import transformers

        torch.set_num_threads(os.cpu_count() or 1)
        torch.manual_seed(0)
        save_pretrained(params, cfg, None, hf_dir)
        model = transformers.AutoModelForCausalLM.from_pretrained(
            hf_dir, dtype=torch.float32, local_files_only=True).eval()
    for batch in args.batches:
        instruction, observations = episode_tokens(cfg.vocab_size, batch, args)
        sides = {}
        for name, reuse in (("jax full", False), ("jax reuse", True)):
            policy = JaxPolicy(cfg, params, _NoTokenizer(), eos_ids=(), kv_reuse=reuse,
                               batch_buckets=(batch,), prompt_step=args.prompt_step)
            t0 = time.perf_counter()
            run_jax(policy, instruction, observations, args.new, seed=0)  # compiles every turn's shape
            warm = time.perf_counter() - t0
            seconds, tokens = median_time(
                lambda: run_jax(policy, instruction, observations, args.new, seed=1), args.reps)
            sides[name] = {"s": seconds, "tokens": tokens, "first_s": warm,
                           "programs": policy.sampler.num_compilations}
        if not args.skip_hf:
            for name, reuse in (("hf", False), ("hf cache", True)):
                run_hf(model, instruction[:, :], observations[:, :, :], 2, reuse)  # warm-up
                seconds, tokens = median_time(
                    lambda: run_hf(model, instruction, observations, args.new, reuse), args.hf_reps)
                sides[name] = {"s": seconds, "tokens": tokens}
        for name, side in sides.items():
            row = {"batch": batch, "side": name, **side, "tokens_per_s": side["tokens"] / side["s"],
                   "episodes_per_s": batch / side["s"], "vs_jax_full": sides["jax full"]["s"] / side["s"]}
            rows.append(row)
            print(table_row(row), flush=True)
    return rows


def table_row(r) -> str:
    return (f"| {r['batch']:>5} | {r['side']:<9} | {r['s']:>8.2f} | {r['tokens_per_s']:>9.0f} | "
            f"{r['episodes_per_s']:>10.2f} | {r['vs_jax_full']:>11.2f}x |")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="small20m")
    parser.add_argument("--batches", type=int, nargs="+", default=[32, 64])
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--instruction", type=int, default=256, help="tokens before the first observation")
    parser.add_argument("--obs", type=int, default=48, help="tokens of each observation")
    parser.add_argument("--new", type=int, default=32, help="tokens of each reply")
    parser.add_argument("--prompt-step", type=int, default=512, help="the sampler's prompt bucket step")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--hf-reps", type=int, default=1)
    parser.add_argument("--skip-hf", action="store_true")
    parser.add_argument("--out", help="also write the rows as JSON here")
    args = parser.parse_args(argv)
    command = "python perf/multiturn_bench.py " + " ".join(
        shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    header = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "machine": f"{platform.machine()} {os.cpu_count()} cpus, jax {jax.__version__} on "
                         f"{jax.devices()[0].platform}",
              "load_avg": os.getloadavg(), "command": command.strip()}
    print(f"# {header['date']}  {header['machine']}  load {header['load_avg']}")
    print(f"# {args.preset}, {args.turns} turns, instruction {args.instruction}, observation {args.obs}, "
          f"reply {args.new} tokens; times per batch of episodes")
    print("| batch | side      | s        | tok/s     | episodes/s | vs jax full |")
    print("|-------|-----------|----------|-----------|------------|-------------|")
    rows = bench(args)
    print(f"reproduce: {header['command']}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({**header, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
