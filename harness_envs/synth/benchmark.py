"""The learnable testbed as a benchmark: generated DBBench-protocol tasks (docs/testbed.md), and
the API regime's generated AppWorld-protocol tasks (`SynthApis`).

Everything but the tasks is DBBench's (AppWorld's for `SynthApis`): episodes, knobs, taxonomy,
directions, scorer and pool. Splits are generated, so a task seed picks which tasks
(`load_split(name, seed=s)`); the scripted `expert` plays each task type in a style
(`harness_envs.synth.expert.STYLES`, `harness_envs.synth.apis_expert.STYLES`).
"""
from __future__ import annotations

from typing import Mapping, Sequence

from harness_envs.appworld.benchmark import POOLS_DIR, REPO_ROOT, AppWorld
from harness_envs.dbbench.benchmark import DBBench
from harness_envs.synth import apis, names, tasks
from harness_envs.synth.apis_expert import ApisExpert
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


class SynthApis(AppWorld):
    """The testbed's API regime (harness_envs/synth/apis.py): AppWorld's protocol and offline world,
    each task with an app of its own; half of the tasks hide the name of the API to call."""

    name = "synth_apis"
    description = ("a code-agent benchmark of generated tasks: the agent writes Python cells that call the APIs "
                   "of a user's app to read one value, and the name of the API to call may not be given")
    splits = tuple(apis.SPLITS)
    agent_kinds = ("oracle", "scripted", "expert")
    default_pool = POOLS_DIR / "testbed_apis.json"

    def __init__(self, *, backend: Mapping | None = None):
        super().__init__(backend=backend)
        if self.backend_kind != "offline":
            raise ValueError(f"synth_apis runs in the offline world only; backend kind {self.backend_kind!r} "
                             "has no generated apps")

    def load_split(self, name: str, *, seed: int = 0, limit: int = 0) -> list[apis.ApisTask]:
        return apis.load_split(name, n=limit or None, seed=seed)

    def open_session(self, task):
        return apis.ApisSession(task, self.limits, isolation=self.isolation, hide=(str(REPO_ROOT),))

    def make_agent(self, kind: str, *, seed: int = 0, default_style: str = "protocol", **options):
        """`expert`: the scripted expert in one style (`apis_expert.STYLES`); else AppWorld's agents."""
        if kind == "expert":
            if options:
                raise ValueError(f"the synth_apis expert takes default_style only, got {sorted(options)}")
            return ApisExpert(default_style)
        return super().make_agent(kind, seed=seed, **options)

    def slice_metrics(self, records: Sequence[dict]) -> dict[str, float]:
        """Success of the hidden-name and named-API tasks, and how often an episode opens by looking
        an API up (the behaviour the docs_first sibling induces)."""
        out = {}
        for kind, hidden in (("hidden", True), ("visible", False)):
            part = [r for r in records if apis.is_hidden(names.task_index(r["task_id"])) == hidden]
            if part:
                out[f"{kind}/success"] = sum(bool(r["success"]) for r in part) / len(part)
                out[f"{kind}/opens_docs"] = sum(apis.opens_with_docs(r.get("replies") or [""]) for r in part) / len(part)
        return out
