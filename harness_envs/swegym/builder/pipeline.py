"""Builds the offline SWE-Gym instances: pinned PyPI sdists -> git repositories with injected bugs
-> SWE-bench records validated by the real scorer.

Measured (2 cores shared with a training job, `--jobs 2`, seed 0):
- full build, `scripts/setup_swegym.sh` from an empty cache (sdists and venvs included): 11 min 43 s,
  94 instances (70 train, 24 test): 12 each from toolz, cachetools, boltons, tabulate, sqlparse,
  isodate and xmltodict, 10 from inflection (its 73 candidates run out); 87 with the FAIL_TO_PASS
  tests removed from the base tree, 7 with them left in; 1 to 5 FAIL_TO_PASS tests each;
- CI's subset, `--packages toolz,xmltodict --max-per-repo 3` from an empty cache and an empty pip
  cache: 76 s, 6 instances (3 train, 3 test), the first three of the full build's;
- a second run with the cache complete: 1.6 s (nothing rebuilt);
- the same packages built twice in two caches: byte-identical instance files and refs.

Cache (root: the `cache` argument, else `$HSJAX_SWEGYM_CACHE`, else `<checkout>/.cache/swegym`;
nothing in it is committed):
- `sdists/<file>.tar.gz`: `pip download --no-deps --no-binary :all: <name>==<version>`, checked
  against the sha256 pinned in `packages.py` (a mismatch is an error, never a silent rebuild);
- `venvs/pypi__<name>/`: a venv (no pip) with pytest and the package's test dependencies, not the
  package itself (the tests import it from the work tree through PYTHONPATH);
- `repos/pypi__<name>.git`: bare; the pristine sdist at `refs/hsjax/pristine`, each kept instance an
  orphan commit of its base tree at `refs/tags/<instance_id>` (gitrepo.py);
- `instances/offline.jsonl` (the packages of the last run, in `PACKAGES` order) and
  `instances/build_report.json`; `instances/parts/pypi__<name>.{jsonl,json}` per package;

Scratch (the extracted tree the tests run in) is a temp directory, removed after each package.

Per package (`build_package`):
1. extract the sdist (sources.py), commit it; run its suite twice (hash seeds 1 and 2): a test that
   passes both times belongs to the universe; the first run also traces which test files execute
   each line of the package's source (linetrace.py);
2. enumerate every mutation of every function (mutations.py) and order them by the seed;
3. try candidates in that order, skipping a function that already has an instance and a mutation
   no test executes; each try runs only the test files that execute the mutated lines, with
   `--maxfail` one past the cap. FAIL_TO_PASS = universe tests that now fail (1 to `MAX_F2P`, no
   collection error, no time-out); PASS_TO_PASS = universe tests of the FAIL_TO_PASS files that
   still pass (SWE-bench runs whole test files);
4. the base tree is the mutated source with the FAIL_TO_PASS test functions removed from their files
   (removed_tests.py), and `test_patch` puts them back (`test_patch_mode="removed"`), so the agent cannot read the
   judging tests. Where a test cannot be removed cleanly (a method inherited from a mixin in
   another file, a class left empty, a file that no longer collects or imports) the tests stay in
   the base tree and `test_patch` is empty (`test_patch_mode="in_base"`). `patch` (gold) restores
   the source file;
5. validation with the scorer (`scoring.evaluate` on a `LocalRuntime` of this cache): the gold patch
   resolves; the empty patch does not, with every FAIL_TO_PASS test failing and every PASS_TO_PASS
   test passing. Only then is the instance kept (`pypi__<name>-<n>`, n counting kept ones).

Determinism: sdists pinned by hash, candidates ordered by a seeded shuffle of a sorted list, test
runs with fixed hash seeds, commits with fixed identities and dates, patches with full blob ids,
statements chosen by hash. So the same package list, seed and cap give byte-identical
`offline.jsonl` and the same commit shas on any machine. A capped build keeps a prefix of a larger
cap's instances (the candidate order does not depend on the cap). A package whose part was built
with the same fingerprint (builder source, package pin, seed, cap) and whose refs are intact is not
rebuilt; a run with a complete cache only rewrites the two summary files.
"""
from __future__ import annotations

