"""DBBench tasks (AgentBench database task): typed records loaded from the vendored JSON lines.

Splits: `dev` (60 items) and `standard` (300) as published, plus `standard_train` (240) and
`standard_heldout` (60), a deterministic split of `standard` stratified by type (see
`heldout_ids`). Every task keeps the id of its source item (`standard-0042`) in every split.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import pathlib

DATA_DIR = pathlib.Path(__file__).resolve().parent / "data"

SELECT_TYPES = (
    "other",
    "counting",
    "comparison",
    "ranking",
    "aggregation-SUM",
    "aggregation-MIN",
    "aggregation-MAX",
    "aggregation-AVG",
)
MODIFY_TYPES = ("INSERT", "UPDATE", "DELETE")
CATEGORIES = ("SELECT", "INSERT", "UPDATE")

SOURCE_FILES = {
    "dev": ("dev.jsonl", "eb941c58a7a5651357b19e46aa05070f6cd5a7d83ce70cefd24aa3581e1e1130"),
    "standard": ("standard.jsonl", "cf8dec6fb8051f46e6171136824aaa8b8707c3affbb3185c0bad2b39bc6b71e2"),
}
DERIVED_SPLITS = ("standard_train", "standard_heldout")
SPLITS = tuple(SOURCE_FILES) + DERIVED_SPLITS
HELDOUT_FRACTION = 0.2


@dataclasses.dataclass(frozen=True)
class Table:
    name: str
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]


@dataclasses.dataclass(frozen=True)
class DBTask:
    task_id: str
    split: str
    index: int  # line number (0-based) in the source file
    type: str
    question: str
    add_description: str
    table: Table
    label: tuple[str, ...]  # SELECT family: answer strings; INSERT/UPDATE: the gold statement
    answer_md5: str | None  # INSERT/UPDATE: "[('<32 hex>',)]", the table hash after the gold statement
    source: str


def is_modification(task: DBTask) -> bool:
    return task.type in MODIFY_TYPES


def category(task_type: str) -> str:
    """AgentBench's scoring category: every type that is not INSERT/UPDATE counts as SELECT."""
    return task_type if task_type in ("INSERT", "UPDATE") else "SELECT"


def _parse_table(raw: dict, where: str) -> Table:
    if isinstance(raw, list):
        if len(raw) != 1:
            raise ValueError(f"{where}: {len(raw)} tables; DBBench items here hold exactly one table")
        raw = raw[0]
    info = raw["table_info"]
    columns = tuple(str(c["name"]) for c in info["columns"])
    # Cells are stored as str, as the environment inserts them into TEXT columns.
    rows = tuple(tuple(str(cell) for cell in row) for row in info["rows"])
    for r, row in enumerate(rows):
        if len(row) != len(columns):
            raise ValueError(f"{where}: row {r} has {len(row)} cells for {len(columns)} columns")
    return Table(name=str(raw["table_name"]), columns=columns, rows=rows)


def parse_item(raw: dict, split: str, index: int) -> DBTask:
    where = f"{split} item {index}"
    (task_type,) = raw["type"]
    answer_md5 = raw.get("answer_md5")
    if task_type in MODIFY_TYPES and not answer_md5:
        raise ValueError(f"{where}: {task_type} item without answer_md5")
    return DBTask(
        task_id=f"{split}-{index:04d}",
        split=split,
        index=index,
        type=task_type,
        question=raw["description"],
        add_description=raw["add_description"],
        table=_parse_table(raw["table"], where),
        label=tuple(str(x) for x in raw["label"]),
        answer_md5=str(answer_md5) if answer_md5 else None,
        source=raw.get("source", ""),
    )


@functools.lru_cache(maxsize=None)
def _load_source(name: str) -> tuple[DBTask, ...]:
    filename, sha256 = SOURCE_FILES[name]
    path = DATA_DIR / filename
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing; the DBBench data ships in harness_envs/dbbench/data/")
    blob = path.read_bytes()
    digest = hashlib.sha256(blob).hexdigest()
    if digest != sha256:
        raise ValueError(
            f"{path} has sha256 {digest}, expected {sha256}; restore the vendored copy (see data/SOURCE.md)"
        )
    lines = blob.decode("utf-8").splitlines()
    return tuple(parse_item(json.loads(line), name, i) for i, line in enumerate(lines) if line.strip())


def _stable_key(task_id: str) -> str:
    return hashlib.sha256(task_id.encode()).hexdigest()


@functools.lru_cache(maxsize=None)
def heldout_ids() -> frozenset[str]:
    """The `standard_heldout` task ids: within each type, the round(20%) ids first by sha256(task_id).

    Gives 20 INSERT, 20 UPDATE, 3 each of other/counting/comparison/ranking and 2 of each
    aggregation type: 60 held out, 240 for training.
    """
    by_type: dict[str, list[str]] = {}
    for task in _load_source("standard"):
        by_type.setdefault(task.type, []).append(task.task_id)
    chosen = set()
    for ids in by_type.values():
        n = round(len(ids) * HELDOUT_FRACTION)
        chosen.update(sorted(ids, key=_stable_key)[:n])
    return frozenset(chosen)


def load_split(name: str) -> list[DBTask]:
    """Tasks of a split, in source-file order. `split` on each task is the name asked for."""
    if name in SOURCE_FILES:
        return list(_load_source(name))
    if name in DERIVED_SPLITS:
        held = heldout_ids()
        keep_heldout = name == "standard_heldout"
        return [
            dataclasses.replace(t, split=name)
            for t in _load_source("standard")
            if (t.task_id in held) == keep_heldout
        ]
    raise ValueError(f"unknown DBBench split {name!r}; choose one of {', '.join(SPLITS)}")


def get_task(task_id: str) -> DBTask:
    """The task with this id (`dev-0005`, `standard-0180`), from its source split."""
    split, _, index = task_id.rpartition("-")
    if split not in SOURCE_FILES or not index.isdigit():
        raise ValueError(f"malformed DBBench task id {task_id!r}; expected e.g. 'standard-0042'")
    tasks = _load_source(split)
    i = int(index)
    if i >= len(tasks):
        raise ValueError(f"{task_id!r}: split {split!r} has only {len(tasks)} items")
    return tasks[i]
