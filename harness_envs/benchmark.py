"""The benchmark interface: everything Harness-S, evaluation and training know of a benchmark.

Each benchmark declares in one place, `harness_envs/<name>/benchmark.py`, a subclass of `Benchmark`:

    name, description   identity; `description` is the line an LLM proposer reads ("a SQL benchmark: ...")
    knobs               its `KnobSchema`: the generic knobs plus its own
    failure_modes       its failure taxonomy, "success" first; every episode result has one
    directions          repair directions: failure mode -> the knob subspace that could repair it
    splits, load_split  the task loader (tasks carry `task_id`, `type` and `question`)
    make_episode        an `Episode` of a task under a `HarnessSpec`
    initial_messages    the context an episode opens with (a rescue is re-rendered in the base with it)
    summarize           the scorer's summary of episode results; `headline` names its main number
    slice_metrics       optional scalars of an evaluation beyond the summary (a slice of the tasks)
    format_table        the table `run.py` prints for {column: summary}
    agent_kinds, make_agent   scripted agents (chat policies) that play the benchmark: `oracle_agent`
                        and `slipping_agent` give the `oracle` and `scripted` kinds
    default_pool        the pool file shipped with it

A benchmark instance holds its resources (database servers, worker processes), each started on
first use (`_started`); `close()` releases them, and it is a context manager. `docs/architecture.md` walks through adding one.
"""
from __future__ import annotations

import abc
import pathlib
from typing import Any, Callable, Iterable, Mapping, Sequence

from harness_envs.base import Episode, Message, Task
from harness_envs.harness import Direction, HarnessSpec, KnobSchema, Pool, load_pool

SUCCESS = "success"


def percent_table(summaries: dict[str, dict], rows: Sequence[tuple[str, str]], rule_before: Iterable[str] = ()) -> str:
    """The printable table of a benchmark's `format_table`: one column per summary, one row per
    (label, summary key), values in % ("-" where a summary lacks the key), a rule above each row
    whose key is in `rule_before`."""
    names, rule_before = list(summaries), set(rule_before)
    label_w = max(len(label) for label, _ in rows) + 2
    col_w = max(8, *(len(n) + 2 for n in names))
    lines = ["".ljust(label_w) + "".join(n.rjust(col_w) for n in names)]
    for label, key in rows:
        if key in rule_before:
            lines.append("-" * (label_w + col_w * len(names)))
        cells = [("-" if summaries[n].get(key) is None else f"{100 * summaries[n][key]:.1f}").rjust(col_w)
                 for n in names]
        lines.append(label.ljust(label_w) + "".join(cells))
    return "\n".join(lines)