import ast
import collections
import concurrent.futures
import dataclasses
import hashlib
import json
import os
import pathlib
import shutil
import tempfile
import time

from harness_envs.swegym.builder import gitrepo, mutations, statements, testrun
from harness_envs.swegym.builder.removed_tests import remove_tests
from harness_envs.swegym.builder.sources import (BuildError, ensure_venv, extract, fetch_sdist, module_name,
                                                 source_files)
from harness_envs.swegym.builder.packages import PACKAGES, PYTEST_PIN, Package, select
from harness_envs.swegym.instances import Instance, load_jsonl, write_jsonl
from harness_envs.swegym.local_runtime import LocalRuntime
from harness_envs.swegym.runtime import PYTEST
from harness_envs.swegym.scoring import evaluate

PROJECT_ROOT = pathlib.Path(__file__).resolve().parents[3]
DEFAULT_CACHE = PROJECT_ROOT / ".cache" / "swegym"
CACHE_ENV = "HSJAX_SWEGYM_CACHE"
SEED = 0
MAX_PER_REPO = 12
MAX_F2P = 5
TRIES_PER_INSTANCE = 10  # candidate test runs allowed per instance asked for
CREATED_AT = "2024-01-01T00:00:00Z"
PRISTINE_TIMEOUT_S = 900.0
VALIDATE_TIMEOUT_S = 300.0


def cache_root(cache: str | os.PathLike | None = None) -> pathlib.Path:
    return pathlib.Path(cache or os.environ.get(CACHE_ENV) or DEFAULT_CACHE).resolve()


@dataclasses.dataclass(frozen=True)
class Config:
    cache: pathlib.Path
    max_per_repo: int = MAX_PER_REPO
    seed: int = SEED
    isolation_mode: str = "auto"
    force: bool = False


# ------------------------------------------------------------------------------------------ the cache

def fingerprint(pkg: Package, config: Config) -> str:
    """What a package's part depends on: the builder's code (not its comments or docstrings), the
    package's pin, the seed, the cap and the pytest line. Not the scorer's or the runtime's code:
    the cache test re-validates every shipped instance with them, and `--force` rebuilds."""
    h = hashlib.sha256()
    here = pathlib.Path(__file__).parent
    for name in sorted(p.name for p in here.glob("*.py")):
        h.update(name.encode() + b"\0" + _code(here / name) + b"\0")
    h.update(repr((dataclasses.astuple(pkg), config.seed, config.max_per_repo, PYTEST_PIN, PYTEST)).encode())
    return h.hexdigest()


def _code(path: pathlib.Path) -> bytes:
    """A module's code without comments and docstrings, so that editing either keeps the cache."""
    tree = ast.parse(path.read_bytes())
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree).encode()


# ------------------------------------------------------------------------------------------ one package

@dataclasses.dataclass
class _Suite:
    universe: set[str]
    files: list[str]
    lines: dict[tuple[str, int], set[str]]
    seconds: float


def _pristine_suite(pkg: Package, scratch: pathlib.Path, venv: pathlib.Path, sources: list[str],
                    config: Config) -> _Suite:
    tree = (scratch / "tree").resolve()
    real = {str(tree / s): s for s in sources}
    first, trace = testrun.run_pytest(scratch, venv, pkg.pythonpath, list(pkg.tests), timeout_s=PRISTINE_TIMEOUT_S,
                                      hashseed=1, isolation_mode=config.isolation_mode, trace_files=list(real))
    second, _ = testrun.run_pytest(scratch, venv, pkg.pythonpath, list(pkg.tests), timeout_s=PRISTINE_TIMEOUT_S,
                                   hashseed=2, isolation_mode=config.isolation_mode)
    for run in (first, second):
        if run.broken or trace is None:
            raise BuildError(f"{pkg.requirement}: the pristine suite does not run (status {run.returncode}, "
                             f"timed out {run.timed_out}, collection errors {run.collection_errors}): "
                             f"{run.output[-1500:]}")
    universe = {t for t in first.passed() & second.passed() if testrun.SAFE_ID.match(t)}
    files = sorted({t.split("::", 1)[0] for t in universe})
    lines: dict[tuple[str, int], set[str]] = {}
    for where, test_files in trace.items():
        path, _, line = where.rpartition(":")
        if path in real:
            lines[(real[path], int(line))] = set(files) if "*" in test_files else set(test_files) & set(files)
    return _Suite(universe, files, lines, second.seconds)


