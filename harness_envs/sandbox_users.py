"""Uids of their own for sandboxes: a root parent leases one per workspace or REPL, and the agent's
code runs as it (`sandbox_child.py` drops to it before any agent code runs).

Why a uid and not root: root inside bubblewrap keeps nearly every capability unless dropped, the
kernel never applies RLIMIT_NPROC to root, and without bubblewrap root code can signal, ptrace
and read the memory of its parent. A leased uid owns nothing but its episode directory, can
signal only its own processes, and `kill_all` ends every one of them at the end of the episode
(a `setsid` daemon included), in every isolation mode.
"""
from __future__ import annotations

import fcntl
import os
import pathlib
import stat
import subprocess
import tempfile

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
