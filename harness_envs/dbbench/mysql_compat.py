"""MySQL dialect on SQLite: statement rewriting, MySQL functions, a MySQL-like collation and shims.

`translate(sql)` turns one MySQL statement into what SQLite should run: string literals decoded
with MySQL's backslash escapes, `"double quoted"` text treated as a string (MySQL's default
sql_mode has no ANSI_QUOTES), `#` and `-- ` comments dropped, identifiers that start with a digit
quoted, `/` made a decimal division, comparisons of a column with a number made numeric, and a few
operators and keywords mapped (`||`, `&&`, `<=>`, `DIV`, `RLIKE`, `LEFT(`, `RIGHT(`, `SEPARATOR`,
`CAST(.. AS SIGNED)`, `START TRANSACTION`). What SQLite accepts but MySQL refuses (`[name]`, a
string as a table name) is refused. Statements SQLite lacks (`SHOW TABLES`, `DESCRIBE t`,
`SHOW COLUMNS FROM t`, ...) come back as a `Shim` for the backend to answer.
`install(conn, database)` registers the functions, SUM and the `MYSQL_AI_CI` collation.
"""
from __future__ import annotations

import dataclasses
import datetime
import functools
import hashlib
import math
import re
import unicodedata

COLLATION = "MYSQL_AI_CI"
MAX_STRING_CHARS = 1_000_000  # REPEAT/LPAD/RPAD results beyond this are NULL, as over max_allowed_packet


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


# ----------------------------------------------------------------------------------------------
# Collation, LIKE and REGEXP


@functools.lru_cache(maxsize=65536)
def fold(text: str) -> str:
    """Case- and accent-insensitive key, close to utf8mb4_0900_ai_ci (NO PAD)."""
    decomposed = unicodedata.normalize("NFKD", text)
    return "".join(ch for ch in decomposed if not unicodedata.combining(ch)).casefold()


@functools.lru_cache(maxsize=65536)
def sort_key(text: str) -> str:
    """fold(text) with every character tagged by class, so that spaces and punctuation sort before
    digits and letters, as in the Unicode Collation Algorithm (binary order would put '?' after '7')."""
    return "".join(("\x02" if ch.isalnum() else "\x01") + ch for ch in fold(text))


def collate_ai_ci(a: str, b: str) -> int:
    ka, kb = sort_key(a), sort_key(b)
    return (ka > kb) - (ka < kb)


def to_text(value) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


@functools.lru_cache(maxsize=4096)
def _like_regex(pattern: str, escape: str) -> re.Pattern:
    out, i = [], 0
    while i < len(pattern):
        ch = pattern[i]
        if escape and ch == escape and i + 1 < len(pattern):
            out.append(re.escape(pattern[i + 1]))
            i += 2
            continue
        out.append(".*" if ch == "%" else "." if ch == "_" else re.escape(ch))
        i += 1
    return re.compile("".join(out), re.S)


def mysql_like(pattern, value, escape="\\"):
    pattern, value = to_text(pattern), to_text(value)
    if pattern is None or value is None:
        return None
    return int(_like_regex(fold(pattern), fold(escape or "")).fullmatch(fold(value)) is not None)


# Nested quantifiers like (a+)+ backtrack exponentially in Python's `re`, which no time
# budget can interrupt inside a user function; such patterns are refused.
_QUANTIFIED_GROUP = re.compile(r"\((?:[^()\\]|\\.)*[*+}](?:[^()\\]|\\.)*\)\s*[*+{]")


@functools.lru_cache(maxsize=1024)
def _compile_regexp(pattern: str) -> re.Pattern:
    if _QUANTIFIED_GROUP.search(pattern) or len(pattern) > 1000:
        raise ValueError("REGEXP pattern with nested quantifiers or over 1000 characters is not supported")
    return re.compile(pattern, re.I | re.S)


def mysql_regexp(pattern, value):
    pattern, value = to_text(pattern), to_text(value)
    if pattern is None or value is None:
        return None
    return int(_compile_regexp(pattern).search(value) is not None)