class Benchmark(abc.ABC):
    """One benchmark's tasks, harness knobs, taxonomy, repair directions, scorer and agents."""

    name: str
    description: str
    knobs: KnobSchema
    failure_modes: tuple[str, ...]
    directions: tuple[Direction, ...]
    splits: tuple[str, ...]
    headline: str
    agent_kinds: tuple[str, ...] = ()
    oracle_agent: type | None = None  # replays the gold; `make_agent("oracle")`
    slipping_agent: type | None = None  # the oracle with slips (`noise`, `seed`); `make_agent("scripted")`
    default_pool: pathlib.Path | None = None

    # ------------------------------------------------------------------ tasks and episodes

    @abc.abstractmethod
    def load_split(self, name: str, *, seed: int = 0) -> list[Task]:
        """The tasks of split `name`. `seed` picks which tasks where a split is generated."""

    @abc.abstractmethod
    def make_episode(self, task: Task, spec: HarnessSpec, *, sample_index: int = 0) -> Episode:
        """A fresh episode of `task` under `spec`; `sample_index` tells rollouts of a task apart."""

    @abc.abstractmethod
    def initial_messages(self, task: Task, spec: HarnessSpec) -> list[Message]:
        """The messages an episode of `task` under `spec` opens with (instruction and task)."""

    # ------------------------------------------------------------------ scoring

    @abc.abstractmethod
    def summarize(self, results: Iterable[dict]) -> dict:
        """The scorer's summary of episode results (each with `type` and `success`); holds `headline`."""

    def slice_metrics(self, records: Sequence[dict]) -> dict[str, float]:
        """Extra scalars of an evaluation's episode records (`hsjax.rollout.runner.episode_record`),
        such as success on a slice of the tasks; the training loop logs them as
        `eval/<split>/<harness>/<name>`. None by default."""
        return {}

    @abc.abstractmethod
    def format_table(self, summaries: dict[str, dict]) -> str:
        """A printable table of {column name: summary} (columns: harnesses, or arms)."""

    # ------------------------------------------------------------------ agents

    def make_agent(self, kind: str, *, seed: int = 0, noise: Mapping[str, float] | None = None, **options) -> Any:
        """A scripted agent (a chat policy) of one of `agent_kinds`: `oracle` replays the gold;
        `scripted` slips with the probabilities `noise` ({slip: p}; slips at 0 are left out)."""
        if kind == "oracle" and self.oracle_agent is not None:
            return self.oracle_agent(**options)
        if kind == "scripted" and self.slipping_agent is not None:
            active = {k: float(v) for k, v in (noise or {}).items() if float(v) > 0}
            return self.slipping_agent(active, seed=seed, **options)
        raise ValueError(f"{self.name} has no scripted agent {kind!r}; kinds: {list(self.agent_kinds)}")

    # ------------------------------------------------------------------ harnesses

    def load_pool(self, path: str | pathlib.Path | None = None) -> Pool:
        """The pool file at `path` (default: the benchmark's own), read against `knobs`."""
        path = path or self.default_pool
        if path is None:
            raise ValueError(f"{self.name} ships no pool; name a pool file")
        return load_pool(path, self.knobs)

    def direction(self, *, name: str | None = None, failure_mode: str | None = None) -> Direction | None:
        """The direction with that name, or the one repairing that failure mode; None if none does."""
        for d in self.directions:
            if (name is not None and d.name == name) or (failure_mode is not None and d.failure_mode == failure_mode):
                return d
        return None

    def target_modes(self, specs: Sequence[HarnessSpec]) -> dict[str, str | None]:
        """The failure mode each spec was evolved for, read from its direction."""
        out = {}
        for spec in specs:
            d = self.direction(name=spec.direction) if spec.direction else None
            out[spec.name] = d.failure_mode if d else None
        return out

    def check(self) -> None:
        """Raises if the declarations disagree: directions naming unknown modes or knobs."""
        if not self.failure_modes or self.failure_modes[0] != SUCCESS:
            raise ValueError(f"{self.name}: failure_modes must start with {SUCCESS!r}")
        for d in self.directions:
            if d.failure_mode not in self.failure_modes:
                raise ValueError(f"{self.name}: direction {d.name!r} targets unknown failure mode {d.failure_mode!r}")
            unknown = [k for k in d.knobs if k not in self.knobs]
            if unknown:
                raise ValueError(f"{self.name}: direction {d.name!r} names unknown knobs {unknown}")
        names = [d.name for d in self.directions]
        if len(set(names)) != len(names):
            raise ValueError(f"{self.name}: direction names repeat: {names}")

    # ------------------------------------------------------------------ resources

    def _started(self, name: str, start: Callable[[], Any]) -> Any:
        """The resource `name` (a database server, a worker), made by `start()` on first use and
        released by `close()`."""
        resources = self.__dict__.setdefault("_resources", {})
        if name not in resources:
            resources[name] = start()
        return resources[name]

    def close(self) -> None:
        """Releases what the benchmark holds (database servers, workers), the latest started first."""
        resources = self.__dict__.pop("_resources", {})
        for resource in reversed(resources.values()):
            resource.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"{type(self).__name__}()"
