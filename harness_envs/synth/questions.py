"""Question families of the synthetic testbed: phrasing templates and gold SQL, per DBBench type.

Each family turns a generated table into a question and the gold statement that answers it (SELECT
family) or performs it (INSERT/UPDATE). Labels are not computed here: `tasks.py` executes the gold
statement on the episode database. Templates come in two disjoint sets, `train` and `heldout`; the
held-out wording differs from every training template by a word or two, so the split tests
phrasing generalization without turning each question into a new language for a tiny model.

Gold SQL is kept short and uniform (no backticks, one line) because the scripted expert runs it
verbatim and a tiny policy learns to write it.
"""
from __future__ import annotations

import dataclasses
import random
from typing import Callable

from harness_envs.dbbench.data import Table
from harness_envs.synth.tables import Column

TYPES = (
    "other", "counting", "comparison", "ranking",
    "aggregation-SUM", "aggregation-MIN", "aggregation-MAX", "aggregation-AVG",
    "INSERT", "UPDATE",
)
PHRASINGS = ("train", "heldout", "names_train", "names_heldout", "names_train_varied",
             "names_train_shared_leads")

# {type: {phrasing set: templates}}. Ranking templates carry their sort order after a "|".
TEMPLATES: dict[str, dict[str, tuple[str, ...]]] = {
    "other": {"train": ("What is the {col} of {k}?", "Give the {col} of {k}."),
              "heldout": ("What is the {col} for {k}?",)},
    "counting": {"train": ("How many rows have {cat} {v}?", "Count the rows with {cat} {v}."),
                 "heldout": ("How many rows are there with {cat} {v}?",)},
    "comparison": {"train": ("Which {key} has {num} above {x}?", "List each {key} with {num} over {x}."),
                   "heldout": ("Which {key} has {num} greater than {x}?",)},
    "ranking": {"train": ("Which {key} has the highest {num}?|DESC", "Which {key} has the lowest {num}?|ASC"),
                "heldout": ("Which {key} has the largest {num}?|DESC", "Which {key} has the smallest {num}?|ASC")},
    "aggregation-SUM": {"train": ("What is the total {num} for {cat} {v}?", "Sum the {num} of rows with {cat} {v}."),
                        "heldout": ("What is the sum of {num} for {cat} {v}?",)},
    "aggregation-MIN": {"train": ("What is the minimum {num} for {cat} {v}?",
                                  "Give the bottom {num} of rows with {cat} {v}."),
                        "heldout": ("What is the least {num} for {cat} {v}?",)},
    "aggregation-MAX": {"train": ("What is the maximum {num} for {cat} {v}?",
                                  "Give the top {num} of rows with {cat} {v}."),
                        "heldout": ("What is the greatest {num} for {cat} {v}?",)},
    "aggregation-AVG": {"train": ("What is the average {num} for {cat} {v}?",
                                  "Give the mean {num} of rows with {cat} {v}."),
                        "heldout": ("What is the mean {num} for {cat} {v}?",)},
    "INSERT": {"train": ("Add a row with {pairs} to {t}.", "Insert {pairs} into {t}."),
               "heldout": ("Add a new row to {t} with {pairs}.",)},
    "UPDATE": {"train": ("Set the {col} of {k} to {v}.", "Change the {col} of {k} to {v}."),
               "heldout": ("Make the {col} of {k} equal {v}.",)},
}