# ----------------------------------------------------------------------------------------------
# MySQL scalar functions

_NUMERIC_PREFIX = re.compile(r"\s*[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")


def to_double(value) -> float | None:
    """MySQL's string-to-number rule: the longest numeric prefix, else 0."""
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    m = _NUMERIC_PREFIX.match(to_text(value))
    return float(m.group()) if m else 0.0


def md5(value):
    text = to_text(value)
    return None if text is None else hashlib.md5(text.encode("utf-8")).hexdigest()


def concat(*args):
    if any(a is None for a in args):
        return None
    return "".join(to_text(a) for a in args)


def concat_ws(sep, *args):
    if sep is None:
        return None
    return to_text(sep).join(to_text(a) for a in args if a is not None)


def mysql_if(cond, a, b):
    truthy = cond is not None and (to_double(cond) != 0)
    return a if truthy else b


def locate(sub, text, pos=1):
    sub, text = to_text(sub), to_text(text)
    if sub is None or text is None or pos is None:
        return None
    start = int(pos) - 1
    if start < 0:
        return 0
    return fold(text).find(fold(sub), start) + 1


def substring_index(text, delim, count):
    text, delim = to_text(text), to_text(delim)
    if text is None or delim is None or count is None:
        return None
    count = int(count)
    if count == 0 or not delim:
        return ""
    parts = text.split(delim)
    return delim.join(parts[:count]) if count > 0 else delim.join(parts[count:])


def mysql_left(text, n):
    text = to_text(text)
    return None if text is None or n is None else text[: max(int(n), 0)]


def mysql_right(text, n):
    text = to_text(text)
    if text is None or n is None:
        return None
    n = int(n)
    return text[-n:] if n > 0 else ""


def byte_length(value):
    text = to_text(value)
    return None if text is None else len(text.encode("utf-8"))


def char_length(value):
    text = to_text(value)
    return None if text is None else len(text)


def repeat(value, n):
    text = to_text(value)
    if text is None or n is None:
        return None
    n = max(int(n), 0)
    return None if len(text) * n > MAX_STRING_CHARS else text * n


