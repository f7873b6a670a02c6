"""A benchmark of this checkout beside the same benchmark at another git revision, run alternately
on the same machine, so that a change is judged by a ratio against its peer, not by absolute figures.

    python perf/compare_revisions.py --base 8f237ba --rounds 2 -- --batches 1 8 64

Each round runs `perf/rollout_bench.py <args> --out ...` once in a temporary worktree of
`--base` and once here (alternating which goes first), then prints per batch the median JAX tok/s of
each side, their ratio, and the same ratio for transformers `generate`, which is the same code on
both sides: its ratio shows how much the machine drifted between the runs.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parents[1]


def run_bench(checkout: pathlib.Path, bench_args: list[str], out: pathlib.Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(checkout), "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu")}
    cmd = [sys.executable, "perf/rollout_bench.py", *bench_args, "--out", str(out)]
    subprocess.run(cmd, cwd=checkout, env=env, check=True, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


def by_batch(results: list[dict], key: str) -> dict[int, float]:
    values: dict[int, list[float]] = {}
    for result in results:
        for row in result["rows"]:
            if row.get(key):
                values.setdefault(row["batch"], []).append(row[key])
    return {b: statistics.median(v) for b, v in sorted(values.items())}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="git revision to compare against")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("bench_args", nargs=argparse.REMAINDER, help="after --: rollout_bench.py arguments")
    args = parser.parse_args(argv)
    bench_args = [a for a in args.bench_args if a != "--"]
    results: dict[str, list[dict]] = {"base": [], "here": []}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        base_tree = tmp / "base"
        subprocess.run(["git", "worktree", "add", "--detach", str(base_tree), args.base], cwd=REPO, check=True,
                       capture_output=True)
        try:
            for r in range(args.rounds):
                order = [("base", base_tree), ("here", REPO)]
                for side, checkout in (order if r % 2 == 0 else order[::-1]):
                    results[side].append(run_bench(checkout, bench_args, tmp / f"{side}_{r}.json"))
                    print(f"round {r + 1}/{args.rounds}: {side} done", file=sys.stderr, flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base_tree)], cwd=REPO, capture_output=True)
    jax_base, jax_here = by_batch(results["base"], "jax_tokens_per_s"), by_batch(results["here"], "jax_tokens_per_s")
    hf_base, hf_here = by_batch(results["base"], "hf_tokens_per_s"), by_batch(results["here"], "hf_tokens_per_s")
    print(f"# rollout_bench.py {' '.join(bench_args)}: {args.base} vs this checkout, {args.rounds} rounds, "
          f"medians; {results['here'][0]['machine']}")
    print("| batch | base JAX tok/s | here JAX tok/s | here / base | HF here / base (drift) |")
    print("|-------|----------------|----------------|-------------|------------------------|")
    for b in jax_here:
        drift = f"{hf_here[b] / hf_base[b]:.3f}" if b in hf_here and b in hf_base else "-"
        print(f"| {b:>5} | {jax_base[b]:>14.0f} | {jax_here[b]:>14.0f} | {jax_here[b] / jax_base[b]:>11.3f} | "
              f"{drift:>22} |")
    print(f"reproduce: python perf/compare_revisions.py --base {args.base} --rounds {args.rounds} -- "
          + " ".join(bench_args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
