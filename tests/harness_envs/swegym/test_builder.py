"""The offline instance builder: statements, test removal, log parsing, a whole build of a
handwritten package (no network: its sdist is made here, its venv is this project's), and the
instances of the cache that `scripts/setup_swegym.sh` built.

The cache test validates every shipped instance with the real scorer (gold patch resolves, empty
patch does not). Without a cache it is skipped; with `HSJAX_REQUIRE_SWEGYM=1` (set in CI, which
builds a subset first) it fails instead.
"""
import hashlib
import io
import json
import os
import pathlib
import sys
import tarfile

import pytest

from harness_envs.swegym.builder import gitrepo, pipeline, statements
from harness_envs.swegym.builder.packages import PACKAGES, SPLITS, Package, select
from harness_envs.swegym.builder.pipeline import Config, build_package, cache_root, validate
from harness_envs.swegym.builder.removed_tests import remove_tests
from harness_envs.swegym.builder.testrun import Failure, parse_failures
from harness_envs.swegym.instances import load_jsonl
from harness_envs.swegym.local_runtime import LocalRuntime

# ------------------------------------------------------------------------------------ statements

PATCH = """diff --git a/pkg/core.py b/pkg/core.py
--- a/pkg/core.py
+++ b/pkg/core.py
@@ -1,3 +1,3 @@
 def clamp(value, low, high):
-    if value <= low:
+    if value < low:
         return low
"""


def test_statement_names_the_function_and_shows_the_failure_but_not_the_fix():
    failure = Failure(("assert clamp(1, 1, 5) == 1",), ("AssertionError: assert 2 == 1",))
    text = statements.write("pypi__pkg-1", "pkg", "1.0", "pkg.core", "clamp", "Limit a value.", [failure], 1, PATCH)
    assert "pkg.core.clamp" in text and "assert 2 == 1" in text and "1 check" in text
    assert not statements.leaks(text, PATCH)
    assert "value < low" not in text and "value <= low" not in text


def test_statement_drops_an_excerpt_that_would_show_a_patched_line():
    leaky = Failure(("if value < low:",), ("AssertionError",))
    text = statements.write("pypi__pkg-2", "pkg", "1.0", "pkg.core", "clamp", "", [leaky], 1, PATCH)
    assert not statements.leaks(text, PATCH) and "pkg.core.clamp" in text
    leaky_error = Failure((), ("    if value <= low:",))
    text = statements.write("pypi__pkg-3", "pkg", "1.0", "pkg.core", "clamp", "", [leaky_error], 2, PATCH)
    assert not statements.leaks(text, PATCH)


def test_statement_templates_are_chosen_deterministically():
    failure = Failure(("assert f() == 1",), ("assert 0 == 1",))
    texts = {statements.write(f"pypi__pkg-{n}", "pkg", "1", "pkg", "f", "", [failure], 1, PATCH) for n in range(12)}
    assert len(texts) == len(statements.TEMPLATES)
    again = statements.write("pypi__pkg-5", "pkg", "1", "pkg", "f", "", [failure], 1, PATCH)
    assert again == statements.write("pypi__pkg-5", "pkg", "1", "pkg", "f", "", [failure], 1, PATCH)


def test_statement_excerpts_hold_nothing_that_differs_between_machines():
    failure = Failure(("assert f(g) is None",),
                      ("assert <function g at 0x7f3831460e00> is None",
                       " +  where x = getattr(<module 'operator' from "
                       "'/root/.pyenv/versions/3.11.7/lib/python3.11/operator.py'>)",
                       "  File /tmp/hsjax-build-x/tree/pkg/core.py, line 3"))
    text = statements.write("pypi__pkg-1", "pkg", "1", "pkg", "f", "", [failure], 1, PATCH,
                            roots=("/tmp/hsjax-build-x/tree",))
    assert "0x7f" not in text and "at 0x..." in text
    assert "/root/" not in text and "from 'operator.py'" in text
    assert "/tmp/" not in text and "File pkg/core.py" in text


# ------------------------------------------------------------------------------------ removing tests

TEST_FILE = '''import pytest


def helper():
    return 1


def test_a():
    assert helper() == 1


@pytest.mark.parametrize("x", [1, 2])
def test_b(x):
    assert x


class TestC:
    def test_c1(self):
        assert True

    def test_c2(self):
        assert True


class TestOnly:
    def test_only(self):
        assert True
'''


