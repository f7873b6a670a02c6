"""Scoring a patch as SWE-bench does, stricter about who reports: apply it to a fresh checkout,
apply the test patch, run the test files, and call the instance resolved iff every FAIL_TO_PASS and
every PASS_TO_PASS test passes (docs/swegym.md, "Scoring").

`evaluate` uses nothing but the `Workspace` interface, so both runtimes score the same way:
1. a fresh workspace at `base_commit`; the file that configures pytest there is noted
   (`pytest_infra.find_inifile`) before any patch;
2. the model patch, fed on stdin (never a file the tests could read), through `git apply -v`, else
   `patch --batch --fuzz=5 -p1` (SWE-bench's fallback; dry run first, so a patch is applied whole or
   not at all). Model patches are hostile input: one that names an absolute path, a `..` step or a
   `.git` directory is refused before either tool sees it, and so is one that touches test
   infrastructure (`pytest_infra`: conftest.py, pytest.ini, sitecustomize.py, .pth, ...; a changed
   pytest section of setup.cfg/tox.ini/pyproject.toml is refused once applied). Refused, not
   restored: in RL the refusal is what teaches a policy not to try;
3. the test files the scorer runs and those the test patch touches are reset to the base commit
   (deleted if the test patch creates them), so the model cannot have pre-edited the tests, then the
   test patch is applied;
4. the tests run through `pytest_driver.py` (`python -I -`, the base's pytest config, no plugin
   auto-loading), and the statuses are read from its nonce-framed report (`pytest_run`), never from
   the log the tested code can print into.

A test passes iff its status is PASSED or XFAIL; a test the report does not name fails (a
collection error, a crash, a time-out). `parse_pytest_log`, the log parser the scorer used before,
stays for the builder, which runs code it wrote itself.
"""
from __future__ import annotations

import dataclasses
import os
import posixpath
import re
import shlex
import time

from harness_envs.swegym import pytest_infra, pytest_run
from harness_envs.swegym.instances import Instance
from harness_envs.swegym.runtime import Runtime, Workspace, WorkspaceError, files_of_tests

__all__ = ["FAILURES", "Report", "evaluate", "parse_pytest_log", "passing", "touched_paths", "unsafe_paths"]

STATUSES = ("PASSED", "FAILED", "ERROR", "SKIPPED", "XFAIL", "XPASS")
PASSING = ("PASSED", "XFAIL")
FAILING = ("FAILED", "ERROR")
FAILURES = (None, "empty_patch", "patch_does_not_apply", "test_infrastructure", "test_patch_does_not_apply",
            "f2p_failing", "p2p_broken", "test_timeout", "no_test_report", "test_run_tampered")
LOG_CHARS = 32 << 20
TAIL_CHARS = 4000
_ALIASES = {"XFAILED": "XFAIL", "XPASSED": "XPASS", "PASS": "PASSED", "FAIL": "FAILED"}
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_XDIST = re.compile(r"^\[gw\d+\] \[\s*\d+%\] ")
_VERBOSE = re.compile(r"^(?P<id>\S.*?::.*?) (?P<status>PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)"
                      r"(?: \(.*\))?(?:\s+\[\s*\d+%\])?\s*$")
_SUMMARY_HEADER = re.compile(r"^=+ short test summary info =+$")


# ---------------------------------------------------------------------------------------- the log

def _summary_id(status: str, rest: str) -> str | None:
    """The test id at the start of `rest` (what follows `STATUS ` in a summary line).

    An id has spaces only inside its parametrisation brackets (`t.py::test[a b]`), and a message
    may follow it after ` - `, so: no `[` before the first space -> the id ends there; else it ends
    at the first `]` that closes the line or precedes ` - ` (`test[c - d] - AssertionError: x[1]`)."""
    rest = rest.strip()
    if not rest or (status == "SKIPPED" and rest.startswith("[")):  # `SKIPPED [1] file:line: reason`
        return None
    first_space, bracket = rest.find(" "), rest.find("[")
    if first_space == -1 or bracket == -1 or bracket > first_space:
        return rest if first_space == -1 else rest[:first_space]
    for i, char in enumerate(rest):
        if char == "]" and (i == len(rest) - 1 or rest.startswith(" - ", i + 1)):
            return rest[:i + 1]
    return rest[:first_space]


def _summary_line(line: str) -> tuple[str, str] | None:
    word, _, rest = line.partition(" ")
    status = _ALIASES.get(word, word)
    if status not in STATUSES:
        return None
    test_id = _summary_id(status, rest)
    return (test_id, status) if test_id else None


