"""Domains, typed columns and small random tables for the synthetic DBBench-protocol testbed.

A `Domain` names a table, a key column (unique short names) and typed value columns. Values are
short lowercase words and fixed-width numbers, so that text order equals numeric order: MIN, MAX,
ORDER BY and `>` give the same answer whether the engine compares cells as text (SQLite, columns
are TEXT as in AgentBench) or as numbers (MySQL). Dates are ISO strings for the same reason.

`make_table(domain, rng)` draws 3-6 columns (the key, at least one category and one integer
column) and 5-20 rows with unique keys.
"""
from __future__ import annotations

import dataclasses
import datetime
import random

from harness_envs.dbbench.data import Table

KINDS = ("key", "category", "int", "decimal", "date")


@dataclasses.dataclass(frozen=True)
class Column:
    """One typed column. `pool`: the words of a key or category column; `low`/`high`: the range of
    an int (fixed width: same digit count at both ends) or decimal column (two decimals)."""

    name: str
    kind: str
    pool: tuple[str, ...] = ()
    low: int = 0
    high: int = 0

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"column {self.name!r}: kind {self.kind!r} is not one of {KINDS}")
        if self.kind in ("key", "category") and len(self.pool) < 3:
            raise ValueError(f"column {self.name!r}: a {self.kind} column needs a pool of at least 3 words")
        if self.kind in ("int", "decimal") and len(str(self.low)) != len(str(self.high)):
            raise ValueError(f"column {self.name!r}: {self.low} and {self.high} differ in width; "
                             "fixed-width numbers keep text order equal to numeric order")

    @property
    def numeric(self) -> bool:
        return self.kind in ("int", "decimal")

    def value(self, rng: random.Random) -> str:
        if self.kind in ("key", "category"):
            return rng.choice(self.pool)
        if self.kind == "int":
            return str(rng.randint(self.low, self.high))
        if self.kind == "decimal":
            return f"{rng.randint(self.low * 100, self.high * 100) / 100:.2f}"
        day = datetime.date(2020, 1, 1) + datetime.timedelta(days=rng.randint(0, 4 * 365))
        return day.isoformat()


@dataclasses.dataclass(frozen=True)
class Domain:
    name: str
    table: str
    key: Column
    columns: tuple[Column, ...]  # value columns; the key always comes first in a table

    def by_kind(self, *kinds: str) -> list[Column]:
        return [c for c in self.columns if c.kind in kinds]


def _words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


# Train domains and held-out domains share no table name, column name or word.
DOMAINS: dict[str, Domain] = {d.name: d for d in (
    Domain("sports", "games", Column("team", "key", _words(
        "lynx hawks bears wolves eagles sharks tigers lions foxes owls ravens bulls rams jets "
        "kings suns storm comets rockets pilots")), (
        Column("city", "category", _words("oslo lima rome kyiv doha")),
        Column("coach", "category", _words("ruiz kent lund moss")),
        Column("wins", "int", low=10, high=60),
        Column("points", "int", low=100, high=900),
        Column("played", "date"),
    )),
    Domain("products", "items", Column("product", "key", _words(
        "lamp desk sofa chair mug kettle fan clock rug vase sink stool mirror pillow towel "
        "bucket ladder broom candle basket")), (
        Column("category", "category", _words("home garden office kitchen")),
        Column("brand", "category", _words("acme zeta nova orbit")),
        Column("stock", "int", low=10, high=99),
        Column("price", "decimal", low=10, high=99),
        Column("added", "date"),
    )),
    Domain("employees", "staff", Column("name", "key", _words(
        "anna ben carl dora emil fay gus hana ivan jade karl lena milo nina otto pia quin rosa "
        "sami tara")), (
        Column("dept", "category", _words("sales legal it hr ops")),
        Column("level", "category", _words("junior senior lead")),
        Column("age", "int", low=20, high=65),
        Column("salary", "int", low=3000, high=9000),
        Column("hired", "date"),
    )),
    Domain("cities", "towns", Column("town", "key", _words(
        "avon bray clun derby ely frome goole hull ilkley jarrow kendal leek march nairn "
        "oban poole ripon selby tring wells")), (
        Column("region", "category", _words("north south east west")),
        Column("coast", "category", _words("yes no partly")),
        Column("mayors", "int", low=10, high=40),
        Column("people", "int", low=10000, high=99000),
        Column("area", "decimal", low=10, high=90),
    )),
    # held-out domains
    Domain("flights", "trips", Column("code", "key", _words(
        "ax12 bq34 cz56 dk78 ep90 fr21 gt43 hv65 jw87 kx19 lm28 np37 qr46 sv55 tw64 uy73 vz82 "
        "wb91 xc15 yd26")), (
        Column("origin", "category", _words("paris tokyo cairo delhi")),
        Column("airline", "category", _words("aero sky jetway blue")),
        Column("seats", "int", low=100, high=400),
        Column("fare", "decimal", low=50, high=99),
        Column("departs", "date"),
    )),
    Domain("books", "shelf", Column("title", "key", _words(
        "dune emma ulysses beloved hamlet ivanhoe lolita matilda oliver persuasion rebecca "
        "sula walden zorba candide dracula frankenstein heidi kim middlemarch")), (
        Column("genre", "category", _words("novel poetry drama essay")),
        Column("author", "category", _words("austen joyce morrison tolstoy")),
        Column("pages", "int", low=100, high=999),
        Column("copies", "int", low=10, high=80),
        Column("printed", "date"),
    )),
)}

MIN_ROWS, MAX_ROWS = 5, 20
MIN_COLS, MAX_COLS = 3, 6


def make_table(domain: Domain, rng: random.Random, max_rows: int = MAX_ROWS) -> tuple[Table, tuple[Column, ...]]:
    """A random table of `domain`: (table, its columns in order, key first), with at most
    `max_rows` rows (INSERT tasks keep a key of the pool free for the new row)."""
    category = rng.choice(domain.by_kind("category"))
    integer = rng.choice(domain.by_kind("int"))
    rest = [c for c in domain.columns if c not in (category, integer)]
    extra = rng.sample(rest, rng.randint(MIN_COLS - 3, min(len(rest), MAX_COLS - 3)))
    value_columns = [c for c in domain.columns if c in (category, integer, *extra)]  # domain order
    columns = (domain.key, *value_columns)
    n_rows = rng.randint(MIN_ROWS, min(max_rows, len(domain.key.pool)))
    keys = rng.sample(domain.key.pool, n_rows)
    rows = tuple((key, *(c.value(rng) for c in value_columns)) for key in keys)
    return Table(name=domain.table, columns=tuple(c.name for c in columns), rows=rows), columns