# The names regime (harness_envs/synth/names.py): the held-out wording changes only words that do
# not set the operator (v1's held-out wording also swapped "maximum" for "greatest", which SFT never
# showed), and no template names the table, so a task can hide it.
NAMES_TEMPLATES: dict[str, dict[str, tuple[str, ...]]] = {
    "other": {"names_train": ("What is the {col} of {k}?",), "names_heldout": ("Tell me the {col} of {k}.",)},
    "counting": {"names_train": ("How many rows have {cat} {v}?",),
                 "names_heldout": ("Tell me how many rows have {cat} {v}.",)},
    "ranking": {"names_train": ("Which {key} has the highest {num}?|DESC", "Which {key} has the lowest {num}?|ASC"),
                "names_heldout": ("Tell me the {key} with the highest {num}.|DESC",
                                  "Tell me the {key} with the lowest {num}.|ASC")},
    "aggregation-SUM": {"names_train": ("What is the total {num} for {cat} {v}?",),
                        "names_heldout": ("Tell me the total {num} for {cat} {v}.",)},
    "aggregation-MIN": {"names_train": ("What is the minimum {num} for {cat} {v}?",),
                        "names_heldout": ("Tell me the minimum {num} for {cat} {v}.",)},
    "aggregation-MAX": {"names_train": ("What is the maximum {num} for {cat} {v}?",),
                        "names_heldout": ("Tell me the maximum {num} for {cat} {v}.",)},
}
# Three training wordings a family (the split varied_train), each value followed by another mark
# ("?", ".", ","): with one wording a family, a policy that copied held-out names at 85% under the
# training wording succeeded on 2% of the same tasks worded "Tell me ... ." -- it had learnt to copy
# a value up to the "?" that ends every training question (docs/results.md, v11). None is a
# held-out wording, and the words that set the operator are the same.
NAMES_VARIED = {
    "other": ("What is the {col} of {k}?", "Give the {col} of {k}.", "For {k}, what is the {col}?"),
    "counting": ("How many rows have {cat} {v}?", "Count the rows that have {cat} {v}.",
                 "For {cat} {v}, how many rows are there?"),
    "ranking": ("Which {key} has the highest {num}?|DESC", "Which {key} has the lowest {num}?|ASC",
                "Find the {key} with the highest {num}.|DESC", "Find the {key} with the lowest {num}.|ASC",
                "Of all rows, which {key} has the highest {num}?|DESC",
                "Of all rows, which {key} has the lowest {num}?|ASC"),
    "aggregation-SUM": ("What is the total {num} for {cat} {v}?", "Give the total {num} for {cat} {v}.",
                        "For {cat} {v}, what is the total {num}?"),
    "aggregation-MIN": ("What is the minimum {num} for {cat} {v}?", "Give the minimum {num} for {cat} {v}.",
                        "For {cat} {v}, what is the minimum {num}?"),
    "aggregation-MAX": ("What is the maximum {num} for {cat} {v}?", "Give the maximum {num} for {cat} {v}.",
                        "For {cat} {v}, what is the maximum {num}?"),
}
# NAMES_VARIED plus wordings whose lead-in ("What is the", "Give the", "Find the") another family
# uses too (the split shared_leads_train), so the words after the lead-in, not the lead-in, set the
# family. Under NAMES_VARIED only ranking said "Find the"; its SFT then succeeded on 4 of 17 held-out
# ranking tasks ("Tell me the X with the lowest Y.": it wrote `SELECT MIN(...)` or a wrong column)
# and on 17 of 17 of the same tasks worded "Find the X with the lowest Y." (docs/results.md, v12).
NAMES_SHARED_LEADS = {
    "other": NAMES_VARIED["other"] + ("Find the {col} of {k}.",),
    "counting": NAMES_VARIED["counting"],
    "ranking": NAMES_VARIED["ranking"] + (
        "Give the {key} with the highest {num}.|DESC", "Give the {key} with the lowest {num}.|ASC",
        "What is the {key} with the highest {num}?|DESC", "What is the {key} with the lowest {num}?|ASC"),
    **{f"aggregation-{op}": NAMES_VARIED[f"aggregation-{op}"] + (f"Find the {word} {{num}} for {{cat}} {{v}}.",)
       for op, word in (("SUM", "total"), ("MIN", "minimum"), ("MAX", "maximum"))},
}
for _type, _sets in NAMES_TEMPLATES.items():
    TEMPLATES[_type].update(_sets)
    TEMPLATES[_type]["names_train_varied"] = NAMES_VARIED[_type]
    TEMPLATES[_type]["names_train_shared_leads"] = NAMES_SHARED_LEADS[_type]

MAX_COMPARISON_MATCHES = 3


@dataclasses.dataclass(frozen=True)
class Question:
    text: str
    sql: str
    template: str  # "<type>/<phrasing>/<index>"


def template_id(task_type: str, phrasing: str, index: int) -> str:
    return f"{task_type}/{phrasing}/{index}"


def _pick_template(task_type: str, phrasing: str, rng: random.Random) -> tuple[str, str, str | None]:
    options = TEMPLATES[task_type].get(phrasing)
    if not options:
        raise ValueError(f"question family {task_type!r} has no {phrasing!r} templates")
    i = rng.randrange(len(options))
    text, _, order = options[i].partition("|")
    return text, template_id(task_type, phrasing, i), order or None


def _col_values(table: Table, columns: tuple[Column, ...], col: Column) -> list[str]:
    j = columns.index(col)
    return [row[j] for row in table.rows]


def _pick(columns: tuple[Column, ...], rng: random.Random, *kinds: str) -> Column | None:
    options = [c for c in columns[1:] if c.kind in kinds]
    return rng.choice(options) if options else None


def _lookup(table, columns, rng, phrasing):
    key, col = columns[0], _pick(columns, rng, "category", "int", "decimal", "date")
    k = rng.choice(_col_values(table, columns, key))
    text, tid, _ = _pick_template("other", phrasing, rng)
    return Question(text.format(col=col.name, k=k),
                    f"SELECT {col.name} FROM {table.name} WHERE {key.name} = '{k}'", tid)