def test_remove_tests_takes_out_functions_methods_and_parametrised_ones(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text(TEST_FILE)
    out = remove_tests(tmp_path, ["tests/test_x.py::test_b[2]", "tests/test_x.py::TestC::test_c2",
                                  "tests/test_x.py::test_a"])
    text = out["tests/test_x.py"].decode()
    assert "def test_b" not in text and "def test_c2" not in text and "def test_a" not in text
    assert "@pytest.mark.parametrize" not in text
    assert "def helper" in text and "def test_c1" in text and "def test_only" in text
    compile(text, "test_x.py", "exec")


def test_remove_tests_refuses_what_it_cannot_remove_cleanly(tmp_path):
    (tmp_path / "test_x.py").write_text(TEST_FILE)
    assert remove_tests(tmp_path, ["test_x.py::TestOnly::test_only"]) is None  # an empty class
    assert remove_tests(tmp_path, ["test_x.py::TestInherited::test_a"]) is None  # defined elsewhere
    assert remove_tests(tmp_path, ["test_x.py::test_missing"]) is None


# ------------------------------------------------------------------------------------ log parsing

LOG = """============================= test session starts ==============================
collected 3 items

t/test_m.py .FF                                                          [100%]

=================================== FAILURES ===================================
_________________________________ test_second __________________________________
t/test_m.py:8: in test_second
    assert f(2) == 3
pkg/m.py:4: in f
    return x - 1
E   assert 1 == 3
E    +  where 1 = f(2)
_______________________________ TestK.test_k[a.b] _______________________________
t/test_m.py:12: in test_k
    g()
E   ValueError: bad
=========================== short test summary info ============================
PASSED t/test_m.py::test_first
FAILED t/test_m.py::test_second - assert 1 == 3
FAILED t/test_m.py::TestK::test_k[a.b] - ValueError: bad
"""


def test_parse_failures_keeps_the_tests_own_lines_and_the_errors():
    out = parse_failures(LOG, {"t/test_m.py::test_second", "t/test_m.py::TestK::test_k[a.b]"})
    second = out["t/test_m.py::test_second"]
    assert second.test_lines == ("assert f(2) == 3",)  # not the package's `return x - 1`
    assert second.error == ("assert 1 == 3", " +  where 1 = f(2)")
    assert out["t/test_m.py::TestK::test_k[a.b]"].error == ("ValueError: bad",)


def test_package_list_is_pinned_and_split_by_repository():
    assert 5 <= len(PACKAGES) <= 8
    assert {p.split for p in PACKAGES} == set(SPLITS)
    assert len({p.key for p in PACKAGES}) == len(PACKAGES)
    for p in PACKAGES:
        assert len(p.sha256) == 64 and p.sdist.endswith(".tar.gz") and p.licence
    assert [p.name for p in select("xmltodict,toolz")] == ["toolz", "xmltodict"]
    with pytest.raises(ValueError, match="unknown package"):
        select("left-pad")


# ------------------------------------------------------------------------------------ a whole build

TINY_CORE = '''"""Small helpers."""


def clamp(value, low, high):
    """`value` limited to the range [low, high]."""
    if value < low:
        return low
    if value > high:
        return high
    return value


def window(items, size):
    """Every run of `size` consecutive items."""
    return [items[i:i + size] for i in range(len(items) - size + 1)]


def is_even(n):
    """Whether `n` is even."""
    return n % 2 == 0
'''
TINY_TESTS = '''from tinypkg.core import clamp, is_even, window


def test_clamp_below():
    assert clamp(-5, 0, 10) == 0


def test_clamp_above():
    assert clamp(15, 0, 10) == 10


def test_clamp_inside():
    assert clamp(5, 0, 10) == 5


def test_clamp_edges():
    assert clamp(0, 0, 10) == 0 and clamp(10, 0, 10) == 10


def test_window():
    assert window([1, 2, 3], 2) == [[1, 2], [2, 3]]


def test_window_whole():
    assert window([1, 2], 2) == [[1, 2]]


def test_is_even():
    assert is_even(4) and not is_even(3)
'''


def _tiny_sdist(directory: pathlib.Path) -> pathlib.Path:
    files = {"tinypkg/__init__.py": "", "tinypkg/core.py": TINY_CORE, "tests/test_core.py": TINY_TESTS,
             "PKG-INFO": "Metadata-Version: 2.1\nName: tinypkg\nVersion: 0.1\n"}
    path = directory / "tinypkg-0.1.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name, text in sorted(files.items()):
            data = text.encode()
            info = tarfile.TarInfo(f"tinypkg-0.1/{name}")
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            tar.addfile(info, io.BytesIO(data))
    return path


def _tiny_package(sdist: pathlib.Path) -> Package:
    return Package("tinypkg", "0.1", hashlib.sha256(sdist.read_bytes()).hexdigest(), "MIT", sdist.name, "tinypkg",
                   source=("tinypkg",), tests=("tests",), split="train")


def _tiny_cache(root: pathlib.Path, sdist: pathlib.Path) -> pathlib.Path:
    (root / "sdists").mkdir(parents=True)
    (root / "sdists" / sdist.name).write_bytes(sdist.read_bytes())
    (root / "venvs").mkdir()
    (root / "venvs" / "pypi__tinypkg").symlink_to(sys.prefix)  # this project's venv: it has pytest
    return root


def test_a_handwritten_package_builds_validated_deterministic_instances(tmp_path, monkeypatch):
    sdist = _tiny_sdist(tmp_path)
    pkg = _tiny_package(sdist)
    monkeypatch.setattr(pipeline, "ensure_venv", lambda p, cache: cache / "venvs" / p.key)
    first, report = build_package(pkg, Config(_tiny_cache(tmp_path / "a", sdist), max_per_repo=2))
    assert [i.instance_id for i in first] == ["pypi__tinypkg-1", "pypi__tinypkg-2"], report
    assert report["kept"] == 2 and report["tried"] >= 2

    # The same package, seed and a smaller cap on a second cache: the same first instance, byte for byte.
    second, _ = build_package(pkg, Config(_tiny_cache(tmp_path / "b", sdist), max_per_repo=1))
    assert json.dumps(second[0].to_json(), sort_keys=True) == json.dumps(first[0].to_json(), sort_keys=True)

    repo = gitrepo.BareRepo(tmp_path / "a" / "repos" / "pypi__tinypkg.git")
    tags = repo.refs("refs/tags/")
    runtime = LocalRuntime(tmp_path / "a" / "repos", tmp_path / "a" / "venvs")
    for inst in first:
        assert tags[f"refs/tags/{inst.instance_id}"] == inst.base_commit
        assert repo.git("rev-list", "--count", inst.base_commit).decode().strip() == "1"  # an orphan
        assert inst.repo == "pypi/tinypkg" and inst.extra["split"] == "train" and inst.version == "0.1"
        assert 1 <= len(inst.FAIL_TO_PASS) <= pipeline.MAX_F2P and inst.PASS_TO_PASS
        assert not set(inst.FAIL_TO_PASS) & set(inst.PASS_TO_PASS)
        assert inst.patch.startswith("diff --git a/tinypkg/core.py b/tinypkg/core.py")
        assert not statements.leaks(inst.problem_statement, inst.patch)
        if inst.extra["test_patch_mode"] == "removed":  # the judging tests are not in the base tree
            base_tests = repo.read(inst.base_commit, "tests/test_core.py").decode()
            for test_id in inst.FAIL_TO_PASS:
                assert f"def {test_id.split('::')[-1].split('[')[0]}(" not in base_tests
    assert validate(first[0], runtime) is None  # build_package validated both; once more from outside
    assert gitrepo.PRISTINE_REF in repo.refs("refs/hsjax/")


# ------------------------------------------------------------------------------------ the built cache

def _shipped():
    path = cache_root() / "instances" / "offline.jsonl"
    if not path.is_file():
        message = f"no offline SWE-Gym cache at {path} (scripts/setup_swegym.sh builds it)"
        if os.environ.get("HSJAX_REQUIRE_SWEGYM") == "1":
            pytest.fail(message + " (HSJAX_REQUIRE_SWEGYM=1)")
        pytest.skip(message)
    return load_jsonl(path)


def test_every_shipped_instance_validates_with_the_scorer():
    instances = _shipped()
    assert instances, "the offline cache holds no instance"
    root = cache_root()
    runtime = LocalRuntime(root / "repos", root / "venvs")
    by_repo = {}
    for inst in instances:
        assert inst.extra["split"] in SPLITS
        by_repo.setdefault(inst.repo, set()).add(inst.extra["split"])
        assert not statements.leaks(inst.problem_statement, inst.patch), inst.instance_id
        assert validate(inst, runtime) is None, inst.instance_id
    assert all(len(splits) == 1 for splits in by_repo.values())  # a repository is in one split only
