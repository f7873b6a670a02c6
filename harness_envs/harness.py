"""Harness specs, their knob schemas, repair directions and pools, and the generic knob behaviour.

A `HarnessSpec` is plain data: a name, the harness it was derived from (`parent`), the repair
`direction` it stands for, and `knobs` (only the values that differ from the defaults). Specs
round-trip through JSON and can be validated, diffed and derived. Every spec is read against the
`KnobSchema` of its benchmark: the generic knobs below, which every benchmark shares, plus the
benchmark's own (`harness_envs/<benchmark>/benchmark.py`). A benchmark may redefine a generic
knob's default and allowed values (its instruction variants, say), never its type.

A `Pool` is a base harness and its siblings, read from a pool file whose base is the one harness
without a parent. A `Direction` names a failure mode and the knob subspace that could repair it.

The generic behaviour lives in small pure functions here (observation truncation and paging,
context selection); the rest (instruction text, action parsing) in each benchmark's harness module.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any, Iterator, Mapping


@dataclasses.dataclass(frozen=True)
class Knob:
    """One knob: type, default, allowed values or range, a one-line doc, and optionally the knob
    (and its values) that must be set for this one to act (`enabled_by`)."""

    type: type
    default: Any
    doc: str
    choices: tuple | None = None
    min: int | None = None
    max: int | None = None
    optional: bool = False  # None allowed
    enabled_by: tuple[str, tuple] | None = None

    def check(self, name: str, value: Any) -> None:
        if value is None and self.optional:
            return
        # bool is an int subclass: a True where an int is expected is a mistake, not a 1.
        if (self.type is int and isinstance(value, bool)) or not isinstance(value, self.type):
            raise ValueError(
                f"knob {name!r} must be {self.type.__name__}{' or None' if self.optional else ''}, "
                f"got {value!r} ({type(value).__name__}); {name}: {self.doc}")
        if self.choices is not None and value not in self.choices:
            raise ValueError(f"knob {name!r}={value!r} is not one of {self.choices}; {name}: {self.doc}")
        if self.min is not None and value < self.min:
            raise ValueError(f"knob {name!r}={value!r} is below its minimum {self.min}; {name}: {self.doc}")
        if self.max is not None and value > self.max:
            raise ValueError(f"knob {name!r}={value!r} is above its maximum {self.max}; {name}: {self.doc}")

    @property
    def free_text(self) -> bool:
        """A string with no fixed choices (a hint line): proposed by an LLM, never enumerated."""
        return self.type is str and self.choices is None


CONTEXT_MODES = ("all", "last_n", "compress")

# Knobs every benchmark has. Their behaviour is generic (truncate, select_context below) or
# implemented by each benchmark's episode with the same meaning.
GENERIC_KNOBS: dict[str, Knob] = {
    "instruction": Knob(str, "default", "instruction variant shown to the model; each benchmark names its "
                                        "variants", choices=("default",)),
    "parse_mode": Knob(str, "strict", "strict: the published action format; lenient: also repairs common "
                                      "format slips", choices=("strict", "lenient")),
    "on_malformed": Knob(str, "fail", "on an unparseable reply: end the episode, or send format feedback",
                         choices=("fail", "retry")),
    "max_format_retries": Knob(int, 2, "format feedback messages per episode when on_malformed=retry",
                               min=0, max=10, enabled_by=("on_malformed", ("retry",))),
    "obs_max_chars": Knob(int, 800, "observation length before it is cut and '[TRUNCATED]' appended",
                          min=50, max=100_000),
    "context": Knob(str, "all", "context shown to the model: all turns, the last n, or older observations "
                                "elided", choices=CONTEXT_MODES),
    "context_last_n": Knob(int, 4, "turns (reply + observation) kept intact by context=last_n/compress",
                           min=1, max=100, enabled_by=("context", ("last_n", "compress"))),
    "max_rounds": Knob(int, 15, "actions executed before the episode ends on the turn limit", min=1, max=100),
    "verify_before_answer": Knob(bool, False, "a final answer given before any successful action (or an empty "
                                              "one) gets one verification prompt instead of being accepted"),
    "hint": Knob(str, None, "an extra hint line at the end of the instruction", optional=True),
}


class KnobSchema(Mapping[str, Knob]):
    """The knobs of one benchmark: `GENERIC_KNOBS` (possibly redefined) plus its own, by name."""

    def __init__(self, benchmark: str, own: Mapping[str, Knob] = (), *,
                 generic: Mapping[str, Knob] = GENERIC_KNOBS):
        own = dict(own)
        for name, knob in own.items():
            if name in generic and knob.type is not generic[name].type:
                raise TypeError(f"{benchmark}: knob {name!r} redefines a generic {generic[name].type.__name__} "
                                f"knob as {knob.type.__name__}; a benchmark may change a generic knob's "
                                "default and allowed values, not its type")
        self.benchmark = benchmark
        self._knobs = {**generic, **own}
        for name, knob in self._knobs.items():
            if knob.default is not None or not knob.optional:
                knob.check(name, knob.default)
            if knob.enabled_by is not None and knob.enabled_by[0] not in self._knobs:
                raise ValueError(f"{benchmark}: knob {name!r} is enabled by {knob.enabled_by[0]!r}, not a knob")
        self.generic = tuple(n for n in self._knobs if n in generic)
        self.own = tuple(n for n in self._knobs if n not in generic)

    def __getitem__(self, name: str) -> Knob:
        if name not in self._knobs:
            raise KeyError(f"unknown knob {name!r} for {self.benchmark}; known knobs: {sorted(self._knobs)}")
        return self._knobs[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._knobs)

    def __len__(self) -> int:
        return len(self._knobs)

    def __repr__(self) -> str:
        return f"KnobSchema({self.benchmark!r}, {len(self)} knobs)"

    def defaults(self) -> dict[str, Any]:
        return {name: k.default for name, k in self._knobs.items()}

    def check(self, owner: str, knobs: Mapping[str, Any]) -> None:
        unknown = sorted(set(knobs) - set(self._knobs))
        if unknown:
            raise ValueError(f"harness {owner!r}: unknown knob(s) {unknown} for {self.benchmark}; "
                             f"known knobs: {sorted(self._knobs)}")
        for name, value in knobs.items():
            self._knobs[name].check(name, value)

    def base(self, name: str = "base", doc: str = "", **knobs) -> "HarnessSpec":
        """A root spec of this schema (no parent)."""
        return HarnessSpec(name=name, knobs=knobs, doc=doc, schema=self).validate()


@dataclasses.dataclass(frozen=True)
class HarnessSpec:
    """A harness as data. `knobs` holds only overrides of the schema's defaults; read values with
    `knob()`. `schema` is the benchmark's `KnobSchema`; it is not part of the JSON form."""

    name: str
    parent: str | None = None
    direction: str | None = None
    knobs: dict = dataclasses.field(default_factory=dict)
    doc: str = ""
    schema: KnobSchema | None = dataclasses.field(default=None, compare=False, repr=False)

    def validate(self) -> "HarnessSpec":
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"harness name must be a non-empty str, got {self.name!r}")
        if self.schema is None:
            raise ValueError(f"harness {self.name!r} has no knob schema; build specs from a benchmark "
                             "(benchmark.knobs.base(), load_pool(path, benchmark.knobs))")
        self.schema.check(self.name, self.knobs)
        return self

    def knob(self, name: str) -> Any:
        return self.knobs.get(name, self.schema[name].default)

    def resolved(self) -> dict[str, Any]:
        """Every knob's value, defaults filled in."""
        return {**self.schema.defaults(), **self.knobs}

    def with_knobs(self, *, name: str | None = None, direction: str | None = None, doc: str = "",
                   **changes) -> "HarnessSpec":
        """A child spec: this spec's knobs with `changes` applied; parent = this spec's name."""
        if name is None:
            name = self.name + "+" + "+".join(f"{k}={v}" for k, v in sorted(changes.items()))
        knobs = {**self.knobs, **changes}
        knobs = {k: v for k, v in knobs.items() if k not in self.schema or v != self.schema[k].default}
        return HarnessSpec(name=name, parent=self.name, direction=direction, knobs=knobs, doc=doc,
                           schema=self.schema).validate()

    def diff(self, other: "HarnessSpec") -> dict[str, tuple[Any, Any]]:
        """Knobs whose resolved values differ: {knob: (self value, other value)}."""
        a, b = self.resolved(), other.resolved()
        return {k: (a[k], b[k]) for k in self.schema if a[k] != b[k]}

    def to_json(self) -> dict:
        return {"name": self.name, "parent": self.parent, "direction": self.direction,
                "knobs": dict(sorted(self.knobs.items())), "doc": self.doc}

    @classmethod
    def from_json(cls, data: dict | str, schema: KnobSchema) -> "HarnessSpec":
        if isinstance(data, str):
            data = json.loads(data)
        allowed = {"name", "parent", "direction", "knobs", "doc"}
        extra = sorted(set(data) - allowed)
        if extra:
            raise ValueError(f"harness spec has unknown field(s) {extra}; allowed: {sorted(allowed)}")
        if "name" not in data:
            raise ValueError(f"harness spec {data!r} has no 'name'")
        return cls(name=data["name"], parent=data.get("parent"), direction=data.get("direction"),
                   knobs=dict(data.get("knobs") or {}), doc=data.get("doc", ""), schema=schema).validate()


