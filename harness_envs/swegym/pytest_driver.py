"""The scorer's pytest run, as the harness controls it: this file's text is fed on stdin to
`python -I -` inside the workspace (never written into it), followed by one `main(...)` line that
carries a nonce fresh for each run. It runs in the instance's own interpreter and venv, so its
syntax stays Python 3.6 and its pytest API pytest 3.6.

What it pins, so that files of the model's patch cannot alter collection or reporting:
- `python -I`: no PYTHONPATH, no user site, so a `sitecustomize.py`/`usercustomize.py` in the tree
  never runs at start-up; the tree's import roots are put on `sys.path` here instead;
- pytest's configuration: `-c <the file the base commit configures pytest with>` (or /dev/null),
  `--rootdir=<tree>`, `-p no:cacheprovider`, PYTEST_ADDOPTS and PYTEST_PLUGINS cleared, plugin
  auto-loading off (`PYTEST_DISABLE_PLUGIN_AUTOLOAD`): the venv's own plugins are loaded by name,
  none whose distribution lies in the tree;
- the outcome: every test's status taken by the plugin below from pytest's reports, written as one
  JSON line prefixed by the nonce to a duplicate of the original stdout; the parent reads that line
  and nothing the tests printed.

And what it reports for the parent to judge: the file of every plugin and hook function pytest ran
(a module of the patch among them means the patch hooked into pytest), and every function of
pytest and pluggy whose code was replaced while the tests ran (a tripwire: code of the package under
test runs in this process and can rewrite anything in it; see docs/swegym.md).
"""
import importlib
import json
import os
import sys

PASSING_HOOKS = ("pytest_runtest_protocol", "pytest_runtest_makereport", "pytest_runtest_logreport",
                 "pytest_report_teststatus", "pytest_runtest_call", "pytest_pyfunc_call", "pytest_collectreport",
                 "pytest_make_collect_report", "pytest_terminal_summary", "pytest_sessionfinish")
FAILING = ("FAILED", "ERROR")


def _functions(module):
    """(name, function) of the functions and methods `module` defines."""
    for attr, value in list(vars(module).items()):
        if getattr(value, "__module__", None) != module.__name__:
            continue
        if isinstance(value, type):
            for name, member in list(vars(value).items()):
                member = getattr(member, "__func__", None) or getattr(member, "fget", None) or member
                if hasattr(member, "__code__"):
                    yield attr + "." + name, member
        elif hasattr(value, "__code__"):
            yield attr, value


def snapshot():
    """{qualified name: (function, its code)} of every function of pytest and pluggy now loaded."""
    out = {}
    for name, module in sorted(sys.modules.items()):
        if module is None or not (name == "pytest" or name.split(".")[0] in ("_pytest", "pluggy")):
            continue
        for attr, function in _functions(module):
            out[name + "." + attr] = (function, function.__code__)
    return out


def replaced(before):
    """The names of `before` whose function or code is no longer what it was."""
    now = snapshot()
    return sorted(name for name, (function, code) in before.items()
                  if name not in now or now[name][0] is not function or function.__code__ is not code)


def _source_file(thing):
    code = getattr(getattr(thing, "__func__", thing), "__code__", None)
    if code is not None:
        return code.co_filename
    module = sys.modules.get(getattr(thing, "__module__", None) or getattr(type(thing), "__module__", ""))
    return getattr(thing, "__file__", None) or getattr(module, "__file__", None)


class Recorder(object):
    """Statuses from pytest's own reports, as `-rA` would print them."""

    def __init__(self):
        self.statuses = {}
        self.config = None

    def _set(self, nodeid, status):
        if self.statuses.get(nodeid) not in FAILING:
            self.statuses[nodeid] = status

    def pytest_configure(self, config):
        self.config = config

    def pytest_collectreport(self, report):
        if report.failed:
            self._set(report.nodeid, "ERROR")

    def pytest_runtest_logreport(self, report):
        xfail = hasattr(report, "wasxfail")
        if report.failed:
            self._set(report.nodeid, "FAILED" if report.when == "call" else "ERROR")
        elif report.skipped:
            self._set(report.nodeid, "XFAIL" if xfail else "SKIPPED")
        elif report.when == "call":
            self._set(report.nodeid, "XPASS" if xfail else "PASSED")

    def hooked_files(self):
        """The files of every plugin and of every hook function that took part in reporting."""
        if self.config is None:
            return []
        manager, files = self.config.pluginmanager, set()
        for plugin in manager.get_plugins():
            if plugin is not self:
                files.add(_source_file(plugin))
        for hook in PASSING_HOOKS:
            for impl in getattr(manager.hook, hook).get_hookimpls():
                if impl.plugin is not self:
                    files.add(_source_file(impl.function))
        return sorted(f for f in files if f)


def venv_plugins(tree):
    """`-p module` for each pytest11 entry point of a distribution outside `tree`."""
    try:
        from importlib import metadata
    except ImportError:  # Python < 3.8: no plugin is loaded by name
        return []
    args = []
    for dist in metadata.distributions():
        where = os.path.realpath(str(dist.locate_file("")))
        if where == tree or where.startswith(tree + os.sep):
            continue
        for entry in dist.entry_points:
            if entry.group == "pytest11":
                args += ["-p", entry.value.split(":")[0].strip()]
    return args


def main(nonce, inifile, env, options, files):
    report_fd = os.dup(1)  # the real stdout, kept before any test can redirect fd 1
    tree = os.path.realpath(os.getcwd())
    for key in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS"):
        os.environ.pop(key, None)
    os.environ.update(env)
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    # The runtime's PYTHONPATH (the tree's import roots), which -I kept from the interpreter.
    sys.path[:0] = [tree] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    import pytest
    import _pytest.config
    for name in getattr(_pytest.config, "default_plugins", ()):
        try:
            importlib.import_module("_pytest." + name)
        except ImportError:
            pass
    before = snapshot()
    recorder = Recorder()
    args = (["-c", inifile or os.devnull, "--rootdir", tree, "-p", "no:cacheprovider"] + venv_plugins(tree)
            + list(options) + ["--"] + list(files))
    exitstatus = int(pytest.main(args, plugins=[recorder]))
    result = {"statuses": recorder.statuses, "exitstatus": exitstatus, "replaced": replaced(before),
              "hooked_files": recorder.hooked_files()}
    sys.stdout.flush()
    sys.stderr.flush()
    line = ("\n" + nonce + " " + json.dumps(result) + "\n").encode("utf-8")
    while line:
        line = line[os.write(report_fd, line):]
    return exitstatus
