"""The testbed results report: tables, curves and behaviour analysis over a sweep of arm workdirs.

A sweep root holds `ROOT/<arm>/seed<k>/` training workdirs of `experiments/testbed.py` (the
`warmstart` arm scores the warm start once, at step 0). Everything here is a pure function of the
loaded runs (studies.testbed.runs), plus a few matplotlib (Agg) plots and the CLI:

    python -m studies.testbed.report --root ROOT --out DIR

prints the results table, success at equal rollout budgets and the behaviour table, and writes the
PNGs and `report.json` to DIR. `studies/testbed/ablations.ipynb` draws the same from a notebook.

Conventions: success is under the base harness, greedy; "final" is an arm's last evaluation; mean
and std are over seeds (sample std, ddof=1; 0 for a single seed). Arms are compared at equal
executor rollouts (base + rescue, `rollouts/total`), not only at equal steps: rescue spends extra
rollouts per step. Behaviour counts every policy reply of an episode record as one action.
"""
from __future__ import annotations

import argparse
import collections
import json
import pathlib
from typing import Sequence

import numpy as np

from hsjax.harness_s import analysis
from hsjax.infra.metrics import write_json
from studies.testbed.behaviour import ACTION_KINDS, behaviour
from studies.testbed.runs import HEADLINE, TRAIN_SPLIT, WARMSTART, Run, by_arm, families, load_sweep


# ---------------------------------------------------------------- results

def mean_std(values) -> dict | None:
    values = [float(v) for v in values if v is not None]
    if not values:
        return None
    std = float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
    return {"mean": float(np.mean(values)), "std": std, "n": len(values)}


def _success(records, types=None) -> float | None:
    ok = [bool(r["success"]) for r in records if types is None or r["type"] in types]
    return float(np.mean(ok)) if ok else None


def run_summary(run: Run) -> dict:
    """One run's final numbers (the `results_table` columns)."""
    held, train = run.final_eval(HEADLINE), run.final_eval(TRAIN_SPLIT)
    fam_a, fam_b = families(run)
    train_eps = train["episodes"] if train else []
    return {
        "step": max([row.get("step", 0) for row in run.metrics] or [0]),
        "heldout": _success(held["episodes"]) if held else None,
        "train": _success(train_eps) if train else None,
        "train_A": _success(train_eps, fam_a),
        "train_B": _success(train_eps, fam_b),
        "rollouts": run.last("rollouts/total", 0),
        "rescue_rollouts": run.last("rollouts/rescue_total", 0),
        "wall_s": sum(row.get(k, 0.0) for row in run.metrics for k in ("time/rollout", "time/update", "time/eval")),
    }


RESULT_COLUMNS = ("heldout", "train", "train_A", "train_B", "rollouts", "rescue_rollouts", "wall_s")


def results_table(runs: Sequence[Run]) -> list[dict]:
    """Per arm: n seeds and {"mean", "std", "n"} (or None) of every RESULT_COLUMNS value."""
    rows = []
    for arm, group in by_arm(runs).items():
        summaries = [run_summary(r) for r in group]
        row = {"arm": arm, "seeds": [r.seed for r in group], "step": max(s["step"] for s in summaries)}
        row.update({c: mean_std(s[c] for s in summaries) for c in RESULT_COLUMNS})
        rows.append(row)
    return rows


def _cell(v: dict | None, scale=100.0, digits=1) -> str:
    return "–" if v is None else f"{v['mean'] * scale:.{digits}f} ± {v['std'] * scale:.{digits}f}"


