"""The docker-free runtime: an instance's repository as a private git work tree in a temp directory,
its commands under `harness_envs.sandbox_command.run_command` with the repository's virtual environment.

Workspace creation (docs/swegym.md gives the measured time): `git init`, then `git fetch --depth 1`
of the base commit alone from the cached repository (`<repos_dir>/<owner>__<name>.git`, or a work
tree `<repos_dir>/<owner>__<name>`), then a checkout. Nothing else of the source repository comes
along: no remote, no other ref, no `FETCH_HEAD` naming the source, no object beyond the base
commit's tree; the offline cache makes each base commit an orphan, so even `git log` shows one
commit. Git identity is set in the tree's own config, so the agent's `git commit` works.

Commands, under bubblewrap (`sandbox.wrap` gives the mount order):
- the host's `/` read-only; the cached repositories, the hsjax checkout (its instance files hold the
  gold patches) and the temp root of all workspaces covered by empty tmpfs, so the agent cannot
  read the fixed code, the answers or another episode's tree;
- the work tree writable, and a private directory of the workspace mounted as `/tmp` (also HOME
  and TMPDIR), kept between commands and deleted with the workspace;
- the repository's virtual environment (built once, shared) re-exposed read-only, its `bin` first
  on PATH, and `PYTHONPATH` the work tree (or `<tree>/src`, `instance.extra["pythonpath"]`), so the
  agent's edits are what gets imported;
- no network, own PID namespace (every process of a command dies with it, background ones too),
  the rlimits of `limits`, a wall-clock limit per command, output cut at `limits.output_chars`, and
  a minimal environment (no host variable, so no host credential, leaks in);
- as a uid of the workspace's own when this process is root (`uids`; by default under bubblewrap):
  the kernel never applies RLIMIT_NPROC to root, and root inside bubblewrap keeps nearly every
  capability. Each workspace leases a uid (`sandbox.SandboxUser`, gid the same number) from
  `sandbox.SANDBOX_UIDS` for its whole life, so `limits.nproc` (SANDBOX_NPROC when it is None:
  processes and threads, counted per uid machine-wide) bounds that workspace alone, and concurrent
  episodes never starve each other. The command drops to it after its rlimits (no capabilities,
  no_new_privs). The workspace directory is chowned to the uid once the checkout is made (on the
  busy 2-core dev machine 0.06-0.17 s for 10,000 files, as fast as `chown -R`, against 1.6-3.2 s
  for the shallow clone of the same tree), files the host writes into the tree are given to it too, and
  when the venv or its interpreter lies under a directory others cannot enter (`/root/.pyenv`,
  say) that directory is covered by an empty tmpfs with them alone re-exposed read-only (the venv
  stays root's: readable, not writable). The host side (root) reads and diffs the tree as before;
  `close()` kills whatever the uid still runs before the lease ends.

Limits of the walls: as root with `uids=None`, RLIMIT_NPROC does not bind, so a fork bomb runs until
the wall clock ends the command (its PID namespace is then torn down); without bubblewrap
(`isolation_mode` unshare or none) commands can read and write the whole machine (with `uids` given
explicitly: read what any user may, write only the workspace, which is all the leased uid owns).

The host-side file operations (`read_file`, `write_file`, `exists`) confine paths to the tree after
following symlinks, read regular files only (a FIFO would block), and refuse binary or oversized
files. `diff()` runs git inside the sandbox, since the tree's `.git/config` is the agent's to write
(`core.fsmonitor`, filters, ...) and must never run on the host.
"""
from __future__ import annotations

import dataclasses
import math
import os
import pathlib
import shutil
import stat
import subprocess
import tempfile

from harness_envs.sandbox import SANDBOX_UIDS, SYSTEM_PATH, Limits, SandboxUser, child_env, closed_ancestor, isolation
from harness_envs.sandbox_command import CommandResult, run_command
from harness_envs.sandbox_mounts import disk_usage, venv_mounts
from harness_envs.swegym.instances import Instance
from harness_envs.swegym.runtime import Runtime, Workspace, WorkspaceError, commit_id, diff_command