def _verbose_line(line: str) -> tuple[str, str] | None:
    match = _VERBOSE.match(line)
    return (match["id"], match["status"]) if match else None


def _summary_sections(lines: list[str]) -> set[int]:
    """Line numbers inside `short test summary info` sections (header to the next `====` line)."""
    inside, numbers = False, set()
    for number, line in enumerate(lines):
        if _SUMMARY_HEADER.match(line):
            inside = True
        elif inside and line.startswith("="):
            inside = False
        elif inside:
            numbers.add(number)
    return numbers


def parse_pytest_log(log: str) -> dict[str, str]:
    """{test id: status} from a pytest log: `STATUS id[ - message]` summary lines (`-rA`), read only
    inside `short test summary info` sections when the log has one, and `id STATUS [ nn%]` progress
    lines (`-v`; xdist's `[gw0] [ 50%] STATUS id`).

    Statuses are PASSED, FAILED, ERROR, SKIPPED, XFAIL, XPASS. A failing status (FAILED, ERROR) for an
    id is never replaced by a later passing one (a test that passed, then errored at teardown, fails).
    Judge a test with `passing`, which also knows the cut ids of published test lists."""
    lines = [_ANSI.sub("", raw).rstrip("\r ") for raw in log.splitlines()]
    sections = _summary_sections(lines)
    found: list[tuple[str, str]] = []
    for number, line in enumerate(lines):
        progress = _XDIST.sub("", line)
        if progress != line:
            hit = _summary_line(progress)
        elif not sections or number in sections:
            hit = _summary_line(line) or _verbose_line(line)
        else:
            hit = _verbose_line(line)
        if hit:
            found.append(hit)
    statuses: dict[str, str] = {}
    for test_id, status in found:
        if statuses.get(test_id) not in FAILING:
            statuses[test_id] = status
    return statuses


def passing(statuses: dict[str, str], test_id: str) -> bool:
    """SWE-bench's rule: PASSED or XFAIL passes; any other status, or none, fails.

    SWE-bench's own parser cut ids at their first space, and published test lists carry the cut
    form (`t.py::test[a` for `t.py::test[a b]`): such an id passes iff every test it may stand for
    ran and passed."""
    if test_id in statuses:
        return statuses[test_id] in PASSING
    if "[" in test_id and not test_id.endswith("]"):
        matches = [s for t, s in statuses.items() if t.startswith(test_id + " ")]
        return bool(matches) and all(s in PASSING for s in matches)
    return False


# ---------------------------------------------------------------------------------------- patches

_HEADER = re.compile(r"^(?:--- |\+\+\+ |\*\*\* |Index: |rename from |rename to |copy from |copy to )(?P<path>.+)$")
_DIFF_GIT = re.compile(r"^diff --git (?P<paths>.+)$")
_HUNK = re.compile(r"^@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")


def _header_paths(patch: str) -> list[str]:
    out = []
    for line in patch.splitlines():
        match = _HEADER.match(line)
        if match:
            out.append(match["path"].split("\t", 1)[0].strip())
            continue
        match = _DIFF_GIT.match(line)
        if match:
            out += match["paths"].split(" ")
    return out


def _unquote(path: str) -> str:
    """A git C-style quoted path (`"a/\\303\\251t\\303\\251.py"`) as the tools decode it."""
    if len(path) >= 2 and path[0] == path[-1] == '"':
        try:
            return path[1:-1].encode("latin-1", "backslashreplace").decode("unicode_escape")
        except UnicodeDecodeError:
            return path[1:-1]
    return path


def unsafe_paths(patch: str) -> list[str]:
    """The paths of `patch` that could reach outside the tree or into `.git`: absolute ones (other
    than /dev/null), ones with a `..` step, ones that enter a `.git` directory; quoted paths are
    judged once unquoted. Every header form counts (`---`/`+++`, `***`, `Index:`, `diff --git`,
    renames and copies), so a path cannot hide in a form one tool reads and this check does not."""
    bad = []
    for path in _header_paths(patch):
        bare = _unquote(path)
        if bare == "/dev/null":
            continue
        parts = bare.split("/")
        if bare.startswith("/") or ".." in parts or ".git" in parts:
            bad.append(path)
    return sorted(set(bad))


def touched_paths(patch: str) -> list[str]:
    """Every tree path `patch` names in any header form, each both as written and without its first
    component (`a/x` and `x`: -p1 strips it, `Index:` lines have none), /dev/null left out. A
    superset of what the patch changes: enough to refuse on, never to apply by."""
    out = set()
    for path in _header_paths(patch):
        bare = _unquote(path)
        if bare != "/dev/null" and bare:
            out.add(bare)
            if "/" in bare:
                out.add(bare.split("/", 1)[1])
    return sorted(out)


