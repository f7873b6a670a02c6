"""`python -m harness_envs.swegym.builder`: builds the offline SWE-Gym instances (pipeline.py)."""
import argparse
import json
import os
import sys

from harness_envs.swegym.builder.pipeline import CACHE_ENV, DEFAULT_CACHE, MAX_PER_REPO, SEED, build
from harness_envs.swegym.builder.packages import PACKAGES


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness_envs.swegym.builder", description=__doc__)
    parser.add_argument("--cache", help=f"cache root (default ${CACHE_ENV}, else {DEFAULT_CACHE})")
    parser.add_argument("--packages", help=f"comma-separated subset of {','.join(p.name for p in PACKAGES)}")
    parser.add_argument("--max-per-repo", type=int, default=MAX_PER_REPO, help="instances kept per package")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="packages built at once")
    parser.add_argument("--isolation", default="auto", help="sandbox of the test runs (auto, bwrap, unshare, none)")
    parser.add_argument("--force", action="store_true", help="rebuild packages even if their cached part is current")
    args = parser.parse_args(argv)
    report = build(args.packages, cache=args.cache, max_per_repo=args.max_per_repo, seed=args.seed, jobs=args.jobs,
                   isolation_mode=args.isolation, force=args.force, log=lambda m: print(m, flush=True))
    print(json.dumps({name: {k: r[k] for k in ("kept", "tried", "suite_tests", "seconds")}
                      for name, r in report["packages"].items()}, indent=1))
    print(f"{report['instances']} instances ({report['splits']}) in {report['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
