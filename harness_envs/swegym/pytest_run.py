"""The scorer's pytest run: the command line, the driver it feeds on stdin, and the report it reads.

`pytest_driver.py` runs inside the workspace and writes one line, `<nonce> <json>`, to the stdout it
had before any test ran; `read_report` takes the statuses from that line alone. The nonce is fresh
for each run and exists only in the driver's text on stdin, so a test (or the package it imports)
that prints `PASSED <id>` or a forged report line is not believed; a run that ends without the line
(a crash, `os._exit`, a kill) has no result, and every test of it fails.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
import re
import secrets
import shlex

from harness_envs.swegym.runtime import PYTEST

__all__ = ["DRIVER", "RunReport", "driver_input", "pytest_options", "read_report", "COMMAND"]

DRIVER = pathlib.Path(__file__).with_name("pytest_driver.py")
# -I: isolated (no PYTHONPATH, no user site: a sitecustomize.py in the tree never runs); `-`: the
# driver comes on stdin, never as a file the tests could read or rewrite.
COMMAND = "exec python -I -"
_ENV_WORD = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_PYTEST_HEADS = (["pytest"], ["py.test"], ["python", "-m", "pytest"], ["python3", "-m", "pytest"])


@dataclasses.dataclass(frozen=True)
class RunReport:
    """What the driver saw: {test id: status} (PASSED, FAILED, ERROR, SKIPPED, XFAIL, XPASS; a
    collection error under the file's id), pytest's exit status, the pytest/pluggy functions whose
    code was replaced during the run, and the files of every plugin and reporting hook."""

    statuses: dict[str, str]
    exitstatus: int
    replaced: tuple[str, ...]
    hooked_files: tuple[str, ...]


def pytest_options(test_cmd: str | None) -> tuple[dict[str, str], list[str]]:
    """(environment, pytest options) of an instance's `test_cmd` (`[VAR=value ...] pytest|python -m
    pytest [options]`); PYTEST's options when there is none. The driver runs pytest itself, so a
    test_cmd that is not a pytest line cannot be honoured: ValueError naming the fix."""
    words = shlex.split(test_cmd or PYTEST)
    env = {}
    while words and _ENV_WORD.match(words[0]):
        key, _, value = words.pop(0).partition("=")
        env[key] = value
    for head in _PYTEST_HEADS:
        if words[:len(head)] == head:
            return env, words[len(head):]
    raise ValueError(f"test_cmd {test_cmd!r} is not a pytest command line ([VAR=value ...] pytest [options] or "
                     "python -m pytest [options]); the scorer runs pytest itself: give its options that way")


def driver_input(inifile: str | None, test_cmd: str | None, files: list[str]) -> tuple[str, str]:
    """(stdin for COMMAND, the nonce its report line starts with) for a run of the test `files`
    (tree-relative) with pytest configured by `inifile` (tree-relative; None: no configuration)."""
    env, options = pytest_options(test_cmd)
    nonce = "hsjax-report-" + secrets.token_hex(16)
    call = f"sys.exit(main({nonce!r}, {inifile!r}, {env!r}, {options!r}, {list(files)!r}))"
    return f"{DRIVER.read_text()}\n{call}\n", nonce


def read_report(output: str, nonce: str) -> tuple[RunReport | None, str | None]:
    """(the report, None) from the run's output, or (None, why there is none): no line with the
    nonce (the run died before its end, or its output was cut), more than one (the tested code
    learned the nonce), or a line that does not parse."""
    lines = [line for line in output.splitlines() if line.startswith(nonce + " ")]
    if len(lines) != 1:
        return None, ("the test run ended without the harness's report (it crashed, exited early or was killed)"
                      if not lines else f"the test run printed the harness's report {len(lines)} times: forged")
    try:
        data = json.loads(lines[0][len(nonce) + 1:])
        return RunReport({str(k): str(v) for k, v in data["statuses"].items()}, int(data["exitstatus"]),
                         tuple(data["replaced"]), tuple(data["hooked_files"])), None
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        return None, f"the harness's report does not parse ({e})"