def _counting(table, columns, rng, phrasing):
    cat = _pick(columns, rng, "category")
    v = rng.choice(_col_values(table, columns, cat))  # present, so the count is at least 1
    text, tid, _ = _pick_template("counting", phrasing, rng)
    return Question(text.format(cat=cat.name, v=v),
                    f"SELECT COUNT(*) FROM {table.name} WHERE {cat.name} = '{v}'", tid)


def _comparison(table, columns, rng, phrasing):
    # Integers only: a fixed-width integer literal compares the same as text and as a number.
    key, num = columns[0], _pick(columns, rng, "int")
    values = sorted({int(v) for v in _col_values(table, columns, num)}, reverse=True)
    if len(values) < 2:
        return None
    x = values[rng.randint(1, min(MAX_COMPARISON_MATCHES, len(values) - 1))]
    if sum(int(v) > x for v in _col_values(table, columns, num)) > MAX_COMPARISON_MATCHES:
        return None  # ties above the threshold: keep answers short
    text, tid, _ = _pick_template("comparison", phrasing, rng)
    return Question(text.format(key=key.name, num=num.name, x=x),
                    f"SELECT {key.name} FROM {table.name} WHERE {num.name} > {x}", tid)


def _ranking(table, columns, rng, phrasing):
    key, num = columns[0], _pick(columns, rng, "int", "decimal")
    text, tid, order = _pick_template("ranking", phrasing, rng)
    values = _col_values(table, columns, num)
    extreme = max(values) if order == "DESC" else min(values)
    if values.count(extreme) != 1:
        return None  # a tie has no single answer
    return Question(text.format(key=key.name, num=num.name),
                    f"SELECT {key.name} FROM {table.name} ORDER BY {num.name} {order} LIMIT 1", tid)


def _aggregation(func: str, kinds: tuple[str, ...]):
    def build(table, columns, rng, phrasing):
        cat, num = _pick(columns, rng, "category"), _pick(columns, rng, *kinds)
        if num is None:
            return None
        v = rng.choice(_col_values(table, columns, cat))
        text, tid, _ = _pick_template(f"aggregation-{func}", phrasing, rng)
        expr = f"ROUND(AVG({num.name}), 2)" if func == "AVG" else f"{func}({num.name})"
        return Question(text.format(num=num.name, cat=cat.name, v=v),
                        f"SELECT {expr} FROM {table.name} WHERE {cat.name} = '{v}'", tid)
    return build


def _insert(table, columns, rng, phrasing):
    key = columns[0]
    free = [w for w in key.pool if w not in set(_col_values(table, columns, key))]
    if not free:
        return None
    values = [rng.choice(free)] + [c.value(rng) for c in columns[1:]]
    pairs = ", ".join(f"{c.name} {v}" for c, v in zip(columns, values))
    text, tid, _ = _pick_template("INSERT", phrasing, rng)
    names = ", ".join(c.name for c in columns)
    quoted = ", ".join(f"'{v}'" for v in values)
    return Question(text.format(pairs=pairs, t=table.name),
                    f"INSERT INTO {table.name} ({names}) VALUES ({quoted})", tid)


def _update(table, columns, rng, phrasing):
    key, col = columns[0], _pick(columns, rng, "category", "int", "decimal", "date")
    row = rng.choice(table.rows)
    old = row[columns.index(col)]
    v = col.value(rng)
    if v == old:
        return None  # the statement must change the table
    text, tid, _ = _pick_template("UPDATE", phrasing, rng)
    k = row[0]
    return Question(text.format(col=col.name, k=k, v=v),
                    f"UPDATE {table.name} SET {col.name} = '{v}' WHERE {key.name} = '{k}'", tid)


FAMILIES: dict[str, Callable[..., Question | None]] = {
    "other": _lookup,
    "counting": _counting,
    "comparison": _comparison,
    "ranking": _ranking,
    "aggregation-SUM": _aggregation("SUM", ("int",)),  # integer sums stay exact
    "aggregation-MIN": _aggregation("MIN", ("int", "decimal", "date")),
    "aggregation-MAX": _aggregation("MAX", ("int", "decimal", "date")),
    "aggregation-AVG": _aggregation("AVG", ("int",)),
    "INSERT": _insert,
    "UPDATE": _update,
}


def make_question(task_type: str, table: Table, columns: tuple[Column, ...], rng: random.Random,
                  phrasing: str) -> Question | None:
    """A question of `task_type` about `table`, or None when this table cannot carry one (e.g. a
    tie for the ranking's extreme); the caller draws another table."""
    if task_type not in FAMILIES:
        raise ValueError(f"unknown question family {task_type!r}; known: {TYPES}")
    if phrasing not in PHRASINGS:
        raise ValueError(f"unknown phrasing set {phrasing!r}; choose one of {PHRASINGS}")
    return FAMILIES[task_type](table, columns, rng, phrasing)


def description(table: Table) -> str:
    """DBBench's table description line."""
    return f"The name of this table is {table.name}, and the headers of this table are {','.join(table.columns)}."