__all__ = ["DEFAULT_CACHE", "DEFAULT_LIMITS", "SANDBOX_NPROC", "LocalRuntime", "LocalWorkspace", "repo_key"]

PROJECT_ROOT = pathlib.Path(__file__).resolve().parents[2]
DEFAULT_CACHE = PROJECT_ROOT / ".cache" / "swegym"
# What one command may use (an agent's command: a test file's run at most; the scorer gives its test
# run a longer wall clock, and `run(timeout_s=...)` widens cpu_s with it, which would end it first).
# `disk_mb` bounds how much the workspace (tree and private /tmp) may grow over its checkout.
DEFAULT_LIMITS = Limits(wall_s=120.0, cpu_s=600, memory_mb=8192, file_mb=256, open_files=1024, nproc=None,
                        output_chars=30_000, disk_mb=2048)
# Processes and threads of one workspace's uid when `limits.nproc` is None (the container runtime's
# default too): room for a test run with subprocesses and a BLAS thread per core, not for a bomb.
SANDBOX_NPROC = 1024
READ_LIMIT_BYTES = 1 << 20
DIFF_CHARS = 16 << 20
GIT_TIMEOUT_S = 120.0
PRIVATE = ".hsjax-tmp"  # the workspace's /tmp, beside the tree
GIT_IDENTITY = "[user]\n\tname = hsjax agent\n\temail = agent@hsjax.invalid\n[gc]\n\tauto = 0\n"


def repo_key(repo: str) -> str:
    """The cache's name for a repository: `owner/name` -> `owner__name`."""
    return repo.replace("/", "__")


class LocalRuntime(Runtime):
    """Workspaces of the offline cache (or of any clones named `<owner>__<name>[.git]` in
    `repos_dir`, with environments `<venvs_dir>/<owner>__<name>`). `hide`: more host paths the
    agent must not see (an instance file kept outside the checkout, say). `uids`: the range each
    workspace leases its commands' uid from (root only); "auto" is `sandbox.SANDBOX_UIDS` whenever
    this process is root, in every isolation mode, else None (commands run as this process's uid,
    which bubblewrap then maps in a user namespace of its own)."""

    name = "local"

    def __init__(self, repos_dir: str | os.PathLike | None = None, venvs_dir: str | os.PathLike | None = None,
                 limits: Limits = DEFAULT_LIMITS, isolation_mode: str = "auto",
                 tmp_root: str | os.PathLike | None = None, *, hide: tuple[str, ...] = (),
                 read_limit_bytes: int = READ_LIMIT_BYTES, uids: range | str | None = "auto"):
        self.repos_dir = os.path.realpath(repos_dir or DEFAULT_CACHE / "repos")
        self.venvs_dir = os.path.realpath(venvs_dir or DEFAULT_CACHE / "venvs")
        self.mode = isolation(isolation_mode)
        if uids == "auto":
            uids = SANDBOX_UIDS if os.geteuid() == 0 else None
        if uids is not None and (not isinstance(uids, range) or os.geteuid() != 0):
            raise ValueError(f"uids={uids!r}: commands run as leased uids only when this process is root and "
                             "uids is a range (or 'auto'); pass uids=None")
        self.uids = uids
        if uids is not None and limits.nproc is None:
            limits = dataclasses.replace(limits, nproc=SANDBOX_NPROC)
        self.limits, self.read_limit_bytes = limits, read_limit_bytes
        self.tmp_root = os.path.realpath(tmp_root or tempfile.gettempdir())
        self.hide = (self.repos_dir, str(PROJECT_ROOT), self.tmp_root, *hide)

    def source(self, instance: Instance) -> str:
        """The cached repository of `instance`: a bare `<key>.git` or a work tree `<key>`."""
        key = repo_key(instance.repo)
        for candidate in (os.path.join(self.repos_dir, key + ".git"), os.path.join(self.repos_dir, key)):
            if os.path.isdir(candidate):
                return candidate
        raise WorkspaceError(f"{instance.instance_id}: no repository for {instance.repo} in {self.repos_dir} "
                             f"(looked for {key}.git and {key}; scripts/setup_swegym.sh builds the offline cache)")

    def venv(self, instance: Instance) -> str:
        """The real path of the repository's virtual environment (it must hold bin/python)."""
        path = os.path.realpath(os.path.join(self.venvs_dir, repo_key(instance.repo)))
        if not os.path.isfile(os.path.join(path, "bin", "python")):
            raise WorkspaceError(f"{instance.instance_id}: no virtual environment for {instance.repo} at {path} "
                                 "(bin/python missing; scripts/setup_swegym.sh builds it)")
        return path

    def reach(self, venv: str) -> list[str]:
        """The paths commands are shown read-only: the venv and its base interpreter. Under
        bubblewrap they are mounted at their own paths on an allow-listed root (`sandbox_mounts`),
        so a directory others cannot enter on the way (/root/.pyenv) does not matter; in the other
        modes a leased uid must be able to walk to them and to the tree, else a WorkspaceError."""
        paths = venv_mounts(venv)
        if self.uids is not None and self.mode != "bwrap":
            for path in [self.tmp_root, *paths]:
                closed = closed_ancestor(path)
                if closed is not None:
                    raise WorkspaceError(f"{path} lies under {closed}, which the sandbox uids cannot enter, and only "
                                         "bubblewrap can mount it elsewhere; give others search permission there "
                                         "(chmod o+x), install bubblewrap, or pass uids=None")
        return paths

    def workspace(self, instance: Instance) -> "LocalWorkspace":
        return LocalWorkspace(self, instance)


