"""The learnable testbed as a benchmark: generated DBBench-protocol tasks (docs/testbed.md).

Everything but the tasks is DBBench's: episodes, knobs, taxonomy, directions, scorer and pool.
Splits are generated, so a task seed picks which tasks (`load_split(name, seed=s)`); the scripted
`expert` plays each task type in a style (`harness_envs.synth.expert.STYLES`).
"""
from __future__ import annotations

from typing import Mapping, Sequence

from harness_envs.dbbench.benchmark import DBBench
from harness_envs.synth import names, tasks
from harness_envs.synth.expert import ScriptedExpert


class Synth(DBBench):
    name = "synth"
    description = ("a SQL benchmark of generated tasks: the agent answers a question about a small SQLite "
                   "table, or changes the table as asked, running one SQL statement per turn")
    splits = tuple(tasks.SPLITS)
    agent_kinds = ("oracle", "scripted", "expert")

    def load_split(self, name: str, *, seed: int = 0, limit: int = 0) -> list[tasks.SynthTask]:
        return tasks.load_split(name, n=limit or None, seed=seed)

    def make_agent(self, kind: str, *, seed: int = 0, styles: Mapping[str, str] | None = None, **options):
        """`expert`: the scripted expert, `styles` {task type: style}; else DBBench's agents."""
        if kind == "expert":
            return ScriptedExpert(dict(styles or {}), **options)
        return super().make_agent(kind, seed=seed, **options)


class SynthNames(Synth):
    """The testbed's names regime (harness_envs/synth/names.py): every task draws its own table,
    column and value names, and half of the tasks hide the table name."""

    name = "synth_names"
    description = ("a SQL benchmark of generated tasks: the agent answers a question about a small SQLite "
                   "table whose name may not be given, running one SQL statement per turn")
    splits = tuple(names.NAMES_SPLITS)

    def load_split(self, name: str, *, seed: int = 0, limit: int = 0) -> list[tasks.SynthTask]:
        return names.load_split(name, n=limit or None, seed=seed)

    def slice_metrics(self, records: Sequence[dict]) -> dict[str, float]:
        """Success of the hidden-name and visible-name tasks, and how often an episode opens with
        SHOW TABLES (the behaviour the tables_first sibling induces)."""
        out = {}
        for kind, hidden in (("hidden", True), ("visible", False)):
            part = [r for r in records if names.is_hidden(names.task_index(r["task_id"])) == hidden]
            if part:
                out[f"{kind}/success"] = sum(bool(r["success"]) for r in part) / len(part)
                out[f"{kind}/opens_show_tables"] = sum(
                    names.opens_with_show_tables(r.get("replies") or [""]) for r in part) / len(part)
        return out
