"""The SWE-Gym / SWE-bench per-instance images through a docker-compatible CLI (docker, podman).

One container per workspace: `<cli> run -d --network none --memory M --memory-swap M --pids-limit N
<image> sleep infinity`; the repository is at `/testbed` with the instance's environment in the
conda env `testbed`. Each command is `<cli> exec -w /testbed <id> timeout -k 5 T bash -lc
'<activate>; <command>'`: `timeout` ends it (and its process group) inside the container, and the
host kills the CLI client if even that does not return, reporting a time-out either way; the
container stays up (a command's setsid'd stray may live on in it). Files go through `exec` too:
reads as base64 (exact bytes, so binary files are recognised), writes on stdin (`cat > path`),
both after `realpath` inside the container confines the path to /testbed. `diff()` is
`git -c core.fileMode=false add -A && git diff --cached <base_commit>` (images carry mode noise).
`close()` is `<cli> rm -f`.

The image is `instance.extra["image_name"]` or, by SWE-Gym's convention (OpenHands' SWE-Gym
evaluation), `xingyaoww/sweb.eval.x86_64.<instance_id, "__" -> "_s_">`, lower-cased.

Tested with a fake CLI (tests/harness_envs/swegym/test_container_runtime.py) that runs every argv
this module builds on the host, in a directory standing for the container; that does NOT exercise
real images, conda activation, the resource flags (--memory, --pids-limit, --network none are only
checked to be passed), image pulls, or isolation: a real container is the only wall here. The
images' /testbed is as SWE-bench built it: a full clone, so later commits (the fix) may be
reachable through its other refs; this runtime does not scrub them.
"""
from __future__ import annotations

import base64
import binascii
import dataclasses
import os
import posixpath
import shutil
import subprocess
import tempfile

from harness_envs.sandbox import Limits
from harness_envs.sandbox_command import CommandResult, run_command
from harness_envs.swegym.instances import Instance
from harness_envs.swegym.runtime import Runtime, Workspace, WorkspaceError, commit_id, diff_command

__all__ = ["ContainerRuntime", "ContainerWorkspace", "DEFAULT_IMAGE_TEMPLATE", "image_name"]

DEFAULT_IMAGE_TEMPLATE = "xingyaoww/sweb.eval.x86_64.{instance_id}"
CONDA_ACTIVATE = "source /opt/miniconda3/bin/activate && conda activate testbed"
DEFAULT_LIMITS = Limits(wall_s=120.0, memory_mb=8192, nproc=1024, output_chars=30_000)
READ_LIMIT_BYTES = 1 << 20
DIFF_CHARS = 16 << 20
CLIENT_GRACE_S = 15.0  # the CLI's own start and teardown, beyond the command's limit
START_TIMEOUT_S = 900.0  # `run` may pull the image
_READ = ('p=$(realpath -e -- "$1" 2>/dev/null) || exit 3; case "$p" in "$2"|"$2"/*) ;; *) exit 4;; esac; '
         '[ -d "$p" ] && exit 5; [ -f "$p" ] || exit 6; [ "$(wc -c < "$p")" -gt "$3" ] && exit 7; base64 < "$p"')
_WRITE = ('p=$(realpath -m -- "$1") || exit 3; case "$p" in "$2"/*) ;; *) exit 4;; esac; [ -d "$p" ] && exit 5; '
          'mkdir -p -- "$(dirname -- "$p")" && cat > "$p"')
_EXISTS = ('p=$(realpath -m -- "$1") || exit 3; case "$p" in "$2"|"$2"/*) ;; *) exit 4;; esac; '
           'if [ -d "$p" ]; then echo dir; elif [ -f "$p" ]; then echo file; else echo none; fi')
_CODES = {3: "cannot be resolved or does not exist", 4: "outside the work tree (symlinks followed)",
          5: "a directory, not a file", 6: "not a regular file", 7: "larger than a read may return"}


def image_name(instance: Instance, template: str = DEFAULT_IMAGE_TEMPLATE) -> str:
    """`extra["image_name"]`, else the template filled with the instance id as SWE-Gym names images."""
    if instance.extra.get("image_name"):
        return instance.extra["image_name"]
    return template.format(instance_id=instance.instance_id.replace("__", "_s_")).lower()


class ContainerRuntime(Runtime):
    """`cli`: "docker", "podman" or a path. `limits`: wall_s and output_chars per command, memory_mb
    and nproc (as --pids-limit) per container; cpu_s, file_mb and open_files are not applied.
    `run_args`: more `run` options (`--platform linux/amd64`, say)."""

    name = "container"

    def __init__(self, cli: str = "docker", image_template: str = DEFAULT_IMAGE_TEMPLATE, workdir: str = "/testbed",
                 limits: Limits = DEFAULT_LIMITS, *, activate: str = CONDA_ACTIVATE, run_args: tuple[str, ...] = (),
                 read_limit_bytes: int = READ_LIMIT_BYTES):
        path = shutil.which(cli)
        if path is None:
            raise WorkspaceError(f"container CLI {cli!r} not found on PATH; install docker or podman, or use the "
                                 "local runtime")
        self.cli, self.image_template, self.workdir = path, image_template, workdir.rstrip("/") or "/"
        self.limits, self.activate, self.run_args = limits, activate, tuple(run_args)
        self.read_limit_bytes = read_limit_bytes

    def workspace(self, instance: Instance) -> "ContainerWorkspace":
        return ContainerWorkspace(self, instance)


