"""The builder's inputs for one package: its pinned sdist (downloaded once, sha256-checked), a venv
with pytest and its test dependencies (built once), the sdist extracted as a work tree, and which of
its files may be mutated and under which module names. A step that cannot go on raises `BuildError`.
"""
from __future__ import annotations

import hashlib
import os
import pathlib
import shutil
import subprocess
import sys
import tarfile
import tempfile

from harness_envs.swegym.builder.packages import PYTEST_PIN, Package


class BuildError(RuntimeError):
    """A step of the build that cannot go on (a bad download, a pristine suite that fails)."""


def fetch_sdist(pkg: Package, cache: pathlib.Path) -> pathlib.Path:
    """The package's sdist in `cache/sdists`, downloaded with pip if absent, sha256-checked."""
    dest = cache / "sdists" / pkg.sdist
    if not dest.is_file():
        dest.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
            proc = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                                   "--dest", tmp, pkg.requirement], capture_output=True, text=True, timeout=900)
            got = pathlib.Path(tmp) / pkg.sdist
            if proc.returncode != 0 or not got.is_file():
                raise BuildError(f"pip download {pkg.requirement} failed (status {proc.returncode}; files "
                                 f"{sorted(os.listdir(tmp))}): {proc.stderr.strip()[-800:]}")
            got.replace(dest)
    digest = hashlib.sha256(dest.read_bytes()).hexdigest()
    if digest != pkg.sha256:
        raise BuildError(f"{dest}: sha256 {digest}, but packages.py pins {pkg.sha256}; delete the file to "
                         "download it again, or update the pin if the release really changed")
    return dest


def ensure_venv(pkg: Package, cache: pathlib.Path) -> pathlib.Path:
    """`cache/venvs/<key>`: a venv without pip, holding PYTEST_PIN and the test deps (built once)."""
    venv = cache / "venvs" / pkg.key
    wanted = "\n".join([PYTEST_PIN, *pkg.test_deps]) + "\n"
    stamp = venv / ".hsjax-requirements"
    if stamp.is_file() and stamp.read_text() == wanted and (venv / "bin" / "python").exists():
        return venv
    shutil.rmtree(venv, ignore_errors=True)
    venv.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True,
                   timeout=300)
    proc = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                           PYTEST_PIN, *pkg.test_deps], capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise BuildError(f"installing {PYTEST_PIN} {' '.join(pkg.test_deps)} into {venv} failed: "
                         f"{proc.stderr.strip()[-800:]}")
    stamp.write_text(wanted)
    return venv


def extract(sdist: pathlib.Path, pkg: Package, scratch: pathlib.Path) -> pathlib.Path:
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    with tarfile.open(sdist) as tar:
        tar.extractall(scratch, filter="data")
    tree = scratch / "tree"
    (scratch / pkg.root).rename(tree)
    return tree


def source_files(pkg: Package, tree: pathlib.Path) -> list[str]:
    """Tree-relative paths of the .py files whose functions may be mutated."""
    out = []
    for entry in pkg.source:
        path = tree / entry
        found = [path] if path.is_file() else sorted(path.rglob("*.py"))
        for f in found:
            rel = f.relative_to(tree).as_posix()
            name = f.name
            if any(rel == e or rel.startswith(e.rstrip("/") + "/") for e in pkg.exclude):
                continue
            if name.startswith("test_") or name == "conftest.py" or "/tests/" in f"/{rel}":
                continue
            out.append(rel)
    return sorted(set(out))


def module_name(pkg: Package, path: str) -> str:
    rel = path[len(pkg.pythonpath) + 1:] if pkg.pythonpath and path.startswith(pkg.pythonpath + "/") else path
    parts = rel.removesuffix(".py").split("/")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)
