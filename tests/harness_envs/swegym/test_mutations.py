"""The builder's mutation operators on small snippets: each rewrites only its span, the result
parses, and enumeration and ordering are deterministic."""
import ast

import pytest

from harness_envs.swegym.builder import mutations
from harness_envs.swegym.builder.mutations import KINDS, enumerate_mutations, order

SOURCE = b'''"""A module."""
LIMIT = 3 + 1  # module level: never mutated


def clip(xs, n):
    """Keep the first n items."""
    if n < 0:
        raise ValueError("negative")
    if not xs:
        return []
    out = xs[:n]
    return out


class Box:
    def fits(self, a, b):
        return a <= self.size and b == 0

    def total(self, items):
        t = 0
        for i in range(len(items)):
            t += items[i] - 1
        return t

    def empty(self):
        return False


def pair(a, b):
    return divmod(a, b)


def label(x):
    return f"{x + 1}" + str(x)
'''


def _mutants(kind=None):
    found = enumerate_mutations(SOURCE, "pkg/mod.py")
    return [m for m in found if kind is None or m.kind == kind]


def _rewrite(m):
    """(the original text of the span, the replacement), checking everything else is untouched."""
    out = m.apply(SOURCE)
    assert out[:m.start] == SOURCE[:m.start]
    assert out[m.start + len(m.new.encode()):] == SOURCE[m.end:]
    ast.parse(out)
    return SOURCE[m.start:m.end].decode(), m.new


def _pairs(kind):
    return {(_rewrite(m), m.function) for m in _mutants(kind)}


def test_every_operator_is_exercised_and_every_result_parses():
    found = _mutants()
    assert {m.kind for m in found} == set(KINDS)
    for m in found:
        _rewrite(m)
        assert m.path == "pkg/mod.py" and m.line <= m.end_line


def test_module_level_code_and_fstrings_are_left_alone():
    module_line = SOURCE.index(b"LIMIT")
    assert all(m.start > module_line + 20 for m in _mutants())
    fstring = SOURCE.index(b'f"{x + 1}"')
    assert not [m for m in _mutants() if fstring <= m.start < fstring + 10]


def test_flip_comparison():
    pairs = _pairs("flip_comparison")
    assert (("<", "<="), "clip") in pairs
    assert (("<=", "<"), "Box.fits") in pairs
    assert (("==", "!="), "Box.fits") in pairs


def test_boolean_operators():
    assert _pairs("swap_boolop") == {(("and", "or"), "Box.fits")}
    dropped = {new for (old, new), _ in _pairs("drop_condition")}
    assert dropped == {"a <= self.size", "b == 0"}


def test_negate_condition_adds_or_removes_not():
    pairs = {pair for pair, _ in _pairs("negate_condition")}
    assert ("n < 0", "not (n < 0)") in pairs
    assert ("not xs", "xs") in pairs


def test_remove_if_deletes_whole_lines_only_when_the_block_keeps_a_statement():
    removed = [m for m in _mutants("remove_if")]
    assert {m.function for m in removed} == {"clip"}
    for m in removed:
        text = SOURCE[m.start:m.end].decode()
        assert text.startswith("    if ") and text.endswith("\n") and m.new == ""


def test_swap_args_and_off_by_one_and_arith_and_return():
    assert (("a, b", "b, a"), "pair") in _pairs("swap_args")
    off = _pairs("off_by_one")
    assert (("n", "n + 1"), "clip") in off  # slice bound
    assert (("len(items)", "len(items) + 1"), "Box.total") in off  # range stop
    assert (("items[i] - 1", "items[i]"), "Box.total") in off
    assert (("0", "1"), "Box.fits") in off  # an integer compared against
    arith = _pairs("flip_arith")
    assert (("+=", "-="), "Box.total") in arith and (("-", "+"), "Box.total") in arith
    assert not any(f == "label" for _, f in arith)  # str(x) + ...: a string, not arithmetic


def test_change_return():
    source = b"def f(x):\n    if x:\n        return True\n    return 0\n"
    found = {(source[m.start:m.end].decode(), m.new) for m in enumerate_mutations(source, "f.py")
             if m.kind == "change_return"}
    assert found == {("True", "False"), ("0", "1")}


def test_positions_are_utf8_byte_offsets():
    source = 'def f(s):\n    return "héllo wörld" if s == "ä" else s < "é"\n'.encode()
    found = enumerate_mutations(source, "u.py")
    flips = {(source[m.start:m.end].decode(), m.new) for m in found if m.kind == "flip_comparison"}
    assert flips == {("==", "!="), ("<", "<=")}
    for m in found:
        ast.parse(m.apply(source))


def test_a_comment_between_operands_drops_the_site():
    source = b"def f(a, b):\n    return (a  # why\n            < b)\n"
    assert not [m for m in enumerate_mutations(source, "c.py") if m.kind == "flip_comparison"]


def test_unparsable_source_yields_nothing():
    assert enumerate_mutations(b"def f(:\n", "bad.py") == []


def test_enumeration_and_order_are_deterministic():
    first, second = _mutants(), _mutants()
    assert first == second
    a, b = order(first, "0/pkg"), order(list(reversed(second)), "0/pkg")
    assert a == b and sorted(a, key=lambda m: m.key) == sorted(first, key=lambda m: m.key)
    assert order(first, "1/pkg") != a
    # dealt round-robin: the first len(kinds) candidates are of distinct kinds
    head = [m.kind for m in a[:len(KINDS)]]
    assert len(set(head)) == len(head)


@pytest.mark.parametrize("snippet", [
    b"def f(x):\n    while not (y := x()):\n        pass\n",
    b"def f(a, b):\n    return a if not (a or b) else b\n",
    b"def f(*a):\n    return g(*a, 1)\n",
    b"async def f(a):\n    return await g(a, 2) + 1\n",
])
def test_tricky_snippets_only_give_parsable_rewrites(snippet):
    for m in enumerate_mutations(snippet, "t.py"):
        ast.parse(m.apply(snippet))


def test_functions_names_nested_and_methods():
    tree = ast.parse(b"def a():\n    def b():\n        pass\nclass C:\n    def m(self):\n        pass\n")
    assert [name for name, _ in mutations.functions(tree)] == ["a", "a.b", "C.m"]
