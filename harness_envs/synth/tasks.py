"""Synthetic DBBench-protocol tasks: `make_tasks(split, n, seed) -> list[SynthTask]`.

A `SynthTask` is a `DBTask` (same env, harnesses and evaluator) that also carries its gold SQL,
domain and question template. Labels are computed by executing the gold statement on a fresh SQLite
episode database: SELECT family, every cell of the result as a string (row by row, AgentBench's
label format); INSERT/UPDATE, the label is the statement and `answer_md5` the backend's
`table_hash()` after it.

Splits (docs/testbed.md):
    synth_train    domains sports, products, employees, cities; the `train` templates
    synth_heldout  domains flights, books (other table, column names and values); the `heldout`
                   templates (each differs from the training wording)
Types cycle with the index, so any n >= 10 holds every type. Task i depends only on (split, seed, i):
`make_tasks(s, 100, 0)` is the first 100 tasks of `make_tasks(s, 500, 0)`. Results are cached.
"""
from __future__ import annotations

import dataclasses
import functools
import random
from typing import Callable

from harness_envs.dbbench.data import DBTask, is_modification
from harness_envs.dbbench.sqlite_backend import SQLiteBackend
from harness_envs.synth.questions import TYPES, description, make_question
from harness_envs.synth.tables import DOMAINS, MAX_ROWS, make_table


@dataclasses.dataclass(frozen=True)
class SplitSpec:
    domains: tuple[str, ...]
    phrasing: str


SPLITS: dict[str, SplitSpec] = {
    "synth_train": SplitSpec(("sports", "products", "employees", "cities"), "train"),
    "synth_heldout": SplitSpec(("flights", "books"), "heldout"),
}
DEFAULT_SIZES = {"synth_train": 2000, "synth_heldout": 400}
_MAX_ATTEMPTS = 100


@dataclasses.dataclass(frozen=True)
class SynthTask(DBTask):
    gold_sql: str = ""
    domain: str = ""
    template: str = ""
    hidden: bool = False  # the description withholds the table name (the names regime)
    database: str = ""  # the episode database's name; empty: the table's (as DBBench)
    # Other tables in the episode database (testbed v4): SHOW TABLES lists them beside `table`.
    extra_tables: tuple = ()


class GenerationError(RuntimeError):
    """A task could not be generated (a family that no table of the domain can carry)."""


def label_task(task: SynthTask, backend: SQLiteBackend) -> SynthTask:
    """`task` with its label: the gold statement executed on a fresh episode database."""
    db = backend.open(task)
    try:
        res = db.execute(task.gold_sql)
        if not res.ok:
            raise GenerationError(f"{task.task_id}: gold SQL {task.gold_sql!r} failed: {res.error}")
        if is_modification(task):
            return dataclasses.replace(task, label=(task.gold_sql,), answer_md5=db.table_hash())
        cells = tuple(str(cell) for row in res.rows for cell in row)
        if not cells or any(cell == "None" for cell in cells):
            raise GenerationError(f"{task.task_id}: gold SQL {task.gold_sql!r} gave {res.text}")
        return dataclasses.replace(task, label=cells)
    finally:
        db.close()


def make_task(split: str, seed: int, index: int, backend: SQLiteBackend | None = None) -> SynthTask:
    """Task `index` of (split, seed): its type is TYPES[index % len(TYPES)]."""
    if split not in SPLITS:
        raise ValueError(f"unknown synthetic split {split!r}; choose one of {sorted(SPLITS)}")
    spec = SPLITS[split]
    task_type = TYPES[index % len(TYPES)]
    rng = random.Random(f"{split}/{seed}/{index}")
    for _ in range(_MAX_ATTEMPTS):
        domain = DOMAINS[rng.choice(spec.domains)]
        max_rows = MAX_ROWS - 2 if task_type == "INSERT" else MAX_ROWS
        table, columns = make_table(domain, rng, max_rows=max_rows)
        question = make_question(task_type, table, columns, rng, spec.phrasing)
        if question is not None:
            break
    else:
        raise GenerationError(f"{split} seed {seed} task {index}: no {task_type} question in "
                              f"{_MAX_ATTEMPTS} tables; check the family's column needs")
    task = SynthTask(
        task_id=f"{split}-s{seed}-{index:05d}", split=split, index=index, type=task_type,
        question=question.text, add_description=description(table), table=table, label=(),
        answer_md5=None, source=f"synth:{domain.name}:{question.template}",
        gold_sql=question.sql, domain=domain.name, template=question.template)
    return label_task(task, backend or SQLiteBackend())


@functools.lru_cache(maxsize=32)
def _cached(make: Callable, split: str, n: int, seed: int) -> tuple[SynthTask, ...]:
    backend = SQLiteBackend()
    return tuple(make(split, seed, i, backend) for i in range(n))


def generated(make: Callable, split: str, n: int, seed: int = 0) -> list[SynthTask]:
    """The first `n` tasks `make(split, seed, index, backend)` gives; deterministic and cached in memory."""
    if n < 0:
        raise ValueError(f"n={n} must be >= 0")
    return list(_cached(make, split, int(n), int(seed)))


def split_of_size(make: Callable, sizes: dict[str, int], name: str, n: int | None, seed: int) -> list[SynthTask]:
    """The split `name` of a generator, `n` tasks or its default size in `sizes`."""
    if name not in sizes:
        raise ValueError(f"unknown synthetic split {name!r}; choose one of {sorted(sizes)}")
    return generated(make, name, sizes[name] if n is None else n, seed)


def make_tasks(split: str, n: int, seed: int = 0) -> list[SynthTask]:
    """The first `n` tasks of (split, seed); deterministic and cached in memory."""
    return generated(make_task, split, n, seed)


def load_split(name: str, n: int | None = None, seed: int = 0) -> list[SynthTask]:
    """`make_tasks(name, n or DEFAULT_SIZES[name], seed)`: the split at its default size."""
    return split_of_size(make_task, DEFAULT_SIZES, name, n, seed)


def by_type(tasks: list[DBTask], per_type: int) -> list[DBTask]:
    """The first `per_type` tasks of each type, in the order given (a balanced evaluation sample)."""
    counts: dict[str, int] = {}
    out = []
    for task in tasks:
        if counts.get(task.type, 0) < per_type:
            counts[task.type] = counts.get(task.type, 0) + 1
            out.append(task)
    return out
