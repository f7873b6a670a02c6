"""MySQL statements for SQLite: `translate(sql)` turns one MySQL statement into what SQLite should run.

String literals are decoded with MySQL's backslash escapes, `"double quoted"` text is treated as a
string (MySQL's default sql_mode has no ANSI_QUOTES), `#` and `-- ` comments are dropped,
identifiers that start with a digit are quoted, `/` is made a decimal division, comparisons of a
column with a number are made numeric (through `MYSQL_NUM`, see `mysql_functions`), and a few
operators and keywords are mapped (`||`, `&&`, `<=>`, `DIV`, `RLIKE`, `LEFT(`, `RIGHT(`,
`SEPARATOR`, `CAST(.. AS SIGNED)`, `START TRANSACTION`). What SQLite accepts but MySQL refuses
(`[name]`, a string as a table name) is refused. Statements SQLite lacks (`SHOW TABLES`,
`DESCRIBE t`, `SHOW COLUMNS FROM t`, ...) come back as a `Shim` for the backend to answer.
"""
from __future__ import annotations

import dataclasses
import re


class SQLSyntaxError(ValueError):
    """The input is not one executable statement; the message is the observation to show."""


@dataclasses.dataclass(frozen=True)
class Shim:
    kind: str  # show_tables | show_databases | describe | show_create_table | use
    name: str | None = None
    like: str | None = None


# ----------------------------------------------------------------------------------------------
# Tokenizing and rewriting

_ESCAPES = {"0": "\0", "'": "'", '"': '"', "b": "\b", "n": "\n", "r": "\r", "t": "\t", "Z": "\x1a", "\\": "\\"}


def _read_quoted(sql: str, i: int, quote: str, backslash: bool) -> tuple[str, int]:
    """Decode the quoted token opening at sql[i]; return (value, index after the closing quote)."""
    out = []
    j = i + 1
    n = len(sql)
    while j < n:
        ch = sql[j]
        if backslash and ch == "\\" and j + 1 < n:
            nxt = sql[j + 1]
            # MySQL keeps `\%` and `\_` as two characters so that LIKE sees the escape.
            out.append("\\" + nxt if nxt in "%_" else _ESCAPES.get(nxt, nxt))
            j += 2
            continue
        if ch == quote:
            if j + 1 < n and sql[j + 1] == quote:
                out.append(quote)
                j += 2
                continue
            return "".join(out), j + 1
        out.append(ch)
        j += 1
    raise SQLSyntaxError(
        "1064 (42000): You have an error in your SQL syntax; an unterminated "
        f"{'string' if quote != '`' else 'identifier'} starts near {sql[i:i + 40]!r}"
    )


def tokenize(sql: str) -> list[tuple[str, str]]:
    """Split MySQL text into ("code", text), ("str", value), ("ident", name), (";", ";") tokens.

    Comments are dropped (each leaves a space).
    """
    tokens: list[tuple[str, str]] = []
    code: list[str] = []
    i, n = 0, len(sql)

    def flush():
        if code:
            tokens.append(("code", "".join(code)))
            code.clear()

    while i < n:
        ch = sql[i]
        if ch in "'\"":
            flush()
            value, i = _read_quoted(sql, i, ch, backslash=True)
            tokens.append(("str", value))
        elif ch == "`":
            flush()
            value, i = _read_quoted(sql, i, "`", backslash=False)
            tokens.append(("ident", value))
        elif ch == "#" or (sql.startswith("--", i) and (i + 2 == n or sql[i + 2].isspace())):
            end = sql.find("\n", i)
            i = n if end < 0 else end
            code.append(" ")
        elif sql.startswith("/*", i):
            end = sql.find("*/", i + 2)
            if end < 0:
                raise SQLSyntaxError("1064 (42000): You have an error in your SQL syntax; unterminated /* comment")
            i = end + 2
            code.append(" ")
        elif ch == ";":
            flush()
            tokens.append((";", ";"))
            i += 1
        else:
            code.append(ch)
            i += 1
    flush()
    return tokens


