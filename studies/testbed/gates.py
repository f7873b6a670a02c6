"""The warm-start gates of testbed v2 (`config.mode = 'testbed_gates'`; docs/testbed.md, "Testbed v2").

    python run.py --config experiments/testbed.py:gates --config.model.hf_dir=W_sft/hf --workdir W_gates

Before any GRPO arm runs, the warm start must make the effect reachable. At the trainer's
temperature, on `gates.tasks_per_cell` tasks per cell:
    G1  visible names under base: held-out success >= 50%, within 10 points of the training words
    G2  hidden names under tables_first: opens with SHOW TABLES 60-80% of episodes, succeeds >= 40%
    G3  hidden names under base: opens with SHOW TABLES 4-12%, succeeds 2-8% (so most groups of 4
        fail entirely and need a rescue); the bands are `gates.g3_opens` and `gates.g3_success`
    G4  hidden names under schema_reminder: success within 15 points of G2's
Prints the table, writes `W/gates.json`. With `model.checkpoint` (a training workdir) it measures a
trained policy the same way: the opening rate under base on hidden held-out names is the mechanism.

`gates.regime` names the lookup regime (`studies.testbed.lookup.ROLES`): `names` as above; `apis`
(the AppWorld-protocol regime) has the same gates with docs_first for tables_first, api_list for
schema_reminder and opening with the app's API list for opening with SHOW TABLES.
"""
from __future__ import annotations

import os

import numpy as np

from hsjax import builders
from hsjax.infra import metrics as metrics_lib
from hsjax.policies.base import SamplingParams
from hsjax.rollout.runner import EpisodeRunner, Job
from studies.testbed import lookup


def cells_of(roles: lookup.LookupRoles) -> tuple[tuple[str, str, bool, str], ...]:
    """(cell, split key, hidden, harness) of the gates."""
    return (("visible/heldout/base", "heldout", False, "base"),
            ("visible/train/base", "train", False, "base"),
            (f"hidden/heldout/{roles.hint}", "heldout", True, roles.hint),
            ("hidden/heldout/base", "heldout", True, "base"),
            (f"hidden/heldout/{roles.reminder}", "heldout", True, roles.reminder))


CELLS = cells_of(lookup.ROLES["names"])


def cell_tasks(bench, split: str, seed: int, hidden: bool, n: int) -> list:
    """The first `n` tasks of (split, seed) whose table name is hidden (or visible)."""
    tasks = [t for t in bench.load_split(split, seed=seed, limit=4 * n + 12) if t.hidden == hidden]
    if len(tasks) < n:
        raise ValueError(f"{split} seed {seed}: only {len(tasks)} tasks with hidden={hidden}, wanted {n}")
    return tasks[:n]


def verdicts(cells: dict, g3_opens=(0.04, 0.12), g3_success=(0.02, 0.08),
             roles: lookup.LookupRoles = lookup.ROLES["names"]) -> dict[str, dict]:
    """{gate: {"pass": bool, "rule": text}} from the cells' success and opening rates (fractions);
    G3's bands are the config's `gates.g3_opens` / `gates.g3_success` (v2's by default)."""
    s = {name: c["success"] for name, c in cells.items()}
    o = {name: c[roles.metric] for name, c in cells.items()}
    hint, reminder = f"hidden/heldout/{roles.hint}", f"hidden/heldout/{roles.reminder}"
    opening = roles.label.removesuffix(" first %")
    g1 = s["visible/heldout/base"] >= 0.5 and abs(s["visible/heldout/base"] - s["visible/train/base"]) <= 0.10
    g2 = 0.6 <= o[hint] <= 0.8 and s[hint] >= 0.4
    g3 = (g3_opens[0] <= o["hidden/heldout/base"] <= g3_opens[1]
          and g3_success[0] <= s["hidden/heldout/base"] <= g3_success[1])
    band = lambda lo_hi: f"{100 * lo_hi[0]:g}-{100 * lo_hi[1]:g}%"  # noqa: E731
    # One-sided (the pre-registered rule as amended before any arm ran, docs/results.md): the
    # negative control must rescue about as often as the positive one, so that its failing to
    # transfer is not for want of rescues; more often is a stricter control. With an exact copy
    # schema_reminder recovers every guess (~96%) while tables_first succeeds only when it opens
    # with SHOW TABLES (G2 caps that at 80%), so a two-sided rule fails every warm start that
    # copies well.
    g4 = s[reminder] >= s[hint] - 0.15
    return {"G1": {"pass": g1, "rule": "visible held-out under base >= 50%, within 10 points of training words"},
            "G2": {"pass": g2, "rule": f"hidden under {roles.hint}: opens {opening} 60-80%, success >= 40%"},
            "G3": {"pass": g3, "rule": f"hidden under base: opens {opening} {band(g3_opens)}, "
                                       f"success {band(g3_success)}"},
            "G4": {"pass": g4, "rule": f"hidden under {roles.reminder}: success at least G2's less 15 points"}}


def format_gates(cells: dict, gates: dict, roles: lookup.LookupRoles = lookup.ROLES["names"]) -> str:
    lines = [f"{'cell':<34}{'n':>5}{'success %':>11}{roles.label:>21}"]
    for name, c in cells.items():
        lines.append(f"{name:<34}{c['n']:>5}{100 * c['success']:>11.1f}{100 * c[roles.metric]:>21.1f}")
    for gate, v in gates.items():
        lines.append(f"{gate}  {'PASS' if v['pass'] else 'FAIL'}  {v['rule']}")
    return "\n".join(lines)


def main(config, workdir: str) -> dict:
    os.makedirs(workdir, exist_ok=True)
    g = config.gates
    roles = lookup.ROLES[g.regime]
    bench = builders.make_benchmark(config)
    pool = builders.load_pool(config, bench)
    policy = builders.load_jax_policy(config.model.hf_dir, config.model.checkpoint, seed=config.seed)
    runner = EpisodeRunner(bench.make_episode, policy, SamplingParams(), batch_size=g.batch_size)
    sampling = SamplingParams(temperature=g.temperature, max_new_tokens=g.max_new_tokens, seed=config.seed)
    splits = {"heldout": (g.heldout_split, g.heldout_seed), "train": (g.train_split, g.train_seed)}
    jobs, spans = [], {}
    for name, split_key, hidden, harness in cells_of(roles):
        split, seed = splits[split_key]
        tasks = cell_tasks(bench, split, seed, hidden, g.tasks_per_cell)
        spans[name] = (len(jobs), len(jobs) + len(tasks))
        jobs += [Job(pool[harness], task) for task in tasks]
    trajs = runner.run(jobs, sampling)  # one batch: every cell shares the sampler's compiled shapes
    bench.close()
    cells, episodes = {}, []
    for name, (a, b) in spans.items():
        part = trajs[a:b]
        cells[name] = {"n": len(part), "success": float(np.mean([t.result["success"] for t in part])),
                       roles.metric: float(np.mean([roles.opens([x["text"] for x in t.turns]) for t in part]))}
        episodes += [{"cell": name, "task_id": t.result["task_id"], "success": t.result["success"],
                      "failure_mode": t.result["failure_mode"], "replies": [x["text"] for x in t.turns]}
                     for t in part]
    gates = verdicts(cells, tuple(g.g3_opens), tuple(g.g3_success), roles)
    print(format_gates(cells, gates, roles), flush=True)
    out = {"cells": cells, "gates": gates, "temperature": g.temperature, "episodes": episodes}
    metrics_lib.write_json(os.path.join(workdir, "gates.json"), out)
    return out
