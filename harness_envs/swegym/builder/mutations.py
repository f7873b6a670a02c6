"""Procedural bugs: small rewrites of one expression or statement inside a function.

Each operator walks a module's AST and proposes `Mutation`s: a byte span of the file and the text
that replaces it. Applying one is a plain splice, so everything outside the span (the rest of the
function, the rest of the file) stays byte-identical and the gold patch is a one- or two-line diff.
Spans come from the AST's positions (UTF-8 byte columns); an operator token, which the AST does not
locate, is found in the gap between its operands, and a proposal whose gap holds anything but
whitespace, parentheses and line continuations (a comment, say) is dropped. Every proposal is
checked by parsing the edited function: it must parse, and its AST must differ from the original.

Operators (`KINDS`; the issue's list; the nearest swesmith modifier in brackets):
- `flip_comparison` [OperationFlipOperator]: `<`<->`<=`, `>`<->`>=`, `==`<->`!=`, `in`<->`not in`,
  `is`<->`is not`, in a comparison with one operator;
- `swap_boolop` [OperationFlipOperator]: `and`<->`or` in a two-operand boolean expression;
- `drop_condition`: `a and b` -> `a` (or `b`), one candidate per operand;
- `negate_condition` [ControlIfElseInvert, roughly]: the test of an `if`, `while` or conditional
  expression gets `not (...)`, or loses its `not`;
- `remove_if` [RemoveConditional]: an `if` statement without `else` that is not alone in its block
  is deleted, whole lines;
- `swap_args`: the first two positional arguments of a call trade places;
- `off_by_one` [OperationChangeConstants, roughly]: `e + 1`/`e - 1` -> `e`, `e +/- k` -> `e +/- (k-1)`
  (k >= 2); an integer compared against, used as an index or as a slice's upper bound moves by one
  (k -> k-1, or 0 -> 1); a computed stop of `range(...)` or upper bound of a slice gets `+ 1`;
- `flip_arith` [OperationChange]: `+`<->`-` (not where an operand is plainly a string or a list: a
  literal, `str(...)`, a string method's result), `/`<->`//`, also as augmented assignment
  (`+=`<->`-=`);
- `change_return`: `return True`<->`return False`, `return k` (int) -> k-1 (or 0 -> 1).

Only function bodies are touched (module- and class-level code runs at import, where a bug is a
crash rather than a behaviour), never inside an f-string (Python 3.11's positions there are not
reliable) and never inside a nested function's own body, which is enumerated as its own function
(`qualname` `outer.inner`, `Class.method`).

Why not swesmith's modifiers: swesmith (PyPI `swesmith`) rewrites whole functions with libcst code
generation and flips each site with a probability, and importing its procedural package pulls in
tree-sitter grammars for seven languages; its repository pipeline expects GitHub mirrors and
Docker. These rewrites cover the same Python operators with exact spans and no dependency.
"""
from __future__ import annotations

import ast
import dataclasses
import random
import re
from typing import Iterator

KINDS = ("flip_comparison", "swap_boolop", "drop_condition", "negate_condition", "remove_if",
         "swap_args", "off_by_one", "flip_arith", "change_return")

_CMP_FLIP = {ast.Lt: ("<", "<="), ast.LtE: ("<=", "<"), ast.Gt: (">", ">="), ast.GtE: (">=", ">"),
             ast.Eq: ("==", "!="), ast.NotEq: ("!=", "=="), ast.In: ("in", "not in"),
             ast.NotIn: ("not in", "in"), ast.Is: ("is", "is not"), ast.IsNot: ("is not", "is")}
_CMP_TOKEN = {ast.Lt: r"<", ast.LtE: r"<=", ast.Gt: r">", ast.GtE: r">=", ast.Eq: r"==",
              ast.NotEq: r"!=", ast.In: r"\bin\b", ast.NotIn: r"\bnot\s+in\b", ast.Is: r"\bis\b",
              ast.IsNot: r"\bis\s+not\b"}
_ARITH_FLIP = {ast.Add: ("+", "-"), ast.Sub: ("-", "+"), ast.Div: ("/", "//"), ast.FloorDiv: ("//", "/")}
_ARITH_TOKEN = {ast.Add: r"\+", ast.Sub: r"-", ast.Div: r"(?<!/)/(?!/)", ast.FloorDiv: r"//"}
# What may sit around an operator token between two operands.
_FILLER = re.compile(r"[\s()\\]*")
# Nodes that need parentheses to be an operand of `not` or to stand where another expression stood.
_LOOSE = (ast.BoolOp, ast.IfExp, ast.Lambda, ast.NamedExpr, ast.Compare, ast.BinOp, ast.UnaryOp,
          ast.Await, ast.Yield, ast.YieldFrom, ast.Starred)


