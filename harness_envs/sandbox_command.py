"""One command at a time inside the sandbox's walls (`harness_envs.sandbox`): `run_command` runs a
command (a shell line for SWE-style benchmarks) as a child process with the same limits, isolation,
environment and optional uid as the REPL, keeps the head of its merged output, and kills its whole
process group when the wall clock runs out.
"""
from __future__ import annotations

import dataclasses
import os
import subprocess
import tempfile
import time
from typing import Sequence

from harness_envs.sandbox import Limits, child_argv, kill_group, readable
from harness_envs.sandbox_isolation import child_env, isolation, wrap


@dataclasses.dataclass
class CommandResult:
    returncode: int | None
    output: str
    dropped: int = 0
    timed_out: bool = False
    seconds: float = 0.0


def run_command(argv: Sequence[str] | str, workdir: str, limits: Limits = Limits(), *, isolation_mode: str = "auto",
                hide: Sequence[str] = (), env: dict | None = None, binds: Sequence[tuple[str, str]] = (),
                show: Sequence[str] = (), stdin: str | bytes | None = None,
                user: tuple[int, int] | None = None) -> CommandResult:
    """Runs one command (a string runs under `bash -c`) inside the walls, in `workdir`, with stdout
    and stderr merged and cut at `limits.output_chars`. `stdin` is the command's standard input
    (none by default), passed through an unnamed temporary file so that a large input can never
    block against the output pipe; `binds` and `show` as in `wrap`. `env` is the command's whole
    environment (None: `child_env(workdir)`); the parent's is never passed on by default.

    `user` (uid, gid; a root parent only): the command runs as that uid with that gid and no
    supplementary groups, no capabilities and no way to gain privileges again (no_new_privs, so no
    setuid binary either); the child checks that root cannot be regained, else it runs nothing and
    exits with status 126. Whatever the command must write (`workdir`, the `binds`) must then be
    that uid's (`SandboxUser.own`), and what it runs reachable by it (`show` under bubblewrap;
    `closed_ancestor` elsewhere). The caller kills the uid's processes when its episode ends
    (`SandboxUser.kill_all`): a command in `unshare`/`none` mode has no PID namespace to end them."""
    if isinstance(argv, str):
        argv = ["bash", "-c", argv]
    if user is not None and os.geteuid() != 0:
        raise ValueError(f"run_command(user={tuple(user)}) needs a parent running as root (euid 0, not "
                         f"{os.geteuid()}); pass user=None")
    mode = isolation(isolation_mode)
    full = wrap(child_argv("exec", limits, workdir, "-", argv, user), workdir, mode, hide, binds=binds, show=show,
                drop_to_user=user is not None)
    env = child_env(workdir) if env is None else env
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
            if not readable(proc.stdout.fileno(), left):
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
            kill_group(proc)
        proc.stdout.close()
    return CommandResult(None if timed_out else proc.returncode, kept.decode("utf-8", "replace"), dropped=dropped,
                         timed_out=timed_out, seconds=time.monotonic() - t0)


