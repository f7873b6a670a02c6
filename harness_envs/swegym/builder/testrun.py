"""The builder's pytest runs: one command line, the scorer's, in a sandbox, and what its log says.

The work tree is `<scratch>/tree`; `<scratch>` is the sandbox's writable directory (home and the
tracer's files live beside the tree). Every run is the scorer's own command (`runtime.PYTEST`:
`python -m pytest -rA -p no:cacheprovider -W ignore::DeprecationWarning`) plus `--tb=short` (for the
problem statement's excerpts; it changes no outcome) and, for candidates, `--maxfail` (a mutation
failing more tests than an instance may have is rejected anyway). It runs under
`sandbox_command.run_command` (bubblewrap where present: writes only inside the package's scratch directory,
no network, rlimits, a wall-clock limit that kills the whole process group, so a mutation that loops
forever costs one time-out) with the environment the local runtime gives an agent: the package's
venv first on PATH, PYTHONPATH the tree's import root, no bytecode files (a mutated module of the
same size and mtime would otherwise run from a stale .pyc). `PYTHONHASHSEED` is pinned per run so
that results are reproducible; the pristine suite runs under two different seeds, and a test must
pass under both to count.

Statuses come from `scoring.parse_pytest_log`, the scorer's parser, so the builder and the scorer
cannot disagree on a test id. Collection errors (an `ERROR` id without `::`, or pytest's exit
status 2-4) mark the run as broken.
"""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
import shlex
import shutil

from harness_envs.sandbox import Limits
from harness_envs.sandbox_command import run_command
from harness_envs.sandbox_mounts import venv_mounts
from harness_envs.swegym.runtime import PYTEST
from harness_envs.swegym.scoring import parse_pytest_log

SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
LOG_CHARS = 16 << 20
# Test ids the builder keeps: no spaces, quotes, shell or glob characters beyond brackets.
SAFE_ID = re.compile(r"^[A-Za-z0-9_./:\[\]\-,+=@%^~]+$")
_SECTION = re.compile(r"^=+ (FAILURES|ERRORS) =+$")
_ANY_SECTION = re.compile(r"^=+ .* =+$")
_HEADER = re.compile(r"^_{2,} (.+?) _{2,}$")
_ENTRY = re.compile(r"^(\S[^:]*):(\d+): in (.+)$")
TRACE_MODULE = "_hsjax_linetrace"


@dataclasses.dataclass(frozen=True)
class Failure:
    """What the log shows of one failing test: the lines of the test's own code the traceback
    passes through (the last is where it failed) and the exception lines (`E   ...`)."""

    test_lines: tuple[str, ...]
    error: tuple[str, ...]


@dataclasses.dataclass
class Run:
    statuses: dict[str, str]
    failures: dict[str, Failure]
    returncode: int | None
    timed_out: bool
    seconds: float
    output: str

    @property
    def collection_errors(self) -> list[str]:
        return sorted(t for t, s in self.statuses.items() if s == "ERROR" and "::" not in t)

    @property
    def broken(self) -> bool:
        """The run did not get to run the tests: a time-out, a collection error, an internal error."""
        return self.timed_out or bool(self.collection_errors) or self.returncode not in (0, 1)

    def passed(self) -> set[str]:
        return {t for t, s in self.statuses.items() if s == "PASSED" and "::" in t}

    def failed(self) -> set[str]:
        return {t for t, s in self.statuses.items() if s in ("FAILED", "ERROR") and "::" in t}


def environment(scratch: pathlib.Path, venv: pathlib.Path, pythonpath: str, hashseed: int) -> dict:
    """The local runtime's environment for an agent's command, with a pinned hash seed."""
    root = (scratch / "tree").resolve()
    home = scratch / "home"
    home.mkdir(exist_ok=True)
    return {"PATH": f"{venv}/bin:{SYSTEM_PATH}", "VIRTUAL_ENV": str(venv), "HOME": str(home), "TMPDIR": str(home),
            "PYTHONPATH": os.pathsep.join(str(root / p) for p in (pythonpath or ".").split(os.pathsep)),
            "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": str(hashseed), "LANG": "C.UTF-8", "TERM": "dumb",
            "COLUMNS": "200"}