def _changed_files(patch: str) -> tuple[list[str], list[str]]:
    """(files the patch modifies or deletes, files it creates), as tree paths (`a/`, `b/` cut).

    Hunk bodies are skipped by their line counts, so that a removed line `-- x` (`--- x` in the
    patch) is not taken for a file header. (`unsafe_paths` reads every line instead: there a false
    alarm only refuses a patch.)"""
    modified, created, old, left = [], [], None, (0, 0)
    for line in patch.splitlines():
        if left != (0, 0):
            tag = line[:1]
            if tag == "\\":  # "\ No newline at end of file"
                continue
            if tag in (" ", "", "-", "+"):  # context (its space may be stripped), removed, added
                left = (max(0, left[0] - (tag != "+")), max(0, left[1] - (tag != "-")))
                continue
            left = (0, 0)  # the hunk ended early: read the line as a header
        hunk = _HUNK.match(line)
        if hunk:
            left = tuple(int(n) if n is not None else 1 for n in hunk.groups())
        elif line.startswith("--- "):
            old = line[4:].split("\t", 1)[0].strip()
        elif line.startswith("+++ ") and old is not None:
            new = line[4:].split("\t", 1)[0].strip()
            if old == "/dev/null":
                created.append(new[2:] if new.startswith("b/") else new)
            else:
                modified.append(old[2:] if old.startswith("a/") else old)
            old = None
    return list(dict.fromkeys(modified)), list(dict.fromkeys(created))


def _apply(ws: Workspace, patch: str) -> tuple[str | None, str]:
    """('git' | 'patch' | None, log): `git apply -v`, else `patch` (a dry run first)."""
    if not patch.endswith("\n"):
        patch += "\n"  # a patch cut before its last newline is "corrupt" to both tools
    git = ws.run("git apply -v", stdin=patch)
    if git.returncode == 0:
        return "git", git.output
    options = "--batch --fuzz=5 -p1 --forward --no-backup-if-mismatch --reject-file=-"
    dry = ws.run(f"patch --dry-run {options}", stdin=patch)
    if dry.returncode == 0:
        real = ws.run(f"patch {options}", stdin=patch)
        if real.returncode == 0:
            return "patch", git.output + real.output
        return None, git.output + real.output
    return None, git.output + dry.output


# ---------------------------------------------------------------------------------------- evaluate

