"""A toy SWE-Gym instance laid out as the offline cache (docs/swegym.md): a bare repository whose
base commit is an orphan behind the tag `refs/tags/<instance_id>`, next to the "upstream" history
that holds the fix and a secret tag the agent must not reach, and a virtual environment (this
project's own, linked: it has pytest).

`acme/calc`: `sub` adds instead of subtracting. The test patch adds `test_sub` to the existing test
file and a new file `tests/test_new.py`; PASS_TO_PASS includes a parametrised id with a space and an
XFAIL test (which counts as passing).
"""
from __future__ import annotations

import dataclasses
import os
import pathlib
import subprocess
import sys

from harness_envs.swegym.instances import Instance

OPS = '''def add(a, b):
    return a + b


def sub(a, b):
    return a + b


def mul(a, b):
    return a * b
'''
TESTS = '''import pytest

from calc.ops import add, mul


def test_add():
    assert add(2, 3) == 5


def test_mul():
    assert mul(2, 3) == 6


@pytest.mark.parametrize("words", ["a b"])
def test_words(words):
    assert len(words.split()) == 2


@pytest.mark.xfail(reason="a known bug, not this instance's")
def test_known_bug():
    assert mul(0.1, 3) == 0.3
'''
NEW_TEST = '''from calc.ops import sub


def test_sub_negative():
    assert sub(2, 5) == -3
'''
F2P = ("tests/test_ops.py::test_sub", "tests/test_new.py::test_sub_negative")
P2P = ("tests/test_ops.py::test_add", "tests/test_ops.py::test_mul", "tests/test_ops.py::test_words[a b]",
       "tests/test_ops.py::test_known_bug")


@dataclasses.dataclass
class Toy:
    repos_dir: pathlib.Path
    venvs_dir: pathlib.Path
    instance: Instance
    gold_patch: str
    fixed_commit: str  # on the upstream branch: the fix the agent must not see
    secret_commit: str  # behind another tag


def git(cwd, *args, input: str | None = None) -> str:
    env = {"PATH": os.environ["PATH"], "HOME": str(cwd), "GIT_CONFIG_NOSYSTEM": "1", "GIT_AUTHOR_NAME": "t",
           "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True,
                          input=input).stdout


def _write(root: pathlib.Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def make_toy(root: pathlib.Path, instance_id: str = "acme__calc-1") -> Toy:
    src = root / "src"
    src.mkdir(parents=True)
    git(src, "init", "-q", "-b", "main")
    _write(src, {"calc/__init__.py": "", "calc/ops.py": OPS, "tests/test_ops.py": TESTS, "setup.cfg": "[x]\n"})
    git(src, "add", "-A")
    base = git(src, "commit-tree", git(src, "write-tree").strip(), "-m", "base").strip()  # an orphan
    git(src, "reset", "-q", "--hard", base)
    git(src, "tag", instance_id, base)

    _write(src, {"calc/ops.py": OPS.replace("return a + b\n\n\ndef mul", "return a - b\n\n\ndef mul")})
    gold = git(src, "diff")
    git(src, "checkout", "-q", "--", ".")
    tests = TESTS.replace("from calc.ops import add, mul", "from calc.ops import add, mul, sub")
    _write(src, {"tests/test_ops.py": tests + "\n\ndef test_sub():\n    assert sub(5, 3) == 2\n",
                 "tests/test_new.py": NEW_TEST})
    git(src, "add", "-N", "tests/test_new.py")
    test_patch = git(src, "diff")

    # The upstream history: the fix committed on main, and an unrelated secret behind a tag.
    git(src, "apply", input=gold)
    git(src, "add", "-A")
    git(src, "commit", "-q", "-m", "fix sub")
    fixed = git(src, "rev-parse", "HEAD").strip()
    _write(src, {"SECRET.txt": "the answer\n"})
    git(src, "add", "-A")
    git(src, "commit", "-q", "-m", "secret")
    secret = git(src, "rev-parse", "HEAD").strip()
    git(src, "tag", "secret", secret)
    git(src, "reset", "-q", "--hard", fixed)

    repos, venvs = root / "repos", root / "venvs"
    repos.mkdir()
    venvs.mkdir()
    git(root, "clone", "-q", "--bare", str(src), str(repos / "acme__calc.git"))
    (venvs / "acme__calc").symlink_to(sys.prefix)  # this project's venv: it has pytest
    instance = Instance(instance_id=instance_id, repo="acme/calc", base_commit=base,
                        problem_statement="sub(5, 3) returns 8", patch=gold, test_patch=test_patch,
                        FAIL_TO_PASS=F2P, PASS_TO_PASS=P2P)
    return Toy(repos, venvs, instance, gold, fixed, secret)
