"""The Harness-S router: top-k sibling harnesses for a failed group, from profiles and LLM votes.

For each candidate h of the pool the router computes

    profile(h) = sum over the group's failure modes m of freq(m) * profiles.score(h, type, m)
    votes(h)   = the aggregated voter rankings, in [0, 1] (see `aggregate`)
    score(h)   = profile_weight * profile(h) + (1 - profile_weight) * votes(h)

and returns the k best, ties broken by profile(h), then by a seeded shuffle of the pool
(`tie_break="shuffle"`) or by name (`tie_break="name"`). When no voter answers (or none is
configured) score(h) = profile(h): the router falls back to the profiles alone.

Exploration (`selection`): `ucb` adds a bonus to each posterior mean that shrinks with the sibling's
own evidence (`exploration_bonus`); `thompson` replaces the mean by one draw from its Beta posterior
(`Profiles.thompson`), so siblings with little evidence are tried in proportion to their chance of
being best. Why the shuffle: at a cold start every sibling scores the same, and testbed v3's
alphabetical tie order sent the first steps' rescues of every failed group to the same decoys. Every
random choice of a decision comes from `decision_rng(step, group, task)`, a generator seeded by the
router's seed and those three alone, so a resumed run decides exactly as the uninterrupted one.

Validity (`validity_weight` w > 0): score(h) is multiplied by validity(h)**w, the posterior share of
h's checked successful rescues that were valid base trajectories (`hsjax.harness_s.replay`), so a
sibling whose rescues rest on what only it shows the policy loses rank as the evidence comes in.
Down-weighting alone does not keep such a sibling out of the top k when fewer than k siblings rescue
at all (testbed v3, the router arm's seed 1: `schema_reminder`, 7.0 of 126.4 checked rescues valid,
was still second of two in every decision from step 3 on). `validity_floor` f > 0 excludes a sibling whose validity is below f, and the group gets
fewer siblings rather than that one. f is at most 0.5, the validity of a sibling with nothing
checked, so an unchecked sibling is never excluded; at 0.5 a sibling is out once more of its
checked rescues were invalid than valid. An excluded sibling gets no rescue to check, and
re-anchoring's decay moves its validity toward 0.5 without reaching it: at f = 0.5 it stays out for
the run; below 0.5 decay brings it back to be checked again (at f = 0.4 and decay 0.9, v3's
`schema_reminder` counts after 32 re-anchorings).

Outcomes of the rescue rollouts feed back twice: into the profiles (the sibling's Beta counts for
the task type and the base group's failure mode) and into each voter's record, for `weighted`
aggregation: a voter that put the re-rolled sibling in its top k gets one success or failure.

Re-anchoring (`reanchor`, every `reanchor_every` steps) decays profiles and voter records toward
their priors so the router follows the policy as it learns, then folds in fresh evidence: buffered
rescue outcomes (when `online=False`) and outcomes of probe tasks re-run under each sibling.
"""
from __future__ import annotations

import collections
import dataclasses
import json
import math
import time
import zlib
from typing import Any, Iterable, Sequence

import numpy as np

from hsjax.harness_s.router.aggregation import (AGGREGATIONS, aggregate, combine, dominant_mode, group_summary,
                                                mode_frequencies, ranked, rescue_outcome, task_field)
from hsjax.harness_s.router.profiles import Profiles
from hsjax.harness_s.router.voters import LLMVoter, VoteCache, VoteRequest, VoterSpec, vote_all

SELECTIONS = ("ucb", "thompson")
TIE_BREAKS = ("shuffle", "name")


@dataclasses.dataclass
class Decision:
    harnesses: list[str]
    scores: dict[str, float]
    reasons: list[str]
    votes: dict[str, list[str]]
    voter_failures: int
    latency_s: float
    profile_scores: dict[str, float] = dataclasses.field(default_factory=dict)
    vote_scores: dict[str, float] | None = None
    failures: dict[str, str] = dataclasses.field(default_factory=dict)
    fallback: bool = True


