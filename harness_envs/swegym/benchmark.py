"""SWE-Gym as a benchmark: everything the training loop and Harness-S know of it, declared here.

Two backends behind one episode and harness (docs/swegym.md):
- `offline` (default): instances the offline builder made from small pure-Python packages
  (`scripts/setup_swegym.sh` writes `.cache/swegym/{repos,venvs,instances/offline.jsonl}`), run by
  the docker-free `LocalRuntime`; splits `train` and `test`, by repository (`extra["split"]`).
- `swegym`: a SWE-bench / SWE-Gym JSONL (`instances`), usually with the per-instance images through
  `runtime=container`; every instance is `train` unless `split_file` (JSON `{split: [instance ids]}`)
  says otherwise.

Knobs: the generic ones (SWE-Gym names its instruction variants; `max_rounds` gives way to
`max_iterations`, counted per reply as OpenHands counts them; a malformed call gets format feedback
by default, as OpenHands answers a reply without a call) plus its own: the compile check on edit, the
windowed viewer, the str_replace hint, reproduce-first, test-after-edit and the command timeout.
Failure taxonomy: `taxonomy.FAILURE_MODES`; repair directions: `DIRECTIONS`.
"""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from typing import Iterable, Mapping, Sequence

from harness_envs.benchmark import Benchmark
from harness_envs.harness import GENERIC_KNOBS, Direction, HarnessSpec, Knob, KnobSchema
from harness_envs.swegym import agents, evaluator, scoring, taxonomy
from harness_envs.swegym import harness as swegym_harness
from harness_envs.swegym.container_runtime import ContainerRuntime
from harness_envs.swegym.env import SWEGymEpisode
from harness_envs.swegym.instances import Instance, load_jsonl
from harness_envs.swegym.local_runtime import DEFAULT_LIMITS, LocalRuntime

POOLS_DIR = pathlib.Path(__file__).resolve().parents[1] / "pools"
REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
DEFAULT_CACHE = REPO_ROOT / ".cache" / "swegym"
CACHE_ENV = "HSJAX_SWEGYM_CACHE"  # the builder's cache root too
OFFLINE_INSTANCES = "instances/offline.jsonl"
BACKENDS = ("offline", "swegym")
RUNTIMES = ("local", "container")
OFFLINE_SPLITS = ("train", "test")
SETUP = "scripts/setup_swegym.sh"

KNOBS = KnobSchema("swegym", {
    "instruction": Knob(str, "codeact", "instruction variant: the CodeAct function descriptions and SWE-Gym's task "
                                        "message, or a short one", choices=swegym_harness.INSTRUCTIONS),
    "on_malformed": Knob(str, "retry", "on a reply without a well-formed call: send format feedback (as OpenHands "
                                       "does), or end the episode", choices=("fail", "retry")),
    "max_format_retries": Knob(int, 3, "format feedback messages per episode before a malformed reply ends it",
                               min=0, max=10, enabled_by=("on_malformed", ("retry",))),
    "obs_max_chars": Knob(int, 16_000, "observation length before it is cut and '[TRUNCATED]' appended "
                                       "(OpenHands clips the editor's output at 16,000)", min=500, max=100_000),
    "max_iterations": Knob(int, 30, "replies before the episode ends on the iteration limit (SWE-Gym: 30 lite, "
                                    "50 full)", min=1, max=200),
    "command_timeout_s": Knob(int, 120, "seconds an execute_bash command may run when the call gives no timeout",
                              min=5, max=1800),
    "view_window": Knob(int, 0, "0: a view shows the lines asked for (the whole file without view_range); N: "
                                "every file view shows N lines, a narrower view_range widened around its middle",
                        min=0, max=2000),
    "str_replace_hint": Knob(bool, False, "after a failed str_replace, show the file's lines closest to old_str and "
                                          "how to fix the call"),
    "lint_on_edit": Knob(str, "off", "compile-check an edited .py file: report a new SyntaxError after the edit, or "
                                     "refuse the edit", choices=("off", "report", "refuse")),
    "reproduce_first": Knob(bool, False, "the task asks to reproduce the issue first, and an edit of an existing file "
                                         "before any command that ran Python is refused"),
    "test_after_edit": Knob(bool, False, "after each edit, rerun the latest command that ran Python (the "
                                         "reproduction; a failing one first) and append its result"),
}, generic={k: v for k, v in GENERIC_KNOBS.items() if k != "max_rounds"})

