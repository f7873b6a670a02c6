"""A tiny offline SWE-Gym cache, laid out as `scripts/setup_swegym.sh` lays out the real one
(`<root>/repos/<owner>__<name>.git`, `<root>/venvs/<owner>__<name>`, `<root>/instances/offline.jsonl`),
for tests that must not depend on the built cache.

Two repositories, one instance each, from the same package template (`core.py` of 60-odd lines, the
bug well below line 20, and a 24,000-character CHANGES.txt so that dumping the repository fills an
observation):
- `tiny/textkit` (split train): `window` drops the last window (`range(len(items) - size)`); the
  test patch adds the FAIL_TO_PASS test to the existing test file (SWE-bench style: the test is hidden).
- `tiny/mathkit` (split test): `clamp` returns `low` above the range; the FAIL_TO_PASS test is
  already in the repository and the test patch is empty (the offline builder's mutation style).
Each base commit is an orphan behind the tag `<instance_id>`; the venvs link this project's own
(it has pytest).
"""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from harness_envs.swegym.benchmark import CACHE_ENV, DEFAULT_CACHE, OFFLINE_INSTANCES

CORE = '''"""Small helpers for sequences and numbers."""


def first(items, default=None):
    """The first item, or `default` when there is none."""
    for item in items:
        return item
    return default


def chunks(items, size):
    """Successive pieces of `size` items; the last may be shorter."""
    return [items[i:i + size] for i in range(0, len(items), size)]


def mean(values):
    """The arithmetic mean; 0.0 for no values."""
    values = list(values)
    if not values:
        return 0.0
    return sum(values) / len(values)


def window(items, size):
    """Every run of `size` consecutive items, in order."""
    if size <= 0:
        raise ValueError("size must be positive")
    return [items[i:i + size] for i in range(len(items) - size + 1)]


def clamp(value, low, high):
    """`value` limited to the range [low, high]."""
    if low > high:
        raise ValueError("low is above high")
    if value < low:
        return low
    if value > high:
        return high
    return value


def scale(values, factor):
    """Every value times `factor`."""
    return [v * factor for v in values]


def describe(values):
    """A one-line description of `values`."""
    values = list(values)
    if not values:
        return "empty"
    return f"{len(values)} values, mean {mean(values):.2f}"
'''
TESTS = '''from {pkg}.core import chunks, clamp, describe, first, mean, scale, window


def test_first():
    assert first([3, 4]) == 3 and first([], 9) == 9


def test_chunks():
    assert chunks([1, 2, 3], 2) == [[1, 2], [3]]


def test_mean():
    assert mean([1, 2, 3]) == 2.0 and mean([]) == 0.0


def test_window_size_one():
    assert window([1, 2], 1)[0] == [1]


def test_clamp_inside():
    assert clamp(5, 0, 10) == 5


def test_clamp_below():
    assert clamp(-5, 0, 10) == 0


def test_scale():
    assert scale([1, 2], 3) == [3, 6]


def test_describe():
    assert describe([]) == "empty"
'''
WINDOW_TEST = '''

def test_window_last():
    assert window([1, 2, 3], 2) == [[1, 2], [2, 3]]
'''
CLAMP_TEST = '''from mathkit.core import clamp


def test_clamp_above():
    assert clamp(15, 0, 10) == 10
'''
CHANGES = "".join(f"- {n:04d}: release note line kept for history, nothing to see in this line.\n" for n in range(320))
TEXTKIT_BUG = ("range(len(items) - size + 1)", "range(len(items) - size)")
MATHKIT_BUG = ("        return high\n", "        return low\n")
P2P_NAMES = ("test_first", "test_chunks", "test_mean", "test_window_size_one", "test_clamp_inside", "test_clamp_below",
             "test_scale", "test_describe")


def git(cwd, *args, input: str | None = None) -> str:
    env = {"PATH": os.environ["PATH"], "HOME": str(cwd), "GIT_CONFIG_NOSYSTEM": "1", "GIT_AUTHOR_NAME": "t",
           "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True,
                          input=input).stdout


def _write(root: pathlib.Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def _repo(root: pathlib.Path, pkg: str, bug: tuple[str, str], extra_files: dict[str, str], test_patch_files: dict,
          instance_id: str, split: str, problem: str, f2p: list[str]) -> dict:
    src = root / "src" / pkg
    src.mkdir(parents=True)
    git(src, "init", "-q", "-b", "main")
    assert bug[0] in CORE
    tests = TESTS.format(pkg=pkg)
    _write(src, {f"{pkg}/__init__.py": "", f"{pkg}/core.py": CORE.replace(bug[0], bug[1]), "tests/__init__.py": "",
                 "tests/test_core.py": tests, "CHANGES.txt": CHANGES, **extra_files})
    git(src, "add", "-A")
    base = git(src, "commit-tree", git(src, "write-tree").strip(), "-m", "base").strip()
    git(src, "reset", "-q", "--hard", base)
    git(src, "tag", instance_id, base)
    _write(src, {f"{pkg}/core.py": CORE})
    gold = git(src, "diff")
    git(src, "checkout", "-q", "--", ".")
    test_patch = ""
    if test_patch_files:
        _write(src, {name: fn(tests) for name, fn in test_patch_files.items()})
        test_patch = git(src, "diff")
        git(src, "checkout", "-q", "--", ".")
    key = f"tiny__{pkg}"
    git(root, "clone", "-q", "--bare", str(src), str(root / "repos" / f"{key}.git"))
    (root / "venvs" / key).symlink_to(sys.prefix)  # this project's venv: it has pytest
    return {"instance_id": instance_id, "repo": f"tiny/{pkg}", "base_commit": base, "problem_statement": problem,
            "patch": gold, "test_patch": test_patch, "FAIL_TO_PASS": f2p,
            "PASS_TO_PASS": [f"tests/test_core.py::{n}" for n in P2P_NAMES], "split": split, "version": "0.1"}


def make_cache(root: pathlib.Path) -> pathlib.Path:
    """Writes the tiny cache under `root` and returns `root` (use it as backend.cache_dir)."""
    (root / "repos").mkdir(parents=True)
    (root / "venvs").mkdir()
    records = [
        _repo(root, "textkit", TEXTKIT_BUG, {}, {"tests/test_core.py": lambda t: t + WINDOW_TEST}, "tiny__textkit-1",
              "train", "window([1, 2, 3], 2) returns only [[1, 2]]: the last window [2, 3] is missing.",
              ["tests/test_core.py::test_window_last"]),
        _repo(root, "mathkit", MATHKIT_BUG, {"tests/test_clamp.py": CLAMP_TEST}, {}, "tiny__mathkit-1", "test",
              "clamp(15, 0, 10) returns 0 instead of 10: values above the range come back as the low end.",
              ["tests/test_clamp.py::test_clamp_above"]),
    ]
    (root / "instances").mkdir()
    (root / "instances" / "offline.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return root


def built_cache_or_skip() -> pathlib.Path:
    """The offline cache scripts/setup_swegym.sh builds (`$HSJAX_SWEGYM_CACHE`, else .cache/swegym). Tests
    that need it are skipped when it is absent, and fail instead with `HSJAX_REQUIRE_SWEGYM=1` (CI)."""
    cache = pathlib.Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE)
    if not (cache / OFFLINE_INSTANCES).is_file():
        message = f"the offline SWE-Gym cache is not built at {cache}: scripts/setup_swegym.sh builds it"
        if os.environ.get("HSJAX_REQUIRE_SWEGYM") == "1":
            pytest.fail(message + " (HSJAX_REQUIRE_SWEGYM=1)")
        pytest.skip(message)
    return cache