class Router:
    """Chooses siblings for failed groups; learns from rescue outcomes; state round-trips exactly.

    `voters`: VoterSpecs (or LLMVoters). `reanchor_every` = R steps (0: never by itself);
    `decay`: factor applied to profile and voter counts at each re-anchoring; `online`: fold rescue
    outcomes into the profiles as they arrive (True) or buffer them until the next re-anchoring.
    `selection`, `tie_break`, `seed`, `validity_weight` and `validity_floor`: the module doc.
    """

    def __init__(self, pool_names: Sequence[str], profiles: Profiles | None = None,
                 voters: Sequence[VoterSpec | LLMVoter] = (), k: int = 2, aggregation: str = "borda",
                 profile_weight: float = 0.5, *, explore: float = 0.2,
                 voter_prior: tuple[float, float] = (1.0, 1.0), decay: float = 0.9,
                 reanchor_every: int = 0, online: bool = True, deadline_s: float | None = None,
                 cache_size: int = 4096, max_pending: int = 4096, selection: str = "ucb",
                 tie_break: str = "shuffle", seed: int = 0, validity_weight: float = 0.0,
                 validity_floor: float = 0.0):
        self.pool_names = list(pool_names)
        if not self.pool_names or len(set(self.pool_names)) != len(self.pool_names):
            raise ValueError(f"Router pool_names must be non-empty and unique, got {self.pool_names}")
        if not 1 <= k <= len(self.pool_names):
            raise ValueError(f"Router k={k}: must be between 1 and the pool size {len(self.pool_names)}")
        if aggregation not in AGGREGATIONS:
            raise ValueError(f"Router aggregation={aggregation!r}: expected one of {AGGREGATIONS}")
        if not 0.0 <= profile_weight <= 1.0:
            raise ValueError(f"Router profile_weight={profile_weight}: must be in [0, 1]")
        if not 0.0 <= decay <= 1.0:
            raise ValueError(f"Router decay={decay}: must be in [0, 1] (1 = never forget)")
        self.profiles = profiles if profiles is not None else Profiles(self.pool_names)
        for name in self.pool_names:
            self.profiles.add(name)
        self.voters = [v if isinstance(v, LLMVoter) else LLMVoter(v) for v in voters]
        names = [v.name for v in self.voters]
        if len(set(names)) != len(names):
            raise ValueError(f"Router voter names must be unique, got {names}")
        if explore < 0:
            raise ValueError(f"Router explore={explore}: must be >= 0 (0 = pure posterior means)")
        if selection not in SELECTIONS:
            raise ValueError(f"Router selection={selection!r}: expected one of {SELECTIONS}")
        if tie_break not in TIE_BREAKS:
            raise ValueError(f"Router tie_break={tie_break!r}: expected one of {TIE_BREAKS}")
        if validity_weight < 0:
            raise ValueError(f"Router validity_weight={validity_weight}: must be >= 0 (0 = ignore validity)")
        self.selection, self.tie_break, self.seed = selection, tie_break, int(seed)
        self.validity_weight = float(validity_weight)
        if not 0.0 <= validity_floor <= 0.5:
            raise ValueError(f"Router validity_floor={validity_floor}: must be in [0, 0.5] (0 = off; above 0.5 "
                             "every sibling with no checked rescue would be excluded)")
        self.validity_floor = float(validity_floor)
        self.k, self.aggregation, self.profile_weight = k, aggregation, profile_weight
        self.explore = float(explore)
        self.voter_prior = (float(voter_prior[0]), float(voter_prior[1]))
        self.decay, self.reanchor_every, self.online = decay, reanchor_every, online
        self.deadline_s, self.max_pending = deadline_s, max_pending
        self.cache = VoteCache(cache_size)
        self.voter_stats: dict[str, list[float]] = {v.name: [0.0, 0.0] for v in self.voters}
        self.counters: dict[str, int] = collections.Counter()
        self.pending: collections.OrderedDict[str, dict] = collections.OrderedDict()
        self.recent: list[dict] = []
        self.last_reanchor_step: int | None = None
        self._log: list[dict] = []
        self._step = collections.Counter()  # since the last pop_step_metrics(); not checkpointed

    def __repr__(self):
        return (f"Router(pool={self.pool_names}, k={self.k}, aggregation={self.aggregation!r}, "
                f"voters={[v.name for v in self.voters]})")

    def close(self):
        for v in self.voters:
            v.close()

    # ------------------------------------------------------------------ deciding

    def voter_weights(self) -> dict[str, float]:
        """spec.weight times the posterior mean of how often the voter's top-k choices rescued."""
        a0, b0 = self.voter_prior
        return {v.name: v.spec.weight * (a0 + self.voter_stats[v.name][0])
                / (a0 + b0 + sum(self.voter_stats[v.name])) for v in self.voters}

    def decision_rng(self, step: int | None, group_index: int | None, task_id: Any) -> np.random.Generator:
        """The generator of one decision's random choices (Thompson draws, the tie shuffle): a
        function of (seed, step, group, task) only, so it does not depend on earlier decisions."""
        task_key = zlib.crc32(str(task_id).encode())
        return np.random.default_rng([self.seed % 2**32, 0 if step is None else step + 1,
                                      0 if group_index is None else group_index + 1, task_key])

    def exploration_bonus(self, harness: str, failure_mode: str | None) -> float:
        """UCB-style: explore * sqrt(ln(1 + N) / (1 + n)), n = the sibling's (decayed) observations
        for this failure mode, N = the whole pool's. A sibling never tried on a mode gets the
        largest bonus, which shrinks as its own evidence grows."""
        if not self.explore or self.selection != "ucb":
            return 0.0
        def cell_n(h):
            p = self.profiles[h]
            cell = p.by_mode.get(failure_mode) if failure_mode is not None else p.overall
            return sum(cell) if cell else 0.0
        total = sum(cell_n(h) for h in self.pool_names)
        return self.explore * math.sqrt(math.log1p(total) / (1.0 + cell_n(harness)))

    def profile_scores(self, task_type: str | None, freqs: dict[str, float],
                       rng: np.random.Generator | None = None) -> dict[str, float]:
        """sum over the group's failure modes m of freq(m) * (score(h, type, m) + bonus(h, m)) under
        `ucb`, of freq(m) * (a Beta draw for (h, type, m)) under `thompson` (draws from `rng`, in
        pool order); times validity(h)**validity_weight."""
        if self.selection == "thompson" and rng is None:
            raise ValueError("Router.profile_scores under selection='thompson' needs the decision's rng")

        def one(h, m):
            if self.selection == "thompson":
                return self.profiles.thompson(h, task_type, m, rng)
            return self.profiles.score(h, task_type, m) + self.exploration_bonus(h, m)

        modes = freqs or {None: 1.0}
        return {h: sum(f * one(h, m) for m, f in modes.items()) * self.validity_factor(h)
                for h in self.pool_names}

    def validity_factor(self, harness: str) -> float:
        return self.profiles.validity(harness) ** self.validity_weight if self.validity_weight else 1.0

    def invalid(self, harness: str) -> bool:
        """Whether `validity_floor` excludes the sibling (module doc)."""
        return self.validity_floor > 0 and self.profiles.validity(harness) < self.validity_floor

    def top_k(self, task: Any, failed_results: Sequence[dict], *, step: int | None = None,
              group_index: int | None = None) -> Decision:
        start = time.monotonic()
        failed_results = list(failed_results)
        first = failed_results[0] if failed_results else {}
        task_id = task_field(task, "task_id", first.get("task_id"))
        task_type = task_field(task, "type", first.get("type"))
        freqs = mode_frequencies(failed_results)
        rng = self.decision_rng(step, group_index, task_id)
        tie_order = None
        if self.tie_break == "shuffle":
            tie_order = [self.pool_names[i] for i in rng.permutation(len(self.pool_names))]
        prof = self.profile_scores(task_type, freqs, rng)

        votes, failures, vote_scores = {}, {}, None
        if self.voters:
            request = VoteRequest(
                task={"task_id": task_id, "type": task_type, "question": task_field(task, "question")},
                group_summary=group_summary(failed_results),
                cards={h: self.profiles.card(h) for h in self.pool_names},
                candidates=tuple(self.pool_names))
            outcome = vote_all(self.voters, request, cache=self.cache, deadline_s=self.deadline_s)
            votes, failures = outcome.rankings, outcome.failures
            for reason, c in outcome.counters.items():
                self.counters[f"voter/{reason}"] += c
            self.counters["voter_calls"] += len(self.voters)
            self.counters["voter_failures"] += len(failures)
            if votes:
                vote_scores = aggregate(votes, self.pool_names, self.aggregation, self.voter_weights())
        scores = combine(prof, vote_scores, self.profile_weight)
        order = ranked(scores, prof, tie_order)
        excluded = [h for h in order if self.invalid(h)]
        chosen = [h for h in order if h not in excluded][: self.k]
        self.counters["excluded"] += len(excluded)
        mode = dominant_mode(freqs)
        reasons = [self._reason(h, scores, prof, vote_scores, votes, task_type, mode) for h in chosen]
        self.counters["decisions"] += 1
        self.counters["fallbacks"] += int(vote_scores is None)
        if task_id is not None:
            key = str(task_id)
            self.pending.pop(key, None)
            self.pending[key] = {"task_type": task_type, "failure_mode": mode,
                                 "votes": {v: r[: self.k] for v, r in votes.items()}}
            while len(self.pending) > self.max_pending:
                self.pending.popitem(last=False)
        decision = Decision(chosen, scores, reasons, votes, len(failures), time.monotonic() - start,
                            prof, vote_scores, failures, vote_scores is None)
        self._step["decisions"] += 1
        self._step["fallbacks"] += int(decision.fallback)
        self._step["voter_calls"] += len(self.voters)
        self._step["voter_failures"] += len(failures)
        self._step["latency_s"] += decision.latency_s
        self._step["latency_s_max"] = max(self._step["latency_s_max"], decision.latency_s)
        self._log.append({"step": step, "group_index": group_index, "task_id": task_id,
                          "task_type": task_type, "failure_modes": freqs, "aggregation": self.aggregation,
                          "harnesses": chosen, "scores": scores, "profile_scores": prof,
                          "vote_scores": vote_scores, "votes": votes, "voter_failures": failures,
                          "fallback": decision.fallback, "reasons": reasons, "excluded": excluded,
                          "latency_s": decision.latency_s})
        return decision

    def _reason(self, h, scores, prof, vote_scores, votes, task_type, mode) -> str:
        p = self.profiles[h]
        cell = p.by_mode.get(mode) if mode else None
        evidence = (f"{mode}: {cell[0]:.1f}/{sum(cell):.1f} rescued" if cell
                    else f"no {mode} evidence yet, overall {p.overall[0]:.1f}/{p.n:.1f}" if mode
                    else f"overall {p.overall[0]:.1f}/{p.n:.1f} rescued")
        text = f"{h}: score {scores[h]:.3f}; profile {prof[h]:.3f} ({evidence}"
        if self.selection == "thompson":
            text += ", a Thompson draw"
        elif self.explore:
            text += f", exploration bonus {self.exploration_bonus(h, mode):.3f}"
        if self.validity_weight:
            v, nv = p.valid
            text += f", base-valid {v:.1f}/{v + nv:.1f} of checked rescues (x{self.validity_factor(h):.2f})"
        text += ")"
        if vote_scores is None:
            return text + "; profiles only (no voter answered)" if self.voters else text
        first = sum(1 for r in votes.values() if r and r[0] == h)
        listed = sum(1 for r in votes.values() if h in r)
        return (text + f"; votes {vote_scores[h]:.3f} ({self.aggregation}: first for {first}, "
                f"ranked by {listed} of {len(votes)} voters)")

    def drain_log(self) -> list[dict]:
        """Decision records since the last drain (the loop appends them to router_decisions.jsonl)."""
        out, self._log = self._log, []
        return out

    # ------------------------------------------------------------------ learning

    def observe(self, outcomes: Iterable[dict]) -> int:
        """Rescue outcomes (episode results): profile updates and voter credit. Returns how many
        outcomes concerned a pool sibling; others (e.g. base rollouts) are counted and ignored."""
        used, seen_tasks = [], set()
        credit = collections.defaultdict(lambda: [0.0, 0.0])
        for o in outcomes:
            if o.get("harness") not in self.pool_names:
                self.counters["outcomes_ignored"] += 1
                continue
            key = None if o.get("task_id") is None else str(o["task_id"])
            pending = self.pending.get(key) if key is not None else None
            norm = rescue_outcome(o, pending)
            used.append(norm)
            if pending is not None:
                seen_tasks.add(key)
                for voter, top in pending["votes"].items():
                    if norm["harness"] in top and voter in self.voter_stats:
                        credit[voter][0 if norm["success"] else 1] += 1.0
        for voter, (s, f) in credit.items():
            self.voter_stats[voter][0] += s
            self.voter_stats[voter][1] += f
        for key in seen_tasks:
            del self.pending[key]
        if self.online:
            self.profiles.update(used)
        else:
            self.recent.extend(used)
        self.counters["outcomes"] += len(used)
        return len(used)

    def reanchor_due(self, step: int) -> bool:
        return (self.reanchor_every > 0 and step > 0 and step % self.reanchor_every == 0
                and step != self.last_reanchor_step)

    def reanchor(self, step: int, recent_outcomes: Iterable[dict] | None = None,
                 probe_outcomes: Iterable[dict] = ()) -> int:
        """Decays profiles and voter records (once per step), then folds buffered outcomes,
        `recent_outcomes` (not yet observed) and `probe_outcomes` (probe tasks re-run under each
        sibling by the loop; they carry their own `base_failure_mode`). Returns how many were folded."""
        if step != self.last_reanchor_step:
            self.profiles.decay(self.decay)
            for stats in self.voter_stats.values():
                stats[0] *= self.decay
                stats[1] *= self.decay
            self.last_reanchor_step = step
            self.counters["reanchors"] += 1
        fresh = self.recent + [rescue_outcome(o, None) for o in (recent_outcomes or ())]
        fresh += [rescue_outcome(o, None) for o in probe_outcomes]
        self.recent = []
        return self.profiles.update(o for o in fresh if o["harness"] in self.pool_names)

    def pop_step_metrics(self) -> dict[str, float]:
        """Decisions since the last call: count, mean/max latency, voter failure and fallback fractions."""
        st, self._step = self._step, collections.Counter()
        n, calls = st["decisions"], st["voter_calls"]
        return {"router/decisions": float(n),
                "router/latency_s": st["latency_s"] / n if n else 0.0,
                "router/latency_s_max": float(st["latency_s_max"]),
                "router/voter_failures": float(st["voter_failures"]),
                "router/voter_fail_frac": st["voter_failures"] / calls if calls else 0.0,
                "router/fallback_frac": st["fallbacks"] / n if n else 0.0}

    def metrics(self) -> dict[str, float]:
        """Cumulative counters under slash names (`router/...`)."""
        out = {f"router/total/{k}": float(v) for k, v in sorted(self.counters.items())}
        calls = self.counters["voter_calls"]
        out["router/total/voter_fail_frac"] = self.counters["voter_failures"] / calls if calls else 0.0
        return out

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict:
        """Plain JSON. The vote cache and the undrained log are not part of it: the cache only saves
        HTTP calls, and the loop drains the log before each checkpoint."""
        return json.loads(json.dumps({
            "profiles": self.profiles.to_dict(), "voter_stats": self.voter_stats,
            "counters": dict(self.counters), "pending": list(self.pending.items()),
            "recent": self.recent, "last_reanchor_step": self.last_reanchor_step}, allow_nan=False))

    def load_state_dict(self, state: dict) -> None:
        state = json.loads(json.dumps(state))
        self.profiles = Profiles.from_dict(state["profiles"])
        for name in self.pool_names:
            self.profiles.add(name)
        self.voter_stats = {v.name: list(state["voter_stats"].get(v.name, [0.0, 0.0])) for v in self.voters}
        self.counters = collections.Counter(state["counters"])
        self.pending = collections.OrderedDict((k, v) for k, v in state["pending"])
        self.recent = list(state["recent"])
        self.last_reanchor_step = state["last_reanchor_step"]