class LocalWorkspace(Workspace):
    """A private work tree at `<tmp_root>/hsjax-swegym-XXXX/<name>`; see the module docstring."""

    def __init__(self, runtime: LocalRuntime, instance: Instance):
        self.runtime, self.instance_id = runtime, instance.instance_id
        self.base_commit = commit_id(instance.base_commit)
        source, self._venv = runtime.source(instance), runtime.venv(instance)
        self._pythonpath = _pythonpath(instance)
        self._show = runtime.reach(self._venv)
        self.user: SandboxUser | None = None  # the uid commands run as, when the runtime leases them
        self._dir = tempfile.mkdtemp(prefix="hsjax-swegym-", dir=runtime.tmp_root)
        self.root = os.path.join(self._dir, instance.type)
        self._private = os.path.join(self._dir, PRIVATE)
        self._closed = False
        try:
            os.mkdir(self._private)
            _checkout(source, instance, self.root, self._private)
            if runtime.uids is not None:
                self.user = SandboxUser.lease(runtime.uids)
                self.user.own(self._dir)
            self._checkout_bytes = disk_usage(self._dir)
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ commands

    def _env(self) -> dict:
        home = "/tmp" if self.runtime.mode == "bwrap" else self._private
        env = child_env(home, f"{self._venv}/bin:{SYSTEM_PATH}", VIRTUAL_ENV=self._venv,
                        PYTHONPATH=os.pathsep.join(os.path.normpath(os.path.join(self.root, p)) for p in self._pythonpath),
                        PYTHONDONTWRITEBYTECODE="1", TERM="dumb", GIT_CONFIG_NOSYSTEM="1")
        if self.user is not None:  # the leased uid has no passwd entry: getpass.getuser() reads these
            env.update(USER="agent", LOGNAME="agent")
        return env

    def run(self, command: str, timeout_s: float | None = None, *, stdin: str | None = None,
            output_chars: int | None = None) -> CommandResult:
        self._check()
        limits = self.runtime.limits
        if timeout_s is not None:
            limits = dataclasses.replace(limits, wall_s=timeout_s, cpu_s=max(limits.cpu_s, math.ceil(timeout_s)))
        if output_chars is not None:
            limits = dataclasses.replace(limits, output_chars=output_chars)
        binds = [(self._private, "/tmp")] if self.runtime.mode == "bwrap" else []
        result = run_command(command, self.root, limits, isolation_mode=self.runtime.mode, hide=self.runtime.hide,
                             env=self._env(), binds=binds, show=self._show, stdin=stdin,
                             user=self.user.ids if self.user is not None else None)
        self._check_quota()
        return result

    def _check_quota(self) -> None:
        """The disk quota, counted after each command (the tree must stay a host directory the
        host reads and diffs, so no size-limited tmpfs bounds it; RLIMIT_FSIZE bounds each file
        meanwhile): past `limits.disk_mb` of growth over the checkout, whatever the uid still runs
        is killed and the episode ends in a WorkspaceError naming the sizes."""
        quota = self.runtime.limits.disk_mb
        if not quota:
            return
        grown = disk_usage(self._dir) - self._checkout_bytes
        if grown > quota << 20:
            if self.user is not None:
                self.user.kill_all()
            raise WorkspaceError(f"{self.instance_id}: the workspace grew by {grown / (1 << 20):.0f} MB, more than its "
                                 f"disk quota of {quota} MB (Limits.disk_mb); the episode is stopped")

    def diff(self) -> str:
        result = self.run(diff_command(self.base_commit),
                          timeout_s=max(GIT_TIMEOUT_S, self.runtime.limits.wall_s), output_chars=DIFF_CHARS)
        if result.timed_out or result.returncode != 0:
            raise WorkspaceError(f"{self.instance_id}: the diff against {self.base_commit[:12]} failed "
                                 f"({'timed out' if result.timed_out else f'status {result.returncode}'}): "
                                 f"{result.output[-500:]}")
        if result.dropped:
            raise WorkspaceError(f"{self.instance_id}: the diff is larger than {DIFF_CHARS} characters")
        return result.output

    # ------------------------------------------------------------------ files (host side, confined)

    def _resolve(self, path: str) -> str:
        self._check()
        if not isinstance(path, str) or not path or "\0" in path:
            raise WorkspaceError(f"not a usable path: {path!r}")
        real = os.path.realpath(os.path.join(self.root, path))  # an absolute `path` replaces root
        root = os.path.realpath(self.root)
        if real != root and not real.startswith(root + os.sep):
            raise WorkspaceError(f"{path}: outside the work tree {self.root} (symlinks followed); only files "
                                 "of the repository can be read or written")
        return real

    def read_file(self, path: str) -> str:
        real = self._resolve(path)
        try:
            info = os.stat(real)
        except FileNotFoundError:
            raise WorkspaceError(f"{path}: no such file") from None
        if stat.S_ISDIR(info.st_mode):
            raise WorkspaceError(f"{path}: a directory, not a file")
        if not stat.S_ISREG(info.st_mode):
            raise WorkspaceError(f"{path}: not a regular file")
        if info.st_size > self.runtime.read_limit_bytes:
            raise WorkspaceError(f"{path}: {info.st_size} bytes, more than the {self.runtime.read_limit_bytes} "
                                 "a read returns; look at parts of it with a command (sed -n, head, grep)")
        with open(real, "rb") as f:
            data = f.read(self.runtime.read_limit_bytes + 1)
        return _text(data, path)

    def write_file(self, path: str, text: str) -> None:
        real = self._resolve(path)
        data = text.encode("utf-8")
        if len(data) > self.runtime.limits.file_mb * (1 << 20):
            raise WorkspaceError(f"{path}: {len(data)} bytes, more than the file limit of "
                                 f"{self.runtime.limits.file_mb} MB")
        if os.path.isdir(real):
            raise WorkspaceError(f"{path}: a directory, not a file")
        made, parent = [], os.path.dirname(real)
        while not os.path.isdir(parent) and parent != os.path.dirname(parent):
            made.append(parent)
            parent = os.path.dirname(parent)
        try:
            os.makedirs(os.path.dirname(real), exist_ok=True)
            fd = os.open(real, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        except OSError as e:
            raise WorkspaceError(f"{path}: cannot be written ({e.strerror})") from None
        with os.fdopen(fd, "wb") as f:
            if self.user is not None:  # the agent's commands must be able to edit what the host wrote
                os.fchown(f.fileno(), *self.user.ids)
                for directory in made:
                    os.lchown(directory, *self.user.ids)
            f.write(data)

    def exists(self, path: str) -> str | None:
        real = self._resolve(path)
        return "dir" if os.path.isdir(real) else "file" if os.path.isfile(real) else None

    # ------------------------------------------------------------------ life cycle

    def _check(self) -> None:
        if self._closed:
            raise WorkspaceError(f"{self.instance_id}: the workspace is closed")
        if not os.path.isdir(self.root):
            raise WorkspaceError(f"{self.instance_id}: the work tree {self.root} is gone")

    def close(self) -> None:
        if getattr(self, "_closed", True):
            return
        self._closed = True
        user, self.user = self.user, None
        try:
            if user is not None:
                user.kill_all()  # nothing of the uid may outlive its lease (commands without a PID namespace)
        finally:
            _remove(self._dir)
            if user is not None:
                user.release()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def _pythonpath(instance: Instance) -> list[str]:
    """The tree-relative import roots: `instance.extra["pythonpath"]` ("src", or "a:b"), else the tree."""
    value = instance.extra.get("pythonpath") or "."
    parts = value.split(os.pathsep) if isinstance(value, str) else list(value)
    for part in parts:
        if not isinstance(part, str) or os.path.isabs(part) or ".." in pathlib.PurePosixPath(part).parts:
            raise WorkspaceError(f"{instance.instance_id}: pythonpath {value!r} must be relative to the tree")
    return [os.path.normpath(p) for p in parts]


def _git(args: list[str], cwd: str, home: str) -> None:
    env = {"PATH": SYSTEM_PATH, "HOME": home, "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull,
           "GIT_TERMINAL_PROMPT": "0", "LANG": "C"}
    proc = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=GIT_TIMEOUT_S)
    if proc.returncode != 0:
        raise WorkspaceError(f"git {' '.join(args[:2])} failed: {(proc.stderr or proc.stdout).strip()[-500:]}")


