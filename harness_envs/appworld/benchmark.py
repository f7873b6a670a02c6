"""AppWorld as a benchmark: everything the training loop and Harness-S know of it, declared here.

Two backends behind one episode and harness (docs/appworld.md):
- `offline` (default): the world shipped with the project (`world.py`, `apps.py`, `tasks.py`), the
  agent's code in a sandbox per episode (`harness_envs.sandbox`); splits train/dev/test.
- `appworld`: the real AppWorld, through a worker process run by the python of its own venv
  (`scripts/setup_appworld.sh`), with the user's data directory (`root`); splits are AppWorld's
  (train, dev, test_normal, test_challenge).

Knobs: the generic ones (AppWorld names its instruction variants and raises the observation limit,
as the published protocol does not cut outputs) plus its own: the few-shot demonstration, API lists
and docs after API errors, a credentials reminder, a traceback summary and a review of changes
before completion. Failure taxonomy: `taxonomy.FAILURE_MODES`; repair directions: `DIRECTIONS`.
"""
from __future__ import annotations

import pathlib
from typing import Iterable, Mapping

from harness_envs.appworld import agents, evaluator, real, taxonomy
from harness_envs.appworld import harness as appworld_harness
from harness_envs.appworld import tasks as tasks_lib
from harness_envs.appworld.env import AppWorldEpisode
from harness_envs.appworld.session import OfflineSession
from harness_envs.benchmark import Benchmark
from harness_envs.harness import Direction, HarnessSpec, Knob, KnobSchema
from harness_envs.sandbox import Limits

POOLS_DIR = pathlib.Path(__file__).resolve().parents[1] / "pools"
REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
BACKENDS = ("offline", "appworld")

KNOBS = KnobSchema("appworld", {
    "instruction": Knob(str, "appworld", "instruction variant shown as the system message",
                        choices=("appworld", "concise", "brief")),
    "obs_max_chars": Knob(int, 20_000, "observation length before it is cut and '[TRUNCATED]' appended",
                          min=50, max=100_000),
    "max_rounds": Knob(int, 20, "code cells executed before the episode ends on the step limit", min=1, max=100),
    "few_shot": Knob(bool, True, "include the worked demonstration of one task in the instruction"),
    "api_list_on_unknown": Knob(bool, False, "after a call to an API that does not exist, list the app's APIs"),
    "api_doc_on_bad_args": Knob(bool, False, "after a call with wrong arguments, show that API's documentation"),
    "credentials_reminder": Knob(bool, False, "after an auth failure, remind how passwords, login and tokens work"),
    "traceback_summary": Knob(bool, False, "show an error as one summary line and the failing line of code"),
    "review_changes": Knob(bool, False, "hold the first complete_task back and list the changes made to the apps' "
                                        "data, asking to undo what the task did not ask for"),
})

DIRECTIONS: tuple[Direction, ...] = (
    Direction("parse_leniency", "syntax_error", ("parse_mode", "on_malformed", "max_format_retries", "instruction"),
              "extract code from more reply formats"),
    Direction("credentials", "auth_failure", ("credentials_reminder", "instruction"),
              "remind how credentials and access tokens work after an auth failure"),
    Direction("api_discovery", "unknown_api", ("api_list_on_unknown", "few_shot", "instruction"),
              "show the app's real APIs after a call to one that does not exist"),
    Direction("argument_grounding", "wrong_arguments", ("api_doc_on_bad_args", "few_shot"),
              "show the API's documentation after wrong arguments"),
    Direction("error_clarity", "code_error", ("traceback_summary", "obs_max_chars"),
              "shorter, clearer error observations"),
    Direction("answer_verification", "wrong_answer", ("verify_before_answer",),
              "ask to check the answer before complete_task takes effect"),
    Direction("change_review", "collateral_change", ("review_changes",),
              "list the changes made before complete_task takes effect"),
    Direction("state_checking", "wrong_state", ("review_changes", "verify_before_answer", "instruction"),
              "ask to check the changes before complete_task takes effect"),
    Direction("turn_budget", "step_limit", ("max_rounds", "context", "context_last_n"),
              "more cells, or a shorter context per cell"),
    Direction("context_budget", "context_overflow", ("context", "context_last_n", "obs_max_chars"),
              "keep the context inside the token budget"),
)


