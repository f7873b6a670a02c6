"""Where the repository's own files are: experiment files, pool files, shipped assets.

hsjax is installed editable (`pip install -e .`), so the package sits inside the repository and
relative paths in configs (`harness_envs/pools/dbbench_siblings.json`, `assets/testbed_warmstart`)
are resolved against the working directory first, then against the repository root.
"""
from __future__ import annotations

import os
import pathlib

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]


def resolve(path: str | os.PathLike) -> pathlib.Path:
    """`path` as given when it is absolute or exists from the working directory, else from the
    repository root (where the shipped pools, assets and experiments live)."""
    p = pathlib.Path(path)
    return p if p.is_absolute() or p.exists() else REPO_ROOT / p