@dataclasses.dataclass(frozen=True)
class Mutation:
    """Replace bytes `start:end` of the file at `path` with `new`. `function` is the qualified
    name of the enclosing function, `line` the 1-based line of `start`, `kind` one of KINDS."""

    path: str
    function: str
    kind: str
    start: int
    end: int
    new: str
    line: int
    end_line: int

    def apply(self, source: bytes) -> bytes:
        return source[:self.start] + self.new.encode() + source[self.end:]

    @property
    def key(self) -> str:
        return f"{self.path}:{self.start}:{self.end}:{self.kind}:{self.new}"


class _Source:
    """A module's bytes with AST positions turned into byte offsets."""

    def __init__(self, source: bytes):
        self.data = source
        self.line_starts = [0]
        for i, b in enumerate(source):
            if b == 0x0A:
                self.line_starts.append(i + 1)

    def offset(self, line: int, col: int) -> int:
        return self.line_starts[line - 1] + col

    def span(self, node: ast.AST) -> tuple[int, int]:
        return self.offset(node.lineno, node.col_offset), self.offset(node.end_lineno, node.end_col_offset)

    def text(self, node: ast.AST) -> str:
        start, end = self.span(node)
        return self.data[start:end].decode()

    def line_of(self, offset: int) -> int:
        lo, hi = 0, len(self.line_starts) - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.line_starts[mid] <= offset:
                lo = mid
            else:
                hi = mid - 1
        return lo + 1


def functions(tree: ast.AST, prefix: str = "") -> Iterator[tuple[str, ast.AST]]:
    """(qualified name, node) of every function, in source order, nested ones after their parent."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            name = prefix + node.name
            yield name, node
            yield from functions(node, name + ".")
        elif isinstance(node, ast.ClassDef):
            yield from functions(node, prefix + node.name + ".")
        else:
            yield from functions(node, prefix)


def _body_nodes(fn: ast.AST) -> Iterator[tuple[ast.AST, ast.AST | None]]:
    """(node, parent) of every node in `fn`'s body, not entering nested defs, classes or f-strings."""
    stack = [(stmt, fn) for stmt in reversed(fn.body)]
    while stack:
        node, parent = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.JoinedStr)):
            continue
        yield node, parent
        stack.extend((child, node) for child in reversed(list(ast.iter_child_nodes(node))))


def _operator_in_gap(src: _Source, left: ast.AST, right: ast.AST, pattern: str) -> tuple[int, int] | None:
    """Byte span of the one operator token between `left` and `right`, or None if the gap holds
    anything else (a comment) or no or several matches."""
    gap_start, gap_end = src.span(left)[1], src.span(right)[0]
    gap = src.data[gap_start:gap_end].decode()
    matches = list(re.finditer(pattern, gap))
    if len(matches) != 1:
        return None
    m = matches[0]
    if not _FILLER.fullmatch(gap[:m.start()]) or not _FILLER.fullmatch(gap[m.end():]):
        return None
    lead = len(gap[:m.start()].encode())
    return gap_start + lead, gap_start + lead + len(m.group(0).encode())


def _paren(src: _Source, node: ast.AST) -> str:
    text = src.text(node)
    return f"({text})" if isinstance(node, _LOOSE) else text


def _int(node: ast.AST) -> int | None:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    return None


def _nudge(k: int) -> int:
    return k - 1 if k > 0 else k + 1