@dataclasses.dataclass(frozen=True)
class Direction:
    """A repair direction: the failure mode it targets and the knobs that could repair it."""

    name: str
    failure_mode: str
    knobs: tuple[str, ...]
    doc: str


# ---------------------------------------------------------------- pools

class Pool(Mapping[str, HarnessSpec]):
    """A base harness and its siblings, by name (the base first). Read-only."""

    def __init__(self, base: HarnessSpec, siblings=(), *, benchmark: str = "", doc: str = ""):
        self.base, self.siblings = base, tuple(siblings)
        self.benchmark, self.doc = benchmark or base.schema.benchmark, doc
        self._specs: dict[str, HarnessSpec] = {}
        for spec in (base, *self.siblings):
            if spec.name in self._specs:
                raise ValueError(f"pool: harness {spec.name!r} is defined twice")
            if spec.schema is not base.schema:
                raise ValueError(f"pool: harness {spec.name!r} has another knob schema than the base "
                                 f"({spec.schema!r} vs {base.schema!r})")
            self._specs[spec.name] = spec
        if base.parent is not None:
            raise ValueError(f"pool: the base harness {base.name!r} has a parent ({base.parent!r})")
        for spec in self.siblings:
            if spec.parent is None or spec.parent not in self._specs:
                raise ValueError(f"pool: harness {spec.name!r} names parent {spec.parent!r}, not in the pool; "
                                 "every sibling descends from a harness of the pool")

    def __getitem__(self, name: str) -> HarnessSpec:
        if name not in self._specs:
            raise KeyError(f"harness {name!r} is not in the pool; known: {list(self._specs)}")
        return self._specs[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._specs)

    def __len__(self) -> int:
        return len(self._specs)

    def __repr__(self) -> str:
        return f"Pool({self.benchmark!r}, base={self.base.name!r}, siblings={[s.name for s in self.siblings]})"

    def select(self, names) -> list[HarnessSpec]:
        """The specs of `names`, in that order; the error names every missing one."""
        missing = [n for n in names if n not in self._specs]
        if missing:
            raise ValueError(f"harness(es) {missing} are not in the pool; known: {list(self._specs)}")
        return [self._specs[n] for n in names]


