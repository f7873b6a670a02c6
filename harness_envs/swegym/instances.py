"""SWE-bench / SWE-Gym instances, read as they are published (one JSON object per line).

Fields (SWE-bench schema): `instance_id` (`owner__repo-PR`), `repo` (`owner/name`), `base_commit`,
`problem_statement`, `hints_text`, `created_at`, `version`, `patch` (gold, non-test files),
`test_patch`, `FAIL_TO_PASS`, `PASS_TO_PASS` (test ids; the Hugging Face exports store these two as
JSON strings, other dumps as lists: both are read). Other fields (`environment_setup_commit`, an
image name, the offline builder's provenance) are kept in `extra`, untouched.

An `Instance` is also a task of the benchmark interface: `task_id` is the instance id, `type` the
repository's short name (the unit of per-type scores and of the train/test split), `question` the
problem statement.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Iterable

REQUIRED = ("instance_id", "repo", "base_commit", "problem_statement", "patch", "test_patch",
            "FAIL_TO_PASS", "PASS_TO_PASS")
OPTIONAL = ("hints_text", "created_at", "version")


class InstanceError(ValueError):
    """An instance file or line that does not follow the SWE-bench schema."""


@dataclasses.dataclass(frozen=True)
class Instance:
    instance_id: str
    repo: str
    base_commit: str
    problem_statement: str
    patch: str
    test_patch: str
    FAIL_TO_PASS: tuple[str, ...]
    PASS_TO_PASS: tuple[str, ...]
    hints_text: str = ""
    created_at: str = ""
    version: str = ""
    extra: dict = dataclasses.field(default_factory=dict, hash=False, compare=False)

    # -------------------------------------------------------------- the benchmark's Task protocol
    @property
    def task_id(self) -> str:
        return self.instance_id

    @property
    def type(self) -> str:
        return self.repo.split("/")[-1]

    @property
    def question(self) -> str:
        return self.problem_statement

    # -------------------------------------------------------------- (de)serialisation
    def to_json(self) -> dict:
        """The SWE-bench record (test-id lists as lists), `extra` fields back at top level."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "extra"}
        out["FAIL_TO_PASS"], out["PASS_TO_PASS"] = list(self.FAIL_TO_PASS), list(self.PASS_TO_PASS)
        return {**self.extra, **out}

    @classmethod
    def from_json(cls, record: dict, where: str = "instance") -> "Instance":
        if not isinstance(record, dict):
            raise InstanceError(f"{where}: expected a JSON object, got {type(record).__name__}")
        missing = [k for k in REQUIRED if k not in record]
        if missing:
            raise InstanceError(f"{where}: missing SWE-bench fields {missing}")
        values = {}
        for key in REQUIRED + OPTIONAL:
            if key not in record:
                continue
            value = record[key]
            if key in ("FAIL_TO_PASS", "PASS_TO_PASS"):
                value = _test_ids(value, f"{where}: {key}")
            elif value is None:
                value = ""
            elif not isinstance(value, str):
                raise InstanceError(f"{where}: {key} must be a string, got {type(value).__name__}")
            values[key] = value
        if not values["instance_id"]:
            raise InstanceError(f"{where}: empty instance_id")
        extra = {k: v for k, v in record.items() if k not in REQUIRED + OPTIONAL}
        return cls(**values, extra=extra)


def _test_ids(value, where: str) -> tuple[str, ...]:
    if isinstance(value, str):  # the Hugging Face exports: a JSON list inside a string
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise InstanceError(f"{where}: a string that is not a JSON list ({e})") from None
    if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
        raise InstanceError(f"{where}: must be a list of test-id strings")
    return tuple(value)


def load_jsonl(path: str | pathlib.Path) -> list[Instance]:
    """Every instance of a JSONL file, in file order; a bad line fails with its line number."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise InstanceError(f"{path}: no such instance file")
    out, seen = [], set()
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise InstanceError(f"{where}: not JSON ({e})") from None
            inst = Instance.from_json(record, where)
            if inst.instance_id in seen:
                raise InstanceError(f"{where}: instance_id {inst.instance_id!r} repeats")
            seen.add(inst.instance_id)
            out.append(inst)
    return out


def write_jsonl(instances: Iterable[Instance], path: str | pathlib.Path) -> None:
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for inst in instances:
            f.write(json.dumps(inst.to_json(), sort_keys=True) + "\n")
    tmp.replace(path)
