"""Where an instance's repository lives while an agent works on it and while a patch is scored.

One interface, two implementations (docs/swegym.md):
- `LocalRuntime` (docker-free): a git work tree of the instance's repository at `base_commit` in a
  temp directory; commands run through `harness_envs.sandbox.run_command` (bubblewrap when present:
  no network, writes only inside the work tree; rlimits on CPU, memory, file size, processes; a
  wall-clock limit per command; bounded output), with the repository's virtual environment (built
  once, reused read-only) first on PATH.
- `ContainerRuntime`: the per-instance images of SWE-bench / SWE-Gym through a `docker`-compatible
  CLI (`docker` or `podman`), the repository at `/testbed`.

Every file operation of the editor tool and every shell command of the agent goes through a
`Workspace`, so harness, tools and scorer do not know which runtime they run on.
"""
from __future__ import annotations

import abc

from harness_envs.sandbox import CommandResult
from harness_envs.swegym.instances import Instance

__all__ = ["CommandResult", "Runtime", "Workspace", "WorkspaceError"]


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
    def run(self, command: str, timeout_s: float | None = None) -> CommandResult:
        """Runs one shell line in `root` under the runtime's limits; never raises for the command's
        own failure (non-zero status, time-out: see CommandResult)."""

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

    @abc.abstractmethod
    def test_command(self, instance: Instance, test_ids: tuple[str, ...]) -> str:
        """The shell line that runs `test_ids` in a workspace of `instance` and prints a log the
        scorer parses (pytest `-rA` summary lines)."""

    def close(self) -> None:
        """Releases what the runtime holds (cached images, pools)."""
