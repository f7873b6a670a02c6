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


def files() -> list[str]:
    """The names of the experiment files that define `get_config` (`common.py` holds helpers only)."""
    return [p.stem for p in sorted(EXPERIMENTS_DIR.glob("*.py")) if hasattr(load(p.stem), "get_config")]


# The module-level tables an experiment file keeps its variants in: each key (or entry) is a
# variant that builds a config alone (`*VARIANTS`, `*ARMS`, `OTHER_MODES`), or that modifies the
# training arm it is combined with (`*MODIFIERS`).
_VARIANT_TABLE_SUFFIXES = ("VARIANTS", "ARMS")
_MODIFIER_TABLE_SUFFIX = "MODIFIERS"


def variants(module: types.ModuleType) -> tuple[list[str], list[str]]:
    """(variants, modifiers) of an experiment file, read from its tables, for `run.py --help`."""
    alone, modifiers = set(), set()
    for name, table in vars(module).items():
        if not isinstance(table, (dict, tuple)) or not all(isinstance(k, str) for k in table):
            continue
        if name.endswith(_VARIANT_TABLE_SUFFIXES) or name == "OTHER_MODES":
            alone.update(table)
        elif name.endswith(_MODIFIER_TABLE_SUFFIX):
            modifiers.update(table)
    return sorted(alone), sorted(modifiers)