def build_package(pkg: Package, config: Config) -> tuple[list[Instance], dict]:
    """Builds, validates and caches one package's instances; returns them and its report."""
    t0 = time.monotonic()
    cache = config.cache
    sdist = fetch_sdist(pkg, cache)
    venv = ensure_venv(pkg, cache).resolve()
    # Scratch lives in the system temp directory, as the runtime's workspaces do: under the checkout,
    # pytest would find hsjax's own pytest.ini above a package that has no configuration of its own.
    scratch = pathlib.Path(tempfile.mkdtemp(prefix=f"hsjax-swegym-build-{pkg.key}-"))
    try:
        return _build_in(pkg, config, sdist, venv, scratch, t0)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _build_in(pkg: Package, config: Config, sdist: pathlib.Path, venv: pathlib.Path, scratch: pathlib.Path,
              t0: float) -> tuple[list[Instance], dict]:
    cache = config.cache
    tree = extract(sdist, pkg, scratch)
    repo = gitrepo.BareRepo(cache / "repos" / f"{pkg.key}.git")
    shutil.rmtree(repo.path, ignore_errors=True)
    repo.create()
    pristine_tree = repo.tree_of_directory(tree)
    repo.set_ref(gitrepo.PRISTINE_REF, repo.commit(pristine_tree, f"{pkg.name} {pkg.version} (pristine sdist)"))

    phases = {"setup": time.monotonic() - t0}
    sources = source_files(pkg, tree)
    suite = _pristine_suite(pkg, scratch, venv, sources, config)
    phases["pristine"] = time.monotonic() - t0 - sum(phases.values())
    original = {s: (tree / s).read_bytes() for s in sources}
    candidates = [m for s in sources for m in mutations.enumerate_mutations(original[s], s)]
    ordered = mutations.order(candidates, f"{config.seed}/{pkg.name}")
    runtime = LocalRuntime(cache / "repos", cache / "venvs", isolation_mode=config.isolation_mode)
    timeout_s = max(60.0, 10 * suite.seconds)

    t_loop = time.monotonic()
    phases["validation"] = 0.0
    kept: list[Instance] = []
    taken: set[tuple[str, str]] = set()
    reasons: collections.Counter = collections.Counter()
    tries = 0
    for m in ordered:
        if len(kept) >= config.max_per_repo or tries >= TRIES_PER_INSTANCE * config.max_per_repo:
            break
        if (m.path, m.function) in taken:
            reasons["skipped: function has an instance"] += 1
            continue
        files = set().union(*(suite.lines.get((m.path, line), set()) for line in range(m.line, m.end_line + 1)))
        if not files:
            reasons["skipped: no test runs the line"] += 1
            continue
        tries += 1
        target = tree / m.path
        target.write_bytes(m.apply(original[m.path]))
        try:
            run, _ = testrun.run_pytest(scratch, venv, pkg.pythonpath, sorted(files), timeout_s=timeout_s, hashseed=0,
                                        maxfail=MAX_F2P + 1, isolation_mode=config.isolation_mode)
        finally:
            target.write_bytes(original[m.path])
        failing = sorted(run.failed() & suite.universe)
        if run.timed_out:
            reasons["timeout"] += 1
            continue
        if run.broken:
            reasons["collection error"] += 1
            continue
        if not failing:
            reasons["no test fails"] += 1
            continue
        if len(failing) > MAX_F2P:
            reasons[f"more than {MAX_F2P} tests fail"] += 1
            continue
        f2p_files = sorted({t.split("::", 1)[0] for t in failing})
        p2p = sorted(t for t in run.passed() & suite.universe if t.split("::", 1)[0] in f2p_files)
        instance_id = f"{pkg.key}-{len(kept) + 1}"
        inst = _make_instance(pkg, config, repo, pristine_tree, scratch, venv, original, m, run, failing, p2p,
                              instance_id)
        t_validate = time.monotonic()
        why = validate(inst, runtime)
        phases["validation"] += time.monotonic() - t_validate
        if why:
            reasons[why] += 1
            repo.delete_ref(f"refs/tags/{instance_id}")
            continue
        kept.append(inst)
        taken.add((m.path, m.function))
    phases["candidates"] = time.monotonic() - t_loop - phases["validation"]
    repo.prune()
    report = {"package": pkg.name, "version": pkg.version, "licence": pkg.licence, "split": pkg.split,
              "suite_tests": len(suite.universe), "suite_seconds": round(suite.seconds, 2),
              "candidates": len(candidates), "tried": tries, "kept": len(kept),
              "rejected": dict(sorted(reasons.items())), "seconds": round(time.monotonic() - t0, 1),
              "phase_seconds": {k: round(v, 1) for k, v in phases.items()},
              "fingerprint": fingerprint(pkg, config)}
    return kept, report


