"""Sandboxes for untrusted agent code: a persistent Python REPL per episode, or one command at a time.

Agent code is hostile input. Whatever it does, it runs in a separate process that
- holds resource limits it cannot raise (`Limits`: CPU seconds, address space, file size, open
  files, optionally processes), set by the process itself before any agent code runs;
- has no network and sees the file system read-only except its episode directory, when
  bubblewrap (`bwrap`, Debian package `bubblewrap`) is installed: `--unshare-net`, `--ro-bind / /`,
  `--bind <episode dir>`, new PID/IPC/UTS namespaces, `--die-with-parent`, and `hide` paths covered by
  an empty tmpfs (the project's own source, so agent code cannot read task generators);
- without bubblewrap, `unshare --net` (network only) or nothing; the Python REPL then relies on
  its inner wall alone (an audit hook refusing sockets, processes, native code and writes outside
  the episode directory; `sandbox_child.py`). `isolation()` says which one a machine gets;
- is killed with its whole process group when a cell or command passes its wall-clock limit;
- returns bounded output, and on any exception the traceback of the agent's own code as text;
- for `run_command(user=...)`, runs as an unprivileged uid: a parent running as root drops to it
  inside the child, after the rlimits and before the command (`SandboxUser` leases a uid of its own
  to each workspace). The kernel never applies RLIMIT_NPROC to root, and root inside bubblewrap
  keeps nearly every capability (CAP_SYS_ADMIN among them); the uid has neither.

`PythonSandbox` is the REPL (AppWorld-style code cells, state kept between cells) with an optional
bridge object whose calls the parent answers (`apis.app.api(...)`: the world's state stays in the
parent, out of the agent code's reach). `run_command` runs one command (a shell line for SWE-style
benchmarks) under the same walls. docs/appworld.md gives the measured overheads.
"""
from __future__ import annotations

import dataclasses
import fcntl
import functools
import json
import math
import os
import pathlib
import select
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Sequence

CHILD_SOURCE = (pathlib.Path(__file__).with_name("sandbox_child.py")).read_text()
ISOLATIONS = ("auto", "bwrap", "unshare", "none")
_MAX_MESSAGE_BYTES = 1 << 24
_START_TIMEOUT_S = 20.0


@dataclasses.dataclass(frozen=True)
class Limits:
    """What one sandbox process may use. `wall_s` bounds each cell or command; `cpu_s` the process's
    whole life (an episode of cells); `nproc` is RLIMIT_NPROC as the kernel counts it (every
    process and thread of the user, machine-wide; never applied to root: run commands as a
    `SandboxUser`), None to leave it."""

    wall_s: float = 10.0
    cpu_s: int = 60
    memory_mb: int = 1024
    file_mb: int = 16
    open_files: int = 64
    nproc: int | None = None
    output_chars: int = 20_000

    def to_child(self, user: tuple[int, int] | None = None) -> str:
        return json.dumps({"cpu_s": self.cpu_s, "memory_mb": self.memory_mb, "file_mb": self.file_mb,
                           "open_files": self.open_files, "nproc": self.nproc,
                           "output_chars": self.output_chars, **({"user": list(user)} if user else {})})


@dataclasses.dataclass
class CellResult:
    """What one cell did. `error` is the class name of what it raised (also `TimeoutError` when the
    wall clock ran out and `SandboxError` when the process died), `traceback` its text."""

    output: str
    error: str | None = None
    traceback: str | None = None
    dropped: int = 0
    timed_out: bool = False
    crashed: bool = False
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclasses.dataclass
class CommandResult:
    returncode: int | None
    output: str
    dropped: int = 0
    timed_out: bool = False
    seconds: float = 0.0


