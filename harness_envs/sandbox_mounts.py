"""What a sandbox process sees of the file system: bubblewrap's mounts, built from an allow-list.

Under bubblewrap the sandbox starts from an empty root and gets only:
- the system's programs and libraries read-only (`SYSTEM_DIRS`: /usr and the /bin, /lib... links or
  directories beside it) and a few files of /etc that programs read to start (`ETC_FILES`: the
  dynamic linker's cache, passwd/group for user names, timezone, hosts, alternatives); never
  /etc/shadow, /root, /home, /work, /opt, /srv, /tmp or any checkout;
- the interpreter the sandbox child runs (the base interpreter of this process: the child needs
  the standard library alone), read-only, at its own path;
- what the caller names, in this order: `binds` writable (a private directory as /tmp, say),
  `show` read-only (a venv; `venv_mounts` gives a venv's with its base interpreter), and the
  episode directory, writable, mounted last so that nothing covers it;
- its own /proc and /dev, no network, new PID/IPC/UTS (and cgroup, where possible) namespaces.

An allow-list rather than `/` read-only with named paths hidden: a path nobody thought to hide
(another checkout on the machine, a file holding gold patches) is simply not there. `hide` still
covers paths that lie *inside* an allowed mount with an empty tmpfs (an instance file kept under a
venv, say); a later mount can re-expose part of it.

Every directory bubblewrap makes on the way to a mount is made with `--dir` (mode 0755), so a
child that drops to a leased uid can walk to what it was given. When this process is root the
child keeps only CAP_SETUID and CAP_SETGID (`--cap-drop ALL` plus those two), which it spends on
dropping to its uid before any agent code runs; bubblewrap sets no_new_privs for it. A user
namespace is used only when this process is not root (bubblewrap needs one then): bubblewrap 0.8.0
run as root can map the sandbox's uid only onto uid 0 outside, so file permission checks would see
root; a real leased uid (`sandbox_users.SandboxUser`) is the stronger wall there.

The modes without bubblewrap (`unshare`, `none`) have no mount walls: the leased uid reads what any
user of the machine may read and writes only what it owns.
"""
from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
from typing import Sequence

SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
ETC_FILES = ("alternatives", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "timezone", "nsswitch.conf",
             "passwd", "group", "hosts", "protocols", "services", "mime.types")


def interpreter() -> tuple[str, str]:
    """(the base interpreter's real path, the real path of its prefix): what the sandbox child runs
    (`python -I -S`, standard library only), never a venv's copy."""
    prefix = os.path.realpath(sys.base_prefix)
    exe = os.path.realpath(sys.executable)
    if not exe.startswith(prefix + os.sep):  # a venv made with --copies, or a venv's own python
        exe = os.path.join(prefix, "bin", f"python{sys.version_info.major}.{sys.version_info.minor}")
    return exe, prefix


def venv_mounts(venv: str) -> list[str]:
    """The real paths a command needs to run `venv`'s python: the venv and its base interpreter's
    prefix (pyvenv.cfg's `home` is its bin directory; the target of bin/python as well)."""
    venv = os.path.realpath(venv)
    paths = [venv]
    homes = [os.path.dirname(os.path.realpath(os.path.join(venv, "bin", "python")))]
    try:
        with open(os.path.join(venv, "pyvenv.cfg"), encoding="utf-8") as f:
            config = {k.strip(): v.strip() for k, v in (line.split("=", 1) for line in f if "=" in line)}
        if config.get("home"):
            homes.append(os.path.realpath(config["home"]))
    except OSError:
        pass
    for home in homes:
        prefix = os.path.dirname(home)
        if prefix not in paths and not prefix.startswith(venv + os.sep) and prefix not in ("/", "/usr"):
            paths.append(prefix)
    return paths


def _under(path: str, base: str) -> bool:
    return path != base and path.startswith(base.rstrip("/") + os.sep)