def split_single(tokens: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The tokens of the one statement; an error if more than one statement is present."""
    try:
        end = tokens.index((";", ";"))
    except ValueError:
        end = len(tokens)
    rest = tokens[end + 1:]
    if any(kind != ";" and not (kind == "code" and not text.strip()) for kind, text in rest):
        raise SQLSyntaxError(
            "1064 (42000): Only one SQL statement can be executed per call; this input has more text "
            "after the first ';'. Nothing was executed."
        )
    stmt = tokens[:end]
    if all(kind == "code" and not text.strip() for kind, text in stmt):
        raise SQLSyntaxError("1065 (42000): Query was empty")
    return stmt


_WORD = re.compile(r"[A-Za-z0-9_$\u0080-\uffff]+")
_NUMBER = re.compile(r"\d+(?:[eE]\d+)?$|0[xX][0-9a-fA-F]+$|0[bB][01]+$")
_EXPONENT_HEAD = re.compile(r"\d+[eE]$")
_CODE_REWRITES = [
    (re.compile(r"\|\|"), " OR "),
    (re.compile(r"&&"), " AND "),
    (re.compile(r"<=>"), " IS "),
    (re.compile(r"\bRLIKE\b", re.I), "REGEXP"),
    (re.compile(r"\bLEFT(\s*\()", re.I), r"mysql_left\1"),
    (re.compile(r"\bRIGHT(\s*\()", re.I), r"mysql_right\1"),
    (re.compile(r"\bSEPARATOR\b", re.I), ","),
    # MySQL's `/` always divides as decimals and DIV as integers; SQLite's `/` truncates integers.
    # `*` and `/` share one precedence level and associate left, so `x * 1.0 / y` keeps the grouping.
    (re.compile(r"/"), " * 1.0 / "),
    (re.compile(r"\bDIV\b", re.I), "/"),
    (re.compile(r"\bAS\s+(?:UN)?SIGNED(?:\s+INT(?:EGER)?)?\b", re.I), "AS INTEGER"),
    (re.compile(r"\bAS\s+(?:DATE|DATETIME|TIME)\b", re.I), "AS TEXT"),
    (re.compile(r"^\s*START\s+TRANSACTION\b", re.I), "BEGIN"),
]


def _quote_ident(name: str) -> str:
    # Backticks, not double quotes: SQLite reads an unknown "name" as a string literal, which would
    # turn a misspelt column into a constant instead of MySQL's error 1054.
    return "`" + name.replace("`", "``") + "`"


def _quote_string(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _quote_digit_identifiers(code: str) -> str:
    out, last = [], 0
    for m in _WORD.finditer(code):
        word = m.group()
        if not word[0].isdigit() or _NUMBER.match(word):
            continue
        if _EXPONENT_HEAD.match(word) and code[m.end():m.end() + 1] in ("+", "-"):
            continue  # 1e+5
        if m.start() > 0 and code[m.start() - 1] == "." and code[m.start() - 2:m.start() - 1].isdigit():
            continue  # fractional part of 1.5e3
        out.append(code[last:m.start()])
        out.append(_quote_ident(word))
        last = m.end()
    out.append(code[last:])
    return "".join(out)


def _rewrite_code(code: str) -> str:
    code = _quote_digit_identifiers(code)
    for pattern, repl in _CODE_REWRITES:
        code = pattern.sub(repl, code)
    return code


# MySQL compares a string with a number as two doubles ('21,052' > 146445 is 21 > 146445), SQLite
# compares TEXT columns as text. Comparisons of a plain column with a numeric literal are rewritten
# to go through MYSQL_NUM (MySQL's string-to-double rule); other expressions stay as they are.
_COL = r'(?:(?:"(?:[^"]|"")*"|[A-Za-z_][\w$]*)\.)?(?:"(?:[^"]|"")*"|[A-Za-z_][\w$]*)'
_NUM = r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?"
_OP = r"<=|>=|<>|!=|==|=|<|>"
_COL_OP_NUM = re.compile(rf'(?<![\w$."])({_COL})(\s*)({_OP})(\s*)({_NUM})(?![\w.])')
_NUM_OP_COL = re.compile(rf'(?<![\w$.])({_NUM})(\s*)({_OP})(\s*)({_COL})(?![\w$"(.])')
_COL_RANGE = re.compile(
    rf'(?<![\w$."])({_COL})(\s+(?:NOT\s+)?(?:BETWEEN\s+{_NUM}\s+AND\s+{_NUM}'
    rf'|IN\s*\(\s*{_NUM}(?:\s*,\s*{_NUM})*\s*\))(?![\w.]))', re.I)
_KEYWORDS = frozenset("""AND OR NOT NULL IS WHERE ON HAVING SELECT CASE WHEN THEN ELSE END BY IN LIKE
    BETWEEN EXISTS DISTINCT ALL ANY SOME TRUE FALSE LIMIT OFFSET AS FROM SET VALUES RETURN XOR""".split())
_WHERE = re.compile(r'"(?:[^"]|"")*"|\b(WHERE)\b', re.I)


def _numeric_comparisons(sql: str) -> str:
    start = 0
    if re.match(r"\s*UPDATE\b", sql, re.I):  # leave the SET assignments alone
        start = next((m.start() for m in _WHERE.finditer(sql) if m.group(1)), len(sql))

    def wrap_left(m):
        if m.group(1).upper() in _KEYWORDS:
            return m.group(0)
        return f"MYSQL_NUM({m.group(1)})" + "".join(m.groups()[1:])

    def wrap_right(m):
        if m.group(5).upper() in _KEYWORDS:
            return m.group(0)
        return "".join(m.groups()[:4]) + f"MYSQL_NUM({m.group(5)})"

    tail = sql[start:]
    tail = _COL_OP_NUM.sub(wrap_left, tail)
    tail = _NUM_OP_COL.sub(wrap_right, tail)
    tail = _COL_RANGE.sub(wrap_left, tail)
    return sql[:start] + tail


def render(tokens: list[tuple[str, str]]) -> str:
    strings, parts = [], []
    for kind, text in tokens:
        if kind == "code":
            parts.append(_rewrite_code(text))
        elif kind == "str":  # a placeholder, so that later rewrites never look inside literals
            parts.append(f"\x00{len(strings)}\x00")
            strings.append(_quote_string(text))
        elif kind == "ident":
            parts.append(_quote_ident(text))
    sql = _numeric_comparisons("".join(parts))
    return re.sub(r"\x00(\d+)\x00", lambda m: strings[int(m.group(1))], sql).strip()


# Shims: matched on a normalized form where identifiers and strings are placeholders.
_NAME = r"(?P<name>\S+?)"
_SHIM_PATTERNS = [
    ("show_tables", re.compile(
        r"SHOW\s+(?:FULL\s+)?TABLES(?:\s+(?:FROM|IN)\s+\S+)?(?:\s+LIKE\s+(?P<like>\S+))?", re.I)),
    ("show_databases", re.compile(r"SHOW\s+(?:DATABASES|SCHEMAS)", re.I)),
    ("describe", re.compile(rf"(?:DESCRIBE|DESC|EXPLAIN)\s+{_NAME}", re.I)),
    ("describe", re.compile(
        rf"SHOW\s+(?:FULL\s+)?(?:COLUMNS|FIELDS)\s+(?:FROM|IN)\s+{_NAME}(?:\s+(?:FROM|IN)\s+\S+)?"
        r"(?:\s+LIKE\s+(?P<like>\S+))?", re.I)),
    ("show_create_table", re.compile(rf"SHOW\s+CREATE\s+TABLE\s+{_NAME}", re.I)),
    ("use", re.compile(rf"USE\s+{_NAME}", re.I)),
]


def _match_shim(tokens: list[tuple[str, str]]) -> Shim | None:
    head = next((text for kind, text in tokens if kind == "code" and text.strip()), "")
    if not re.match(r"\s*(SHOW|DESCRIBE|DESC|EXPLAIN|USE)\b", head, re.I):
        return None
    values, parts = [], []
    for kind, text in tokens:
        if kind == "code":
            parts.append(text)
        else:
            parts.append(f" \x00{len(values)}\x00 ")
            values.append(text)
    flat = " ".join("".join(parts).split())

    def resolve(s: str | None) -> str | None:
        if s is None:
            return None
        m = re.fullmatch(r"\x00(\d+)\x00", s)
        return values[int(m.group(1))] if m else s

    for kind, pattern in _SHIM_PATTERNS:
        m = pattern.fullmatch(flat)
        if m:
            groups = m.groupdict()
            return Shim(kind, resolve(groups.get("name")), resolve(groups.get("like")))
    return None


_TABLE_POSITION = re.compile(r"\b(?:FROM|JOIN|INTO|UPDATE|TABLE)\s*$", re.I)


def _syntax_error_near(near: str) -> SQLSyntaxError:
    return SQLSyntaxError(
        "1064 (42000): You have an error in your SQL syntax; check the manual that corresponds to your "
        f"MySQL server version for the right syntax to use near '{near[:80]}' at line 1"
    )


def check_mysql_only(tokens: list[tuple[str, str]]) -> None:
    """Refuse what SQLite accepts but MySQL rejects: `[bracketed]` names and a string as a table."""
    previous = ""
    for kind, text in tokens:
        if kind == "code" and "[" in text:
            raise _syntax_error_near(text[text.index("["):])
        if kind == "str" and _TABLE_POSITION.search(previous):
            raise _syntax_error_near(text)
        previous = text if kind == "code" else ""


def translate(sql: str) -> str | Shim:
    """One MySQL statement as SQLite text, or a Shim; raises SQLSyntaxError with the observation."""
    tokens = split_single(tokenize(sql))
    shim = _match_shim(tokens)
    if shim is not None:
        return shim
    check_mysql_only(tokens)
    return render(tokens)