@functools.lru_cache(maxsize=None)
def _works(argv: tuple[str, ...]) -> bool:
    try:
        return subprocess.run([*argv, "true"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def isolation(requested: str = "auto") -> str:
    """The isolation this machine gives: `bwrap` if bubblewrap runs, else `unshare` if a network
    namespace can be made, else `none`. Asking for one that does not work is an error."""
    if requested not in ISOLATIONS:
        raise ValueError(f"sandbox isolation {requested!r} is not one of {ISOLATIONS}")
    bwrap_ok = shutil.which("bwrap") is not None and _works(("bwrap", "--ro-bind", "/", "/", "--unshare-net", "--"))
    unshare_ok = shutil.which("unshare") is not None and _works(tuple(_unshare_prefix()))
    if requested == "auto":
        return "bwrap" if bwrap_ok else "unshare" if unshare_ok else "none"
    if (requested == "bwrap" and not bwrap_ok) or (requested == "unshare" and not unshare_ok):
        raise RuntimeError(f"sandbox isolation {requested!r} does not work on this machine; install bubblewrap "
                           "(apt-get install bubblewrap) or use isolation='auto'")
    return requested


def _unshare_prefix() -> list[str]:
    return ["unshare", "--net"] + ([] if os.geteuid() == 0 else ["--map-root-user"])


def wrap(argv: Sequence[str], workdir: str, mode: str, hide: Sequence[str] = (), *,
         binds: Sequence[tuple[str, str]] = (), show: Sequence[str] = (), enterable: bool = False) -> list[str]:
    """`argv` inside the isolation `mode` (a resolved one: bwrap, unshare or none).

    Under bwrap the mounts stack in this order, each able to cover the ones before: `/` read-only,
    an empty tmpfs over each `hide` path, the writable `binds` (host source, sandbox destination;
    e.g. a private directory as `/tmp`), the read-only `show` paths (re-exposed after a `hide` or a
    bind covered them), and `workdir`, writable, last, so that nothing covers it. The directories
    bubblewrap makes on the way to a mount are root's with mode 0700; `enterable` makes them 0755
    (`--dir`, a no-op where one exists), for a command that drops to another uid. The other modes
    have no file-system walls and ignore `hide`, `binds` and `show`."""
    if mode == "bwrap":
        prefix = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]

        def mount(kind: str, source: str, dest: str) -> None:
            if enterable:
                parents = pathlib.PurePosixPath(dest).parents
                for parent in reversed([str(p) for p in parents if str(p) != "/"]):
                    prefix.extend(["--dir", parent])
            prefix.extend([kind, source, dest])

        hidden = [os.path.realpath(p) for p in hide if os.path.isdir(p)]
        for path in hidden:
            prefix += ["--tmpfs", path]
        # The base interpreter (the child runs `python -I -S`) stays visible even under a hidden path.
        keep = os.path.realpath(sys.base_prefix)
        if any(keep == h or keep.startswith(h + os.sep) for h in hidden):
            mount("--ro-bind", keep, keep)
        for source, dest in binds:
            mount("--bind", os.path.realpath(source), dest)
        for path in show:
            mount("--ro-bind", os.path.realpath(path), os.path.realpath(path))
        workdir = os.path.realpath(workdir)
        mount("--bind", workdir, workdir)
        prefix += ["--chdir", workdir, "--unshare-net", "--unshare-pid",
                   "--unshare-ipc", "--unshare-uts", "--die-with-parent", "--new-session", "--"]
        return prefix + list(argv)
    if mode == "unshare":
        return _unshare_prefix() + ["--"] + list(argv)
    if mode == "none":
        return list(argv)
    raise ValueError(f"wrap needs a resolved isolation (bwrap, unshare, none), got {mode!r}")


def _python(hide: Sequence[str]) -> str:
    """An interpreter path that stays visible when `hide` paths are covered: the base interpreter
    (the child needs only the standard library), which `wrap` keeps visible."""
    if not hide:
        return sys.executable
    exe = os.path.realpath(sys.executable)
    hidden = [os.path.realpath(p) for p in hide]
    if any(exe.startswith(h + os.sep) for h in hidden):  # a venv made with --copies
        exe = os.path.join(sys.base_prefix, "bin", f"python{sys.version_info.major}.{sys.version_info.minor}")
    return exe


def _readable(fd: int, timeout_s: float) -> bool:
    """Whether `fd` has data (or end of file) within `timeout_s`; poll, not select, so that
    descriptor numbers past 1024 (many episodes open at once) work."""
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    # Rounded up: a poll that woke before the caller's deadline would read as "no answer" instead of a timeout.
    return bool(poller.poll(max(0, math.ceil(timeout_s * 1000))))


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            proc.kill()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


def _death(returncode: int | None) -> str:
    if returncode is not None and returncode < 0:
        sig = -returncode
        why = {signal.SIGXCPU: "its CPU time limit", signal.SIGKILL: "a kill (memory or CPU limit)",
               signal.SIGSEGV: "a crash"}.get(sig, signal.Signals(sig).name if sig in signal.valid_signals() else sig)
        return f"stopped by {why}"
    return f"exited with status {returncode}"


class PythonSandbox:
    """A persistent Python REPL in its own process (started on the first cell, restarted after a
    timeout or a crash, which loses the variables). `bridge` names the object through which cells
    call the parent; `on_call(path, args, kwargs)` answers those calls (an exception it raises
    reaches the cell as an exception of the same class name and message). `workdir` None: a fresh
    temporary directory, removed by `close()`."""

    def __init__(self, limits: Limits = Limits(), *, workdir: str | None = None, isolation_mode: str = "auto",
                 bridge: str = "", on_call: Callable[[list, list, dict], Any] | None = None,
                 hide: Sequence[str] = ()):
        self.limits, self.bridge, self.on_call, self.hide = limits, bridge, on_call, tuple(hide)
        self.mode = isolation(isolation_mode)
        self._own_dir = workdir is None
        self.workdir = workdir or tempfile.mkdtemp(prefix="hsjax-sandbox-")
        self._proc: subprocess.Popen | None = None
        self._to_child = self._from_child = None
        self._buffer = b""
        self.cells = 0
        self.starts = 0

    # ------------------------------------------------------------------ life cycle

    def _start(self) -> None:
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        argv = [_python(self.hide), "-I", "-S", "-c", CHILD_SOURCE, "repl", self.limits.to_child(), self.workdir,
                f"{to_child_r},{from_child_w}", self.bridge]
        try:
            self._proc = subprocess.Popen(
                wrap(argv, self.workdir, self.mode, self.hide), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, pass_fds=(to_child_r, from_child_w), start_new_session=True,
                cwd=self.workdir)
        finally:
            os.close(to_child_r)
            os.close(from_child_w)
        self._to_child, self._from_child, self._buffer = to_child_w, from_child_r, b""
        self.starts += 1
        ready = self._read(time.monotonic() + _START_TIMEOUT_S)
        if not ready or ready.get("op") != "ready":
            proc = self._proc
            self._stop()
            raise RuntimeError(f"the sandbox did not start ({self.mode} isolation; the process {_death(proc.poll())}); "
                               "check that the interpreter is visible inside it, or try isolation_mode='none'")

    def _stop(self) -> None:
        proc, self._proc = self._proc, None
        for fd in (self._to_child, self._from_child):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._to_child = self._from_child = None
        if proc is not None:
            _kill(proc)

    def close(self) -> None:
        self._stop()
        if self._own_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self._stop()
        except Exception:
            pass

    # ------------------------------------------------------------------ the pipe

    def _write(self, message: dict) -> bool:
        data = (json.dumps(message, default=repr) + "\n").encode()
        try:
            while data:
                data = data[os.write(self._to_child, data):]
            return True
        except (OSError, TypeError):
            return False

    def _read(self, deadline: float) -> dict | None:
        """The next message, or None on timeout, end of stream or garbage (a hostile cell may write
        anything to the pipe; the caller then restarts the process)."""
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or len(self._buffer) > _MAX_MESSAGE_BYTES:
                return None
            if not _readable(self._from_child, left):
                continue  # the loop's own clock decides whether the deadline has passed
            chunk = os.read(self._from_child, 1 << 16)
            if not chunk:
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        try:
            message = json.loads(line)
        except ValueError:
            return {"op": "garbage"}
        return message if isinstance(message, dict) else {"op": "garbage"}

    # ------------------------------------------------------------------ cells

    def run(self, code: str, name: str | None = None) -> CellResult:
        """Runs one cell; its variables persist for the next one."""
        t0 = time.monotonic()
        if self._proc is None or self._proc.poll() is not None:
            self._stop()
            self._start()
        self.cells += 1
        deadline = time.monotonic() + self.limits.wall_s
        if not self._write({"op": "run", "code": code, "name": name or f"<cell {self.cells}>"}):
            return self._failed(t0, "the sandbox process is gone")
        while True:
            message = self._read(deadline)
            if message is None:
                if time.monotonic() >= deadline:
                    self._stop()
                    return CellResult("", error="TimeoutError", timed_out=True, seconds=time.monotonic() - t0,
                                      traceback=f"TimeoutError: the code ran longer than {self.limits.wall_s:g} s and "
                                                "was stopped; the REPL was restarted, so earlier variables are gone")
                return self._failed(t0, "")
            op = message.get("op")
            if op == "done":
                return CellResult(str(message.get("output") or ""), error=message.get("error"),
                                  traceback=message.get("traceback"), dropped=int(message.get("dropped") or 0),
                                  seconds=time.monotonic() - t0)
            if op == "call" and self.on_call is not None:
                if not self._write(self._answer(message)):
                    return self._failed(t0, "the sandbox process is gone")
                continue
            return self._failed(t0, f"it sent an unexpected message ({str(op)[:40]!r})")

    def _answer(self, message: dict) -> dict:
        path, args, kwargs = message.get("path"), message.get("args"), message.get("kwargs")
        if not isinstance(path, list) or not isinstance(args, list) or not isinstance(kwargs, dict):
            return {"op": "reply", "ok": False, "type": "TypeError", "message": "malformed call"}
        try:
            return {"op": "reply", "ok": True, "value": self.on_call([str(p) for p in path], args, kwargs)}
        except Exception as e:
            return {"op": "reply", "ok": False, "type": type(e).__name__, "message": str(e)}

    def _failed(self, t0: float, why: str) -> CellResult:
        proc = self._proc
        returncode = None
        if proc is not None:
            try:
                returncode = proc.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                pass
        self._stop()
        state = _death(returncode) if returncode is not None else "stopped answering"
        text = (f"SandboxError: the REPL process {state}{'; ' + why if why else ''}; it was restarted, so "
                "earlier variables are gone")
        return CellResult("", error="SandboxError", traceback=text, crashed=True, seconds=time.monotonic() - t0)


def run_command(argv: Sequence[str] | str, workdir: str, limits: Limits = Limits(), *, isolation_mode: str = "auto",
                hide: Sequence[str] = (), env: dict | None = None, binds: Sequence[tuple[str, str]] = (),
                show: Sequence[str] = (), stdin: str | bytes | None = None,
                user: tuple[int, int] | None = None) -> CommandResult:
    """Runs one command (a string runs under `bash -c`) inside the walls, in `workdir`, with stdout
    and stderr merged and cut at `limits.output_chars`. `stdin` is the command's standard input
    (none by default), passed through an unnamed temporary file so that a large input can never
    block against the output pipe; `binds` and `show` as in `wrap`.

    `user` (uid, gid; a root parent only): the command runs as that uid with that gid and no
    supplementary groups, no capabilities and no way to gain privileges again (no_new_privs, so no
    setuid binary either); the child checks that root cannot be regained, else it runs nothing and
    exits with status 126. Whatever the command must write (`workdir`, the `binds`) must then be
    that uid's (`SandboxUser.own`), and what it runs reachable by it (`closed_ancestor`)."""
    if isinstance(argv, str):
        argv = ["bash", "-c", argv]
    if user is not None and os.geteuid() != 0:
        raise ValueError(f"run_command(user={tuple(user)}) needs a parent running as root (euid 0, not "
                         f"{os.geteuid()}); pass user=None")
    mode = isolation(isolation_mode)
    full = wrap([_python(hide), "-I", "-S", "-c", CHILD_SOURCE, "exec", limits.to_child(user), workdir, "-", *argv],
                workdir, mode, hide, binds=binds, show=show, enterable=user is not None)
    with tempfile.TemporaryFile() as source:
        if stdin is not None:
            source.write(stdin.encode() if isinstance(stdin, str) else stdin)
            source.seek(0)
        return _collect(full, workdir, limits, env, source if stdin is not None else subprocess.DEVNULL)


def _collect(full: list[str], workdir: str, limits: Limits, env: dict | None, stdin) -> CommandResult:
    """Runs `full`, keeping the head of its output, until it exits or the wall clock runs out (also
    when it closed its output early and went on running: `exec >&-; sleep 1000`)."""
    t0 = time.monotonic()
    proc = subprocess.Popen(full, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True, cwd=workdir, env=env)
    kept, dropped, timed_out = bytearray(), 0, False
    deadline = t0 + limits.wall_s
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            if not _readable(proc.stdout.fileno(), left):
                continue
            chunk = os.read(proc.stdout.fileno(), 1 << 16)
            if not chunk:
                break
            room = max(0, limits.output_chars - len(kept))
            kept += chunk[:room]
            dropped += max(0, len(chunk) - room)
    finally:
        if not timed_out:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
        if timed_out:
            _kill(proc)
        proc.stdout.close()
    return CommandResult(None if timed_out else proc.returncode, kept.decode("utf-8", "replace"), dropped=dropped,
                         timed_out=timed_out, seconds=time.monotonic() - t0)


# ---------------------------------------------------------------------------------------- own uids

# Uids leased to workspaces, gid = uid: above the subordinate ids that `useradd` hands out by default
# (/etc/subuid: 100000 up to 600100000) and below 2**31 (tools that read a uid as a signed int).
SANDBOX_UIDS = range(1_500_000_000, 1_500_000_000 + 4096)
UID_LOCKS = "/run/hsjax-sandbox-uids" if os.path.isdir("/run") else os.path.join(tempfile.gettempdir(),
                                                                                   "hsjax-sandbox-uids")


class SandboxUser:
    """A uid (and the gid of the same number) leased to one workspace for its whole life, so that
    RLIMIT_NPROC, which counts every process and thread of a uid machine-wide, bounds that workspace
    and no other: concurrent workspaces never share a uid, so one fork bomb cannot starve the
    others. The lease is an exclusive `flock` on `<locks>/<uid>`, held until `release()` or until
    this process dies, so it is exclusive across the processes of a machine too. Root only."""

    def __init__(self, uid: int, lock_fd: int):
        self.uid, self.gid, self._lock_fd = uid, uid, lock_fd

    @property
    def ids(self) -> tuple[int, int]:
        return self.uid, self.gid

    @classmethod
    def lease(cls, uids: range = SANDBOX_UIDS, locks: str = UID_LOCKS) -> "SandboxUser":
        """The first uid of `uids` that no other workspace of the machine holds."""
        if os.geteuid() != 0:
            raise PermissionError(f"sandbox uids can be leased only by root (this process runs as uid {os.geteuid()})")
        os.makedirs(locks, mode=0o700, exist_ok=True)
        info = os.lstat(locks)
        if not os.path.isdir(locks) or os.path.islink(locks) or info.st_uid != 0 or info.st_mode & 0o022:
            raise PermissionError(f"{locks}: the uid lock directory must be root's own, not a link, and "
                                  "writable by nobody else; remove it and retry")
        for uid in uids:
            fd = os.open(os.path.join(locks, str(uid)), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            return cls(uid, fd)
        raise RuntimeError(f"all {len(uids)} sandbox uids ({uids.start}..{uids.stop - 1}) are leased: too many "
                           "workspaces open at once on this machine; close some or pass a longer range")

    def own(self, path: str) -> None:
        """Makes `path` and everything under it this uid's (`lchown`: links are not followed)."""
        os.lchown(path, self.uid, self.gid)
        stack = [path] if os.path.isdir(path) and not os.path.islink(path) else []
        while stack:
            with os.scandir(stack.pop()) as entries:
                for entry in entries:
                    os.lchown(entry.path, self.uid, self.gid)
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)

    def kill_all(self) -> None:
        """SIGKILLs every process of this uid (`kill -KILL -1` run as the uid: the kernel signals
        them all in one pass, so a fork bomb cannot outrun it)."""
        subprocess.run(["/bin/sh", "-c", "kill -KILL -1"], user=self.uid, group=self.gid, extra_groups=[], env={},
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       cwd="/", timeout=30)

    def release(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def __del__(self):
        self.release()


def closed_ancestor(path: str) -> str | None:
    """The outermost directory on the way to `path` (itself included) that users other than its
    owner and group cannot enter (no `o+x`; `/root` is the usual one), or None. Under bubblewrap an
    empty tmpfs `hide` over it plus `show` of `path` makes `path` reachable by a sandbox uid."""
    parts = pathlib.PurePosixPath(os.path.realpath(path)).parts
    for i in range(1, len(parts) + 1):
        directory = os.path.join(*parts[:i])
        try:
            info = os.stat(directory)
        except FileNotFoundError:
            return None
        if stat.S_ISDIR(info.st_mode) and not info.st_mode & stat.S_IXOTH:
            return directory
    return None
