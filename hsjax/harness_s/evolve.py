"""Directional harness evolution: base-harness failures in, a sibling pool (`pool.json`) out.

The mode that runs it: `hsjax/modes/evolve.py` (`python run.py --config experiments/evolve.py:dev`).

From episodes of the current policy under the base harness, failures are grouped by failure mode
(the benchmark's taxonomy). Each failure mode has one repair direction (the benchmark's
`directions`): the knob subspace that could repair it. Per direction:

1. candidates: every single-knob mutation of the base inside the subspace, then two-knob
   mutations drawn with the seed, up to `max_candidates`; optionally more proposed by an LLM over
   the OpenAI-compatible API (`LLMProposer`), validated against the knob schema;
2. rescue score: the failed tasks of that mode re-run under each candidate, `tries` each, with the
   same policy; the base harness is re-run on them too (the control: what a re-roll alone rescues);
3. regression check: candidates that rescue more than the control are run on a sample of base
   successes; one whose success there drops more than `regression_tolerance` below the base's
   re-run of the same sample is rejected;
4. the best survivor is kept: most rescue successes, then most regression-sample successes, then
   fewest knobs changed, then candidate order.

A re-run keeps the base episode's `sample_index`: scripted agents key their randomness on it and
replay the same behaviour, so a rescue is the harness's doing; a sampling policy draws afresh.
Everything is deterministic given the seed and a deterministic policy. docs/harness_s.md,
"Directional evolution", has the direction table and the pool.json layout.
"""
from __future__ import annotations

import collections
import dataclasses
import json
import random
from typing import Iterable, Sequence

from harness_envs.benchmark import Benchmark
from harness_envs.harness import HarnessSpec
from hsjax.harness_s.candidates import enumerate_candidates
from hsjax.harness_s.proposer import LLMProposer
from hsjax.rollout.runner import EpisodeRunner, Job

POOL_FILE = "pool.json"


# ---------------------------------------------------------------- failures and outcomes

def group_failures(base_results: Iterable[dict]) -> dict[str, list[dict]]:
    """Failed base episodes by failure mode (modes sorted; episodes in the order given)."""
    groups: dict[str, list[dict]] = collections.defaultdict(list)
    for r in base_results:
        if not r["success"]:
            groups[r["failure_mode"]].append(r)
    return {m: groups[m] for m in sorted(groups)}


def failure_key(result: dict) -> tuple[str, int]:
    return str(result["task_id"]), int(result.get("sample_index", 0))


def rescue_jobs(failures: Sequence[dict], specs: Sequence[HarnessSpec], tasks_by_id: dict,
                tries: int = 1) -> list[Job]:
    """Every failure under every spec, `tries` times, at the failure's own sample index."""
    return [Job(spec, tasks_by_id[f["task_id"]], int(f.get("sample_index", 0)))
            for spec in specs for f in failures for _ in range(tries)]


def rescue_outcome(failure: dict, result: dict, attempt: int = 0) -> dict:
    """A rescue rollout as an outcome record: `hsjax.harness_s.router.Profiles.update` reads it as is, and
    `hsjax.harness_s.analysis` groups it by sibling and by the base failure mode."""
    return {"harness": result["harness"], "task_id": failure["task_id"], "task_type": failure["type"],
            "sample_index": int(failure.get("sample_index", 0)), "try": attempt,
            "base_failure_mode": failure["failure_mode"], "success": bool(result["success"]),
            "failure_mode": result["failure_mode"], "num_turns": result.get("num_turns"),
            "num_tokens": result.get("num_tokens")}


def collect_rescues(runner: EpisodeRunner, failures: Sequence[dict], specs: Sequence[HarnessSpec],
                    tasks_by_id: dict, tries: int = 1) -> list[dict]:
    """Re-runs every base failure under every spec; returns one outcome record per rollout."""
    results = runner.results(rescue_jobs(failures, specs, tasks_by_id, tries))
    outcomes, i = [], 0
    for _spec in specs:
        for f in failures:
            for attempt in range(tries):
                outcomes.append(rescue_outcome(f, results[i], attempt))
                i += 1
    return outcomes


