"""Eval mode: score a policy on DBBench under one or more harnesses.

    python run.py --config experiments/dbbench.py:eval --config.policy.kind=oracle --workdir W

Builds the backend, the tasks, the harness specs and the policy from the config; runs every
(harness, task) episode through `hsjax.rollout.engine.collect`; writes `W/eval/<config.name>.json` with
`config`, `summary` ({harness: evaluator.summarize(...)}) and `episodes` (one record per episode);
prints the per-type table (rows: types, categories, overall; columns: harnesses).
"""
from __future__ import annotations

import json
import logging
import os
import pathlib
import time
from typing import Any

import ml_collections

from harness_envs import harness as hz
from harness_envs.dbbench import evaluator
from harness_envs.dbbench.agents import NoisyAgent, OracleAgent
from harness_envs.dbbench.backends import make_backend
from harness_envs.dbbench.data import CATEGORIES, SELECT_TYPES, MODIFY_TYPES, load_split
from harness_envs.dbbench.env import DBBenchEpisode
from hsjax.infra import paths

log = logging.getLogger(__name__)

POLICY_KINDS = ("oracle", "scripted", "http", "jax")


# ---------------------------------------------------------------- building blocks

def harness_names(value) -> list[str]:
    """`config.harnesses` as a list: a list/tuple, or one comma-separated string."""
    items = [value] if isinstance(value, str) else list(value)
    names = [n.strip() for item in items for n in str(item).split(",") if n.strip()]
    if not names:
        raise ValueError("config.harnesses is empty; name at least one harness, e.g. ['base']")
    return names


def resolve_path(path: str) -> pathlib.Path:
    return paths.resolve(path)


def build_harnesses(names: list[str], pool_path: str | None) -> list[hz.HarnessSpec]:
    pool = hz.load_pool(resolve_path(pool_path)) if pool_path else {"base": hz.BASE}
    missing = [n for n in names if n not in pool]
    if missing:
        raise ValueError(f"harness(es) {missing} are not in the pool {pool_path or '(none: only base)'}; "
                         f"known: {sorted(pool)}")
    return [pool[n] for n in names]


def build_backend(cfg: ml_collections.ConfigDict):
    options: dict[str, Any] = {}
    if cfg.get("time_budget_s"):
        options["time_budget_s"] = float(cfg.time_budget_s)
    if cfg.kind == "mariadb" and cfg.get("url"):
        options["url"] = cfg.url
    return make_backend(cfg.kind, **options)


def build_policy(cfg: ml_collections.ConfigDict, seed: int):
    """The policy named by `cfg.kind`: a ChatPolicy (oracle, scripted, http) or the JAX policy."""
    kind = cfg.kind
    if kind == "oracle":
        return OracleAgent()
    if kind == "scripted":
        noise = dict(cfg.noise) if cfg.get("noise") is not None else {}
        return NoisyAgent({k: float(v) for k, v in noise.items() if float(v) > 0}, seed=seed)
    if kind == "http":
        from hsjax.rollout.policy import HttpChatPolicy

        if not cfg.get("base_url") or not cfg.get("model"):
            raise ValueError("policy.kind=http needs --config.policy.base_url=... and --config.policy.model=...")
        return HttpChatPolicy(cfg.base_url, cfg.model, api_key_env=cfg.get("api_key_env") or None,
                              timeout=float(cfg.get("timeout", 60.0)))
    if kind == "jax":
        from hsjax.rollout.policy import JaxPolicy

        ckpt = cfg.get("checkpoint")
        if not ckpt:
            raise ValueError("policy.kind=jax needs --config.policy.checkpoint=<HF dir or workdir>")
        if (pathlib.Path(ckpt) / "config.json").exists():
            return JaxPolicy.from_pretrained(ckpt, seed=seed)
        hf_dir = cfg.get("hf_dir")
        if not hf_dir:
            raise ValueError(f"policy.checkpoint={ckpt} is not an HF directory (no config.json); for a workdir "
                             "checkpoint also set --config.policy.hf_dir to the HF directory of its base model")
        from hsjax.infra.checkpoint import load_params

        policy = JaxPolicy.from_pretrained(hf_dir, seed=seed)
        policy.update_params(load_params(ckpt))
        return policy
    raise ValueError(f"config.policy.kind={kind!r} is not one of {POLICY_KINDS}")


def sampling_params(cfg: ml_collections.ConfigDict, seed: int):
    from hsjax.rollout.policy import SamplingParams

    return SamplingParams(temperature=float(cfg.temperature), top_p=float(cfg.top_p), top_k=int(cfg.top_k),
                          greedy=bool(cfg.greedy), max_new_tokens=int(cfg.max_new_tokens), seed=seed)


