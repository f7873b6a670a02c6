"""The FAIL_TO_PASS tests taken out of an instance's base tree: `remove_tests` gives each test file's
text without the named test functions and methods (their decorators and the blank lines before them
too), or None where that cannot be done cleanly, and the instance then keeps its tests in the base
tree (pipeline.py, step 4).
"""
from __future__ import annotations

import ast
import collections
import pathlib


def remove_tests(tree: pathlib.Path, test_ids: list[str]) -> dict[str, bytes] | None:
    """{test file: its text without the functions of `test_ids`}, or None when one cannot be removed
    cleanly: not defined in the file it is collected from (inherited), nested deeper than a class,
    defined twice, or leaving an empty class body."""
    wanted: dict[str, set[tuple[str, ...]]] = collections.defaultdict(set)
    for test_id in test_ids:
        path, *names = test_id.split("::")
        names[-1] = names[-1].split("[", 1)[0]
        if len(names) > 2:
            return None
        wanted[path].add(tuple(names))
    out = {}
    for path, names in sorted(wanted.items()):
        data = (tree / path).read_bytes()
        try:
            module = ast.parse(data)
        except SyntaxError:
            return None
        lines = data.splitlines(keepends=True)
        spans = []
        for name in sorted(names):
            span = _definition(module, name)
            if span is None:
                return None
            spans.append(span)
        for first, last in sorted(set(spans), reverse=True):
            while first > 1 and not lines[first - 2].strip():  # the blank lines before the definition go too
                first -= 1
            del lines[first - 1:last]
        out[path] = b"".join(lines)
    return out


def _definition(module: ast.Module, names: tuple[str, ...]) -> tuple[int, int] | None:
    """(first line with decorators, last line) of the test function or method `names`."""
    scope = module.body
    if len(names) == 2:
        classes = [n for n in module.body if isinstance(n, ast.ClassDef) and n.name == names[0]]
        if len(classes) != 1:
            return None
        scope = classes[0].body
    found = [n for n in scope if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == names[-1]]
    if len(found) != 1:
        return None
    fn = found[0]
    if len(names) == 2 and len(scope) == 1:
        return None
    return min([fn.lineno] + [d.lineno for d in fn.decorator_list]), fn.end_lineno