@dataclasses.dataclass
class Report:
    instance_id: str
    applied: bool
    apply_method: str | None  # 'git' | 'patch' | None
    f2p_passed: int
    f2p_total: int
    p2p_passed: int
    p2p_total: int
    resolved: bool
    failure: str | None  # one of FAILURES
    seconds: float
    log_tail: str

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def evaluate(instance: Instance, model_patch: str, runtime: Runtime, timeout_s: float = 1800.0) -> Report:
    """Scores `model_patch` on `instance` in a fresh workspace of `runtime` (closed afterwards).

    `failure` says why an unresolved patch failed, first cause first: patch_does_not_apply,
    test_infrastructure (the patch changes how tests are collected, run or reported: refused),
    test_patch_does_not_apply, test_timeout, no_test_report (the run ended without the driver's
    report), test_run_tampered (pytest's code was replaced while the tests ran), empty_patch (an
    empty patch is still run: its report carries the test counts), f2p_failing, p2p_broken. A
    time-out fails even if the tests it ran passed. WorkspaceError when no workspace can be made (a
    missing repository or image is the set-up's fault, never the patch's)."""
    t0 = time.monotonic()
    f2p, p2p = instance.FAIL_TO_PASS, instance.PASS_TO_PASS
    files = files_of_tests(f2p + p2p)

    def report(applied, method, failure, log, statuses=None):
        statuses = statuses or {}
        f2p_ok, p2p_ok = (sum(passing(statuses, t) for t in ids) for ids in (f2p, p2p))
        return Report(instance.instance_id, applied, method, f2p_ok, len(f2p), p2p_ok, len(p2p),
                      failure is None, failure, time.monotonic() - t0, log[-TAIL_CHARS:])

    with runtime.workspace(instance) as ws:
        inifile = pytest_infra.find_inifile(files, lambda path: _read(ws, path))  # the base commit's
        empty = not model_patch.strip()
        method = None
        if not empty:
            bad = unsafe_paths(model_patch)
            if bad:
                return report(False, None, "patch_does_not_apply", f"refused: the patch names paths outside "
                                                                   f"the tree or inside .git: {bad}")
            touched = touched_paths(model_patch)
            infrastructure = pytest_infra.infrastructure_paths(touched)
            if infrastructure:
                return report(False, None, "test_infrastructure", f"refused: the patch changes test "
                                                                  f"infrastructure: {infrastructure}")
            configs = [p for p in touched if posixpath.basename(p) in pytest_infra.CONFIG_FILES]
            sections = {p: pytest_infra.pytest_section(p, _read(ws, p)) for p in configs}
            method, log = _apply(ws, model_patch)
            if method is None:
                return report(False, None, "patch_does_not_apply", log)
            changed = sorted(p for p in configs if pytest_infra.pytest_section(p, _read(ws, p)) != sections[p])
            if changed:
                return report(True, method, "test_infrastructure", f"refused: the patch changes the pytest "
                                                                   f"section of {changed}")
        failed = _reset_tests(ws, instance, files)
        if failed is not None:
            return report(not empty, method, "test_patch_does_not_apply", failed)
        stdin, nonce = pytest_run.driver_input(inifile, instance.extra.get("test_cmd"), files)
        result = ws.run(pytest_run.COMMAND, timeout_s=timeout_s, stdin=stdin, output_chars=LOG_CHARS)
        run, missing = pytest_run.read_report(result.output, nonce)
        log = "\n".join(line for line in result.output.splitlines() if not line.startswith(nonce))
        if result.timed_out:
            return report(not empty, method, "test_timeout", log)
        if run is None:
            return report(not empty, method, "no_test_report", f"{log}\n[scorer] {missing}")
        hooked = _patched_hooks(ws.root, run.hooked_files, touched_paths(model_patch))
        if hooked:
            return report(not empty, method, "test_infrastructure", f"{log}\n[scorer] refused: pytest ran hooks "
                                                                    f"from files the patch changes: {hooked}")
        if run.replaced:
            return report(not empty, method, "test_run_tampered", f"{log}\n[scorer] pytest's code was replaced "
                                                                  f"while the tests ran: {list(run.replaced)[:10]}")
        f2p_ok = all(passing(run.statuses, t) for t in f2p)
        p2p_ok = all(passing(run.statuses, t) for t in p2p)
        failure = None if f2p_ok and p2p_ok else "empty_patch" if empty else "f2p_failing" if not f2p_ok else "p2p_broken"
        return report(not empty, method, failure, log, run.statuses)


def _read(ws: Workspace, path: str) -> str | None:
    """The text of a tree file, None if it is absent or not a readable text file."""
    try:
        return ws.read_file(path) if ws.exists(path) == "file" else None
    except WorkspaceError:
        return None


def _patched_hooks(root: str, hooked_files: tuple[str, ...], touched: list[str]) -> list[str]:
    """The files of pytest plugins and hooks that the patch wrote, or that are no file at all (code
    made by `exec` or `compile`, which the patch alone can have put there)."""
    root = root.rstrip("/") + "/"
    out = []
    for path in hooked_files:
        if not os.path.isabs(path):
            out.append(path)
        elif path.startswith(root) and path[len(root):] in touched:
            out.append(path[len(root):])
    return sorted(set(out))


def _reset_tests(ws: Workspace, instance: Instance, files: list[str]) -> str | None:
    """Resets the test files the scorer runs and those the test patch touches to the base commit
    (deleting those it creates), then applies the test patch; None, or the log of the failure. The
    tests are the instance's: a model's edit of one (a reproduction test added, an assertion
    loosened) never reaches the run."""
    if instance.test_patch.strip() and unsafe_paths(instance.test_patch):
        return f"the test patch names unsafe paths: {unsafe_paths(instance.test_patch)}"
    modified, created = _changed_files(instance.test_patch) if instance.test_patch.strip() else ([], [])
    base = shlex.quote(instance.base_commit)
    steps = [f"for f in {' '.join(shlex.quote(f) for f in files)}; do "
             f"if git cat-file -e {base}:\"$f\" 2>/dev/null; then git checkout -q {base} -- \"$f\" || exit 1; fi; done"]
    if modified:
        steps.append(f"git checkout -q {base} -- " + " ".join(shlex.quote(f) for f in modified))
    if created:
        steps.append("rm -rf -- " + " ".join(shlex.quote(f) for f in created))
    reset = ws.run(" && ".join(steps))
    if reset.returncode != 0:
        return f"resetting the test files failed: {reset.output}"
    if not instance.test_patch.strip():
        return None
    method, log = _apply(ws, instance.test_patch)
    return log if method is None else None
