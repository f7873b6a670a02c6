"""MySQL's functions, SUM and collation on SQLite: `install(conn, database)` registers them on a
connection. Scalar functions follow MySQL's NULL and type rules (a string compared or added as a
number is read as a double, `to_double`); `MYSQL_AI_CI` is a case- and accent-insensitive NO PAD
collation close to utf8mb4_0900_ai_ci; LIKE and REGEXP follow MySQL's escapes, and a REGEXP that
could backtrack without bound is refused. Statement rewriting is `mysql_translate`.
"""
from __future__ import annotations

import datetime
import functools
import hashlib
import math
import re
import unicodedata

COLLATION = "MYSQL_AI_CI"
MAX_STRING_CHARS = 1_000_000  # REPEAT/LPAD/RPAD results beyond this are NULL, as over max_allowed_packet


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