def load_pool(path: str | pathlib.Path, schema: KnobSchema) -> Pool:
    """Reads a pool file `{"benchmark": ..., "harnesses": [spec, ...]}`: the one harness without a
    parent is the base, every other names a parent in the pool, so lineage stays inspectable."""
    path = pathlib.Path(path)
    if not path.exists():
        raise FileNotFoundError(f"harness pool {path} does not exist; see harness_envs/pools/ for examples")
    data = json.loads(path.read_text())
    if not isinstance(data, dict) or not isinstance(data.get("harnesses"), list):
        raise ValueError(f"{path}: a pool file is an object with a list 'harnesses'")
    benchmark = data.get("benchmark")
    if benchmark != schema.benchmark:
        raise ValueError(f"{path} is a pool of benchmark {benchmark!r}, not {schema.benchmark!r}; "
                         "name a pool of the benchmark the run uses")
    try:
        specs = [HarnessSpec.from_json(raw, schema) for raw in data["harnesses"]]
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    roots = [s for s in specs if s.parent is None]
    if len(roots) != 1:
        raise ValueError(f"{path}: a pool has exactly one base harness (the one with \"parent\": null), "
                         f"found {[s.name for s in roots] or 'none'}; add the base, e.g. "
                         '{"name": "base", "parent": null, "knobs": {}}')
    try:
        return Pool(roots[0], [s for s in specs if s.parent is not None], benchmark=benchmark,
                    doc=data.get("doc", ""))
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None