def _score(failures: Sequence[dict], results: Sequence[dict], tries: int) -> dict:
    """Rescue numbers of one harness: `successes` over all tries, `rescued` failures (any try)."""
    per_failure = [sum(bool(r["success"]) for r in results[i * tries:(i + 1) * tries])
                   for i in range(len(failures))]
    n = len(failures) * tries
    return {"successes": sum(per_failure), "rescued": sum(1 for s in per_failure if s),
            "rate": sum(per_failure) / n if n else 0.0}


# ---------------------------------------------------------------- evolution

@dataclasses.dataclass(frozen=True)
class EvolveSettings:
    tries: int = 1  # re-runs of each failure per candidate
    max_failures: int = 0  # failures used per direction (0: all), a seeded sample
    min_failures: int = 1  # directions with fewer failures are skipped
    max_candidates: int = 12  # enumerated candidates per direction
    max_knobs: int = 2  # 1: single-knob mutations only
    regression_sample: int = 20  # base successes re-run under each candidate
    regression_tolerance: float = 0.05  # allowed drop of the success rate on that sample
    seed: int = 0


@dataclasses.dataclass
class Evolution:
    siblings: list[HarnessSpec]
    evidence: dict[str, dict]  # sibling name -> evidence
    unrepaired: dict[str, dict]  # failure mode -> why no sibling was kept
    regression: dict  # the regression sample and the base's success on it
    counters: dict

    def pool_extra(self) -> dict:
        return {"evidence": self.evidence, "unrepaired": self.unrepaired, "regression_reference": self.regression,
                "counters": self.counters}


def _sample(items: Sequence[dict], n: int, seed: int, tag: str) -> list[dict]:
    """A seeded sample of at most n items (all when n <= 0), in their original order."""
    if n <= 0 or len(items) <= n:
        return list(items)
    keep = sorted(random.Random(f"{seed}/{tag}").sample(range(len(items)), n))
    return [items[i] for i in keep]