class AppWorld(Benchmark):
    """`backend`: `{"kind": "offline" | "appworld", "isolation", "wall_s", "cpu_s", "memory_mb"}` and,
    for `appworld`, `python` (the AppWorld venv's interpreter; default `.venv-appworld/bin/python`)
    and `root` (the directory holding AppWorld's `data/`)."""

    name = "appworld"
    description = ("a code-agent benchmark: the agent does a user's task by writing Python cells that call apps' "
                   "APIs (contacts, notes, wallet, mail, ...) in a REPL, logging in and paging results as needed")
    knobs = KNOBS
    failure_modes = taxonomy.FAILURE_MODES
    directions = DIRECTIONS
    headline = "tgc"
    agent_kinds = ("oracle", "scripted")
    oracle_agent, slipping_agent = agents.OracleAgent, agents.SlippingAgent  # slips: `agents.SLIPS`
    default_pool = POOLS_DIR / "appworld_siblings.json"

    def __init__(self, *, backend: Mapping | None = None):
        options = {k: v for k, v in dict(backend or {}).items() if v not in ("", None)}
        self.backend_kind = options.pop("kind", "offline")
        if self.backend_kind not in BACKENDS:
            raise ValueError(f"appworld backend kind {self.backend_kind!r} is not one of {BACKENDS}")
        self.isolation = options.pop("isolation", "auto")
        self.limits = Limits(wall_s=float(options.pop("wall_s", 10.0)), cpu_s=int(options.pop("cpu_s", 60)),
                             memory_mb=int(options.pop("memory_mb", 1024)))
        self._real_options = {k: options.pop(k) for k in ("python", "root") if k in options}
        if options:
            raise ValueError(f"unknown appworld backend option(s) {sorted(options)}; known: kind, isolation, wall_s, "
                             "cpu_s, memory_mb, python, root")

    @property
    def splits(self) -> tuple[str, ...]:
        return tasks_lib.SPLITS if self.backend_kind == "offline" else real.SPLITS

    @property
    def real(self) -> real.RealAppWorld:
        """The worker in AppWorld's venv, started on first use."""
        return self._started("real", lambda: real.RealAppWorld(limits=self.limits, isolation=self.isolation,
                                                               **self._real_options))

    def load_split(self, name: str, *, seed: int = 0, limit: int = 0) -> list:
        if seed:
            raise ValueError(f"appworld split {name!r} is fixed; it takes no task seed (got {seed})")
        tasks = tasks_lib.load_split(name) if self.backend_kind == "offline" else self.real.load_split(name)
        return tasks[:limit] if limit else tasks

    def open_session(self, task):
        if self.backend_kind == "offline":
            return OfflineSession(task, self.limits, isolation=self.isolation, hide=(str(REPO_ROOT),))
        return self.real.open(task)

    def make_episode(self, task, spec: HarnessSpec, *, sample_index: int = 0) -> AppWorldEpisode:
        return AppWorldEpisode(task, spec, self.open_session, sample_index=sample_index)

    def initial_messages(self, task, spec: HarnessSpec) -> list[dict]:
        return appworld_harness.initial_messages(spec, task.supervisor, task.question)

    def summarize(self, results: Iterable[dict]) -> dict:
        return evaluator.summarize(results)

    def format_table(self, summaries: dict[str, dict]) -> str:
        return evaluator.format_table(summaries)

    def make_agent(self, kind: str, *, seed: int = 0, **options):
        """The scripted agents run the gold solution: the offline world's only."""
        if kind in ("oracle", "scripted") and self.backend_kind != "offline":
            raise ValueError(f"scripted AppWorld agents need the offline world's gold solutions; backend "
                             f"{self.backend_kind!r} has none to read. Use policy.kind=http or jax")
        return super().make_agent(kind, seed=seed, **options)

    def __repr__(self):
        return f"{type(self).__name__}(backend={self.backend_kind!r})"
