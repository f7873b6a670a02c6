"""Which walls a machine can give agent code (`isolation`), and the command line that puts a
process inside them (`wrap`), with the environment it gets (`child_env`).

Modes: `bwrap` (bubblewrap: mount allow-list, no network, own PID/IPC/UTS namespaces;
`sandbox_mounts`), `unshare` (`unshare --net`: no network, nothing else) and `none`. A root parent
adds a leased uid in every mode (`sandbox_users`); what is refused where is `isolation`'s docstring.
"""
from __future__ import annotations

import functools
import os
import shutil
import subprocess
from typing import Sequence

from harness_envs.errors import SetupRefused
from harness_envs.sandbox_mounts import bwrap_argv

ISOLATIONS = ("auto", "bwrap", "unshare", "none")
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@functools.lru_cache(maxsize=None)
def _works(argv: tuple[str, ...]) -> bool:
    try:
        return subprocess.run([*argv, "true"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _available() -> tuple[bool, bool]:
    """(bubblewrap runs, `unshare --net` runs) on this machine."""
    bwrap_ok = shutil.which("bwrap") is not None and _works(("bwrap", "--ro-bind", "/", "/", "--unshare-net", "--"))
    unshare_ok = shutil.which("unshare") is not None and _works(tuple(_unshare_prefix()))
    return bwrap_ok, unshare_ok


def isolation(requested: str = "auto") -> str:
    """The isolation this machine gives agent code, or a one-line `SetupRefused` where none is safe.

    `auto` is `bwrap` when bubblewrap runs; else, for a root parent, `unshare` (a network namespace;
    the code runs as a leased uid). Where neither holds (no bubblewrap and no network namespace, or
    not root so no uid of its own without bubblewrap's user namespace) agent code is refused: the
    only way to run it then is asking for `none` explicitly, which runs it without walls (as a
    leased uid still when root). Asking for `bwrap` or `unshare` where it does not work, or for
    `unshare` without root (it would run the code as this user), is the same one-line error."""
    if requested not in ISOLATIONS:
        raise SetupRefused(f"sandbox isolation {requested!r} is not one of {ISOLATIONS}")
    if requested == "none":
        return "none"
    bwrap_ok, unshare_ok = _available()
    root = os.geteuid() == 0
    if requested in ("auto", "bwrap") and bwrap_ok:
        return "bwrap"
    if requested in ("auto", "unshare") and unshare_ok and root:
        return "unshare"
    why = ("bubblewrap does not run here" if requested == "bwrap" else
           "`unshare --net` does not run here" if requested == "unshare" and not unshare_ok else
           "without root, `unshare` cannot give the code a uid of its own" if requested == "unshare" else
           "neither bubblewrap nor (as root) `unshare --net` runs here")
    raise SetupRefused(f"sandbox isolation {requested!r}: {why}, so agent code cannot be kept off this user, its "
                    "files and the network; install bubblewrap (apt-get install bubblewrap), or set isolation "
                    "'none' to run it without walls on purpose")


def _unshare_prefix() -> list[str]:
    return ["unshare", "--net"] + ([] if os.geteuid() == 0 else ["--map-root-user"])


def child_env(home: str, path: str = SYSTEM_PATH, **extra: str) -> dict[str, str]:
    """The whole environment of a sandbox process: never the parent's (no API key, token or
    credential of this process reaches agent code); `extra` adds what a use site needs."""
    return {"PATH": path, "HOME": home, "TMPDIR": home, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", **extra}


def wrap(argv: Sequence[str], workdir: str, mode: str, hide: Sequence[str] = (), *,
         binds: Sequence[tuple[str, str]] = (), show: Sequence[str] = (), drop_to_user: bool = False) -> list[str]:
    """`argv` inside the isolation `mode` (a resolved one: bwrap, unshare or none). Under bwrap the
    allow-listed mounts of `sandbox_mounts` (`show` read-only, `binds` writable, `workdir` writable
    last, `hide` only inside those); the other modes have no file-system walls and ignore `hide`,
    `binds` and `show`."""
    if mode == "bwrap":
        return bwrap_argv(argv, workdir, hide=hide, binds=binds, show=show, drop_to_user=drop_to_user)
    if mode == "unshare":
        return _unshare_prefix() + ["--"] + list(argv)
    if mode == "none":
        return list(argv)
    raise ValueError(f"wrap needs a resolved isolation (bwrap, unshare, none), got {mode!r}")