class ContainerWorkspace(Workspace):
    def __init__(self, runtime: ContainerRuntime, instance: Instance):
        self.runtime, self.instance_id = runtime, instance.instance_id
        self.base_commit = commit_id(instance.base_commit)
        self.root, self.image = runtime.workdir, image_name(instance, runtime.image_template)
        self.container: str | None = None
        limits = runtime.limits
        argv = [runtime.cli, "run", "-d", "--network", "none", "--memory", f"{limits.memory_mb}m",
                "--memory-swap", f"{limits.memory_mb}m", "--pids-limit", str(limits.nproc or 1024),
                *runtime.run_args, self.image, "sleep", "infinity"]
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=START_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise WorkspaceError(f"{self.instance_id}: starting {self.image} took over {START_TIMEOUT_S:g} s") from None
        if proc.returncode != 0 or not proc.stdout.strip():
            raise WorkspaceError(f"{self.instance_id}: cannot start a container of {self.image}: "
                                 f"{(proc.stderr or proc.stdout).strip()[-800:]}")
        self.container = proc.stdout.strip().splitlines()[-1]

    # ------------------------------------------------------------------ commands

    def _exec(self, argv: list[str], wall_s: float, output_chars: int, stdin: str | bytes | None = None
              ) -> CommandResult:
        """One `exec` in the container, the CLI client under a host wall clock (no rlimits: the
        client is not what they are for) with its output bounded."""
        if self.container is None:
            raise WorkspaceError(f"{self.instance_id}: the container is removed")
        full = [self.runtime.cli, "exec", *(["-i"] if stdin is not None else []), "-w", self.root, self.container,
                *argv]
        client = Limits(wall_s=wall_s + CLIENT_GRACE_S, cpu_s=None, memory_mb=0, file_mb=0, open_files=None,
                        output_chars=output_chars)
        # The CLI client is ours, not the agent's: it keeps this process's environment (DOCKER_HOST,
        # CONTAINER_HOST, XDG_RUNTIME_DIR, its config under HOME); the container gets none of it.
        return run_command(full, tempfile.gettempdir(), client, isolation_mode="none", stdin=stdin,
                           env=dict(os.environ))

    def run(self, command: str, timeout_s: float | None = None, *, stdin: str | None = None,
            output_chars: int | None = None) -> CommandResult:
        wall = self.runtime.limits.wall_s if timeout_s is None else timeout_s
        script = f"{self.runtime.activate}\n{command}" if self.runtime.activate else command
        result = self._exec(["timeout", "-k", "5", f"{wall:g}", "bash", "-lc", script], wall,
                            output_chars or self.runtime.limits.output_chars, stdin)
        if result.returncode in (124, 137) and result.seconds >= wall:
            result = dataclasses.replace(result, returncode=None, timed_out=True)
        return result

    def diff(self) -> str:
        result = self._exec(["bash", "-c", diff_command(self.base_commit, file_mode=False)],
                            max(120.0, self.runtime.limits.wall_s), DIFF_CHARS)
        if result.timed_out or result.returncode != 0:
            raise WorkspaceError(f"{self.instance_id}: the diff against {self.base_commit[:12]} failed: "
                                 f"{result.output[-500:]}")
        if result.dropped:
            raise WorkspaceError(f"{self.instance_id}: the diff is larger than {DIFF_CHARS} characters")
        return result.output

    # ------------------------------------------------------------------ files (inside the container)

    def _path(self, path: str) -> str:
        if not isinstance(path, str) or not path or "\0" in path:
            raise WorkspaceError(f"not a usable path: {path!r}")
        full = posixpath.normpath(posixpath.join(self.root, path))
        if full != self.root and not full.startswith(self.root.rstrip("/") + "/"):
            raise WorkspaceError(f"{path}: outside the work tree {self.root}")
        return full

    def _script(self, script: str, path: str, *args: str, stdin: str | bytes | None = None,
                output_chars: int = 1000) -> CommandResult:
        result = self._exec(["sh", "-c", script, "sh", self._path(path), self.root, *args], 120.0, output_chars,
                            stdin)
        if result.returncode in _CODES:
            raise WorkspaceError(f"{path}: {_CODES[result.returncode]}")
        if result.timed_out or result.returncode != 0:
            raise WorkspaceError(f"{path}: the container did not answer ({result.output.strip()[-300:]})")
        return result

    def read_file(self, path: str) -> str:
        limit = self.runtime.read_limit_bytes
        result = self._script(_READ, path, str(limit), output_chars=limit * 2 + 4096)
        try:
            data = base64.b64decode(result.output)
        except binascii.Error:
            raise WorkspaceError(f"{path}: the container sent garbled data") from None
        if b"\0" in data[:8192]:
            raise WorkspaceError(f"{path}: a binary file")
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise WorkspaceError(f"{path}: not UTF-8 text") from None

    def write_file(self, path: str, text: str) -> None:
        self._script(_WRITE, path, stdin=text.encode("utf-8"))

    def exists(self, path: str) -> str | None:
        answer = self._script(_EXISTS, path).output.strip()
        return None if answer == "none" else answer

    # ------------------------------------------------------------------ life cycle

    def close(self) -> None:
        container, self.container = getattr(self, "container", None), None
        if container is not None:
            subprocess.run([self.runtime.cli, "rm", "-f", container], capture_output=True, timeout=120)

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