def _proposals(src: _Source, fn: ast.AST) -> Iterator[tuple[str, int, int, str]]:
    """(kind, start, end, new text) for every site in one function."""
    for node, parent in _body_nodes(fn):
        if isinstance(node, ast.Compare) and len(node.ops) == 1:
            op = type(node.ops[0])
            where = _operator_in_gap(src, node.left, node.comparators[0], _CMP_TOKEN[op])
            if where:
                yield "flip_comparison", *where, _CMP_FLIP[op][1]
            k = _int(node.comparators[0])
            if k is not None and op not in (ast.Is, ast.IsNot, ast.In, ast.NotIn):
                yield "off_by_one", *src.span(node.comparators[0]), str(_nudge(k))

        elif isinstance(node, ast.BoolOp) and len(node.values) == 2:
            a, b = node.values
            word = "and" if isinstance(node.op, ast.And) else "or"
            where = _operator_in_gap(src, a, b, rf"\b{word}\b")
            if where:
                yield "swap_boolop", *where, "or" if word == "and" else "and"
                start, end = src.span(node)
                yield "drop_condition", start, end, _paren(src, a) if isinstance(a, ast.BoolOp) else src.text(a)
                yield "drop_condition", start, end, _paren(src, b) if isinstance(b, ast.BoolOp) else src.text(b)

        elif isinstance(node, ast.BinOp) and type(node.op) in _ARITH_FLIP:
            op = type(node.op)
            where = _operator_in_gap(src, node.left, node.right, _ARITH_TOKEN[op])
            if not where:
                continue
            strings = any(_stringy(x) for x in (node.left, node.right))
            if not strings:
                yield "flip_arith", *where, _ARITH_FLIP[op][1]
            k = _int(node.right)
            if op in (ast.Add, ast.Sub) and k is not None and k >= 1:
                if k == 1:  # `e + 1` -> `e`: keep what precedes the operator (the left side, with its parentheses)
                    start, end = src.span(node)
                    yield "off_by_one", start, end, src.data[start:where[0]].decode().rstrip()
                else:
                    yield "off_by_one", *src.span(node.right), str(k - 1)

        elif isinstance(node, ast.AugAssign) and type(node.op) in (ast.Add, ast.Sub):
            where = _operator_in_gap(src, node.target, node.value, _ARITH_TOKEN[type(node.op)] + "=")
            if where and not (isinstance(node.value, ast.Constant) and isinstance(node.value.value, (str, bytes))):
                yield "flip_arith", *where, ("-=" if isinstance(node.op, ast.Add) else "+=")

        elif isinstance(node, (ast.If, ast.While, ast.IfExp)):
            test = node.test
            if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
                inner = test.operand
                # `not (a or b)` -> `a or b`: the operand's span leaves its parentheses out, which an
                # `if`/`while` test does not need; the rarer operands that do need them get them back.
                loose = isinstance(inner, (ast.Lambda, ast.NamedExpr, ast.IfExp))
                keep = f"({src.text(inner)})" if loose else src.text(inner)
                yield "negate_condition", *src.span(test), keep
            elif not isinstance(test, ast.Constant):  # `while True` -> `while not True` is no bug worth a test run
                yield "negate_condition", *src.span(test), f"not {_paren(src, test)}"
            if isinstance(node, ast.If) and not node.orelse:
                span = _whole_lines(src, node, parent)
                if span:
                    yield "remove_if", *span, ""

        elif isinstance(node, ast.Call):
            args = node.args
            if len(args) >= 2 and not any(isinstance(a, ast.Starred) for a in args[:2]):
                first, second = src.text(args[0]), src.text(args[1])
                if first != second:
                    start, mid_a = src.span(args[0])
                    mid_b, end = src.span(args[1])
                    gap = src.data[mid_a:mid_b].decode()
                    yield "swap_args", start, end, second + gap + first
            if isinstance(node.func, ast.Name) and node.func.id == "range" and 1 <= len(args) <= 3 \
                    and not any(isinstance(a, ast.Starred) for a in args):
                stop = args[0] if len(args) == 1 else args[1]
                if _int(stop) is None and not _is_plus_minus_one(stop):
                    yield "off_by_one", *src.span(stop), f"{_paren(src, stop)} + 1"

        elif isinstance(node, ast.Slice) and node.upper is not None:
            upper, k = node.upper, _int(node.upper)
            if k is not None:
                yield "off_by_one", *src.span(upper), str(_nudge(k))
            elif not _is_plus_minus_one(upper) and not isinstance(upper, ast.UnaryOp):
                yield "off_by_one", *src.span(upper), f"{_paren(src, upper)} + 1"

        elif isinstance(node, ast.Subscript) and _int(node.slice) is not None and node.slice.value >= 0:
            yield "off_by_one", *src.span(node.slice), str(_nudge(node.slice.value))

        elif isinstance(node, ast.Return) and isinstance(node.value, ast.Constant):
            value = node.value.value
            if value is True or value is False:
                yield "change_return", *src.span(node.value), str(not value)
            elif type(value) is int:
                yield "change_return", *src.span(node.value), str(_nudge(value))