def evolve(bench: Benchmark, base_results: Sequence[dict], tasks_by_id: dict, runner: EpisodeRunner, *,
           base: HarnessSpec, settings: EvolveSettings = EvolveSettings(),
           directions: Sequence[str] | None = None, proposer: LLMProposer | None = None,
           candidates: dict[str, list[dict]] | None = None) -> Evolution:
    """One sibling per repair direction that has failures and a candidate that beats the control
    without regressing (module docstring). `directions` limits the direction names; `candidates`
    ({direction: [knob changes]}) replaces the enumeration for those directions."""
    s = settings
    by_mode = group_failures(base_results)
    names = set(directions) if directions is not None else None
    known = [d.name for d in bench.directions]
    unknown = sorted((names or set()) - set(known))
    if unknown:
        raise ValueError(f"unknown direction(s) {unknown} for {bench.name}; known: {sorted(known)}")

    successes = [r for r in base_results if r["success"]]
    reg_sample = _sample(successes, s.regression_sample, s.seed, "regression")
    reg_jobs = [Job(base, tasks_by_id[r["task_id"]], int(r.get("sample_index", 0))) for r in reg_sample]
    reg_ref = sum(bool(r["success"]) for r in runner.results(reg_jobs))
    regression = {"n": len(reg_sample), "base_successes": reg_ref,
                  "tasks": [list(failure_key(r)) for r in reg_sample]}

    siblings, evidence, unrepaired = [], {}, {}
    counters = collections.Counter()
    for mode, failures in by_mode.items():
        direction = bench.direction(failure_mode=mode)
        if direction is None:
            unrepaired[mode] = {"n_failures": len(failures), "reason": "no repair direction for this mode"}
            continue
        if names is not None and direction.name not in names:
            continue
        if len(failures) < s.min_failures:
            unrepaired[mode] = {"n_failures": len(failures), "reason": f"fewer than min_failures={s.min_failures}"}
            continue
        used = _sample(failures, s.max_failures, s.seed, f"failures/{mode}")
        cands = [(c, "given") for c in candidates[direction.name]] if candidates and direction.name in candidates \
            else [(c, "enumerated") for c in enumerate_candidates(base, direction, max_candidates=s.max_candidates,
                                                                   max_knobs=s.max_knobs, seed=s.seed)]
        if proposer is not None:
            cands += [(c, "llm") for c in proposer.propose(base, direction, used, existing=[c for c, _ in cands])]
        specs = [base.with_knobs(name=f"{direction.name}#{i}", direction=direction.name, **c)
                 for i, (c, _) in enumerate(cands)]

        results = runner.results(rescue_jobs(used, [base, *specs], tasks_by_id, s.tries))
        per = len(used) * s.tries
        control = _score(used, results[:per], s.tries)
        tried = [{"knobs": c, "source": src, "rescue": _score(used, results[per * (i + 1):per * (i + 2)], s.tries),
                  "regression": None, "status": "no_gain"} for i, (c, src) in enumerate(cands)]
        gainers = [i for i, t in enumerate(tried) if t["rescue"]["successes"] > control["successes"]]
        reg_results = runner.results([Job(specs[i], j.task, j.sample_index) for i in gainers for j in reg_jobs])
        for n, i in enumerate(gainers):
            ok = sum(bool(r["success"]) for r in reg_results[n * len(reg_jobs):(n + 1) * len(reg_jobs)])
            drop = (reg_ref - ok) / len(reg_jobs) if reg_jobs else 0.0
            tried[i]["regression"] = {"n": len(reg_jobs), "successes": ok, "base_successes": reg_ref, "drop": drop}
            tried[i]["status"] = "regressed" if drop > s.regression_tolerance else "passed"
        passed = [i for i in gainers if tried[i]["status"] == "passed"]
        counters["candidates"] += len(cands)
        counters["rejected_no_gain"] += len(cands) - len(gainers)
        counters["rejected_regression"] += len(gainers) - len(passed)
        base_ev = {"failure_mode": mode, "knob_subspace": list(direction.knobs), "n_failures": len(failures),
                   "n_failures_used": len(used), "tries": s.tries, "control": control,
                   "regression_tolerance": s.regression_tolerance}
        if not passed:
            unrepaired[mode] = {**base_ev, "direction": direction.name, "candidates_tried": tried,
                                "reason": "no candidate rescued more than the control without regressing"}
            continue
        best = min(passed, key=lambda i: (-tried[i]["rescue"]["successes"], -tried[i]["regression"]["successes"],
                                          len(tried[i]["knobs"]), i))
        tried[best]["status"] = "kept"
        r, g = tried[best]["rescue"], tried[best]["regression"]
        doc = (f"Evolved along {direction.name} ({direction.doc}): rescued {r['rescued']}/{len(used)} "
               f"{mode} failures of the base ({s.tries} tries each; the base re-run rescued "
               f"{control['rescued']}); {g['successes']}/{g['n']} on base successes (base {reg_ref}).")
        sibling = base.with_knobs(name=direction.name, direction=direction.name, doc=doc, **tried[best]["knobs"])
        siblings.append(sibling)
        evidence[sibling.name] = {**base_ev, "knobs": tried[best]["knobs"], "source": tried[best]["source"],
                                  "rescue": r, "regression": g, "candidates_tried": tried}
    if proposer is not None:
        counters.update({f"llm/{k}": v for k, v in proposer.counters.items()})
    counters["rollouts"] = runner.rollouts
    return Evolution(siblings, evidence, unrepaired, regression, dict(sorted(counters.items())))


def evolution_table(evo: Evolution) -> str:
    """One line per direction: mode, sibling, knobs, rescued, regression."""
    lines = [f"{'failure mode':28}{'sibling':24}{'rescued':>10}{'control':>9}{'regress':>9}  knobs"]
    for name, ev in evo.evidence.items():
        r, g = ev["rescue"], ev["regression"]
        lines.append(f"{ev['failure_mode']:28}{name:24}{r['rescued']:>5}/{ev['n_failures_used']:<4}"
                     f"{ev['control']['rescued']:>9}{g['successes']:>5}/{g['n']:<3}  {json.dumps(ev['knobs'])}")
    for mode, ev in evo.unrepaired.items():
        lines.append(f"{mode:28}{'(none)':24}{'':>10}{'':>9}{'':>9}  {ev['reason']} (n={ev['n_failures']})")
    return "\n".join(lines)
