"""DBBench as a benchmark: everything the training loop and Harness-S know of it, declared here.

Knobs: the generic ones (`harness_envs.harness.GENERIC_KNOBS`; DBBench names its instruction
variants) plus three of its own: result paging, the schema reminder after a failed statement, and
answer normalization. Failure taxonomy: `taxonomy.FAILURE_MODES` (ordered rules in taxonomy.py).
Repair directions: `DIRECTIONS`, one per failure mode a harness can act on. docs/dbbench.md
documents the protocol, the knobs and the taxonomy; docs/harness_s.md the directions.
"""
from __future__ import annotations

import pathlib
from typing import Iterable, Mapping

from harness_envs.benchmark import Benchmark
from harness_envs.dbbench import agents, data, evaluator, taxonomy
from harness_envs.dbbench import harness as dbbench_harness
from harness_envs.dbbench.answers import NORMALIZATIONS
from harness_envs.dbbench.backend_kinds import make_backend
from harness_envs.dbbench.env import DBBenchEpisode
from harness_envs.harness import Direction, HarnessSpec, Knob, KnobSchema

POOLS_DIR = pathlib.Path(__file__).resolve().parents[1] / "pools"

KNOBS = KnobSchema("dbbench", {
    "instruction": Knob(str, "agentbench", "instruction variant shown as the first user message",
                        choices=("agentbench", "schema_first", "concise")),
    "obs_page_rows": Knob(int, 0, "0: off; else at most this many result rows per observation, the "
                                  "same query again shows the next page", min=0, max=1000),
    "schema_reminder_on_error": Knob(bool, False, "append the table schema to the observation of a failed "
                                                  "statement"),
    "answer_normalization": Knob(str, "none", "applied to the final answer before scoring",
                                 choices=NORMALIZATIONS),
})

DIRECTIONS: tuple[Direction, ...] = (
    Direction("parse_leniency", "malformed_action", ("parse_mode", "on_malformed", "max_format_retries", "instruction"),
              "accept or give feedback on format slips"),
    Direction("schema_grounding", "sql_error_loop", ("schema_reminder_on_error", "instruction"),
              "show the schema when statements fail"),
    Direction("answer_verification", "answered_without_querying", ("verify_before_answer", "instruction"),
              "question answers given before any successful statement"),
    Direction("answer_normalization", "answer_format", ("answer_normalization",),
              "normalize the answer before scoring"),
    Direction("observation_paging", "truncated_observation", ("obs_page_rows", "obs_max_chars"),
              "show long results in pages or longer observations"),
    Direction("turn_budget", "turn_limit", ("max_rounds", "context", "context_last_n"),
              "more statements, or a shorter context per turn"),
    Direction("context_budget", "context_overflow", ("context", "context_last_n", "obs_max_chars"),
              "keep the context inside the token budget"),
    Direction("answer_checking", "wrong_answer",
              ("answer_normalization", "obs_page_rows", "obs_max_chars", "verify_before_answer", "instruction"),
              "read results in full, check and normalize answers"),
    Direction("modification_grounding", "no_modification", ("instruction", "verify_before_answer"),
              "get the modification statement run"),
    Direction("modification_checking", "wrong_modification",
              ("instruction", "schema_reminder_on_error", "obs_max_chars"),
              "ground the modification in the table's schema and values"),
)


class DBBench(Benchmark):
    """AgentBench's database task. `backend`: `{"kind": "sqlite" | "mariadb", "url", "time_budget_s",
    "max_db_mb"}` (the MariaDB server starts on first use; past `max_db_mb` an episode ends with
    failure mode `db_size_limit`); `rule`: the scoring rule, `v0.2` (published) or `lenient`."""

    name = "dbbench"
    description = ("a SQL benchmark: the agent answers a question about a MySQL table, or changes the table "
                   "as asked, running one SQL statement per turn")
    knobs = KNOBS
    failure_modes = taxonomy.FAILURE_MODES
    directions = DIRECTIONS
    splits = data.SPLITS
    headline = "overall_cat_accuracy"
    agent_kinds = ("oracle", "scripted")
    oracle_agent, slipping_agent = agents.OracleAgent, agents.NoisyAgent
    default_pool = POOLS_DIR / "dbbench_siblings.json"

    def __init__(self, *, backend: Mapping | None = None, rule: str = "v0.2"):
        if rule not in evaluator.RULES:
            raise ValueError(f"dbbench rule={rule!r} is not one of {evaluator.RULES}")
        options = dict(backend or {"kind": "sqlite"})
        kind = options.pop("kind", "sqlite")
        self.backend_options = {k: v for k, v in options.items() if v not in ("", None)}
        self.backend_kind, self.rule = kind, rule

    @property
    def backend(self):
        """The database backend, started on first use (a MariaDB server is a process)."""
        return self._started("backend", lambda: make_backend(self.backend_kind, **self.backend_options))

    def load_split(self, name: str, *, seed: int = 0, limit: int = 0) -> list[data.DBTask]:
        if seed:
            raise ValueError(f"dbbench split {name!r} is fixed; it takes no task seed (got {seed})")
        tasks = data.load_split(name)
        return tasks[:limit] if limit else tasks

    def make_episode(self, task, spec: HarnessSpec, *, sample_index: int = 0) -> DBBenchEpisode:
        return DBBenchEpisode(task, spec, self.backend, sample_index=sample_index, rule=self.rule)

    def initial_messages(self, task, spec: HarnessSpec) -> list[dict]:
        return dbbench_harness.initial_messages(spec, task.question, task.add_description)

    def summarize(self, results: Iterable[dict]) -> dict:
        return evaluator.summarize(results)

    def format_table(self, summaries: dict[str, dict]) -> str:
        return evaluator.format_table(summaries)

    def __repr__(self):
        return f"{type(self).__name__}(backend={self.backend_kind!r}, rule={self.rule!r})"