def markdown_table(rows: Sequence[dict]) -> str:
    head = ("| arm | seeds | steps | held-out (%) | train (%) | train A (%) | train B (%) | rollouts | "
            "rescue rollouts | wall (s) |")
    lines = [head, "|" + "---|" * head.count(" | ") + "---|"]
    for r in rows:
        pct = [_cell(r[c]) for c in ("heldout", "train", "train_A", "train_B")]
        counts = [_cell(r[c], 1.0, 0) for c in ("rollouts", "rescue_rollouts", "wall_s")]
        lines.append("| " + " | ".join([r["arm"], str(len(r["seeds"])), str(r["step"]), *pct, *counts]) + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------- curves and equal budgets

def _eval_points(run: Run, split: str) -> list[tuple[int, float, float]]:
    """(step, cumulative rollouts, success) at every evaluation of `split`."""
    key = f"eval/{split}/base/success"
    return [(row["step"], row.get("rollouts/total", 0), row[key]) for row in run.metrics if key in row]


def _aggregate(runs: Sequence[Run], split: str, x: str) -> list[tuple[float, float, float]]:
    per_step = collections.defaultdict(list)
    for r in runs:
        for step, rollouts, success in _eval_points(r, split):
            per_step[step].append((rollouts, success))
    out = []
    for step, pts in sorted(per_step.items()):
        success = mean_std(p[1] for p in pts)
        out.append((float(np.mean([p[0] for p in pts])) if x == "rollouts" else step, success["mean"], success["std"]))
    return out


def _with_warmstart(runs: Sequence[Run], split: str, x: str) -> dict[str, list[tuple]]:
    arms = by_arm(runs)
    out = {arm: _aggregate(group, split, x) for arm, group in arms.items()}
    start = out.get(WARMSTART)
    if start:
        for arm, points in out.items():
            if arm != WARMSTART and (not points or points[0][0] != 0):
                out[arm] = [start[0], *points]
    return out


def curves(runs: Sequence[Run], split: str) -> dict[str, list[tuple[int, float, float]]]:
    """{arm: [(step, mean success, std)]}; arms start from the warm start's step-0 point if present."""
    return _with_warmstart(runs, split, "step")


def success_vs_rollouts(runs: Sequence[Run], split: str) -> dict[str, list[tuple[float, float, float]]]:
    """{arm: [(mean cumulative executor rollouts at the eval step, mean success, std)]}."""
    return _with_warmstart(runs, split, "rollouts")


def success_at_budget(runs: Sequence[Run], split: str, budget: float) -> dict[str, dict | None]:
    """Per arm, over seeds: success at each run's last evaluation with rollouts/total <= budget (the
    warm start counts as 0 rollouts), with the mean rollouts actually spent there ("rollouts")."""
    warm = [p for r in runs if r.arm == WARMSTART for p in _eval_points(r, split)]
    start = (0, 0, float(np.mean([p[2] for p in warm]))) if warm else None
    out = {}
    for arm, group in by_arm(runs).items():
        chosen = []
        for r in group:
            points = [p for p in _eval_points(r, split) if p[1] <= budget] or ([start] if start else [])
            if points:
                chosen.append(points[-1])
        out[arm] = mean_std(p[2] for p in chosen)
        if out[arm] is not None:
            out[arm]["rollouts"] = float(np.mean([p[1] for p in chosen]))
    return out


def default_budgets(runs: Sequence[Run]) -> list[float]:
    """Half and all of the smallest final rollout count among the training arms (every arm reaches it)."""
    finals = [r.last("rollouts/total", 0) for r in runs if r.arm != WARMSTART]
    smallest = min([f for f in finals if f] or [0])
    return sorted({float(smallest) // 2, float(smallest)}) if smallest else []


def markdown_budget_table(runs: Sequence[Run], budgets: Sequence[float],
                          splits: Sequence[str] = (HEADLINE, TRAIN_SPLIT)) -> str:
    cols = [(s, b) for s in splits for b in budgets]
    lines = ["| arm | " + " | ".join(f"{s} ≤{b:g} rollouts (%)" for s, b in cols) + " |",
             "|---|" + "---|" * len(cols)]
    table = {(s, b): success_at_budget(runs, s, b) for s, b in cols}
    for arm in by_arm(runs):
        lines.append(f"| {arm} | " + " | ".join(_cell(table[c][arm]) for c in cols) + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------- behaviour

def _final_records(run: Run, split: str | None) -> list[dict]:
    splits = [split] if split else sorted({s for s, _ in run.evals})
    return [e for s in splits if (ev := run.final_eval(s)) for e in ev["episodes"]]


def behaviour_table(runs: Sequence[Run], split: str | None = None) -> list[dict]:
    """Rows {arm, source, harness, **behaviour}: the warm start under base (step-0 eval), each arm's
    final eval under base, and each sibling harness's rescue rollouts during the arm's training.
    `split` None pools both evaluation splits."""
    rows = []
    for arm, group in by_arm(runs).items():
        records = [e for r in group for e in _final_records(r, split)]
        source = "warm start (eval, step 0)" if arm == WARMSTART else "final eval"
        rows.append({"arm": arm, "source": source, "harness": "base", **behaviour(records)})
        rescue = collections.defaultdict(list)
        for r in group:
            for e in r.episodes():
                if e.get("harness", "base") != "base":
                    rescue[e["harness"]].append(e)
        for harness, eps in sorted(rescue.items()):
            rows.append({"arm": arm, "source": "rescue rollouts", "harness": harness, **behaviour(eps)})
    return rows


def markdown_behaviour(rows: Sequence[dict]) -> str:
    kinds = ACTION_KINDS[:5]
    lines = ["| arm | source | harness | episodes | " + " | ".join(f"{k} (%)" for k in kinds)
             + " | recovered (%) | top error | top failure mode |",
             "|---|---|---|---|" + "---|" * (len(kinds) + 3)]
    top = lambda d: next((f"{k} {100 * v:.0f}%" for k, v in d.items()), "–")  # dicts are sorted by share
    for r in rows:
        cells = [f"{100 * r['actions'].get(k, 0.0):.0f}" for k in kinds]
        lines.append(f"| {r['arm']} | {r['source']} | {r['harness']} | {r['episodes']} | " + " | ".join(cells)
                     + f" | {100 * r['recovered_after_error']:.0f} | {top(r['errors'])} | {top(r['failure_modes'])} |")
    return "\n".join(lines)


def inspect_cases(runs: Sequence[Run], split: str = HEADLINE, n: int = 3) -> list[dict]:
    """`n` tasks of `split` side by side across arms (each arm's lowest seed, final eval): tasks where
    the arms disagree on success come first. Each case: task_id, type and per arm the episode's
    success, failure mode, replies, statements and observations."""
    finals = {arm: {e["task_id"]: e for e in ev["episodes"]}
              for arm, group in by_arm(runs).items() if (ev := group[0].final_eval(split))}
    if not finals:
        return []
    common = [t for t in next(iter(finals.values())) if all(t in eps for eps in finals.values())]
    disagree = lambda t: len({finals[a][t]["success"] for a in finals}) > 1
    chosen = sorted(common, key=lambda t: not disagree(t))[:n]
    return [{"task_id": t, "type": next(iter(finals.values()))[t]["type"],
             "arms": {arm: {"success": eps[t]["success"], "failure_mode": eps[t]["failure_mode"],
                            "replies": eps[t].get("replies", []),
                            "statements": [x.get("sql") for x in eps[t].get("turns", []) if x.get("sql")],
                            "observations": [x.get("observation") for x in eps[t].get("turns", [])]}
                      for arm, eps in finals.items()}}
            for t in chosen]


# ---------------------------------------------------------------- plots

def plot_curves(runs: Sequence[Run], path, x: str = "step") -> pathlib.Path:
    """Success per arm (mean ± std over seeds) against training step or cumulative rollouts, per split."""
    plt = analysis._plt()  # the project's one Agg set-up
    fn = curves if x == "step" else success_vs_rollouts
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, split in zip(axes, (HEADLINE, TRAIN_SPLIT)):
        for arm, pts in fn(runs, split).items():
            if not pts:
                continue
            xs, ms, ss = (np.array(v, dtype=float) for v in zip(*pts))
            style = dict(marker="*", markersize=12, linestyle="none") if arm == WARMSTART else dict(marker="o")
            ax.plot(xs, ms, label=arm, **style)
            ax.fill_between(xs, ms - ss, ms + ss, alpha=0.15)
        ax.set_title(f"{split} (base harness)")
        ax.set_xlabel("training step" if x == "step" else "executor rollouts (cumulative)")
        ax.set_ylim(-0.02, 1.02)
    axes[0].set_ylabel("success")
    axes[1].legend(fontsize=7)
    return analysis._save(fig, path)


def plot_behaviour(rows: Sequence[dict], path) -> pathlib.Path:
    """Stacked bars of action kinds, one bar per behaviour-table row."""
    plt = analysis._plt()
    fig, ax = plt.subplots(figsize=(2 + 0.6 * len(rows), 4.5))
    bottom = np.zeros(len(rows))
    for kind in ACTION_KINDS:
        vals = np.array([r["actions"].get(kind, 0.0) for r in rows])
        ax.bar(range(len(rows)), vals, bottom=bottom, label=kind)
        bottom += vals
    labels = [f"{r['arm']}\n{r['harness'] if r['harness'] != 'base' else r['source']}" for r in rows]
    ax.set_xticks(range(len(rows)), labels, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("share of actions")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1, 1))
    return analysis._save(fig, path)


def plot_probe(probe_dir, out_dir) -> list[pathlib.Path]:
    """Plots of the probe's `properties_<label>.json` (locality, complementarity, nonstationarity as
    written by hsjax.harness_s.analysis) and `nonstationarity.json`, when present; [] when there is no probe."""
    probe_dir, out_dir = pathlib.Path(probe_dir), pathlib.Path(out_dir)
    plots = {"locality": analysis.plot_locality, "complementarity": analysis.plot_complementarity,
             "nonstationarity": analysis.plot_nonstationarity}
    paths = []
    for p in sorted(probe_dir.glob("properties_*.json")) if probe_dir.is_dir() else []:
        label = p.stem[len("properties_"):]
        props = json.loads(p.read_text())
        paths += [fn(props[name], out_dir / f"probe_{name}_{label}.png") for name, fn in plots.items() if props.get(name)]
    if (probe_dir / "nonstationarity.json").exists():
        ns = json.loads((probe_dir / "nonstationarity.json").read_text())
        paths.append(analysis.plot_nonstationarity(ns, out_dir / "probe_nonstationarity.png"))
    return paths


def write_plots(runs: Sequence[Run], out_dir, behaviour_rows: Sequence[dict] | None = None,
                probe_dir=None) -> dict[str, pathlib.Path]:
    """curves.png, success_vs_rollouts.png, behaviour.png and the probe's plots (`probe_dir`, if any)."""
    out_dir = pathlib.Path(out_dir)
    rows = behaviour_table(runs) if behaviour_rows is None else behaviour_rows
    paths = {"curves": plot_curves(runs, out_dir / "curves.png"),
             "success_vs_rollouts": plot_curves(runs, out_dir / "success_vs_rollouts.png", x="rollouts"),
             "behaviour": plot_behaviour(rows, out_dir / "behaviour.png")}
    paths.update({p.stem: p for p in (plot_probe(probe_dir, out_dir) if probe_dir else [])})
    return paths


# ---------------------------------------------------------------- CLI

def report(root, out_dir, budgets: Sequence[float] | None = None, cases: int = 3) -> dict:
    """Everything the CLI prints and writes; returns the report.json content (with the markdown)."""
    runs = load_sweep(root)
    budgets = list(budgets) if budgets else default_budgets(runs)
    rows, brows = results_table(runs), behaviour_table(runs)
    out = {"root": str(root), "results": rows, "budgets": budgets,
           "at_budget": {s: {str(b): success_at_budget(runs, s, b) for b in budgets} for s in (HEADLINE, TRAIN_SPLIT)},
           "curves": {s: curves(runs, s) for s in (HEADLINE, TRAIN_SPLIT)},
           "success_vs_rollouts": {s: success_vs_rollouts(runs, s) for s in (HEADLINE, TRAIN_SPLIT)},
           "behaviour": brows, "cases": inspect_cases(runs, HEADLINE, cases),
           "markdown": {"results": markdown_table(rows), "behaviour": markdown_behaviour(brows),
                        "at_budget": markdown_budget_table(runs, budgets)}}
    plots = write_plots(runs, out_dir, brows, probe_dir=pathlib.Path(root) / "probe")
    out["plots"] = {k: str(v) for k, v in plots.items()}
    write_json(pathlib.Path(out_dir, "report.json"), out)
    return out


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", required=True, help="sweep root holding <arm>/seed<k>/ workdirs")
    parser.add_argument("--out", required=True, help="directory for the PNGs and report.json")
    parser.add_argument("--budgets", type=float, nargs="*", help="rollout budgets (default: half and all "
                        "of the smallest final rollout count among the training arms)")
    parser.add_argument("--cases", type=int, default=3, help="held-out episodes shown side by side")
    args = parser.parse_args(argv)
    out = report(args.root, args.out, args.budgets, args.cases)
    for title, key in (("Results", "results"), ("Success at equal rollout budgets", "at_budget"),
                       ("Behaviour", "behaviour")):
        print(f"## {title}\n\n{out['markdown'][key]}\n")
    print(f"wrote {len(out['plots'])} plots and report.json to {args.out}")
    return out


if __name__ == "__main__":
    main()
