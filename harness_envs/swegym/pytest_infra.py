"""Which files of a model patch are test infrastructure, and which file configures pytest.

The scorer refuses a patch that changes how tests are collected, run or reported (docs/swegym.md,
"Scoring"): a fix never needs to, and in RL a refusal is the signal that teaches a policy not to try.
Pure functions of paths and texts; the scorer reads the files through its workspace.

Test infrastructure, wherever it lies in the tree:
- files pytest or Python load by name: `conftest.py`, `pytest.ini`, `.pytest.ini`,
  `sitecustomize.py`, `usercustomize.py`, any `*.pth`, a distribution's `entry_points.txt` (the
  tree is on sys.path, so a `*.egg-info`/`*.dist-info` there can register a pytest11 plugin);
- `__init__.py` of a test directory (`test`, `tests`, `testing`): it runs when pytest imports the
  tests and belongs to the suite, not to the code under test;
- the pytest section of `setup.cfg` (`[tool:pytest]`), `tox.ini` (`[pytest]`) and
  `pyproject.toml` (`[tool.pytest...]`): the rest of those files may change.
"""
from __future__ import annotations

import posixpath
import re
import tomllib

__all__ = ["CONFIG_FILES", "find_inifile", "infrastructure_paths", "pytest_section"]

ALWAYS = ("conftest.py", "pytest.ini", ".pytest.ini", "sitecustomize.py", "usercustomize.py", "entry_points.txt")
TEST_DIRS = ("test", "tests", "testing")
CONFIG_FILES = ("pyproject.toml", "tox.ini", "setup.cfg")
# The order pytest looks for its configuration in one directory (pytest.ini counts even when empty).
INI_ORDER = ("pytest.ini", ".pytest.ini", "pyproject.toml", "tox.ini", "setup.cfg")
_INI_HEADER = re.compile(r"^\s*\[(?P<name>[^\]]*)\]")


def infrastructure_paths(paths: list[str]) -> list[str]:
    """The `paths` (tree-relative) that are test infrastructure by their name alone."""
    out = []
    for path in paths:
        parts = path.split("/")
        name = parts[-1]
        if (name in ALWAYS or name.endswith(".pth")
                or (name == "__init__.py" and any(p in TEST_DIRS for p in parts[:-1]))):
            out.append(path)
    return sorted(set(out))


def _ini_blocks(text: str, names: tuple[str, ...]) -> tuple[str, ...]:
    """The lines (stripped, blank ones dropped) of every section of an ini text named one of
    `names`, header included, in order. Read line by line, not by a parser: a parser other than
    pytest's could read a changed file as unchanged."""
    out, inside = [], False
    for line in text.splitlines():
        header = _INI_HEADER.match(line)
        if header:
            inside = header["name"].strip().lower() in names
        if inside and line.strip():
            out.append(line.strip())
    return tuple(out)


def pytest_section(path: str, text: str | None):
    """What `path` (a CONFIG_FILES name) with contents `text` tells pytest, as a comparable value:
    its pytest section(s); None when it has none or is absent. A pyproject.toml that does not parse
    is returned whole, so that any change of it counts."""
    if text is None:
        return None
    name = posixpath.basename(path)
    if name == "pyproject.toml":
        try:
            return tomllib.loads(text).get("tool", {}).get("pytest")
        except (tomllib.TOMLDecodeError, AttributeError):
            return ("unparsed", text)
    return _ini_blocks(text, ("tool:pytest", "pytest") if name == "setup.cfg" else ("pytest",)) or None


def _has_config(name: str, text: str) -> bool:
    if name in ("pytest.ini", ".pytest.ini"):
        return True
    section = pytest_section(name, text)
    if name == "pyproject.toml":
        return isinstance(section, dict) and "ini_options" in section
    return section is not None


def find_inifile(test_files: list[str], read) -> str | None:
    """The tree-relative file pytest takes its configuration from for `test_files`, searching as it
    does from their common directory up to the tree's root; `read(path)` gives a file's text or
    None. None when no file configures pytest."""
    directory = posixpath.commonpath([posixpath.dirname(f) for f in test_files])
    while True:
        for name in INI_ORDER:
            path = posixpath.join(directory, name) if directory else name
            text = read(path)
            if text is not None and _has_config(name, text):
                return path
        if not directory:
            return None
        directory = posixpath.dirname(directory)
