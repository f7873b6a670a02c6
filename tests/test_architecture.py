"""The architecture holds: the import contract of pyproject.toml, no import cycles, no project
imports hidden in functions, focused modules, benchmarks reached only through their interface, and
docs/architecture.md naming every module (docs/architecture.md)."""
import ast
import importlib.metadata
import pathlib
import pkgutil
import re
import subprocess
import sys

import grimp

import hsjax

REPO = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("hsjax", "harness_envs", "studies")  # the library and its studies
MAX_MODULE_LINES = 400


def _sources():
    for package in PACKAGES:
        yield from sorted((REPO / package).rglob("*.py"))


def test_the_import_contract_is_kept():
    # The `lint-imports` command of import-linter, run on pyproject.toml's contracts.
    code = ("import sys; from importlinter.cli import lint_imports; "
            f"sys.exit(lint_imports(config_filename={str(REPO / 'pyproject.toml')!r}, no_cache=True))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "Contracts: 8 kept, 0 broken." in proc.stdout


def _cycles(graph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), over direct imports."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.find_modules_directly_imported_by(v):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return out


def test_no_import_cycles():
    assert _cycles(grimp.build_graph(*PACKAGES)) == []


def test_the_cycle_finder_finds_a_cycle():
    graph = grimp.ImportGraph()
    for a, b in (("p.a", "p.b"), ("p.b", "p.c"), ("p.c", "p.a"), ("p.c", "p.d")):
        graph.add_import(importer=a, imported=b)
    assert _cycles(graph) == [["p.a", "p.b", "p.c"]]


def _in_function_project_imports(path: pathlib.Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""] if node.level == 0 else ["(relative)"]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                if name == "(relative)" or name.split(".")[0] in PACKAGES:
                    found.append(f"{path.relative_to(REPO)}:{node.lineno} {fn.name} imports {name}")
    return found


def test_no_project_imports_inside_functions():
    # Only optional heavy dependencies (matplotlib, uvicorn, transformers, ...) may be imported late.
    found = [hit for path in _sources() for hit in _in_function_project_imports(path)]
    assert found == []


def test_modules_stay_focused():
    sizes = {str(p.relative_to(REPO)): len(p.read_text().splitlines()) for p in _sources()}
    assert {name: n for name, n in sizes.items() if n > MAX_MODULE_LINES} == {}


# A row of docs/architecture.md's module table: | `hsjax/infra` | `checkpoint`, `sharding` (...), ... |,
# where `sub/` (`a`, `b`) names the modules of a subpackage.
_TABLE_ROW = re.compile(r"^\|\s*`((?:hsjax|harness_envs|studies)[\w/]*)`\s*\|(.*)\|\s*$", re.M)
_SUBPACKAGE = re.compile(r"`([\w/]+)/`\s*\(([^()]*)\)")


def _unnamed_modules(doc: str, modules: list[str]) -> list[str]:
    """The modules (`pkg/sub/name.py`, repository-relative) that the doc's module table does not name:
    `name` in backticks in the row of `pkg/sub`, or in the parentheses after `sub/` in the row of `pkg`."""
    rows: dict[str, set[str]] = {}
    for package, cell in _TABLE_ROW.findall(doc):
        package = package.rstrip("/")
        for sub, names in _SUBPACKAGE.findall(cell):
            rows.setdefault(f"{package}/{sub}", set()).update(re.findall(r"`([^`]+)`", names))
        rows.setdefault(package, set()).update(re.findall(r"`([^`]+)`", _SUBPACKAGE.sub("", cell)))
    return [m for m in modules if m.removesuffix(".py").rsplit("/", 1)[-1] not in rows.get(m.rsplit("/", 1)[0], ())]


def test_the_architecture_doc_names_every_module():
    doc = (REPO / "docs" / "architecture.md").read_text()
    modules = [str(p.relative_to(REPO)) for package in ("hsjax", "harness_envs")
               for p in sorted((REPO / package).rglob("*.py")) if p.name != "__init__.py"]
    assert len(modules) > 100
    assert _unnamed_modules(doc, modules) == []


def test_the_module_table_check_sees_a_missing_module():
    doc = "| `hsjax/p` | `a`, `sub/` (the subpackage: `b`) |\n| `hsjax/p/deep` | `c` |\n| `name` | `x` |\n"
    assert _unnamed_modules(doc, ["hsjax/p/a.py", "hsjax/p/sub/b.py", "hsjax/p/deep/c.py"]) == []
    missing = ["hsjax/p/x.py", "hsjax/p/sub/a.py", "hsjax/p/other/b.py", "hsjax/q/a.py", "hsjax/p/deep/a.py"]
    assert _unnamed_modules(doc, missing) == missing


def test_the_harness_s_core_and_rl_load_no_benchmark():
    """Importing every module of hsjax.harness_s, hsjax.rl, hsjax.rollout and hsjax.llm loads the
    benchmark interface but no benchmark (a fresh interpreter, so other tests' imports do not count)."""
    code = (
        "import importlib, pkgutil, sys\n"
        "for pkg in ('hsjax.harness_s', 'hsjax.rl', 'hsjax.rollout', 'hsjax.policies', 'hsjax.llm'):\n"
        "    root = importlib.import_module(pkg)\n"
        "    for info in pkgutil.walk_packages(root.__path__, pkg + '.'):\n"
        "        importlib.import_module(info.name)\n"
        "print(sorted(m for m in sys.modules if m.startswith('harness_envs')))\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    loaded = eval(proc.stdout.strip().splitlines()[-1])
    assert loaded and set(loaded) <= {"harness_envs", "harness_envs.base", "harness_envs.harness",
                                      "harness_envs.benchmark"}, loaded


def test_every_mode_module_has_a_main():
    modes = importlib.import_module("hsjax.modes")
    for info in pkgutil.iter_modules(modes.__path__):
        module = importlib.import_module(f"hsjax.modes.{info.name}")
        assert callable(getattr(module, "main", None)), info.name


def test_hsjax_is_installed_from_this_checkout():
    dist = importlib.metadata.distribution("hsjax")
    assert dist.metadata["Name"] == "hsjax"
    assert pathlib.Path(hsjax.__file__).resolve().is_relative_to(REPO)
