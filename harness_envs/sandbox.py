"""Sandboxes for untrusted agent code: a persistent Python REPL per episode, or one command at a time.

Agent code is hostile input. Whatever it does, it runs in a separate process that
- runs as a uid of its own when this process is root (`SandboxUser`: the REPL leases one for its
  life, a SWE-Gym workspace for its own), with no capabilities and no_new_privs, in every isolation
  mode: it cannot signal, ptrace or read the memory of its parent, write what root owns, read
  /etc/shadow, or raise its limits; every process of that uid is killed when the REPL stops or
  closes (a `setsid` daemon included);
- gets an explicit minimal environment (`child_env`), never the parent's: no API key reaches it;
- holds resource limits it cannot raise (`Limits`: CPU seconds, address space, file size, open
  files, optionally processes, and a disk quota for the episode directory), set by the process
  itself before any agent code runs;
- under bubblewrap (`bwrap`, Debian package `bubblewrap`) sees only an allow-list of the file system
  (`sandbox_mounts`: system programs and libraries, its interpreter, what the caller shows, its
  episode directory) and has no network, its own PID/IPC/UTS namespaces and `--die-with-parent`;
  without bubblewrap, `unshare --net` (network only; root parents) or, asked for explicitly,
  nothing (`isolation()` says which one a machine gets, and refuses agent code where none is safe);
- in the REPL, also meets an inner wall (an audit hook and import guards refusing sockets,
  processes, native code and writes outside the episode directory; `sandbox_child.py`): a second
  line, never the boundary;
- is killed with its whole process group when a cell or command passes its wall-clock limit;
- returns bounded output, and on any exception the traceback of the agent's own code as text.

`PythonSandbox` is the REPL (AppWorld-style code cells, state kept between cells) with an optional
bridge object whose calls the parent answers (`apis.app.api(...)`: the world's state stays in the
parent, out of the agent code's reach). `sandbox_command.run_command` runs one command (a shell line
for SWE-style benchmarks) under the same walls, with the `Limits`, child process and kill of this
module. docs/appworld.md gives the measured overheads.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
import select
import shutil
import signal
import subprocess
import tempfile
import time
from typing import Any, Callable, Sequence

from harness_envs.sandbox_isolation import ISOLATIONS, SYSTEM_PATH, child_env, isolation, wrap  # noqa: F401 (API)
from harness_envs.sandbox_mounts import disk_usage, interpreter, mount_quota, sweep_stale_quota_mounts, unmount
from harness_envs.sandbox_users import SANDBOX_UIDS, UID_LOCKS, SandboxUser, closed_ancestor  # noqa: F401 (API)

CHILD_SOURCE = (pathlib.Path(__file__).with_name("sandbox_child.py")).read_text()
_MAX_MESSAGE_BYTES = 1 << 24
_START_TIMEOUT_S = 20.0


@dataclasses.dataclass(frozen=True)
class Limits:
    """What one sandbox process may use. `wall_s` bounds each cell or command; `cpu_s` the process's
    whole life (an episode of cells); `nproc` is RLIMIT_NPROC as the kernel counts it (every
    process and thread of the user, machine-wide; never applied to root: run commands as a
    `SandboxUser`), None to leave it; `disk_mb` the episode directory's quota (a REPL's own
    directory is a tmpfs of that size when the parent is root, else its usage is checked after
    each cell; `run_command` leaves it to the caller), None for none."""

    wall_s: float = 10.0
    cpu_s: int = 60
    memory_mb: int = 1024
    file_mb: int = 16
    open_files: int = 64
    nproc: int | None = None
    output_chars: int = 20_000
    disk_mb: int | None = 64

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


def child_argv(role: str, limits: "Limits", workdir: str, pipes: str, rest: Sequence[str],
                user: tuple[int, int] | None) -> list[str]:
    return [interpreter()[0], "-I", "-S", "-c", CHILD_SOURCE, role, limits.to_child(user), workdir, pipes, *rest]


def readable(fd: int, timeout_s: float) -> bool:
    """Whether `fd` has data (or end of file) within `timeout_s`; poll, not select, so that
    descriptor numbers past 1024 (many episodes open at once) work."""
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    # Rounded up: a poll that woke before the caller's deadline would read as "no answer" instead of a timeout.
    return bool(poller.poll(max(0, math.ceil(timeout_s * 1000))))


def kill_group(proc: subprocess.Popen) -> None:
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
    temporary directory, removed by `close()`.

    When this process is root the REPL leases a uid (`SandboxUser`, from `uids`) for its whole
    life and its child drops to it before the first cell; its own directory is then a tmpfs of
    `limits.disk_mb` (`sandbox_mounts.mount_quota`: a hard limit, ENOSPC past it). A directory
    the caller gives is made the uid's instead, and its usage is checked after each cell, as it
    is where no tmpfs can be mounted: past the quota the REPL is stopped, the directory emptied
    and the cell ends in a `DiskQuotaError`. Every process of the uid is killed whenever the REPL
    stops (timeout, crash, close)."""

    def __init__(self, limits: Limits = Limits(), *, workdir: str | None = None, isolation_mode: str = "auto",
                 bridge: str = "", on_call: Callable[[list, list, dict], Any] | None = None,
                 hide: Sequence[str] = (), uids: range = SANDBOX_UIDS):
        self.limits, self.bridge, self.on_call, self.hide = limits, bridge, on_call, tuple(hide)
        self.mode = isolation(isolation_mode)
        self._own_dir = workdir is None
        self.workdir = os.path.realpath(workdir or tempfile.mkdtemp(prefix="hsjax-sandbox-"))
        self._proc: subprocess.Popen | None = None
        self._to_child = self._from_child = None
        self._buffer = b""
        self.cells = 0
        self.starts = 0
        self.user: SandboxUser | None = None
        self.quota_mounted = False
        try:
            if os.geteuid() == 0:
                self.user = SandboxUser.lease(uids)
                sweep_stale_quota_mounts(self.user.uid)  # of a run killed before it could close them
                if self._own_dir and limits.disk_mb:
                    self.quota_mounted = mount_quota(self.workdir, limits.disk_mb, *self.user.ids)
                if not self.quota_mounted:
                    self.user.own(self.workdir)
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ life cycle

    def _start(self) -> None:
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        user = self.user.ids if self.user is not None else None
        argv = child_argv("repl", self.limits, self.workdir, f"{to_child_r},{from_child_w}", [self.bridge], user)
        try:
            self._proc = subprocess.Popen(
                wrap(argv, self.workdir, self.mode, self.hide, drop_to_user=user is not None),
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                pass_fds=(to_child_r, from_child_w), start_new_session=True, cwd=self.workdir,
                env=child_env(self.workdir))
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
            kill_group(proc)
        if self.user is not None:
            self.user.kill_all()  # what the cells started outside the process group (setsid) dies too

    def close(self) -> None:
        self._stop()
        if self.quota_mounted:
            unmount(self.workdir)
            self.quota_mounted = False
        if self._own_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)
        if self.user is not None:
            self.user.release()
            self.user = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close() if self._own_dir else self._stop()
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
            if not readable(self._from_child, left):
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
                over = self._over_quota()
                if over:
                    return self._failed(t0, over, error="DiskQuotaError")
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

    def _over_quota(self) -> str:
        """Why the episode directory is past its quota ("" if it is not); checked where no quota
        tmpfs bounds it. Past it, the directory is emptied (the REPL restarts with it)."""
        if self.quota_mounted or not self.limits.disk_mb:
            return ""
        used = disk_usage(self.workdir)
        if used <= self.limits.disk_mb << 20:
            return ""
        self._stop()
        for entry in os.listdir(self.workdir):
            path = os.path.join(self.workdir, entry)
            shutil.rmtree(path, ignore_errors=True) if os.path.isdir(path) and not os.path.islink(path) else os.remove(path)
        return (f"the episode directory held {used / (1 << 20):.0f} MB, more than its quota of "
                f"{self.limits.disk_mb} MB (Limits.disk_mb), so its files were removed")

    def _failed(self, t0: float, why: str, error: str = "SandboxError") -> CellResult:
        proc = self._proc
        returncode = None
        if proc is not None:
            try:
                returncode = proc.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                pass
        self._stop()
        state = _death(returncode) if returncode is not None else "stopped answering"
        text = (f"{error}: the REPL process {state}{'; ' + why if why else ''}; it was restarted, so "
                "earlier variables are gone")
        return CellResult("", error=error, traceback=text, crashed=True, seconds=time.monotonic() - t0)