def run_shell(scratch: pathlib.Path, env: dict, command: str, timeout_s: float, isolation_mode: str = "auto"):
    """One shell line in `scratch/tree` under the sandbox (writes allowed in `scratch` only)."""
    root = (scratch / "tree").resolve()
    limits = Limits(wall_s=timeout_s, cpu_s=int(timeout_s) + 5, memory_mb=4096, file_mb=64, open_files=512,
                    output_chars=LOG_CHARS)
    # The sandbox mounts an allow-list: the venv the environment names must be shown to the command.
    return run_command(f"cd {shlex.quote(str(root))} && {command}", str(scratch.resolve()), limits,
                       isolation_mode=isolation_mode, env=env, show=venv_mounts(env["VIRTUAL_ENV"]))


def run_pytest(scratch: pathlib.Path, venv: pathlib.Path, pythonpath: str, targets: list[str], *,
               timeout_s: float, hashseed: int, maxfail: int | None = None, isolation_mode: str = "auto",
               trace_files: list[str] | None = None) -> tuple[Run, dict[str, list[str]] | None]:
    """Runs pytest on `targets` (paths relative to the tree `scratch/tree`) and parses the log.
    With `trace_files`, also returns {"real path:line": [test files]} from the line tracer."""
    env = environment(scratch, venv, pythonpath, hashseed)
    argv = [PYTEST, "--tb=short"] + ([f"--maxfail={maxfail}"] if maxfail else [])
    trace_out = None
    if trace_files is not None:
        aux = scratch / "aux"
        aux.mkdir(exist_ok=True)
        shutil.copyfile(pathlib.Path(__file__).with_name("linetrace.py"), aux / f"{TRACE_MODULE}.py")
        trace_out = aux / "trace.json"
        trace_out.unlink(missing_ok=True)
        env["PYTHONPATH"] += os.pathsep + str(aux.resolve())
        env["HSJAX_TRACE_FILES"] = os.pathsep.join(trace_files)
        env["HSJAX_TRACE_OUT"] = str(trace_out.resolve())
        argv.append(f"-p {TRACE_MODULE}")
    command = f"exec {' '.join(argv)} " + " ".join(shlex.quote(t) for t in targets)
    result = run_shell(scratch, env, command, timeout_s, isolation_mode)
    statuses = parse_pytest_log(result.output)
    failing = {t for t, s in statuses.items() if s in ("FAILED", "ERROR") and "::" in t}
    run = Run(statuses, parse_failures(result.output, failing), result.returncode, result.timed_out,
              result.seconds, result.output)
    trace = None
    if trace_out is not None and trace_out.is_file():
        trace = json.loads(trace_out.read_text())
    return run, trace


def parse_failures(log: str, failing: set[str]) -> dict[str, Failure]:
    """{test id: Failure} for the `failing` ids, from the FAILURES and ERRORS sections of a
    `--tb=short` log. A section header names a test by its domain (`Class.test[param]`, `ERROR at
    setup of test_x`); it is matched to the failing id with that domain, and where several files
    have one, to the one whose file the traceback starts in."""
    by_domain: dict[str, list[str]] = {}
    for test_id in sorted(failing):
        path, _, rest = test_id.partition("::")
        head, bracket, params = rest.partition("[")
        by_domain.setdefault(head.replace("::", ".") + bracket + params, []).append(test_id)
    out: dict[str, Failure] = {}
    inside, header, body = False, None, []

    def close():
        if header is None:
            return
        domain = re.sub(r"^ERROR at (setup|teardown) of ", "", header)
        first_file, failure = _failure(body)
        ids = by_domain.get(domain, [])
        if len(ids) > 1:
            ids = [t for t in ids if t.split("::", 1)[0] == first_file] or ids
        if ids and ids[0] not in out:
            out[ids[0]] = failure

    for line in log.splitlines():
        if _SECTION.match(line):
            close()
            inside, header, body = True, None, []
        elif inside and _ANY_SECTION.match(line):
            close()
            inside, header, body = False, None, []
        elif inside and _HEADER.match(line):
            close()
            header, body = _HEADER.match(line).group(1), []
        elif inside and header is not None:
            body.append(line)
    close()
    return out


def _failure(body: list[str]) -> tuple[str | None, Failure]:
    """(the file the traceback starts in, Failure): the source lines of the entries in that file
    (the test's own code) and the exception lines."""
    entries: list[tuple[str, list[str]]] = []
    errors: list[str] = []
    for line in body:
        entry = _ENTRY.match(line)
        if entry:
            entries.append((entry.group(1), []))
        elif line.startswith("E   ") or line == "E":
            errors.append(line[4:])
        elif entries and line.startswith("    "):
            entries[-1][1].append(line.strip())
    if not entries:
        return None, Failure((), tuple(errors))
    first = entries[0][0]
    return first, Failure(tuple(text for path, source in entries if path == first for text in source), tuple(errors))
