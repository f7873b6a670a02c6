"""The offline SWE-Gym instance builder: real small PyPI packages with procedurally injected bugs,
as SWE-bench records validated by the scorer (pipeline.py says how; packages.py lists what).

    python -m harness_envs.swegym.builder [--cache DIR] [--packages a,b] [--max-per-repo N]
    scripts/setup_swegym.sh            # the same, idempotent, what CI runs
"""
from harness_envs.swegym.builder.packages import PACKAGES, SPLITS
from harness_envs.swegym.builder.pipeline import CACHE_ENV, DEFAULT_CACHE, build, cache_root
from harness_envs.swegym.builder.sources import BuildError

__all__ = ["BuildError", "CACHE_ENV", "DEFAULT_CACHE", "PACKAGES", "SPLITS", "build", "cache_root"]
