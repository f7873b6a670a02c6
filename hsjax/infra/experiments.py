"""Experiment files (`experiments/<name>.py`) loaded by path, the way `run.py --config` reads them.

`experiments/` is deliberately not a package: each experiment is one self-contained file that
`ml_collections.config_flags` executes by path. Code that needs another experiment's config (the
testbed builds on dbbench's, the demo on the testbed's arms, tests on all of them) goes through
`load`, so there is one way to do it.
"""
from __future__ import annotations

import importlib.util
import types

from hsjax.infra.paths import REPO_ROOT

EXPERIMENTS_DIR = REPO_ROOT / "experiments"


def load(name: str) -> types.ModuleType:
    """A fresh module for `experiments/<name>.py` (each call executes the file anew, so callers
    that patch the module never see one another's changes)."""
    path = EXPERIMENTS_DIR / f"{name}.py"
    if not path.exists():
        known = sorted(p.stem for p in EXPERIMENTS_DIR.glob("*.py"))
        raise FileNotFoundError(f"no experiment {name!r} at {path}; known: {known}")
    spec = importlib.util.spec_from_file_location(f"hsjax_experiment_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def get_config(name: str, arg: str | None = None):
    """`experiments/<name>.py`'s `get_config(arg)`: `get_config("testbed", "harness_s")` is the
    config of `run.py --config experiments/testbed.py:harness_s`."""
    return load(name).get_config(arg)
