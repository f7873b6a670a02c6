"""JSON for a run's records: `metrics.jsonl` rows (read back, truncated on resume), episode samples,
atomic JSON files, and values made JSON-ready. The writer of each step's metrics to JSON lines,
TensorBoard and W&B is `hsjax.infra.tracking`.

Every row carries `step`; metric names are slash-separated (`reward/mean`, `loss/pg`, ...).
Values are converted to plain Python floats on the host once per step, never inside the jitted
update.
"""
import dataclasses
import json
import math
import os
import pathlib
from typing import Any, Mapping

import numpy as np


def encodable_text(text: str) -> str:
    """`text` with every character UTF-8 cannot encode (a lone surrogate: what a JSON `\\udcff` escape
    or bytes decoded with `surrogateescape` leave in a str) replaced by its escape as visible text,
    the six characters `\\udcff`. Any other text is returned as it is. Without this, one such
    character in an agent's output makes the whole result file unwritable (UnicodeEncodeError) after
    every episode ran; as text, the file stays valid UTF-8 that any JSON reader loads."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def encodable(value: Any) -> Any:
    """`value` with `encodable_text` applied to every string in it, keys included (dicts, lists and
    tuples are walked; anything else is returned as it is)."""
    if isinstance(value, str):
        return encodable_text(value)
    if isinstance(value, Mapping):
        return {encodable(k): encodable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [encodable(v) for v in value]
    return value


def to_python(value: Any) -> Any:
    """Converts JAX/NumPy scalars to JSON-friendly Python values (NaN and inf become None; strings
    are made encodable, `encodable_text`)."""
    if isinstance(value, str):
        return encodable_text(value)
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, Mapping):
        return {encodable_text(str(k)): to_python(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_python(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_python(dataclasses.asdict(value))
    array = np.asarray(value)
    if array.dtype == object and array.ndim == 0:
        return encodable_text(str(value))
    if array.ndim == 0:
        scalar = array.item()
        if isinstance(scalar, float) and not math.isfinite(scalar):
            return None
        return scalar
    return [to_python(v) for v in array.tolist()]


def truncate_strings(value: Any, max_chars: int) -> Any:
    """`value` (JSON-ready: dicts, lists, strings, numbers) with every string longer than `max_chars`
    cut to its first `max_chars` characters and a marker, `…[truncated N chars]`, naming how many were
    cut. `max_chars` <= 0 keeps everything."""
    if max_chars <= 0:
        return value
    if isinstance(value, str):
        if len(value) <= max_chars:
            return value
        return value[:max_chars] + f"…[truncated {len(value) - max_chars} chars]"
    if isinstance(value, Mapping):
        return {k: truncate_strings(v, max_chars) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [truncate_strings(v, max_chars) for v in value]
    return value


def _parse_rows(lines):
    for line in lines:
        try:
            yield line, json.loads(line)
        except json.JSONDecodeError:
            continue  # a line torn by a killed process


def truncate_jsonl_after(path: str, step: int) -> None:
    """Keeps the rows of a JSON-lines file whose `step` is at most `step` (and drops torn lines)."""
    if not os.path.exists(path):
        return
    with open(path) as f:
        kept = [line if line.endswith("\n") else line + "\n"
                for line, row in _parse_rows(f) if row.get("step", 0) <= step]
    with open(path, "w") as f:
        f.writelines(kept)


def read_metrics(workdir: str) -> list[dict]:
    path = os.path.join(workdir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [row for _, row in _parse_rows(f)]


def write_episodes(workdir: str, step: int, records: list[dict]) -> str:
    """Writes one step's episode records as JSON lines under `episodes/` for later analysis."""
    directory = os.path.join(workdir, "episodes")
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"step_{step:06d}.jsonl")
    with open(path, "w") as f:
        for record in records:
            f.write(json.dumps(to_python(record), sort_keys=True) + "\n")
    return path


def write_json(path, data, indent: int | None = 1) -> pathlib.Path:
    """Writes `data` as UTF-8 JSON atomically (a temporary file renamed into place), making the parent
    folder; values JSON cannot hold are written as text, and every string is made encodable
    (`encodable`; the file's `backslashreplace` catches what `default=str` makes). Returns the path."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    text = json.dumps(encodable(data), ensure_ascii=False, indent=indent, default=str) + "\n"
    tmp.write_text(text, encoding="utf-8", errors="backslashreplace")
    tmp.replace(path)
    return path


def append_jsonl(path: str, rows) -> None:
    """Appends rows (dicts) as JSON lines; nothing is written for no rows."""
    rows = list(rows)
    if not rows:
        return
    with open(path, "a") as f:
        for row in rows:
            f.write(json.dumps(to_python(row), sort_keys=True) + "\n")