def _pad(text, n, pad, left):
    text, pad = to_text(text), to_text(pad)
    if text is None or n is None or pad is None:
        return None
    n = int(n)
    if n < 0 or n > MAX_STRING_CHARS:
        return None
    if len(text) >= n:
        return text[:n]
    if not pad:
        return None
    fill = (pad * (n // len(pad) + 1))[: n - len(text)]
    return fill + text if left else text + fill


def upper(value):
    text = to_text(value)
    return None if text is None else text.upper()


def lower(value):
    text = to_text(value)
    return None if text is None else text.lower()


def truncate(x, d):
    if x is None or d is None:
        return None
    factor = 10.0 ** int(d)
    return math.trunc(to_double(x) * factor) / factor


def mysql_format(x, d=0):
    if x is None or d is None:
        return None
    return f"{round(to_double(x), int(d)):,.{max(int(d), 0)}f}"


def greatest(*args):
    return None if any(a is None for a in args) else max(args)


def least(*args):
    return None if any(a is None for a in args) else min(args)


# Dates: MySQL format specifiers that map onto strftime/strptime.
_DATE_SPECIFIERS = {
    "Y": "%Y", "y": "%y", "m": "%m", "c": "%m", "d": "%d", "e": "%d", "M": "%B", "b": "%b",
    "H": "%H", "k": "%H", "i": "%M", "s": "%S", "S": "%S", "p": "%p", "W": "%A", "a": "%a",
    "j": "%j", "T": "%H:%M:%S", "%": "%%",
}
_DATE_PREFIX = re.compile(r"\s*(\d{4})-(\d{1,2})-(\d{1,2})(?:[ T](\d{1,2}):(\d{1,2}):(\d{1,2}))?")


def _strftime_format(mysql_fmt: str) -> str:
    return re.sub(r"%(.)", lambda m: _DATE_SPECIFIERS.get(m.group(1), m.group(1)), mysql_fmt)


def _parse_date(value) -> datetime.datetime | None:
    m = _DATE_PREFIX.match(to_text(value) or "")
    if not m:
        return None
    try:
        return datetime.datetime(*(int(g) if g else 0 for g in m.groups()))
    except ValueError:
        return None


def _date_part(attr):
    def part(value):
        date = _parse_date(value)
        return None if date is None else getattr(date, attr)
    return part


def date_format(value, fmt):
    date = _parse_date(value)
    if date is None or fmt is None:
        return None
    return date.strftime(_strftime_format(to_text(fmt)))


def str_to_date(value, fmt):
    text, fmt = to_text(value), to_text(fmt)
    if text is None or fmt is None:
        return None
    try:
        date = datetime.datetime.strptime(text.strip(), _strftime_format(fmt))
    except ValueError:
        return None
    has_time = any(s in fmt for s in ("%H", "%k", "%i", "%s", "%S", "%T"))
    return date.strftime("%Y-%m-%d %H:%M:%S" if has_time else "%Y-%m-%d")


def datediff(a, b):
    da, db = _parse_date(a), _parse_date(b)
    return None if da is None or db is None else (da.date() - db.date()).days


class MySQLSum:
    """SUM as MySQL computes it on TEXT columns: each string becomes a double (numeric prefix)."""

    def __init__(self):
        self.total, self.seen, self.is_float = 0, False, False

    def step(self, value):
        if value is None:
            return
        self.seen = True
        if isinstance(value, int):
            self.total += value
        else:
            self.is_float = True
            self.total += to_double(value)

    def finalize(self):
        if not self.seen:
            return None
        return float(self.total) if self.is_float else self.total


_FUNCTIONS = [
    ("md5", 1, md5), ("concat", -1, concat), ("concat_ws", -1, concat_ws), ("if", 3, mysql_if),
    ("locate", 2, locate), ("locate", 3, locate), ("position", 2, locate),
    ("substring_index", 3, substring_index), ("mysql_left", 2, mysql_left), ("mysql_right", 2, mysql_right),
    ("mid", 3, lambda s, p, n: None if s is None else to_text(s)[max(int(p) - 1, 0):max(int(p) - 1, 0) + int(n)]),
    ("length", 1, byte_length), ("octet_length", 1, byte_length),
    ("char_length", 1, char_length), ("character_length", 1, char_length),
    ("upper", 1, upper), ("ucase", 1, upper), ("lower", 1, lower), ("lcase", 1, lower),
    ("repeat", 2, repeat), ("lpad", 3, lambda s, n, p: _pad(s, n, p, True)),
    ("rpad", 3, lambda s, n, p: _pad(s, n, p, False)),
    ("reverse", 1, lambda s: None if s is None else to_text(s)[::-1]),
    ("space", 1, lambda n: repeat(" ", n)),
    ("truncate", 2, truncate), ("format", 2, mysql_format), ("format", 1, mysql_format),
    ("greatest", -1, greatest), ("least", -1, least),
    ("isnull", 1, lambda v: int(v is None)),
    ("regexp", 2, mysql_regexp), ("like", 2, mysql_like), ("like", 3, mysql_like),
    ("year", 1, _date_part("year")), ("month", 1, _date_part("month")), ("day", 1, _date_part("day")),
    ("dayofmonth", 1, _date_part("day")),
    ("date_format", 2, date_format), ("str_to_date", 2, str_to_date), ("datediff", 2, datediff),
]


def install(conn, database_name: str) -> None:
    """Register the MySQL functions, SUM and the MYSQL_AI_CI collation on a sqlite3 connection."""
    for name, n_args, fn in _FUNCTIONS:
        conn.create_function(name, n_args, fn, deterministic=True)
    conn.create_function("mysql_num", 1, to_double, deterministic=True)
    conn.create_function("database", 0, lambda: database_name, deterministic=True)
    conn.create_function("schema", 0, lambda: database_name, deterministic=True)
    conn.create_aggregate("sum", 1, MySQLSum)
    conn.create_collation(COLLATION, collate_ai_ci)
