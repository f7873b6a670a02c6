"""Where an instance's repository lives while an agent works on it and while a patch is scored.

One interface, two implementations (docs/swegym.md):
- `LocalRuntime` (docker-free): a git work tree of the instance's repository at `base_commit` in a
  temp directory; commands run through `harness_envs.sandbox_command.run_command` (bubblewrap when present:
  no network, writes only inside the work tree and a private /tmp; rlimits on CPU, memory, file
  size, processes; a wall-clock limit per command; bounded output), with the repository's virtual
  environment (built once, reused read-only) first on PATH.
- `ContainerRuntime`: the per-instance images of SWE-bench / SWE-Gym through a `docker`-compatible
  CLI (`docker` or `podman`), the repository at `/testbed`.

Every file operation of the editor tool and every shell command of the agent goes through a
`Workspace`, so harness, tools and scorer do not know which runtime they run on.
"""
from __future__ import annotations

import abc
import re
import shlex

from harness_envs.sandbox_command import CommandResult
from harness_envs.swegym.instances import Instance

__all__ = ["CommandResult", "Runtime", "Workspace", "WorkspaceError", "commit_id", "diff_command",
           "files_of_tests", "pytest_command"]

# SWE-bench's pytest line (-rA: a summary line for every test), without the cache directory (it would
# land in the tree) and the deprecation noise of old repositories.
PYTEST = "python -m pytest -rA -p no:cacheprovider -W ignore::DeprecationWarning"


class WorkspaceError(RuntimeError):
    """A workspace operation that cannot be done (a path outside the tree, a runtime that died)."""


class Workspace(abc.ABC):
    """One instance's repository at `base_commit`, private to one episode or one scoring run.

    Paths given to `read_file`/`write_file` are absolute paths inside the workspace (under `root`,
    as the agent sees them) or relative to `root`; anything resolving outside `root` raises
    WorkspaceError.
    """

    root: str  # the repository's path as the agent sees it (e.g. /testbed or the work tree)

    @abc.abstractmethod
    def run(self, command: str, timeout_s: float | None = None, *, stdin: str | None = None,
            output_chars: int | None = None) -> CommandResult:
        """Runs one shell line in `root` under the runtime's limits; never raises for the command's
        own failure (non-zero status, time-out: see CommandResult). `timeout_s` and `output_chars`
        replace the runtime's wall-clock and output limits for this command (the scorer's long test
        run and its full log); `stdin` is fed to the command (the scorer's patches, which so never
        become a file the tests could see)."""

    @abc.abstractmethod
    def read_file(self, path: str) -> str:
        """The file's text; WorkspaceError if it is missing, a directory, binary or too large."""

    @abc.abstractmethod
    def write_file(self, path: str, text: str) -> None:
        """Creates or replaces the file (parent directories made as needed)."""

    @abc.abstractmethod
    def exists(self, path: str) -> str | None:
        """'file', 'dir' or None."""

    @abc.abstractmethod
    def diff(self) -> str:
        """The agent's patch: every change of the tree against `base_commit` (new files included),
        as `git add -A; git diff --cached <base_commit>` gives it."""

    @abc.abstractmethod
    def close(self) -> None:
        """Deletes the work tree / removes the container. Idempotent."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Runtime(abc.ABC):
    """Makes workspaces for instances and says how their tests are run."""

    name: str

    @abc.abstractmethod
    def workspace(self, instance: Instance) -> Workspace:
        """A fresh workspace of `instance` at its `base_commit`."""

    def test_command(self, instance: Instance, test_ids: tuple[str, ...]) -> str:
        """The shell line that runs `test_ids` in a workspace of `instance` and prints a log the
        scorer parses (pytest `-rA` summary lines): `pytest_command` for both runtimes here."""
        return pytest_command(instance, test_ids)

    def close(self) -> None:
        """Releases what the runtime holds (cached images, pools)."""


def files_of_tests(test_ids: tuple[str, ...] | list[str]) -> list[str]:
    """The test files that hold `test_ids` (`path::Class::test[params]` -> `path`), first-seen order,
    each once: what SWE-bench runs is whole files (those of the test patch), never single ids."""
    out: list[str] = []
    for test_id in test_ids:
        path = test_id.split("::", 1)[0]
        if "::" not in test_id and not path.endswith(".py"):
            raise ValueError(f"test id {test_id!r} names no pytest file (path::name): "
                             "these runtimes run pytest files only")
        if path not in out:
            out.append(path)
    return out


def pytest_command(instance: Instance, test_ids: tuple[str, ...] | list[str]) -> str:
    """`instance.extra['test_cmd']` (or PYTEST) followed by the files of `test_ids`, shell-quoted."""
    files = files_of_tests(test_ids)
    if not files:  # pytest with no path would run the repository's whole suite
        raise ValueError(f"{instance.instance_id}: no test ids to run")
    prefix = instance.extra.get("test_cmd") or PYTEST
    return " ".join([prefix, *(shlex.quote(f) for f in files)])


def commit_id(sha: str) -> str:
    """`sha` if it is a commit id (7 to 40 hex digits), else WorkspaceError: it reaches git's command
    line, where `--upload-pack=...` would run a program on the host."""
    if not isinstance(sha, str) or not re.fullmatch(r"[0-9a-f]{7,40}", sha):
        raise WorkspaceError(f"base_commit {sha!r} is not a commit id (7 to 40 lowercase hex digits)")
    return sha


def diff_command(base_commit: str, file_mode: bool = True) -> str:
    """The shell line behind `Workspace.diff`: stage everything (new files too), then diff the index
    against the base commit. Flags pin the format whatever the tree's own git config says (the
    agent may have set colours, an external diff, other prefixes); a stale index.lock from a killed
    command is removed first; warnings stay out of the output, which is the patch alone."""
    git = "git" if file_mode else "git -c core.fileMode=false"
    return (f"rm -f .git/index.lock; "
            f"err=$({git} add -A 2>&1) || {{ printf 'git add -A failed: %s\\n' \"$err\"; exit 3; }}; "
            f"{git} -c core.quotePath=true diff --cached --no-color --no-ext-diff --no-textconv --no-relative "
            f"--src-prefix=a/ --dst-prefix=b/ {commit_id(base_commit)} 2>/dev/null "
            "|| { echo 'git diff failed'; exit 4; }")
