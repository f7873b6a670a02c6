"""The head and its log-probs, forward + backward: a block of positions at a time against the head
fused with the log-softmax over vocabulary blocks (`hsjax/rl/fused_head.py`), and the plain dense
head where its logits fit, at the same block budget.

Each case times `jax.grad` of sum(w * logp) with respect to the last hidden states and the tied
head (what the GRPO update differentiates), compiled, median of `--repeats` calls after the
compiling one. The three paths run side by side, alternating, on the same inputs; the gradients
are checked to agree. Random weights, float32; nothing is downloaded.

    python perf/head_bench.py                   # CPU: the testbed's tiny head, a 0.5B head
    python perf/head_bench.py --cases qwen:2x512 --block-mib 64
"""
import argparse
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from hsjax.models.memory_plan import plan_of, rows_per_block, vocab_block
from hsjax.models.model import head_weight, init_params, logits
from hsjax.models.presets import get_preset
from hsjax.rl.losses import token_logp_chunked, token_logp_fused

HEADS = {"tiny": ("tiny", {}), "qwen": ("qwen2_0p5b", {"num_layers": 1})}
DEFAULT_CASES = ("tiny:64x2048", "tiny:64x1024", "tiny:8x2048", "qwen:2x512", "qwen:1x2048")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", nargs="*", default=list(DEFAULT_CASES),
                   help="head:ROWSxT, head one of %s" % sorted(HEADS))
    p.add_argument("--block-mib", type=int, help="block budget (default: this device's memory plan)")
    p.add_argument("--repeats", type=int, default=3)
    return p.parse_args(argv)


def one_case(name: str, rows: int, seq: int, budget: int, repeats: int) -> dict:
    preset, overrides = HEADS[name]
    cfg = get_preset(preset, **overrides)
    params = init_params(cfg, jax.random.key(0))
    parts = {"final_norm": params["final_norm"], "embed": params["embed"]}
    keys = jax.random.split(jax.random.key(1), 3)
    x = jax.random.normal(keys[0], (rows, seq, cfg.hidden_size))
    tokens = jax.random.randint(keys[1], (rows, seq), 0, cfg.vocab_size)
    w = jax.random.normal(keys[2], (rows, seq))
    positions = rows_per_block(seq, rows * cfg.vocab_size * 4, budget)
    block = vocab_block(rows * seq, cfg.vocab_size, budget)

    def by_positions(p, x, chunk=positions):
        fn = lambda h: logits(cfg, h, p["final_norm"], head_weight(cfg, p))  # noqa: E731
        return jnp.sum(w * token_logp_chunked(x, tokens, fn, 1.0, chunk)[0])

    def by_vocab(p, x):
        return jnp.sum(w * token_logp_fused(cfg, p, x, tokens, 1.0, block)[0])

    paths = {"positions": by_positions, "vocab": by_vocab}
    if not positions:  # everything fits: the plain head is the baseline, no blocked path runs
        paths = {"dense": lambda p, x: by_positions(p, x, 0)}
    grads = {k: jax.jit(jax.grad(f, argnums=(0, 1))) for k, f in paths.items()}
    results = {k: jax.block_until_ready(g(parts, x)) for k, g in grads.items()}  # compile
    first = next(iter(results.values()))
    for other in results.values():
        for a, b in zip(jax.tree.leaves(other), jax.tree.leaves(first)):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4 * float(jnp.max(jnp.abs(b))))
    times = {k: [] for k in grads}
    for _ in range(repeats):
        for k, g in grads.items():
            t0 = time.perf_counter()
            jax.block_until_ready(g(parts, x))
            times[k].append(time.perf_counter() - t0)
    return dict(case=f"{name}:{rows}x{seq}", vocab=cfg.vocab_size, width=cfg.hidden_size,
                chunk=positions, block=block, logits_mib=rows * seq * cfg.vocab_size * 4 / 2**20,
                **{"s_" + k: statistics.median(v) for k, v in times.items()})


def main(argv=None):
    args = parse_args(argv)
    budget = (args.block_mib << 20) if args.block_mib else plan_of().block_bytes
    command = " ".join(["python", "perf/head_bench.py"] + (sys.argv[1:] if argv is None else argv))
    print(f"head_bench: {jax.devices()[0].device_kind} ({jax.default_backend()}), jax {jax.__version__}, "
          f"block budget {budget / 2**20:.0f} MiB", flush=True)
    print("\n| case | V x D | logits (MiB) | positions a block | vocab a block | positions (s) "
          "| fused vocab (s) | dense (s) | fused / positions |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for spec in args.cases:
        name, shape = spec.split(":")
        rows, seq = (int(v) for v in shape.split("x"))
        r = one_case(name, rows, seq, budget, args.repeats)
        fmt = lambda k: f"{r['s_' + k]:.3f}" if "s_" + k in r else "–"  # noqa: E731
        ratio = f"{r['s_vocab'] / r['s_positions']:.2f}" if "s_positions" in r else "–"
        print(f"| {r['case']} | {r['vocab']:,} x {r['width']} | {r['logits_mib']:,.0f} | "
              f"{r['chunk'] or 'all'} | {r['block'] or 'all'} | {fmt('positions')} | {fmt('vocab')} "
              f"| {fmt('dense')} | {ratio} |", flush=True)
    print(f"\ncommand: {command}")


if __name__ == "__main__":
    main()