def bwrap_argv(argv: Sequence[str], workdir: str, *, hide: Sequence[str] = (), binds: Sequence[tuple[str, str]] = (),
               show: Sequence[str] = (), drop_to_user: bool = False) -> list[str]:
    """`argv` under bubblewrap with the allow-listed mounts of the module docstring. `binds` are
    (host source, sandbox destination) pairs mounted writable; `drop_to_user`: the child will drop
    to a leased uid itself (root parent only), so it keeps CAP_SETUID/CAP_SETGID for that."""
    args = ["bwrap", "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--die-with-parent", "--new-session", "--proc", "/proc", "--dev", "/dev"]
    if os.geteuid() == 0:
        args += ["--cap-drop", "ALL"]
        if drop_to_user:
            args += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:  # bubblewrap needs a user namespace anyway; forbid the agent code further ones
        args += ["--unshare-user", "--disable-userns"]
    hidden = [os.path.realpath(p) for p in hide if os.path.isdir(p)]
    made: set[str] = set()

    def parents(dest: str) -> None:
        for parent in reversed([str(p) for p in pathlib.PurePosixPath(dest).parents if str(p) != "/"]):
            if parent not in made:
                made.add(parent)
                args.extend(["--dir", parent])

    def mount(kind: str, source: str, dest: str) -> None:
        parents(dest)
        args.extend([kind, source, dest])
        made.add(dest)
        if kind == "--ro-bind":
            for path in hidden:  # the only hide paths that could be seen: those inside an allowed mount
                if _under(path, dest):
                    args.extend(["--tmpfs", path])

    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            args.extend(["--symlink", os.readlink(path), path])
        elif os.path.isdir(path):
            mount("--ro-bind", path, path)
    args += ["--dir", "/etc"]
    for name in ETC_FILES:
        args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    _, prefix = interpreter()
    if not any(prefix == d or _under(prefix, d) for d in SYSTEM_DIRS):
        mount("--ro-bind", prefix, prefix)
    for source, dest in binds:  # before `show`, which may re-expose a path a bind covered (/tmp)
        mount("--bind", os.path.realpath(source), dest)
    for path in show:
        real = os.path.realpath(path)
        mount("--ro-bind", real, real)
    workdir = os.path.realpath(workdir)
    mount("--bind", workdir, workdir)
    # The child enters `workdir` itself once it is its uid's: bubblewrap, root without
    # CAP_DAC_OVERRIDE by now, could not enter a 0700 directory of another uid.
    # The root bubblewrap builds is a writable tmpfs: read-only, so writes outside the binds fail.
    return args + ["--remount-ro", "/", "--chdir", "/", "--"] + list(argv)


# ------------------------------------------------------------------------------------ disk quota


def mount_quota(path: str, size_mb: int, uid: int, gid: int) -> bool:
    """Mounts an empty tmpfs of `size_mb` MB owned by uid:gid (mode 0700, nosuid, nodev) over the
    directory `path` on the host (root only), so the episode directory has a hard size limit
    (writes past it fail with ENOSPC) and stays visible to this process. False where the mount is
    refused (no CAP_SYS_ADMIN, a container without it): the caller then counts usage instead."""
    if os.geteuid() != 0:
        return False
    options = f"size={int(size_mb)}m,mode=0700,uid={uid},gid={gid},nosuid,nodev"
    try:
        return subprocess.run(["mount", "-t", "tmpfs", "-o", options, MOUNT_SOURCE, path], capture_output=True,
                              timeout=20).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


MOUNT_SOURCE = "hsjax-sandbox"  # the source name of every quota tmpfs, so stale ones can be found


def quota_mounts_of(uid: int, mountinfo: str = "/proc/self/mountinfo") -> list[str]:
    """The mount points of the quota tmpfs mounted for `uid` (`mount_quota`), from `mountinfo`."""
    out = []
    try:
        lines = open(mountinfo).read().splitlines()
    except OSError:
        return out
    for line in lines:
        head, sep, tail = line.partition(" - ")
        fields, rest = head.split(), tail.split()
        if not sep or len(fields) < 5 or len(rest) < 3 or rest[:2] != ["tmpfs", MOUNT_SOURCE]:
            continue
        if f"uid={uid}" in rest[2].split(","):
            # mountinfo escapes space, tab, newline and backslash in paths as octal
            out.append(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4]))
    return out


def sweep_stale_quota_mounts(uid: int) -> int:
    """Unmounts the quota tmpfs left mounted for `uid` by a process that died without closing its
    sandbox (SIGKILL, a crash in a worker) and removes their directories when empty; call it right
    after leasing `uid`: while a live sandbox holds the uid its lease is held, so any mount for a
    freshly leased uid is stale. Returns how many it unmounted."""
    stale = quota_mounts_of(uid)
    for path in stale:
        unmount(path)
        try:
            os.rmdir(path)
        except OSError:
            pass
    return len(stale)


def unmount(path: str) -> None:
    """Detaches the quota tmpfs at `path` (lazily: a process still holding a file cannot block it)."""
    subprocess.run(["umount", "-l", path], capture_output=True, timeout=20)


def disk_usage(path: str) -> int:
    """Bytes of disk `path` and everything under it take (allocated blocks, links not followed):
    the accounting check where no quota tmpfs can be mounted."""
    total, stack = 0, [path]
    while stack:
        try:
            entries = os.scandir(stack.pop())
        except OSError:
            continue
        with entries:
            for entry in entries:
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                total += info.st_blocks * 512
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
    return total