def _checkout(source: str, instance: Instance, root: str, home: str) -> None:
    """`root` := a fresh repository holding the base commit alone, checked out on branch `main`."""
    _git(["init", "-q", "--template=", "-b", "main", root], os.path.dirname(root), home)
    url = pathlib.Path(source).as_uri()
    try:
        _git(["fetch", "-q", "--depth", "1", "--no-tags", url, instance.base_commit], root, home)
    except WorkspaceError:  # a server that refuses a bare commit id still serves the instance's tag
        try:
            _git(["fetch", "-q", "--depth", "1", "--no-tags", url, f"refs/tags/{instance.instance_id}"], root, home)
        except WorkspaceError as e:
            raise WorkspaceError(f"{instance.instance_id}: base commit {instance.base_commit} is not in {source} "
                                 f"(neither by id nor by tag): {e}") from None
    try:
        _git(["checkout", "-q", "-B", "main", instance.base_commit], root, home)
    except WorkspaceError as e:
        raise WorkspaceError(f"{instance.instance_id}: base commit {instance.base_commit} is not in {source}: "
                             f"{e}") from None
    os.remove(os.path.join(root, ".git", "FETCH_HEAD"))  # it names the source repository
    with open(os.path.join(root, ".git", "config"), "a", encoding="utf-8") as f:
        f.write(GIT_IDENTITY)


def _text(data: bytes, path: str) -> str:
    if b"\0" in data[:8192]:
        raise WorkspaceError(f"{path}: a binary file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise WorkspaceError(f"{path}: not UTF-8 text") from None


def _remove(path: str) -> None:
    """Deletes a tree whatever modes the agent left on it (a directory made read-only, say)."""

    def retry(function, failed, _exc):
        try:
            os.chmod(os.path.dirname(failed), 0o700)
            os.chmod(failed, 0o700)
            function(failed)
        except OSError:
            pass

    if os.path.lexists(path):
        shutil.rmtree(path, onerror=retry)