def episode_record(result: dict, trajectory=None) -> dict:
    """The JSON record of one episode: the episode's result plus rollout facts."""
    record = dict(result)
    if trajectory is not None:
        record["num_generated_tokens"] = getattr(trajectory, "num_generated_tokens", None)
        record["timings"] = getattr(trajectory, "timings", None)
        if getattr(trajectory, "error", None):
            record["rollout_error"] = trajectory.error
    return record


# ---------------------------------------------------------------- the table

def table_rows(summary: dict[str, dict]) -> list[str]:
    """Row keys present in any harness summary: types, then categories, then overall."""
    keys = set()
    for s in summary.values():
        keys.update(s)
    rows = [f"{t}_accuracy" for t in SELECT_TYPES if f"{t}_accuracy" in keys]
    rows += [f"{c}_accuracy" for c in CATEGORIES if f"{c}_accuracy" in keys]
    rows += [f"{t}_accuracy" for t in MODIFY_TYPES if f"{t}_accuracy" in keys and t not in CATEGORIES]
    return rows + ["overall_cat_accuracy"]


def format_table(summary: dict[str, dict]) -> str:
    names = list(summary)
    rows = table_rows(summary)
    label_w = max(len(r.removesuffix("_accuracy")) for r in rows) + 2
    col_w = max(8, *(len(n) + 2 for n in names))
    lines = ["".ljust(label_w) + "".join(n.rjust(col_w) for n in names)]
    for i, key in enumerate(rows):
        label = key.removesuffix("_accuracy")
        if i > 0 and (key == "overall_cat_accuracy" or (label == CATEGORIES[0])):
            lines.append("-" * (label_w + col_w * len(names)))
        cells = []
        for n in names:
            value = summary[n].get(key)
            cells.append(("-" if value is None else f"{100 * value:.1f}").rjust(col_w))
        lines.append(label.ljust(label_w) + "".join(cells))
    return "\n".join(lines)


# ---------------------------------------------------------------- main

def run_episodes(episodes: list, policy, sampling, *, batch_size: int, env_workers: int,
                 max_context_tokens: int | None, progress=None) -> list:
    from hsjax.rollout.engine import collect

    trajectories = []
    for start in range(0, len(episodes), batch_size):
        chunk = episodes[start:start + batch_size]
        trajectories.extend(collect(chunk, policy, sampling, max_context_tokens=max_context_tokens,
                                    env_workers=env_workers))
        if progress is not None:
            progress.update(len(chunk))
    return trajectories


def main(config: ml_collections.ConfigDict, workdir: str) -> dict:
    from tqdm import tqdm

    if config.eval.get("mode", "eval") == "rank1":
        from hsjax.harness_s import rank1

        return rank1.main(config, workdir)

    t0 = time.perf_counter()
    tasks = load_split(config.split)
    if config.limit:
        tasks = tasks[: int(config.limit)]
    specs = build_harnesses(harness_names(config.harnesses), config.get("pool") or None)
    policy = build_policy(config.policy, int(config.seed))
    sampling = sampling_params(config.sampling, int(config.seed))
    ev = config.eval
    max_ctx = int(ev.max_context_tokens) or None
    backend = build_backend(config.backend)
    records: list[dict] = []
    try:
        with tqdm(total=len(tasks) * len(specs), desc=f"dbbench/{config.split}", unit="ep") as bar:
            for spec in specs:
                bar.set_postfix_str(spec.name)
                episodes = [DBBenchEpisode(t, spec, backend, rule=ev.rule) for t in tasks]
                trajectories = run_episodes(episodes, policy, sampling, batch_size=max(1, int(ev.batch_size)),
                                            env_workers=int(ev.env_workers), max_context_tokens=max_ctx,
                                            progress=bar)
                records.extend(episode_record(tr.result, tr) for tr in trajectories)
    finally:
        backend.close()
    summary = {s.name: evaluator.summarize([r for r in records if r["harness"] == s.name]) for s in specs}
    out = {
        "config": config.to_dict(),
        "harnesses": {s.name: s.to_json() for s in specs},
        "summary": summary,
        "wall_s": time.perf_counter() - t0,
        "episodes": records,
    }
    path = pathlib.Path(workdir) / "eval" / f"{config.name}.json"
    os.makedirs(path.parent, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(out, ensure_ascii=False, default=str) + "\n")
    tmp.replace(path)
    print(f"DBBench {config.split} ({len(tasks)} tasks), policy={config.policy.kind}, "
          f"backend={config.backend.kind}: accuracy in %")
    print(format_table(summary))
    print(f"wrote {path}")
    log.info("eval written to %s in %.1fs", path, out["wall_s"])
    return {"path": str(path), "summary": summary}