_STR_METHODS = {"lower", "upper", "strip", "lstrip", "rstrip", "title", "capitalize", "format", "join", "replace",
                "decode", "encode", "casefold", "swapcase", "ljust", "rjust", "center", "zfill"}


def _stringy(node: ast.AST) -> bool:
    """An operand that is plainly a string or a sequence (where `-` would be a TypeError, not a
    bug): a literal, an f-string, a list or tuple display, `str(...)`, a string method's result,
    or a slice or index of one of these."""
    while isinstance(node, ast.Subscript):
        node = node.value
    if isinstance(node, (ast.JoinedStr, ast.List, ast.Tuple, ast.ListComp)):
        return True
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (str, bytes))
    if isinstance(node, ast.Call):
        func = node.func
        return (isinstance(func, ast.Name) and func.id in ("str", "repr", "list", "tuple")) or \
            (isinstance(func, ast.Attribute) and func.attr in _STR_METHODS)
    return False


def _is_plus_minus_one(node: ast.AST) -> bool:
    return isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)) and _int(node.right) == 1


def _whole_lines(src: _Source, node: ast.stmt, parent: ast.AST) -> tuple[int, int] | None:
    """The span of the full lines `node` occupies, if it has them to itself and its block keeps
    another statement."""
    block = next((getattr(parent, f) for f in ("body", "orelse", "finalbody", "handlers")
                  if node in getattr(parent, f, [])), None)
    if block is None or len(block) < 2:
        return None
    start, end = src.span(node)
    line_start = src.line_starts[node.lineno - 1]
    if src.data[line_start:start].strip():
        return None
    next_line = src.line_starts[node.end_lineno] if node.end_lineno < len(src.line_starts) else len(src.data)
    rest = src.data[end:next_line].strip()
    if rest and not rest.startswith(b"#"):
        return None
    return line_start, next_line


def enumerate_mutations(source: bytes, path: str) -> list[Mutation]:
    """Every valid mutation of one module, sorted by position (then kind, then replacement text).
    A file that does not parse yields none.

    Validity is checked on the enclosing function alone (its lines, under a `class _:` header when
    indented), which is what the edit can change; parsing the whole file per candidate would cost
    seconds per candidate on a 3,000-line module."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    src = _Source(source)
    out, seen = [], set()
    for qualname, fn in functions(tree):
        first = min([fn.lineno] + [d.lineno for d in fn.decorator_list])
        seg_start = src.line_starts[first - 1]
        seg_end = src.line_starts[fn.end_lineno] if fn.end_lineno < len(src.line_starts) else len(source)
        header = b"class _:\n" if source[seg_start:seg_start + 1] in (b" ", b"\t") else b""
        segment = source[seg_start:seg_end]
        try:
            original = ast.dump(ast.parse(header + segment))
        except (SyntaxError, ValueError):
            continue
        for kind, start, end, new in _proposals(src, fn):
            m = Mutation(path, qualname, kind, start, end, new, src.line_of(start),
                         src.line_of(max(start, end - 1)))
            if m.key in seen or not seg_start <= start <= end <= seg_end:
                continue
            seen.add(m.key)
            edited = segment[:start - seg_start] + new.encode() + segment[end - seg_start:]
            try:
                changed = ast.dump(ast.parse(header + edited))
            except (SyntaxError, ValueError):
                continue
            if changed != original:
                out.append(m)
    out.sort(key=lambda m: (m.start, m.end, m.kind, m.new))
    return out


def order(mutations: list[Mutation], seed: str) -> list[Mutation]:
    """The order the builder tries candidates in: shuffled within each kind by `seed`, then dealt
    round-robin across kinds (in a shuffled kind order), so a capped build mixes operators instead
    of taking the most common one. Depends only on the candidates and the seed."""
    rng = random.Random(seed)
    by_kind = {k: sorted((m for m in mutations if m.kind == k), key=lambda m: m.key) for k in KINDS}
    for k in KINDS:
        rng.shuffle(by_kind[k])
    kinds = [k for k in KINDS if by_kind[k]]
    rng.shuffle(kinds)
    out, i = [], 0
    while any(by_kind[k] for k in kinds):
        for k in kinds:
            if i < len(by_kind[k]):
                out.append(by_kind[k][i])
        i += 1
        if all(i >= len(by_kind[k]) for k in kinds):
            break
    return out