def _make_instance(pkg, config, repo, pristine_tree, scratch, venv, original, m, run, f2p, p2p, instance_id):
    """The instance of a candidate that passed its test run, its tag set (the caller deletes it if
    validation fails)."""
    tree = scratch / "tree"
    mutated = m.apply(original[m.path])
    # With the tests left in, the candidate's own run has shown that the base tree imports and collects.
    removed = remove_tests(tree, f2p)
    if removed is not None and not _base_collects(pkg, config, scratch, venv, m.path, mutated, removed, f2p):
        removed = None
    removed = removed or {}
    base_tree = repo.tree_with(pristine_tree, {m.path: mutated, **removed})
    fixed_tree = repo.tree_with(pristine_tree, removed)
    patch = repo.diff(base_tree, fixed_tree, [m.path])
    test_patch = repo.diff(base_tree, pristine_tree, sorted(removed))
    commit = repo.commit(base_tree, f"{pkg.name} {pkg.version}")
    repo.set_ref(f"refs/tags/{instance_id}", commit)
    module = module_name(pkg, m.path)
    failures = [run.failures[t] for t in f2p if t in run.failures]
    statement = statements.write(instance_id, pkg.name, pkg.version, module, m.function,
                                 _docstring(original[m.path], m.function), failures, len(f2p), patch,
                                 roots=(str(tree.resolve()), str(scratch.resolve()), str(tree), str(scratch)))
    extra = {"split": pkg.split, "pythonpath": pkg.pythonpath or ".", "licence": pkg.licence,
             "test_patch_mode": "removed" if removed else "in_base", "builder_seed": config.seed,
             "mutation": {"kind": m.kind, "path": m.path, "function": m.function, "line": m.line}}
    return Instance(instance_id=instance_id, repo=pkg.repo, base_commit=commit, problem_statement=statement,
                    patch=patch, test_patch=test_patch, FAIL_TO_PASS=tuple(f2p), PASS_TO_PASS=tuple(p2p),
                    hints_text="", created_at=CREATED_AT, version=pkg.version, extra=extra)


def _base_collects(pkg, config, scratch, venv, path, mutated, removed, f2p) -> bool:
    """Whether the base tree (the mutated source, `removed` test files) imports the package and
    collects the FAIL_TO_PASS files without error."""
    tree = scratch / "tree"
    saved = {p: (tree / p).read_bytes() for p in [path, *removed]}
    try:
        (tree / path).write_bytes(mutated)
        for p, data in removed.items():
            (tree / p).write_bytes(data)
        files = " ".join(sorted({t.split("::", 1)[0] for t in f2p}))
        env = testrun.environment(scratch, venv, pkg.pythonpath, 0)
        result = testrun.run_shell(scratch, env, f"python -c 'import {pkg.import_name}' && "
                                   f"{PYTEST} -q --collect-only {files}", 120.0, config.isolation_mode)
        return result.returncode in (0, 5) and not result.timed_out  # 5: a file left with no test is fine
    finally:
        for p, data in saved.items():
            (tree / p).write_bytes(data)


def _docstring(source: bytes, qualname: str) -> str:
    for name, fn in mutations.functions(ast.parse(source)):
        if name == qualname:
            doc = ast.get_docstring(fn) or ""
            return doc.strip().split("\n\n", 1)[0].replace("\n", " ").strip()
    return ""


