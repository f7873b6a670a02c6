"""Deterministic git plumbing for the cache's bare repositories (`repos/pypi__<package>.git`).

Trees are built with a private index file (`GIT_INDEX_FILE`), never a checkout: the pristine tree
from the extracted sdist (`git add -A -f`, so an sdist's own .gitignore hides nothing), an
instance's tree as the pristine one with a few files replaced by new blobs. Commits have fixed
author and committer names, e-mails and dates, and no parent, so the same tree gives the same sha
on every machine and an agent's `git log` shows one commit with nothing behind it. Each git call
runs with no system or global configuration (a user's diff.algorithm or diff.noprefix cannot change
a patch) and `LC_ALL=C`.

Refs: the pristine commit is `refs/hsjax/pristine` (outside heads and tags, so no clone or fetch of
branches and tags brings the fixed code along); each kept instance is `refs/tags/<instance_id>`.
The local runtime fetches one base commit by id with `--depth 1 --no-tags`, so a workspace never
holds another instance's tree (which would show the original of the file this instance mutates).
"""
from __future__ import annotations

import os
import pathlib
import subprocess
import tempfile

IDENTITY = {"GIT_AUTHOR_NAME": "hsjax swegym builder", "GIT_AUTHOR_EMAIL": "builder@hsjax.invalid",
            "GIT_COMMITTER_NAME": "hsjax swegym builder", "GIT_COMMITTER_EMAIL": "builder@hsjax.invalid",
            "GIT_AUTHOR_DATE": "2024-01-01T00:00:00+0000", "GIT_COMMITTER_DATE": "2024-01-01T00:00:00+0000"}
PRISTINE_REF = "refs/hsjax/pristine"
TIMEOUT_S = 120


class GitError(RuntimeError):
    """A git command of the builder failed."""


class BareRepo:
    def __init__(self, path: str | os.PathLike):
        self.path = pathlib.Path(path)

    def _env(self, index: str | None = None, work_tree: str | None = None) -> dict:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.path), "LC_ALL": "C",
               "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_DIR": str(self.path), **IDENTITY}
        if index:
            env["GIT_INDEX_FILE"] = index
        if work_tree:
            env["GIT_WORK_TREE"] = work_tree
        return env

    def git(self, *args: str, stdin: bytes | None = None, index: str | None = None, work_tree: str | None = None,
            cwd: str | None = None) -> bytes:
        proc = subprocess.run(["git", *args], input=stdin, capture_output=True, timeout=TIMEOUT_S,
                              env=self._env(index, work_tree), cwd=cwd or str(self.path))
        if proc.returncode != 0:
            raise GitError(f"git {' '.join(args[:3])} in {self.path} failed: "
                           f"{proc.stderr.decode(errors='replace').strip()[-800:]}")
        return proc.stdout

    def create(self) -> None:
        """A new empty bare repository (the caller removes any old one)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "init", "-q", "--bare", "--template=", str(self.path)], check=True,
                       capture_output=True, timeout=TIMEOUT_S, env=self._env())
        # The local runtime fetches a base commit by id; let any reachable id be asked for.
        self.git("config", "uploadpack.allowAnySHA1InWant", "true")
        self.git("config", "gc.auto", "0")

    def tree_of_directory(self, directory: str | os.PathLike) -> str:
        with tempfile.TemporaryDirectory() as tmp:
            index = os.path.join(tmp, "index")
            self.git("add", "-A", "-f", ".", index=index, work_tree=str(directory), cwd=str(directory))
            return self.git("write-tree", index=index).decode().strip()

    def tree_with(self, base_tree: str, files: dict[str, bytes | None]) -> str:
        """`base_tree` with `files` replaced (bytes, same mode as before or 100644) or removed (None)."""
        with tempfile.TemporaryDirectory() as tmp:
            index = os.path.join(tmp, "index")
            self.git("read-tree", base_tree, index=index)
            for path in sorted(files):
                data = files[path]
                if data is None:
                    self.git("update-index", "--force-remove", "--", path, index=index)
                    continue
                blob = self.git("hash-object", "-w", "--stdin", stdin=data).decode().strip()
                self.git("update-index", "--add", "--cacheinfo", f"{self.mode(base_tree, path)},{blob},{path}",
                         index=index)
            return self.git("write-tree", index=index).decode().strip()

    def mode(self, tree: str, path: str) -> str:
        line = self.git("ls-tree", tree, "--", path).decode().strip()
        return line.split()[0] if line else "100644"

    def commit(self, tree: str, message: str) -> str:
        """An orphan commit of `tree` (no parent), deterministic for a given tree and message."""
        return self.git("commit-tree", tree, "-m", message).decode().strip()

    def set_ref(self, ref: str, sha: str) -> None:
        self.git("update-ref", ref, sha)

    def delete_ref(self, ref: str) -> None:
        self.git("update-ref", "-d", ref)

    def refs(self, prefix: str = "refs/") -> dict[str, str]:
        out = self.git("for-each-ref", "--format=%(refname) %(objectname)", prefix).decode()
        return dict(line.split(" ", 1) for line in out.splitlines() if line)

    def diff(self, old_tree: str, new_tree: str, paths: list[str]) -> str:
        """`git diff` from `old_tree` to `new_tree` for `paths`: a/ b/ prefixes and full blob ids
        (abbreviated ones grow with the repository's object count, which would make the text
        depend on how many candidates were tried)."""
        if not paths:
            return ""
        return self.git("diff-tree", "-p", "--no-color", "--no-ext-diff", "--no-textconv", "--full-index",
                        "--src-prefix=a/", "--dst-prefix=b/", old_tree, new_tree, "--", *paths).decode()

    def read(self, tree: str, path: str) -> bytes:
        return self.git("cat-file", "blob", f"{tree}:{path}")

    def prune(self) -> None:
        """Drops the objects of rejected candidates (no ref reaches them) and packs the rest."""
        self.git("reflog", "expire", "--expire=now", "--all")
        self.git("gc", "-q", "--prune=now")
