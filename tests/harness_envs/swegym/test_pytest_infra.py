"""The scorer's rules for test infrastructure and its driver's report: which patch paths are refused,
when a config file's pytest section counts as changed, where pytest's configuration is found, how an
instance's test_cmd is read, and which report lines are believed (docs/swegym.md, "Scoring")."""
import json
import subprocess
import sys

import pytest

from harness_envs.swegym import pytest_infra, pytest_run, scoring


def test_infrastructure_is_named_by_the_file_wherever_it_lies():
    paths = ["conftest.py", "pkg/tests/conftest.py", "pytest.ini", "sub/.pytest.ini", "sitecustomize.py",
             "lib/usercustomize.py", "evil.pth", "pkg.egg-info/entry_points.txt", "pkg/tests/__init__.py",
             "testing/x/__init__.py", "pkg/__init__.py", "pkg/core.py", "setup.cfg", "pkg/tests/test_core.py"]
    assert pytest_infra.infrastructure_paths(paths) == sorted(paths[:10])


def test_patch_paths_are_read_from_every_header_form_with_and_without_their_prefix():
    patch = ("diff --git a/pkg/conftest.py b/pkg/conftest.py\n--- /dev/null\n+++ b/pkg/conftest.py\n"
             "rename from x.py\nrename to tests/__init__.py\n")
    touched = scoring.touched_paths(patch)
    assert {"pkg/conftest.py", "tests/__init__.py", "a/pkg/conftest.py"} <= set(touched)
    assert "/dev/null" not in touched
    assert pytest_infra.infrastructure_paths(touched)


@pytest.mark.parametrize("name,before,after,changed", [
    ("setup.cfg", "[metadata]\nname = x\n[tool:pytest]\naddopts = -q\n", "[metadata]\nname = y\n[tool:pytest]\n"
     "addopts = -q\n", False),
    ("setup.cfg", "[metadata]\nname = x\n", "[metadata]\nname = x\n[tool:pytest]\naddopts = -p evil\n", True),
    ("setup.cfg", "[tool:pytest]\naddopts = -q\n", "[tool:pytest]\naddopts = -q\n  -p evil\n", True),  # continuation
    ("tox.ini", "[tox]\nenvlist = py3\n", "[tox]\nenvlist = py3,py2\n", False),
    ("tox.ini", "[tox]\n", "[tox]\n  [pytest]\naddopts = -p evil\n", True),  # an indented header counts too
    ("pyproject.toml", '[project]\nname = "x"\n', '[project]\nname = "y"\n', False),
    ("pyproject.toml", '[project]\nname = "x"\n', '[project]\nname = "x"\n[tool]\npytest.ini_options.addopts = "-p e"\n',
     True),  # a dotted key, no [tool.pytest...] header
    ("pyproject.toml", '[project]\nname = "x"\n', '[project\nname = "x"\n', True),  # unparseable: any change counts
])
def test_a_config_file_changes_for_pytest_only_when_its_pytest_section_does(name, before, after, changed):
    assert (pytest_infra.pytest_section(name, before) != pytest_infra.pytest_section(name, after)) is changed


def test_the_inifile_is_found_as_pytest_finds_it():
    files = {"pyproject.toml": "[tool.pytest.ini_options]\naddopts = '-q'\n", "setup.cfg": "[tool:pytest]\n",
             "pkg/tests/tox.ini": "[tox]\n", "pkg/setup.cfg": "[metadata]\n"}
    tests = ["pkg/tests/test_a.py", "pkg/tests/sub/test_b.py"]
    assert pytest_infra.find_inifile(tests, files.get) == "pyproject.toml"  # subdirectory files lack a section
    assert pytest_infra.find_inifile(tests, {**files, "pkg/pytest.ini": ""}.get) == "pkg/pytest.ini"  # nearer
    assert pytest_infra.find_inifile(tests, {"pyproject.toml": "[project]\n", "setup.cfg": "[tool:pytest]\n"}.get) == \
        "setup.cfg"
    assert pytest_infra.find_inifile(["t.py"], {}.get) is None


def test_test_cmd_gives_environment_and_options_and_anything_else_is_refused():
    assert pytest_run.pytest_options("A=1 B=x python -m pytest -rA -n0") == ({"A": "1", "B": "x"}, ["-rA", "-n0"])
    assert pytest_run.pytest_options(None)[1][:1] == ["-rA"]
    with pytest.raises(ValueError, match="is not a pytest command line"):
        pytest_run.pytest_options("tox -e py3")


def test_only_one_report_line_with_the_nonce_is_believed():
    nonce = "hsjax-report-abc"
    good = json.dumps({"statuses": {"t.py::a": "PASSED"}, "exitstatus": 0, "replaced": [], "hooked_files": []})
    report, why = pytest_run.read_report(f"PASSED t.py::b\n{nonce} {good}\nnoise\n", nonce)
    assert why is None and report.statuses == {"t.py::a": "PASSED"}
    assert pytest_run.read_report("PASSED t.py::a\n== 1 passed ==\n", nonce)[0] is None  # a log is never read
    assert "without the harness's report" in pytest_run.read_report("", nonce)[1]
    assert "2 times" in pytest_run.read_report(f"{nonce} {good}\n{nonce} {good}\n", nonce)[1]
    assert "does not parse" in pytest_run.read_report(f"{nonce} {{not json\n", nonce)[1]


def test_the_driver_reports_statuses_as_rA_would(tmp_path):
    (tmp_path / "test_s.py").write_text(
        "import pytest\ndef test_pass(): print('PASSED test_s.py::test_fail')\ndef test_fail(): assert 0\n"
        "@pytest.mark.xfail\ndef test_xfail(): assert 0\n@pytest.mark.xfail\ndef test_xpass(): pass\n"
        "@pytest.fixture\ndef bad(): raise RuntimeError\ndef test_error(bad): pass\n")
    stdin, nonce = pytest_run.driver_input(None, None, ["test_s.py"])
    proc = subprocess.run([sys.executable, "-I", "-"], input=stdin, cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    report, why = pytest_run.read_report(proc.stdout, nonce)
    assert why is None, proc.stdout + proc.stderr
    assert report.statuses == {"test_s.py::test_pass": "PASSED", "test_s.py::test_fail": "FAILED",
                               "test_s.py::test_xfail": "XFAIL", "test_s.py::test_xpass": "XPASS",
                               "test_s.py::test_error": "ERROR"}
    assert report.exitstatus == 1 and report.replaced == ()
    assert not any(str(tmp_path) in f for f in report.hooked_files)  # no conftest: nothing of the tree hooked