def validate(inst: Instance, runtime: LocalRuntime) -> str | None:
    """None if the gold patch resolves and the empty patch fails every FAIL_TO_PASS test while every
    PASS_TO_PASS test passes; else the reason."""
    gold = evaluate(inst, inst.patch, runtime, timeout_s=VALIDATE_TIMEOUT_S)
    if not gold.resolved:
        return f"gold patch does not resolve ({gold.failure})"
    empty = evaluate(inst, "", runtime, timeout_s=VALIDATE_TIMEOUT_S)
    if empty.resolved:
        return "empty patch resolves"
    if empty.f2p_passed or empty.p2p_passed != empty.p2p_total:
        return "unstable under the scorer"
    return None


# ------------------------------------------------------------------------------------------ all packages

def _part_is_current(pkg: Package, config: Config) -> bool:
    parts = config.cache / "instances" / "parts"
    report_file, jsonl = parts / f"{pkg.key}.json", parts / f"{pkg.key}.jsonl"
    if config.force or not report_file.is_file() or not jsonl.is_file():
        return False
    if json.loads(report_file.read_text()).get("fingerprint") != fingerprint(pkg, config):
        return False
    repo = gitrepo.BareRepo(config.cache / "repos" / f"{pkg.key}.git")
    venv = config.cache / "venvs" / pkg.key / "bin" / "python"
    if not repo.path.is_dir() or not venv.exists():
        return False
    try:
        tags = repo.refs("refs/tags/")
    except gitrepo.GitError:
        return False
    return all(tags.get(f"refs/tags/{i.instance_id}") == i.base_commit for i in load_jsonl(jsonl))


def _build_one(pkg: Package, config: Config) -> dict:
    instances, report = build_package(pkg, config)
    parts = config.cache / "instances" / "parts"
    parts.mkdir(parents=True, exist_ok=True)
    write_jsonl(instances, parts / f"{pkg.key}.jsonl")
    (parts / f"{pkg.key}.json").write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    return report


def build(packages: str | list[str] | None = None, *, cache: str | os.PathLike | None = None,
          max_per_repo: int = MAX_PER_REPO, seed: int = SEED, jobs: int = 1, isolation_mode: str = "auto",
          force: bool = False, log=print) -> dict:
    """Builds (or reuses) the instances of `packages` (all by default) and writes
    `instances/offline.jsonl` and `instances/build_report.json`; returns the report."""
    t0 = time.monotonic()
    config = Config(cache_root(cache), max_per_repo, seed, isolation_mode, force)
    chosen = select(packages)
    todo = [p for p in chosen if not _part_is_current(p, config)]
    for p in chosen:
        if p not in todo:
            log(f"{p.name}: cached")
    if todo:
        with concurrent.futures.ProcessPoolExecutor(max_workers=max(1, min(jobs, len(todo)))) as pool:
            futures = {pool.submit(_build_one, p, config): p for p in todo}
            for future in concurrent.futures.as_completed(futures):
                r = future.result()
                log(f"{r['package']}: kept {r['kept']} of {r['tried']} tried ({r['candidates']} candidates) "
                    f"in {r['seconds']} s; rejected {r['rejected']}")
    parts = config.cache / "instances" / "parts"
    instances = [i for p in chosen for i in load_jsonl(parts / f"{p.key}.jsonl")]
    write_jsonl(instances, config.cache / "instances" / "offline.jsonl")
    reports = {p.name: json.loads((parts / f"{p.key}.json").read_text()) for p in chosen}
    report = {"packages": reports, "instances": len(instances), "seed": seed, "max_per_repo": max_per_repo,
              "rebuilt": [p.name for p in todo], "seconds": round(time.monotonic() - t0, 1),
              "splits": {s: sum(1 for i in instances if i.extra.get("split") == s) for s in ("train", "test")}}
    (config.cache / "instances" / "build_report.json").write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    return report


__all__ = ["BuildError", "CACHE_ENV", "DEFAULT_CACHE", "PACKAGES", "build", "build_package", "cache_root",
           "validate"]