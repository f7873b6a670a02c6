"""Probe mode: the three pool properties and Rank-1 inference with the learned testbed policy.

    python run.py --config experiments/testbed_probe.py --config.model.hf_dir=W_sft/hf \
        --config.probe.checkpoints=hf,W_run:5,W_run:15 --workdir W_probe

For each checkpoint spec (`hf`: the params in model.hf_dir; `<train workdir>:<step>`: that run's
checkpoint in the same model and tokenizer) the policy samples at `probe.temperature`:

1. base rollouts on `probe.num_tasks` tasks of `probe.split` (task seed `probe.task_seed`),
   `probe.samples` per task;
2. every base failure re-run under every sibling of the pool and under the base again (the control)
   (`evolve.collect_rescues`): locality and complementarity of those outcomes (`hsjax.harness_s.analysis`);
   nonstationarity compares the first and the last checkpoint;
3. Rank-1 vs the base harness at equal executor rollouts (`hsjax.harness_s.rank1`) on every set of
   `probe.rank1_sets`, with success profiles fitted by that checkpoint's policy on a disjoint
   profiling set, for the checkpoints `probe.rank1_checkpoints` selects.

Writes `properties_<label>.json`, `locality_<label>.png`, `complementarity_<label>.png`,
`rank1_<label>.json`, `nonstationarity.{json,png}` (two checkpoints or more) and `probe.json` (the
summary table's numbers) into the workdir; prints the summary table. Every stage restarts the
policy's key sequence at (config.seed, stage), so a checkpoint's numbers do not depend on the
checkpoints probed before it.
"""
from __future__ import annotations

import collections
import dataclasses
import json
import logging
import pathlib
import re
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from harness_envs.harness import HarnessSpec
from hsjax import builders
from hsjax.harness_s import analysis, rank1
from hsjax.harness_s.evolve import collect_rescues
from hsjax.infra import checkpoint as ckpt_lib
from hsjax.infra import paths
from hsjax.infra.metrics import write_json
from hsjax.policies.base import SamplingParams
from hsjax.policies.jax_policy import JaxPolicy
from hsjax.rollout.runner import EpisodeRunner, Job

log = logging.getLogger(__name__)

HF = "hf"
RANK1_CHECKPOINTS = ("last", "first_last", "all", "none")
# Sampling seeds of the stages (SamplingParams.seed); rank-1 sets and arms add their index.
SEED_BASE, SEED_RESCUE, SEED_PROFILE, SEED_RANK1 = 1, 2, 3, 100


class ProbeError(ValueError):
    """The probe's config names something that is not there (a checkpoint, a step, a split)."""


# ---------------------------------------------------------------- checkpoint specs

@dataclasses.dataclass(frozen=True)
class CheckpointSpec:
    """`hf` (workdir None: the warm start's params) or a training run's checkpoint at `step`."""

    label: str
    workdir: str | None = None
    step: int | None = None

    @property
    def text(self) -> str:
        return HF if self.workdir is None else f"{self.workdir}:{self.step}"


def _items(value) -> list[str]:
    """A comma-separated string or a sequence of them, as stripped items."""
    parts = [value] if isinstance(value, str) else list(value)
    return [s.strip() for p in parts for s in str(p).split(",") if s.strip()]


def parse_checkpoints(value) -> list[CheckpointSpec]:
    """`probe.checkpoints` as specs with file-name-safe labels (`hf`, `<workdir name>_step<N>`)."""
    specs = []
    for item in _items(value):
        if item == HF:
            specs.append(CheckpointSpec(HF))
            continue
        workdir, sep, step = item.rpartition(":")
        if not sep or not workdir or not step.isdigit():
            raise ProbeError(f"probe.checkpoints: {item!r} is neither 'hf' nor '<train workdir>:<step>' "
                             "(e.g. /tmp/run:15)")
        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", pathlib.Path(workdir).name) or "run"
        specs.append(CheckpointSpec(f"{name}_step{int(step)}", workdir, int(step)))
    if not specs:
        raise ProbeError("probe.checkpoints is empty; name at least one, e.g. 'hf' or 'W_run:15'")
    labels = collections.Counter(s.label for s in specs)
    if any(n > 1 for n in labels.values()):
        raise ProbeError(f"probe.checkpoints: labels {sorted(l for l, n in labels.items() if n > 1)} occur "
                         "twice; name each checkpoint once (workdirs with the same base name collide)")
    return specs