def save_pool(path: str | pathlib.Path, base: HarnessSpec, siblings, **extra) -> None:
    """Writes a pool file: the base first, then the siblings; `extra` fields (evidence) beside them."""
    payload = {"benchmark": base.schema.benchmark, **extra,
               "harnesses": [s.to_json() for s in (base, *siblings)]}
    pathlib.Path(path).write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n")


# ---------------------------------------------------------------- observations

TRUNCATION_MARK = "[TRUNCATED]"


def truncate(text: str, max_chars: int) -> tuple[str, bool]:
    """Cuts `text` at `max_chars` and appends the truncation mark (AgentBench's 800-char rule)."""
    if len(text) > max_chars:
        return text[:max_chars] + TRUNCATION_MARK, True
    return text, False


def paginate(rows: list, offset: int, max_rows: int, max_chars: int) -> tuple[list, int | None]:
    """One page of `rows` from `offset`: at most `max_rows` rows, and fewer if `str(page)` would pass
    `max_chars` (never fewer than one). Returns (page, next offset or None on the last page)."""
    offset = max(0, min(offset, len(rows)))
    end = min(len(rows), offset + max_rows)
    page = rows[offset:end]
    while len(page) > 1 and len(str(page)) > max_chars:
        page = page[: max(1, len(page) * 3 // 4)]
    end = offset + len(page)
    return page, (end if end < len(rows) else None)


# ---------------------------------------------------------------- context management

def elide_observation(text: str) -> str:
    return f"[earlier observation elided: {len(text)} characters]"


def select_context(history: list[dict], prefix_len: int, mode: str, last_n: int) -> list[dict]:
    """The messages shown to the model. `history[:prefix_len]` (instruction and task) is always kept;
    the rest is turns of (assistant reply, user observation).

    all: everything. last_n: the prefix and the last `last_n` turns. compress: every reply, but the
    observations of turns older than the last `last_n` are replaced by a one-line stub.
    """
    if mode == "all":
        return [dict(m) for m in history]
    prefix, rest = history[:prefix_len], history[prefix_len:]
    keep_from = max(0, len(rest) - 2 * last_n)
    keep_from -= keep_from % 2  # cut between turns, never inside one
    if mode == "last_n":
        return [dict(m) for m in prefix + rest[keep_from:]]
    if mode == "compress":
        out = [dict(m) for m in prefix]
        for i, m in enumerate(rest):
            if i < keep_from and m["role"] == "user":
                out.append({"role": "user", "content": elide_observation(m["content"])})
            else:
                out.append(dict(m))
        return out
    raise ValueError(f"context mode {mode!r} is not one of {CONTEXT_MODES}")
