"""`EpisodeLog`: the finished episodes of an evaluation, appended batch by batch to a JSON-lines
file, so a crash or a stopped run loses at most the batch in flight and a rerun of the same
command skips what was finished.

The first line holds a fingerprint of the config that defines the jobs; each further line is
`{"job": index, "record": {...}}`, the index into the run's deterministic job list. A rerun with a
different fingerprint is refused (mixing two configs' episodes would corrupt the result); a last
line torn by a kill is dropped. The owner deletes the log once its final result is written, so a
later run with the same config (e.g. the newest checkpoint of a workdir) starts afresh.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
from typing import Iterable, Mapping

from hsjax.infra.errors import UserError
from hsjax.infra.metrics import to_python

log = logging.getLogger(__name__)


def fingerprint(config: Mapping, ignore: Iterable[str] = ()) -> str:
    """A short hash of `config` (a nested dict) without the dotted keys in `ignore`."""
    data = json.loads(json.dumps(config, sort_keys=True, default=str))
    for dotted in ignore:
        *parents, leaf = dotted.split(".")
        node = data
        for p in parents:
            node = node.get(p, {}) if isinstance(node, dict) else {}
        if isinstance(node, dict):
            node.pop(leaf, None)
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


class EpisodeLog:
    """Append-only log of finished episodes at `path` for the config with `fingerprint`."""

    def __init__(self, path, fingerprint_: str):
        self.path = os.fspath(path)
        self.fingerprint = fingerprint_

    def load(self) -> dict[int, dict]:
        """{job index: record} of the episodes a previous run finished; {} without a log. A log
        written for another config is a `UserError`."""
        if not os.path.exists(self.path):
            return {}
        with open(self.path) as f:
            lines = f.read().splitlines()
        rows = []
        for i, line in enumerate(lines):
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                if i != len(lines) - 1:
                    raise UserError(f"{self.path}: line {i + 1} is not JSON; delete the file to start the "
                                    "evaluation afresh") from None
                log.warning("%s: dropping a torn last line (the previous run was killed mid-write)", self.path)
        if not rows or rows[0].get("fingerprint") != self.fingerprint:
            raise UserError(f"{self.path} holds episodes of a run with another config (fingerprint "
                            f"{rows[0].get('fingerprint') if rows else None}, now {self.fingerprint}); "
                            "delete it, or use another --workdir or config.name")
        return {int(row["job"]): row["record"] for row in rows[1:]}

    def start(self, done: Mapping[int, dict]) -> None:
        """Rewrites the log with its header and the `done` episodes (this also drops a torn line)."""
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            f.write(json.dumps({"fingerprint": self.fingerprint}) + "\n")
            for job, record in sorted(done.items()):
                f.write(json.dumps({"job": job, "record": to_python(record)}, default=str) + "\n")
        os.replace(tmp, self.path)

    def append(self, records: Mapping[int, dict]) -> None:
        """Appends finished episodes {job index: record} and flushes them to the file."""
        with open(self.path, "a") as f:
            for job, record in records.items():
                f.write(json.dumps({"job": job, "record": to_python(record)}, default=str) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def remove(self) -> None:
        if os.path.exists(self.path):
            os.remove(self.path)