def check_checkpoint(spec: CheckpointSpec) -> None:
    """Raises ProbeError unless the spec's training workdir holds a checkpoint at its step."""
    if spec.workdir is None:
        return
    workdir = pathlib.Path(spec.workdir)
    if not workdir.is_dir():
        raise ProbeError(f"probe.checkpoints: {spec.text!r} names the workdir {workdir}, which does not exist; "
                         "give the --workdir of a training run")
    ckpt_dir = ckpt_lib.resolve_ckpt_dir(workdir)
    if not ckpt_dir.is_dir():
        raise ProbeError(f"probe.checkpoints: {spec.text!r}: {workdir} has no checkpoints directory "
                         f"({ckpt_dir}); is it the workdir of a training run that saved a checkpoint?")
    with ckpt_lib.Checkpointer(ckpt_dir, keep=None, read_only=True) as ckpt:
        steps = ckpt.all_steps()
    if spec.step not in steps:
        raise ProbeError(f"probe.checkpoints: {spec.text!r}: no checkpoint step {spec.step} in {ckpt_dir}; "
                         f"saved steps: {steps}")


def load_params(spec: CheckpointSpec, warm_params):
    """The spec's params in the structure, shapes and dtypes of the warm start's params."""
    if spec.workdir is None:
        return warm_params
    loaded = ckpt_lib.load_params(spec.workdir, spec.step)
    want, got = jax.tree.structure(warm_params), jax.tree.structure(loaded)
    if want != got:
        raise ProbeError(f"checkpoint {spec.text}: its params are not shaped like model.hf_dir's (tree "
                         f"{got} vs {want}); probe a run that started from this warm start")
    for (path, w), g in zip(jax.tree_util.tree_leaves_with_path(warm_params), jax.tree.leaves(loaded)):
        if w.shape != g.shape:
            raise ProbeError(f"checkpoint {spec.text}: {jax.tree_util.keystr(path)} has shape {g.shape}, "
                             f"model.hf_dir has {w.shape}; probe a run that started from this warm start")
    # The warm start's dtypes and placement keep the sampler's compiled programs shared across
    # checkpoints: jit keys its cache on whether an argument is committed to a device, and restored
    # arrays are (the warm start's are not), so as restored each checkpoint compiled them anew.
    return jax.tree.map(_placed_like, warm_params, loaded)


def _placed_like(warm, loaded):
    if warm.committed:
        return jax.device_put(loaded.astype(warm.dtype), warm.sharding)
    return jnp.asarray(np.asarray(loaded), dtype=warm.dtype)


def rank1_labels(specs: Sequence[CheckpointSpec], which: str) -> set[str]:
    if which not in RANK1_CHECKPOINTS:
        raise ProbeError(f"probe.rank1_checkpoints={which!r} is not one of {RANK1_CHECKPOINTS}")
    chosen = {"last": specs[-1:], "first_last": [specs[0], specs[-1]], "all": specs, "none": []}[which]
    return {s.label for s in chosen}


def parse_pairs(value, what: str) -> list[tuple[str, int]]:
    """'name:int' items (rank1 sets `split:task seed`, arms `probe:rollouts`)."""
    out = []
    for item in _items(value):
        name, sep, num = item.rpartition(":")
        if not sep or not name or not num.isdigit():
            raise ProbeError(f"{what}: {item!r} is not '<name>:<integer>'")
        out.append((name, int(num)))
    return out


# ---------------------------------------------------------------- measurements

def base_summary(results: Sequence[dict], summarize) -> dict:
    n, ok = len(results), sum(bool(r["success"]) for r in results)
    modes = collections.Counter(r["failure_mode"] for r in results if not r["success"])
    return {"n": n, "successes": ok, "success": ok / n if n else 0.0,
            "failure_modes": dict(modes.most_common()), "summary": summarize(results)}


def locality_split(loc: dict) -> dict:
    """Pooled rescue rate on the diagonal (each sibling on the mode it was evolved for) and off it."""
    targets = {h: v["target_mode"] for h, v in loc.get("per_sibling", {}).items()}
    pooled = {"diagonal": [0, 0], "off_diagonal": [0, 0]}
    for i, h in enumerate(loc["siblings"]):
        for j, m in enumerate(loc["modes"]):
            cell = pooled["diagonal" if targets.get(h) == m else "off_diagonal"]
            cell[0] += loc["successes"][i][j]
            cell[1] += loc["n"][i][j]
    return {k: {"successes": s, "n": n, "rate": s / n if n else None} for k, (s, n) in pooled.items()}


