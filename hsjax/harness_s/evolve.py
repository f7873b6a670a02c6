"""Directional harness evolution: base-harness failures in, a sibling pool (`pool.json`) out.

    python run.py --config experiments/evolve.py:dev --workdir /tmp/hsjax/evolve

From episodes of the current policy under the base harness, failures are grouped by failure mode
(`harness_envs/dbbench/taxonomy.py`). Each failure mode has one repair direction (`DIRECTIONS`):
the knob subspace that could repair it. Per direction:

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
import itertools
import json
import logging
import pathlib
import random
import re
import time
from typing import Any, Callable, Iterable, Sequence

from harness_envs import harness as hz

log = logging.getLogger(__name__)

POOL_FILE = "pool.json"


# ---------------------------------------------------------------- repair directions

@dataclasses.dataclass(frozen=True)
class Direction:
    """A repair direction: the failure mode it targets and the knobs that could repair it."""

    name: str
    failure_mode: str
    knobs: tuple[str, ...]
    doc: str


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
DIRECTION_BY_MODE: dict[str, Direction] = {d.failure_mode: d for d in DIRECTIONS}
DIRECTION_BY_NAME: dict[str, Direction] = {d.name: d for d in DIRECTIONS}

# A knob that only acts when another knob has one of these values; setting it alone is a no-op.
DEPENDS_ON: dict[str, tuple[str, tuple]] = {
    "context_last_n": ("context", ("last_n", "compress")),
    "max_format_retries": ("on_malformed", ("retry",)),
}
LLM_EXTRA_KNOBS = ("hint",)  # free text: proposed by an LLM only, never enumerated


def knob_values(name: str) -> list:
    """Values tried for a knob, its default excluded: every choice (or the other bool), or for
    an int a ladder around the default (half, double, quadruple; 10/20/50 for a default of 0)."""
    knob = hz.KNOBS[name]
    if knob.type is bool:
        return [not knob.default]
    if knob.choices is not None:
        return [c for c in knob.choices if c != knob.default]
    if knob.type is int:
        ladder = [10, 20, 50] if knob.default == 0 else [knob.default // 2, knob.default * 2, knob.default * 4]
        lo, hi = knob.min if knob.min is not None else -10**9, knob.max if knob.max is not None else 10**9
        return sorted({min(hi, max(lo, v)) for v in ladder} - {knob.default})
    return []


def is_no_op(base: hz.HarnessSpec, changes: dict) -> bool:
    """True if `changes` leaves the base's behaviour unchanged: every value equals the base's, or a
    dependent knob is set while the knob it depends on does not enable it."""
    resolved = {**base.resolved(), **changes}
    effective = {}
    for k, v in changes.items():
        if k in DEPENDS_ON:
            parent, enabling = DEPENDS_ON[k]
            if resolved[parent] not in enabling:
                continue
        if v != base.knob(k):
            effective[k] = v
    return not effective


def _key(changes: dict) -> str:
    return json.dumps(changes, sort_keys=True)


def enumerate_candidates(base: hz.HarnessSpec, direction: Direction, *, max_candidates: int = 12,
                         max_knobs: int = 2, seed: int = 0) -> list[dict]:
    """Knob changes to try along `direction`: every single-knob mutation, then two-knob ones drawn
    with `seed` until `max_candidates`. If the singles alone pass the cap, a seeded sample of them."""
    singles = [{k: v} for k in direction.knobs for v in knob_values(k)]
    singles = [c for c in singles if not is_no_op(base, c)]
    rng = random.Random(f"{seed}/candidates/{direction.name}")
    if len(singles) >= max_candidates:
        picked = sorted(rng.sample(range(len(singles)), max_candidates))
        return [singles[i] for i in picked]
    out, seen = list(singles), {_key(c) for c in singles}
    if max_knobs >= 2:
        pairs = [{a: va, b: vb} for a, b in itertools.combinations(direction.knobs, 2)
                 for va in knob_values(a) for vb in knob_values(b)]
        rng.shuffle(pairs)
        for c in pairs:
            if len(out) >= max_candidates:
                break
            if _key(c) not in seen and not is_no_op(base, c):
                seen.add(_key(c))
                out.append(c)
    return out


# ---------------------------------------------------------------- running episodes

@dataclasses.dataclass(frozen=True)
class Job:
    """One rollout to run: a task under a harness, with the sample index the policy sees."""

    spec: hz.HarnessSpec
    task: Any
    sample_index: int = 0


class EpisodeRunner:
    """Runs jobs through `hsjax.rollout.engine.collect` in batches; counts the rollouts it spent.

    `make_episode(task, spec, sample_index)` builds one episode (e.g. a `DBBenchEpisode`)."""

    def __init__(self, policy, sampling, make_episode: Callable, *, batch_size: int = 256,
                 env_workers: int = 4, max_context_tokens: int | None = None):
        self.policy, self.sampling, self.make_episode = policy, sampling, make_episode
        self.batch_size, self.env_workers = max(1, int(batch_size)), int(env_workers)
        self.max_context_tokens = max_context_tokens
        self.rollouts = 0
        self.seconds = 0.0

    def run(self, jobs: Sequence[Job]) -> list[dict]:
        """The result dict of every job, in order (with `sample_index` set)."""
        from hsjax.rollout.engine import collect

        t0 = time.perf_counter()
        out: list[dict] = []
        for start in range(0, len(jobs), self.batch_size):
            chunk = jobs[start:start + self.batch_size]
            episodes = [self.make_episode(j.task, j.spec, j.sample_index) for j in chunk]
            trajectories = collect(episodes, self.policy, self.sampling,
                                   max_context_tokens=self.max_context_tokens, env_workers=self.env_workers)
            for job, tr in zip(chunk, trajectories):
                result = dict(tr.result)
                result.setdefault("sample_index", job.sample_index)
                result["num_tokens"] = tr.num_generated_tokens or None
                out.append(result)
        self.rollouts += len(jobs)
        self.seconds += time.perf_counter() - t0
        return out


def dbbench_episode_factory(backend, rule: str = "v0.2") -> Callable:
    from harness_envs.dbbench.env import DBBenchEpisode

    def make(task, spec, sample_index):
        return DBBenchEpisode(task, spec, backend, sample_index=sample_index, rule=rule)
    return make


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


def rescue_jobs(failures: Sequence[dict], specs: Sequence[hz.HarnessSpec], tasks_by_id: dict,
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


def collect_rescues(runner: EpisodeRunner, failures: Sequence[dict], specs: Sequence[hz.HarnessSpec],
                    tasks_by_id: dict, tries: int = 1) -> list[dict]:
    """Re-runs every base failure under every spec; returns one outcome record per rollout."""
    results = runner.run(rescue_jobs(failures, specs, tasks_by_id, tries))
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


# ---------------------------------------------------------------- LLM proposals

PROPOSAL_COUNTERS = ("requests", "request_failed", "malformed_reply", "received", "valid", "invalid_shape",
                     "unknown_knob", "bad_value", "off_direction", "no_op", "duplicate")

PROPOSER_SYSTEM = (
    "You improve an agent harness for a SQL benchmark. A harness is a set of knobs; the agent (a "
    "language model) failed tasks under the base harness in the way described. Propose knob changes "
    "that could let the same agent succeed, using only the knobs listed and their allowed values. "
    "Answer with JSON only: {\"candidates\": [{\"knobs\": {\"knob\": value, ...}, \"why\": \"...\"}]}.")


def _knob_line(name: str, value: Any) -> str:
    k = hz.KNOBS[name]
    allowed = (f"one of {list(k.choices)}" if k.choices is not None else
               f"int in [{k.min}, {k.max}]" if k.type is int else
               "true or false" if k.type is bool else "a short string or null")
    return f"- {name} (now {json.dumps(value)}; {allowed}): {k.doc}"


def proposal_prompt(base: hz.HarnessSpec, direction: Direction, failures: Sequence[dict],
                    n: int, examples: int = 3) -> list[dict]:
    knobs = [*direction.knobs, *LLM_EXTRA_KNOBS]
    lines = [f"Failure mode: {direction.failure_mode} ({len(failures)} failed episodes under harness "
             f"{base.name!r}). Repair direction: {direction.name}: {direction.doc}.",
             "Knobs you may change:", *[_knob_line(k, base.knob(k)) for k in knobs]]
    for f in failures[:examples]:
        turns = f.get("turns") or []
        last = turns[-1] if turns and isinstance(turns[-1], dict) else {}
        reply = " ".join(str(last.get("reply", "")).split())[:300]
        obs = " ".join(str(last.get("observation") or last.get("error") or "").split())[:200]
        lines.append(f"Example ({f.get('type')}, {f.get('num_turns')} turns), last reply: {reply!r}; "
                     f"then: {obs!r}")
    lines.append(f"Propose at most {n} candidates.")
    return [{"role": "system", "content": PROPOSER_SYSTEM}, {"role": "user", "content": "\n".join(lines)}]


def parse_proposals(text: str) -> list | None:
    """The candidate list of a reply: the whole reply, a code fence, or the first JSON object in
    prose, holding `{"candidates": [...]}` or a bare list. None when nothing parses."""
    if not isinstance(text, str):
        return None
    pieces = [text.strip(), *re.findall(r"```(?:json)?\s*(.*?)```", text, re.S)]
    brace = text.find("{")
    if brace >= 0:
        pieces.append(text[brace:text.rfind("}") + 1])
    for piece in pieces:
        try:
            value = json.loads(piece)
        except (ValueError, TypeError):
            continue
        if isinstance(value, dict) and isinstance(value.get("candidates"), list):
            return value["candidates"]
        if isinstance(value, list):
            return value
    return None


def validate_proposal(item: Any, base: hz.HarnessSpec, direction: Direction) -> tuple[dict | None, str]:
    """(knob changes, "valid") or (None, reason): invalid_shape, unknown_knob, bad_value,
    off_direction (a knob outside the direction's subspace and `hint`), no_op."""
    changes = item.get("knobs") if isinstance(item, dict) else None
    if not isinstance(changes, dict) or not changes:
        return None, "invalid_shape"
    if any(k not in hz.KNOBS for k in changes):
        return None, "unknown_knob"
    for k, v in changes.items():
        try:
            hz.KNOBS[k].check(k, v)
        except ValueError:
            return None, "bad_value"
    if any(k not in direction.knobs and k not in LLM_EXTRA_KNOBS for k in changes):
        return None, "off_direction"
    if is_no_op(base, changes):
        return None, "no_op"
    return dict(sorted(changes.items())), "valid"


class LLMProposer:
    """Asks a ChatPolicy (normally `hsjax.rollout.policy.HttpChatPolicy`) for knob changes per direction.

    Never raises for the model's sake: a failed request, a reply without a JSON candidate list and
    each invalid or duplicate proposal is dropped and counted (`counters`, `PROPOSAL_COUNTERS`)."""

    def __init__(self, policy, *, n_proposals: int = 4, sampling=None):
        from hsjax.rollout.policy import SamplingParams

        self.policy = policy
        self.n_proposals = int(n_proposals)
        self.sampling = sampling or SamplingParams(greedy=True, max_new_tokens=512)
        self.counters: collections.Counter = collections.Counter({k: 0 for k in PROPOSAL_COUNTERS})
        self.log: list[dict] = []

    def propose(self, base: hz.HarnessSpec, direction: Direction, failures: Sequence[dict],
                existing: Iterable[dict] = ()) -> list[dict]:
        seen = {_key(c) for c in existing}
        self.counters["requests"] += 1
        entry = {"direction": direction.name, "valid": [], "dropped": collections.Counter()}
        self.log.append(entry)
        try:
            reply = self.policy.chat([proposal_prompt(base, direction, failures, self.n_proposals)],
                                     self.sampling, [{"direction": direction.name}])[0]
        except Exception as e:  # transport or server failure: evolution goes on without proposals
            self.counters["request_failed"] += 1
            entry["error"] = f"{type(e).__name__}: {str(e)[:200]}"
            log.warning("LLM proposals for %s failed: %s", direction.name, entry["error"])
            return []
        items = parse_proposals(reply)
        if items is None:
            self.counters["malformed_reply"] += 1
            entry["error"] = "malformed_reply"
            return []
        out = []
        for item in items[: self.n_proposals]:
            self.counters["received"] += 1
            changes, reason = validate_proposal(item, base, direction)
            if changes is not None and _key(changes) in seen:
                changes, reason = None, "duplicate"
            self.counters[reason] += 1
            if changes is None:
                entry["dropped"][reason] += 1
                continue
            seen.add(_key(changes))
            entry["valid"].append(changes)
            out.append(changes)
        return out


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
    siblings: list[hz.HarnessSpec]
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


def evolve(base_results: Sequence[dict], tasks_by_id: dict, runner: EpisodeRunner, *,
           base: hz.HarnessSpec = hz.BASE, settings: EvolveSettings = EvolveSettings(),
           directions: Sequence[str] | None = None, proposer: LLMProposer | None = None,
           candidates: dict[str, list[dict]] | None = None) -> Evolution:
    """One sibling per repair direction that has failures and a candidate that beats the control
    without regressing (module docstring). `directions` limits the direction names; `candidates`
    ({direction: [knob changes]}) replaces the enumeration for those directions."""
    s = settings
    by_mode = group_failures(base_results)
    names = set(directions) if directions is not None else None
    unknown = sorted((names or set()) - set(DIRECTION_BY_NAME))
    if unknown:
        raise ValueError(f"unknown direction(s) {unknown}; known: {sorted(DIRECTION_BY_NAME)}")

    successes = [r for r in base_results if r["success"]]
    reg_sample = _sample(successes, s.regression_sample, s.seed, "regression")
    reg_jobs = [Job(base, tasks_by_id[r["task_id"]], int(r.get("sample_index", 0))) for r in reg_sample]
    reg_ref = sum(bool(r["success"]) for r in runner.run(reg_jobs))
    regression = {"n": len(reg_sample), "base_successes": reg_ref,
                  "tasks": [list(failure_key(r)) for r in reg_sample]}

    siblings, evidence, unrepaired = [], {}, {}
    counters = collections.Counter()
    for mode, failures in by_mode.items():
        direction = DIRECTION_BY_MODE.get(mode)
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

        results = runner.run(rescue_jobs(used, [base, *specs], tasks_by_id, s.tries))
        per = len(used) * s.tries
        control = _score(used, results[:per], s.tries)
        tried = [{"knobs": c, "source": src, "rescue": _score(used, results[per * (i + 1):per * (i + 2)], s.tries),
                  "regression": None, "status": "no_gain"} for i, (c, src) in enumerate(cands)]
        gainers = [i for i, t in enumerate(tried) if t["rescue"]["successes"] > control["successes"]]
        reg_results = runner.run([Job(specs[i], j.task, j.sample_index) for i in gainers for j in reg_jobs])
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


# ---------------------------------------------------------------- evolve mode

def _settings(cfg) -> EvolveSettings:
    return EvolveSettings(tries=int(cfg.tries), max_failures=int(cfg.max_failures),
                          min_failures=int(cfg.min_failures), max_candidates=int(cfg.max_candidates),
                          max_knobs=int(cfg.max_knobs), regression_sample=int(cfg.regression_sample),
                          regression_tolerance=float(cfg.regression_tolerance), seed=int(cfg.seed))


def build_proposer(cfg) -> LLMProposer | None:
    """`config.evolve.llm`: enabled, base_url, model, api_key_env, n_proposals, timeout, max_retries."""
    if not cfg.enabled:
        return None
    from hsjax.rollout.policy import HttpChatPolicy

    if not cfg.base_url or not cfg.model:
        raise ValueError("config.evolve.llm.enabled needs --config.evolve.llm.base_url=... and "
                         "--config.evolve.llm.model=...")
    policy = HttpChatPolicy(cfg.base_url, cfg.model, api_key_env=cfg.api_key_env or None,
                            timeout=float(cfg.timeout), max_retries=int(cfg.max_retries))
    return LLMProposer(policy, n_proposals=int(cfg.n_proposals))


def build_runner(config, policy_cfg, backend) -> EpisodeRunner:
    from hsjax.modes import evaluate

    ev = config.eval
    return EpisodeRunner(evaluate.build_policy(policy_cfg, int(config.seed)),
                         evaluate.sampling_params(config.sampling, int(config.seed)),
                         dbbench_episode_factory(backend, ev.rule), batch_size=int(ev.batch_size),
                         env_workers=int(ev.env_workers), max_context_tokens=int(ev.max_context_tokens) or None)


def run_base(runner: EpisodeRunner, tasks: Sequence, samples: int, base: hz.HarnessSpec = hz.BASE) -> list[dict]:
    return runner.run([Job(base, t, j) for j in range(samples) for t in tasks])


def main(config, workdir: str) -> dict:
    """Evolve a pool from the base harness's failures; write `pool.json` and, if
    `config.analysis.enabled`, the three properties (`hsjax.harness_s.analysis.write_properties`)."""
    from harness_envs.dbbench.data import load_split
    from hsjax.harness_s import analysis
    from hsjax.modes import evaluate

    t0 = time.perf_counter()
    workdir = pathlib.Path(workdir)
    tasks = load_split(config.split)
    if config.limit:
        tasks = tasks[: int(config.limit)]
    tasks_by_id = {t.task_id: t for t in tasks}
    backend = evaluate.build_backend(config.backend)
    try:
        runner = build_runner(config, config.policy, backend)
        base_results = run_base(runner, tasks, int(config.evolve.base_samples))
        proposer = build_proposer(config.evolve.llm)
        directions = [d for d in config.evolve.directions] or None
        evo = evolve(base_results, tasks_by_id, runner, settings=_settings(config.evolve),
                     directions=directions, proposer=proposer)
        modes = collections.Counter(r["failure_mode"] for r in base_results)
        pool_path = workdir / POOL_FILE
        hz.save_pool(pool_path, evo.siblings, benchmark="dbbench",
                     doc=f"Evolved from the base harness on {config.split} ({len(tasks)} tasks x "
                         f"{config.evolve.base_samples} samples), policy {config.policy.kind}, seed {config.seed}.",
                     base_outcomes=dict(sorted(modes.items())), settings=dataclasses.asdict(_settings(config.evolve)),
                     llm_log=proposer.log if proposer else None, **evo.pool_extra())
        print(f"Directional evolution on DBBench {config.split} ({len(tasks)} tasks), policy={config.policy.kind}: "
              f"base {modes['success']}/{len(base_results)} successes")
        print(evolution_table(evo))
        print(f"wrote {pool_path} ({len(evo.siblings)} siblings, {runner.rollouts} rollouts)")
        out = {"pool": str(pool_path), "siblings": [s.name for s in evo.siblings], "counters": evo.counters}
        if config.analysis.enabled and evo.siblings:
            pool = [hz.BASE, *evo.siblings]
            outcomes = collect_rescues(runner, [r for r in base_results if not r["success"]], pool, tasks_by_id,
                                       int(config.analysis.tries))
            second = None
            if config.analysis.compare.kind:
                runner_b = build_runner(config, config.analysis.compare, backend)
                base_b = run_base(runner_b, tasks, int(config.evolve.base_samples))
                second = collect_rescues(runner_b, [r for r in base_b if not r["success"]], pool, tasks_by_id,
                                         int(config.analysis.tries))
            props = analysis.write_properties(workdir, outcomes, evo.siblings, outcomes_b=second,
                                              labels=(config.policy.kind, "compare"))
            print(analysis.summary_text(props))
            out["analysis"] = {k: str(v) for k, v in props["paths"].items()}
    finally:
        backend.close()
    log.info("evolve finished in %.1fs", time.perf_counter() - t0)
    return out
