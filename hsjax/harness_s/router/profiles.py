"""Behavior profiles of sibling harnesses: how often each one rescues what, and at what cost.

Every rescue outcome (a failed base group re-rolled under a sibling) is one Bernoulli observation
for that sibling, filed in three cells: overall, by task type, and by the failure mode of the base
group. A cell stores observed (successes, failures); its Beta posterior is
Beta(prior_alpha + successes, prior_beta + failures). `decay(f)` multiplies the observed counts by
f, which moves every posterior toward the prior, so evidence about an older policy fades.

The score of a sibling for a (task type, failure mode) is a posterior mean with backoff, each level
shrunk toward the one above with strength `backoff` (pseudo-observations):

    m_overall = (prior_alpha + s_all) / (prior_alpha + prior_beta + n_all)
    m_type    = (s_type + backoff * m_overall) / (n_type + backoff)     (m_overall if no type)
    m_mode    = (s_mode + backoff * m_type)    / (n_mode + backoff)     (m_type if no mode)
    score     = m_mode

A cell with no data gives the level above; a cell with much data speaks for itself. The mode cell
is the last, most specific level because the failure mode is what a repair direction targets.

A fourth cell, `valid`, counts whether a sibling's successful rescues were valid base trajectories
(`hsjax.harness_s.replay`: their replies replay to success under the base harness and use nothing
only the sibling's observations showed). `validity(h)` is its posterior mean under a Beta(1, 1)
prior, so a sibling with no checked rescue has validity 0.5 like every other; the router multiplies
a sibling's score by validity**validity_weight, which down-weights siblings that rescue by leaking
what the base harness hides (testbed: `schema_reminder`). The cell decays with the others.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
from typing import Any, Iterable

PROFILES_FILE = "profiles.json"


def _cell_mean(cell: list[float] | None, prior_mean: float, strength: float) -> float:
    """Posterior mean of a cell whose prior is `prior_mean` worth `strength` observations."""
    if not cell:
        return prior_mean
    s, f = cell
    return (s + strength * prior_mean) / (s + f + strength)


def _fmt_count(x: float) -> str:
    return f"{x:.1f}".rstrip("0").rstrip(".")


@dataclasses.dataclass
class SiblingProfile:
    """Observed rescue counts and costs of one sibling. Counts are floats: decay makes them fractional."""

    name: str
    direction: str | None = None
    overall: list[float] = dataclasses.field(default_factory=lambda: [0.0, 0.0])
    by_type: dict[str, list[float]] = dataclasses.field(default_factory=dict)
    by_mode: dict[str, list[float]] = dataclasses.field(default_factory=dict)
    valid: list[float] = dataclasses.field(default_factory=lambda: [0.0, 0.0])  # [valid, not] base replays
    turns_sum: float = 0.0
    turns_n: float = 0.0
    tokens_sum: float = 0.0
    tokens_n: float = 0.0
    rescued_examples: list[dict] = dataclasses.field(default_factory=list)
    failed_examples: list[dict] = dataclasses.field(default_factory=list)

    @property
    def n(self) -> float:
        return self.overall[0] + self.overall[1]

    def mean_turns(self) -> float | None:
        return self.turns_sum / self.turns_n if self.turns_n > 0 else None

    def mean_tokens(self) -> float | None:
        return self.tokens_sum / self.tokens_n if self.tokens_n > 0 else None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "SiblingProfile":
        # Profiles saved before the validity cell existed load with an empty one.
        return cls(**{k: d[k] for k in d})


class Profiles:
    """The profiles of a sibling pool (created on first use for any harness name)."""

    def __init__(self, names: Iterable[str] = (), *, directions: dict[str, str | None] | None = None,
                 prior: tuple[float, float] = (1.0, 1.0), backoff: float = 2.0,
                 max_snippets: int = 2, snippet_chars: int = 240):
        if prior[0] <= 0 or prior[1] <= 0:
            raise ValueError(f"Profiles prior={prior}: both Beta prior counts must be > 0")
        if backoff <= 0:
            raise ValueError(f"Profiles backoff={backoff}: the backoff strength must be > 0")
        self.prior = (float(prior[0]), float(prior[1]))
        self.backoff = float(backoff)
        self.max_snippets = int(max_snippets)
        self.snippet_chars = int(snippet_chars)
        self.profiles: dict[str, SiblingProfile] = {}
        directions = directions or {}
        for name in names:
            self.add(name, directions.get(name))

    @classmethod
    def from_pool(cls, pool: Iterable[Any], **kwargs) -> "Profiles":
        """Profiles for harness specs (anything with `name` and optionally `direction`)."""
        pool = list(pool)
        return cls([s.name for s in pool], directions={s.name: getattr(s, "direction", None) for s in pool},
                   **kwargs)

    def add(self, name: str, direction: str | None = None) -> SiblingProfile:
        if name not in self.profiles:
            self.profiles[name] = SiblingProfile(name, direction)
        elif direction is not None and self.profiles[name].direction is None:
            self.profiles[name].direction = direction
        return self.profiles[name]

    @property
    def names(self) -> list[str]:
        return list(self.profiles)

    def __contains__(self, name: str) -> bool:
        return name in self.profiles

    def __getitem__(self, name: str) -> SiblingProfile:
        if name not in self.profiles:
            raise KeyError(f"no profile for harness {name!r}; known: {sorted(self.profiles)}")
        return self.profiles[name]

    # ------------------------------------------------------------------ learning

    def update(self, outcomes: Iterable[dict]) -> int:
        """Folds rescue outcomes in; returns how many. Keys: `harness`, `success` (required),
        `task_type`, `base_failure_mode`, `num_turns`, `num_tokens`, `snippet`, `base_valid` (optional:
        True/False when a successful rescue was checked against the base harness, None when not)."""
        count = 0
        for o in outcomes:
            for key in ("harness", "success"):
                if key not in o:
                    raise ValueError(f"rescue outcome lacks {key!r}: {sorted(o)}; every outcome needs "
                                     "'harness' and 'success'")
            p = self.add(str(o["harness"]))
            ok = bool(o["success"])
            idx = 0 if ok else 1
            p.overall[idx] += 1.0
            if o.get("task_type") is not None:
                p.by_type.setdefault(str(o["task_type"]), [0.0, 0.0])[idx] += 1.0
            if o.get("base_failure_mode") is not None:
                p.by_mode.setdefault(str(o["base_failure_mode"]), [0.0, 0.0])[idx] += 1.0
            if ok and o.get("base_valid") is not None:
                p.valid[0 if o["base_valid"] else 1] += 1.0
            if o.get("num_turns") is not None:
                p.turns_sum += float(o["num_turns"])
                p.turns_n += 1.0
            if o.get("num_tokens") is not None:
                p.tokens_sum += float(o["num_tokens"])
                p.tokens_n += 1.0
            if o.get("snippet") and self.max_snippets > 0:
                examples = p.rescued_examples if ok else p.failed_examples
                examples.append({"task_type": o.get("task_type"), "failure_mode": o.get("base_failure_mode"),
                                 "text": " ".join(str(o["snippet"]).split())[: self.snippet_chars]})
                del examples[: -self.max_snippets]
            count += 1
        return count

    def decay(self, factor: float) -> None:
        """Multiplies every observed count (and cost weight) by `factor` in [0, 1]: posteriors move
        toward the prior, cost means keep their value but new observations weigh more."""
        if not 0.0 <= factor <= 1.0:
            raise ValueError(f"Profiles.decay factor={factor}: must be in [0, 1] (1 = no decay)")
        for p in self.profiles.values():
            for cell in [p.overall, p.valid, *p.by_type.values(), *p.by_mode.values()]:
                cell[0] *= factor
                cell[1] *= factor
            p.turns_sum *= factor
            p.turns_n *= factor
            p.tokens_sum *= factor
            p.tokens_n *= factor

    # ------------------------------------------------------------------ estimates

    def posterior(self, harness: str, cell: str = "overall", key: str | None = None) -> tuple[float, float]:
        """(alpha, beta) of a cell: `overall`, (`type`, task type) or (`mode`, failure mode)."""
        p = self[harness]
        counts = {"overall": p.overall, "type": p.by_type.get(key or ""),
                  "mode": p.by_mode.get(key or "")}[cell] or [0.0, 0.0]
        return self.prior[0] + counts[0], self.prior[1] + counts[1]

    def _estimate(self, harness: str, task_type: str | None, failure_mode: str | None) -> tuple[float, float]:
        """(posterior mean, its strength in observations) at the most specific level asked for."""
        a0, b0 = self.prior
        if harness not in self.profiles:
            return a0 / (a0 + b0), a0 + b0
        p = self.profiles[harness]
        mean, strength = (a0 + p.overall[0]) / (a0 + b0 + p.n), a0 + b0 + p.n
        for cells, key in ((p.by_type, task_type), (p.by_mode, failure_mode)):
            if key is None:
                continue
            cell = cells.get(str(key))
            mean = _cell_mean(cell, mean, self.backoff)
            strength = self.backoff + (sum(cell) if cell else 0.0)
        return mean, strength

    def score(self, harness: str, task_type: str | None = None, failure_mode: str | None = None) -> float:
        """Posterior mean rescue rate with backoff mode -> type -> overall -> prior (module doc)."""
        return self._estimate(harness, task_type, failure_mode)[0]

    def validity(self, harness: str) -> float:
        """Posterior mean (Beta(1, 1) prior) of the share of the sibling's checked successful rescues
        that were valid base trajectories; 0.5 for a sibling with none checked (module doc)."""
        if harness not in self.profiles:
            return 0.5
        v, nv = self.profiles[harness].valid
        return (1.0 + v) / (2.0 + v + nv)

    def thompson(self, harness: str, task_type: str | None, failure_mode: str | None, rng) -> float:
        """A draw from the Beta with the score's mean and strength (Thompson sampling): cells with
        little evidence spread widely, so a sibling never tried is sometimes ranked first."""
        mean, strength = self._estimate(harness, task_type, failure_mode)
        return float(rng.beta(max(mean * strength, 1e-6), max((1.0 - mean) * strength, 1e-6)))

    def uncertainty(self, harness: str, task_type: str | None = None,
                    failure_mode: str | None = None) -> float:
        """Standard deviation of the Beta with the score's mean and strength: sqrt(m(1-m)/(strength+1)).
        Large for cells with little evidence of their own; the router's exploration bonus uses it."""
        mean, strength = self._estimate(harness, task_type, failure_mode)
        return math.sqrt(mean * (1.0 - mean) / (strength + 1.0))

    def card(self, harness: str, max_rows: int = 6) -> str:
        """A short text card for LLM voters: rescue rates with counts, cost, example snippets."""
        p = self[harness]
        a, b = self.posterior(harness)
        lines = [f"harness: {p.name}" + (f" (repair direction: {p.direction})" if p.direction else ""),
                 f"rescue rate overall: {a / (a + b):.2f} ({_fmt_count(p.overall[0])} of "
                 f"{_fmt_count(p.n)} rescue rollouts succeeded)"]
        if sum(p.valid) > 0:
            lines.append(f"valid base trajectories among checked rescues: {self.validity(harness):.2f} "
                         f"({_fmt_count(p.valid[0])} of {_fmt_count(sum(p.valid))})")
        for title, cells in (("by base failure mode", p.by_mode), ("by task type", p.by_type)):
            rows = sorted(cells.items(), key=lambda kv: (-(kv[1][0] + kv[1][1]), kv[0]))[:max_rows]
            if rows:
                parts = [f"{k} {(s + self.prior[0]) / (s + f + sum(self.prior)):.2f} "
                         f"({_fmt_count(s)}/{_fmt_count(s + f)})" for k, (s, f) in rows]
                lines.append(f"{title}: " + ", ".join(parts))
        cost = []
        if p.mean_turns() is not None:
            cost.append(f"{p.mean_turns():.1f} turns")
        if p.mean_tokens() is not None:
            cost.append(f"{p.mean_tokens():.0f} tokens")
        if cost:
            lines.append("mean cost per rollout: " + ", ".join(cost))
        for sign, examples in (("rescued", p.rescued_examples), ("not rescued", p.failed_examples)):
            for e in examples:
                lines.append(f"example {sign} [{e['task_type']}/{e['failure_mode']}]: {e['text']}")
        return "\n".join(lines)

    # ------------------------------------------------------------------ state

    def to_dict(self) -> dict:
        return {"prior": list(self.prior), "backoff": self.backoff, "max_snippets": self.max_snippets,
                "snippet_chars": self.snippet_chars,
                "profiles": [p.to_dict() for p in self.profiles.values()]}

    @classmethod
    def from_dict(cls, d: dict) -> "Profiles":
        out = cls(prior=tuple(d["prior"]), backoff=d["backoff"], max_snippets=d["max_snippets"],
                  snippet_chars=d["snippet_chars"])
        for pd in d["profiles"]:
            p = SiblingProfile.from_dict(json.loads(json.dumps(pd)))  # a deep copy
            out.profiles[p.name] = p
        return out

    def to_json(self) -> str:
        # Python's float repr round-trips exactly, so from_json(to_json()) restores every count bit for bit.
        return json.dumps(self.to_dict(), sort_keys=True, allow_nan=False)

    @classmethod
    def from_json(cls, text: str) -> "Profiles":
        return cls.from_dict(json.loads(text))

    def save(self, path: str | os.PathLike) -> pathlib.Path:
        """Writes `profiles.json` (atomically) into `path` if it is a directory, else to `path`."""
        path = pathlib.Path(path)
        if path.is_dir():
            path = path / PROFILES_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=1, sort_keys=True, allow_nan=False))
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Profiles":
        path = pathlib.Path(path)
        if path.is_dir():
            path = path / PROFILES_FILE
        if not path.exists():
            raise FileNotFoundError(f"no profiles at {path}; write them with Profiles.save(workdir)")
        return cls.from_dict(json.loads(path.read_text()))