def control_summary(outcomes: Sequence[dict]) -> dict:
    """The base harness re-run on its own failures: what a re-roll alone rescues."""
    runs = [o for o in outcomes if o["harness"] == analysis.CONTROL]
    rescued = {(o["task_id"], o["sample_index"]) for o in runs if o["success"]}
    failures = {(o["task_id"], o["sample_index"]) for o in outcomes}
    return {"rollouts": len(runs), "successes": sum(o["success"] for o in runs),
            "coverage": len(rescued) / len(failures) if failures else 0.0}


def properties(outcomes: Sequence[dict], siblings: Sequence[HarnessSpec], targets: dict) -> dict:
    loc = analysis.locality(outcomes, siblings, targets)
    return {"locality": loc, "locality_split": locality_split(loc),
            "complementarity": analysis.complementarity(outcomes, siblings),
            "control": control_summary(outcomes)}


def rank1_stage(make_runner, pool, profile_tasks: Sequence,
                rank1_sets: dict[str, list], arms: Sequence[tuple[str, int]], summarize) -> dict:
    """Profiles fitted on `profile_tasks`, then every arm on the tasks of all sets at once (one
    straggler tail per arm, not per set), its records split by set afterwards."""
    specs = list(pool.values())
    runner = make_runner(SEED_PROFILE)
    profiles = rank1.fit_profiles(runner, specs, profile_tasks, base=pool.base)
    router = rank1.build_router(specs, profiles)
    out = {"profiles": profiles.to_dict(), "profiling_rollouts": runner.rollouts,
           "profile_task_ids": [t.task_id for t in profile_tasks], "arms": {},
           "sets": {name: {} for name in rank1_sets}}
    all_tasks = [t for tasks in rank1_sets.values() for t in tasks]
    for j, (probe, rollouts) in enumerate(arms):
        key = f"probe={probe},B={rollouts}"
        runner = make_runner(SEED_RANK1 + j)
        run = rank1.run_rank1(runner, router, pool, all_tasks, rollouts=rollouts, probe=probe)
        out["arms"][key] = {"probe": probe, "rollouts_per_task": rollouts, "rollouts": run["rollouts"],
                            "runner_rollouts": runner.rollouts, "seconds": runner.seconds}
        start = 0
        for name, tasks in rank1_sets.items():
            records = run["tasks"][start:start + len(tasks)]
            start += len(tasks)
            out["sets"][name][key] = {
                "probe": probe, "rollouts_per_task": rollouts, "n_tasks": len(tasks),
                # Counted from the rollouts each task's record holds, per arm.
                "rollouts": {"base": sum(len(r["base_failure_modes"]) for r in records),
                             "rank1": sum(len(r["rank1_failure_modes"]) for r in records)},
                "table": rank1.table(records, rollouts, summarize),
                "choices": dict(collections.Counter(r["chosen"] for r in records).most_common()),
                "tasks": records}
    return out


# ---------------------------------------------------------------- files and table

def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.0f}"


def summary_table(rows: Sequence[dict]) -> str:
    """Per checkpoint: base success, failures, coverage of the failures (pool union, best single
    sibling, the base re-run), pooled locality rate on and off the diagonal; then per checkpoint,
    rank-1 set and arm: tasks solved by rank1 and by base, and the rollouts each arm spent."""
    head = (f"{'checkpoint':22}{'base%':>6}{'fails':>6}{'union%':>7}{'best1%':>7}  {'best sibling':18}"
            f"{'ctrl%':>6}{'diag%':>6}{'off%':>6}")
    lines = [head, "-" * len(head)]
    for r in rows:
        comp, split = r["complementarity"], r["locality_split"]
        lines.append(f"{r['label'][:21]:22}{_pct(r['base_success']):>6}{r['n_failures']:>6}"
                     f"{_pct(comp['union']):>7}{_pct(comp['best_single']):>7}  {str(comp['best_sibling'])[:17]:18}"
                     f"{_pct(r['control_coverage']):>6}{_pct(split['diagonal']['rate']):>6}"
                     f"{_pct(split['off_diagonal']['rate']):>6}")
    r1 = [(r["label"], key, cell) for r in rows for key, cell in r.get("rank1", {}).items()]
    if r1:
        head = f"{'checkpoint':22}{'rank-1 set | arm':34}{'rank1%':>7}{'base%':>7}{'rollouts':>10}"
        lines += ["", head, "-" * len(head)]
        lines += [f"{label[:21]:22}{key[:33]:34}{_pct(c['rank1']):>7}{_pct(c['base']):>7}{c['rollouts']:>10}"
                  for label, key, c in r1]
    return "\n".join(lines)