DIRECTIONS: tuple[Direction, ...] = (
    Direction("parse_leniency", "malformed_tool_call", ("parse_mode", "on_malformed", "max_format_retries",
                                                        "instruction"),
              "accept common call-format slips, or give more format feedback"),
    Direction("edit_grounding", "edit_failed", ("str_replace_hint", "view_window"),
              "show the file's real lines after a str_replace that matched nothing or several places"),
    Direction("edit_linting", "syntax_error", ("lint_on_edit",),
              "report or refuse an edit that breaks a Python file's syntax"),
    Direction("file_navigation", "no_edit", ("view_window", "obs_max_chars", "verify_before_answer"),
              "show more of a file per view; question a finish that changed nothing"),
    Direction("reproduction", "blind_edit", ("reproduce_first", "instruction"),
              "require reproducing the issue before editing"),
    Direction("fix_checking", "f2p_failing", ("test_after_edit", "reproduce_first"),
              "rerun the reproduction after each edit"),
    Direction("regression_check", "p2p_broken", ("test_after_edit",),
              "rerun the reproduction after each edit, so a broken test shows"),
    Direction("iteration_budget", "iteration_limit", ("max_iterations", "context", "context_last_n"),
              "more iterations, or a shorter context per iteration"),
    Direction("context_budget", "context_overflow", ("context", "context_last_n", "obs_max_chars", "view_window"),
              "keep the context inside the token budget: condense older observations, shorter outputs"),
)


@dataclasses.dataclass(frozen=True)
class Backend:
    """The options of `config.benchmark.backend` (docs/swegym.md)."""

    kind: str = "offline"
    instances: str = ""  # JSONL; offline default: <cache_dir>/instances/offline.jsonl
    cache_dir: str = ""  # default $HSJAX_SWEGYM_CACHE, else .cache/swegym
    split_file: str = ""  # swegym: JSON {split: [instance ids]}
    runtime: str = "local"
    repos_dir: str = ""  # local: default <cache_dir>/repos
    venvs_dir: str = ""  # local: default <cache_dir>/venvs
    isolation: str = "auto"
    cpu_s: int = 600
    memory_mb: int = 8192
    container_cli: str = "docker"
    test_timeout_s: float = 1800.0