def probe_checkpoint(spec: CheckpointSpec, make_runner, cfg, workdir: pathlib.Path, *, tasks: Sequence,
                     pool, bench, rank1_inputs=None) -> tuple[dict, list[dict]]:
    """Stages 1-3 (module docstring) with the policy's current params: writes the checkpoint's files,
    returns its summary row and its rescue outcomes. `rank1_inputs`: (profiling tasks, {set: tasks},
    arms), or None to skip Rank-1."""
    t0 = time.perf_counter()
    base, siblings = pool.base, list(pool.siblings)
    runner = make_runner(SEED_BASE)
    base_results = runner.results([Job(base, t, j) for j in range(int(cfg.samples)) for t in tasks])
    timings, rollouts = {"base_s": runner.seconds}, {"base": runner.rollouts}
    failures = [r for r in base_results if not r["success"]]
    runner = make_runner(SEED_RESCUE)
    outcomes = collect_rescues(runner, failures, [base, *siblings], {t.task_id: t for t in tasks}, int(cfg.tries))
    timings["rescue_s"], rollouts["rescue"] = runner.seconds, runner.rollouts
    props = properties(outcomes, siblings, bench.target_modes(siblings))
    if outcomes:
        analysis.plot_locality(props["locality"], workdir / f"locality_{spec.label}.png")
        analysis.plot_complementarity(props["complementarity"], workdir / f"complementarity_{spec.label}.png")
    base_sum = base_summary(base_results, bench.summarize)
    row = {"label": spec.label, "checkpoint": spec.text, "base_success": base_sum["success"],
           "n_failures": len(failures), "complementarity": props["complementarity"],
           "locality_split": props["locality_split"], "control_coverage": props["control"]["coverage"]}
    if rank1_inputs is not None:
        t1 = time.perf_counter()
        r1 = rank1_stage(make_runner, pool, *rank1_inputs, bench.summarize)
        timings["rank1_s"] = time.perf_counter() - t1
        rollouts["profiling"] = r1["profiling_rollouts"]
        rollouts["rank1"] = {a: v["runner_rollouts"] for a, v in r1["arms"].items()}
        write_json(workdir / f"rank1_{spec.label}.json",
                    {"label": spec.label, "checkpoint": spec.text, "temperature": float(cfg.temperature),
                     "profile_split": f"{cfg.profile_split}:{cfg.profile_task_seed}", **r1})
        row["rank1"] = {f"{name} | {arm}": {"rank1": v["table"]["rank1"]["accuracy"],
                                            "base": v["table"]["base"]["accuracy"], "rollouts": v["rollouts"]["rank1"]}
                        for name, arms in r1["sets"].items() for arm, v in arms.items()}
    timings["total_s"] = time.perf_counter() - t0
    row["timings"], row["rollouts"] = timings, rollouts
    write_json(workdir / f"properties_{spec.label}.json",
                {"label": spec.label, "checkpoint": spec.text, "temperature": float(cfg.temperature),
                 "tasks": f"{cfg.split}:{cfg.task_seed} x {len(tasks)}", "samples": int(cfg.samples),
                 "tries": int(cfg.tries), "base": base_sum, **props, "rollouts": rollouts, "timings": timings,
                 "outcomes": outcomes,
                 "base_results": [{k: r[k] for k in ("task_id", "type", "sample_index", "success", "failure_mode",
                                                     "num_turns", "num_tokens")} for r in base_results]})
    log.info("probe %s: %s", spec.label, json.dumps(timings))
    return row, outcomes


# ---------------------------------------------------------------- main

def main(config, workdir: str) -> dict:
    t_start = time.perf_counter()
    workdir = pathlib.Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    cfg = config.probe
    # Everything the config names is checked before the model loads: a typo fails in a second.
    specs = parse_checkpoints(cfg.checkpoints)
    for spec in specs:
        check_checkpoint(spec)
    with_rank1 = rank1_labels(specs, cfg.rank1_checkpoints)
    arms = parse_pairs(cfg.rank1_arms, "probe.rank1_arms")
    for probe, rollouts in arms:
        if probe not in rank1.PROBES or rollouts < (2 if probe == "base" else 1):
            raise ProbeError(f"probe.rank1_arms: '{probe}:{rollouts}' must be 'none:<B >= 1>' or 'base:<B >= 2>' "
                             "(the base probe is one of the B rollouts)")
    hf_dir = paths.resolve(config.model.hf_dir) if config.model.hf_dir else None
    if hf_dir is None or not (builders.is_hf_dir(hf_dir) or (hf_dir / "checkpoints").is_dir()):
        raise ProbeError(f"model.hf_dir={config.model.hf_dir!r} is neither an HF model directory nor a training "
                         "workdir; pass the warm start, e.g. --config.model.hf_dir=W_sft/hf or W_sft "
                         "(experiments/testbed.py:sft writes both)")
    (workdir / "config.json").write_text(config.to_json_best_effort(indent=2, sort_keys=True))

    bench = builders.make_benchmark(config)
    tasks = bench.load_split(cfg.split, limit=int(cfg.num_tasks), seed=int(cfg.task_seed))
    rank1_sets = {f"{split}:{seed}": bench.load_split(split, limit=int(cfg.rank1_tasks), seed=seed)
                  for split, seed in parse_pairs(cfg.rank1_sets, "probe.rank1_sets")} if with_rank1 else {}
    profile_tasks = bench.load_split(cfg.profile_split, limit=int(cfg.profile_tasks),
                                     seed=int(cfg.profile_task_seed)) if with_rank1 else []
    profile_ids = {t.task_id for t in profile_tasks}
    for name, set_tasks in rank1_sets.items():
        if profile_ids & {t.task_id for t in set_tasks}:
            raise ProbeError(f"the rank-1 set {name} shares tasks with the profiling set {cfg.profile_split} "
                             f"(task seed {cfg.profile_task_seed}); profile on another task seed")
    pool = builders.load_pool(config, bench)
    siblings = list(pool.siblings)

    model_cfg, warm_params, tokenizer = builders.make_model(config)
    policy = JaxPolicy(model_cfg, warm_params, tokenizer, seed=int(config.seed), prompt_step=int(cfg.prompt_step))

    def make_runner(stage_seed: int) -> EpisodeRunner:
        # Each stage starts the key sequence afresh: its draws do not depend on earlier stages.
        policy.reseed(int(config.seed))
        sampling = SamplingParams(temperature=float(cfg.temperature), max_new_tokens=int(cfg.max_new_tokens),
                                  seed=stage_seed)
        return EpisodeRunner(bench.make_episode, policy, sampling, batch_size=int(cfg.batch_size),
                             env_workers=int(cfg.env_workers), max_context_tokens=int(cfg.max_context_tokens) or None)

    rows, outcomes_by_label = [], {}
    try:
        for spec in specs:
            policy.update_params(load_params(spec, warm_params))
            row, outcomes = probe_checkpoint(
                spec, make_runner, cfg, workdir, tasks=tasks, pool=pool, bench=bench,
                rank1_inputs=(profile_tasks, rank1_sets, arms) if spec.label in with_rank1 else None)
            rows.append(row)
            outcomes_by_label[spec.label] = outcomes
    finally:
        bench.close()

    out: dict[str, Any] = {"checkpoints": rows}
    if len(specs) > 1:
        first, last = specs[0].label, specs[-1].label
        ns = analysis.nonstationarity(outcomes_by_label[first], outcomes_by_label[last], siblings, (first, last))
        write_json(workdir / "nonstationarity.json", ns)
        if ns["modes"]:
            analysis.plot_nonstationarity(ns, workdir / "nonstationarity.png")
        out["nonstationarity"] = {k: ns[k] for k in ("labels", "mean_abs_delta", "flipped_modes")}
    out["wall_s"] = time.perf_counter() - t_start
    write_json(workdir / "probe.json", out)
    print(f"Testbed probe: {len(tasks)} tasks of {cfg.split}:{cfg.task_seed} x {cfg.samples} at T={cfg.temperature}, "
          f"pool {config.pool} ({len(siblings)} siblings)")
    print(summary_table(rows))
    if "nonstationarity" in out:
        ns = out["nonstationarity"]
        shift = "-" if ns["mean_abs_delta"] is None else f"{ns['mean_abs_delta']:.3f}"
        print(f"nonstationarity {' -> '.join(ns['labels'])}: mean |change| of by-mode Beta means {shift}, "
              f"best sibling flipped for {ns['flipped_modes'] or 'no mode'}")
    print(f"wrote {workdir} in {out['wall_s']:.0f}s")
    return out