class SWEGym(Benchmark):
    """`backend`: `{"kind": "offline" | "swegym", "instances", "cache_dir", "split_file", "runtime":
    "local" | "container", "repos_dir", "venvs_dir", "isolation", "cpu_s", "memory_mb",
    "container_cli", "test_timeout_s"}` (empty values take the defaults of `Backend`). Nothing is
    read from disk until a split is loaded or an episode starts."""

    name = "swegym"
    description = ("a software-engineering benchmark: the agent fixes an issue in a Python repository by running "
                   "bash commands and editing files with a str_replace editor; the fix is scored by the repository's "
                   "tests")
    knobs = KNOBS
    failure_modes = taxonomy.FAILURE_MODES
    directions = DIRECTIONS
    headline = "resolved"
    agent_kinds = ("oracle", "scripted")
    # The oracle applies the gold patch and the slipping agent (`agents.SLIPS`) works from it too:
    # every SWE-bench JSONL carries it.
    oracle_agent, slipping_agent = agents.OracleAgent, agents.SlippingAgent
    default_pool = POOLS_DIR / "swegym_siblings.json"

    def __init__(self, *, backend: Mapping | None = None):
        options = {k: v for k, v in dict(backend or {}).items() if v not in ("", None)}
        known = {f.name for f in dataclasses.fields(Backend)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ValueError(f"unknown swegym backend option(s) {unknown}; known: {sorted(known)}")
        self.backend = Backend(**options)
        if self.backend.kind not in BACKENDS:
            raise ValueError(f"swegym backend kind {self.backend.kind!r} is not one of {BACKENDS}")
        if self.backend.runtime not in RUNTIMES:
            raise ValueError(f"swegym runtime {self.backend.runtime!r} is not one of {RUNTIMES}")
        if self.backend.kind == "offline" and self.backend.runtime != "local":
            raise ValueError("the offline SWE-Gym instances have no container images; use runtime=local")
        if self.backend.kind == "swegym" and not self.backend.instances:
            raise ValueError("swegym backend kind 'swegym' needs backend.instances=<a SWE-bench/SWE-Gym JSONL>")
        self.cache_dir = pathlib.Path(self.backend.cache_dir or os.environ.get(CACHE_ENV) or DEFAULT_CACHE)
        self._instances: list[Instance] | None = None

    # ------------------------------------------------------------------ tasks

    @property
    def instances_path(self) -> pathlib.Path:
        return pathlib.Path(self.backend.instances) if self.backend.instances else self.cache_dir / OFFLINE_INSTANCES

    @property
    def splits(self) -> tuple[str, ...]:
        if self.backend.kind == "offline":
            return OFFLINE_SPLITS
        return tuple(self._split_ids()) if self.backend.split_file else ("train",)

    def _split_ids(self) -> dict[str, list[str]]:
        path = pathlib.Path(self.backend.split_file)
        if not path.is_file():
            raise FileNotFoundError(f"swegym split_file {path} does not exist; it is a JSON object "
                                    '{"train": [instance ids], "test": [...]}')
        data = json.loads(path.read_text())
        if not isinstance(data, dict) or not all(isinstance(v, list) for v in data.values()):
            raise ValueError(f"{path}: a split file is a JSON object of lists of instance ids")
        return data

    def instances(self) -> list[Instance]:
        if self._instances is None:
            path = self.instances_path
            if not path.is_file():
                if self.backend.kind == "offline":
                    raise FileNotFoundError(f"no offline SWE-Gym instances at {path}: build the offline cache with "
                                            f"{SETUP} (or set benchmark.backend.cache_dir)")
                raise FileNotFoundError(f"no SWE-Gym instance file at {path} (benchmark.backend.instances)")
            self._instances = load_jsonl(path)
        return self._instances

    def load_split(self, name: str, *, seed: int = 0, limit: int = 0) -> list[Instance]:
        if seed:
            raise ValueError(f"swegym split {name!r} is fixed; it takes no task seed (got {seed})")
        if name not in self.splits:
            raise ValueError(f"swegym ({self.backend.kind}) has no split {name!r}; splits: {list(self.splits)}")
        everything = self.instances()
        if self.backend.kind == "offline":
            chosen = [i for i in everything if i.extra.get("split") == name]
        elif self.backend.split_file:
            wanted = set(self._split_ids()[name])
            chosen = [i for i in everything if i.instance_id in wanted]
        else:
            chosen = list(everything)
        return chosen[:limit] if limit else chosen

    # ------------------------------------------------------------------ episodes

    @property
    def runtime(self):
        """The runtime, made on first use."""
        return self._started("runtime", self._make_runtime)

    def _make_runtime(self):
        b = self.backend
        if b.runtime != "local":
            return ContainerRuntime(cli=b.container_cli)
        limits = dataclasses.replace(DEFAULT_LIMITS, cpu_s=int(b.cpu_s), memory_mb=int(b.memory_mb))
        repos = b.repos_dir or self.cache_dir / "repos"
        if not pathlib.Path(repos).is_dir():
            raise FileNotFoundError(f"no SWE-Gym repositories at {repos}: build the offline cache with "
                                    f"{SETUP} (or set benchmark.backend.repos_dir)")
        # The whole cache (sdists hold the pristine source, instance files the gold patches)
        # and the instance file's directory are hidden from agent commands, wherever they are.
        hide = tuple(str(p) for p in (self.cache_dir, self.instances_path.parent) if p.is_dir())
        return LocalRuntime(repos, b.venvs_dir or self.cache_dir / "venvs", limits, isolation_mode=b.isolation,
                            hide=hide)

    def open_workspace(self, instance: Instance):
        return self.runtime.workspace(instance)

    def score(self, instance: Instance, patch: str) -> scoring.Report:
        """The scorer's report of `patch`. An empty patch is not run: the instance's FAIL_TO_PASS tests
        fail at the base commit (the builder validates it, as SWE-Gym's curation did), so it cannot
        resolve, and running the whole test files costs seconds an untrained policy spends on every
        episode."""
        if not patch.strip():
            p2p = len(instance.PASS_TO_PASS)
            return scoring.Report(instance_id=instance.instance_id, applied=False, apply_method=None, f2p_passed=0,
                                  f2p_total=len(instance.FAIL_TO_PASS), p2p_passed=p2p, p2p_total=p2p, resolved=False,
                                  failure="empty_patch", seconds=0.0, log_tail="not run: the patch is empty")
        return scoring.evaluate(instance, patch, self.runtime, float(self.backend.test_timeout_s))

    def make_episode(self, task: Instance, spec: HarnessSpec, *, sample_index: int = 0) -> SWEGymEpisode:
        return SWEGymEpisode(task, spec, self.open_workspace, self.score, sample_index=sample_index)

    def agent_root(self, task: Instance) -> str:
        """The repository's path as the opening context names it outside an episode (a re-rendered
        prefix): the container's `/testbed`, or for the local runtime, whose work trees live in
        fresh temp directories, the stand-in `/workspace/<repo name>`."""
        return "/testbed" if self.backend.runtime == "container" else f"/workspace/{task.type}"

    def initial_messages(self, task: Instance, spec: HarnessSpec) -> list[dict]:
        return swegym_harness.initial_messages(spec, self.agent_root(task), task.problem_statement)

    # ------------------------------------------------------------------ scoring and agents

    def summarize(self, results: Iterable[dict]) -> dict:
        return evaluator.summarize(results)

    def slice_metrics(self, records: Sequence[dict]) -> dict[str, float]:
        return evaluator.slice_metrics(records)

    def format_table(self, summaries: dict[str, dict]) -> str:
        return evaluator.format_table(summaries)

    def __repr__(self):
        return f"{type(self).__name__}(backend={self.backend.kind!r}, runtime={self.backend.runtime!r})"
