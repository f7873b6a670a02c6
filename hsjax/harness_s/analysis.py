"""The three properties of a sibling pool, measured from rescue outcomes: locality,
complementarity, nonstationarity. JSON results and PNG plots (matplotlib, Agg backend).

An outcome is one rollout of a base failure re-run under a harness, as made by
`hsjax.harness_s.evolve.collect_rescues` (or by the trainer's rescue slots):

    {"harness": "schema_grounding", "task_id": "dev-0003", "sample_index": 0, "task_type": "counting",
     "base_failure_mode": "sql_error_loop", "success": True, ...}

- locality: rescue-rate matrix sibling x base failure mode; a pool is diagonal-dominant when each
  sibling rescues the mode it was evolved for at a higher rate than any other mode;
- complementarity: the fraction of base failures rescued by at least one sibling (any try), beside
  the best single sibling's fraction;
- nonstationarity: each sibling's profile (rescue rate overall and Beta(1, 1) posterior means by
  mode) under two policies, and its change; which sibling is best for a mode may flip.

The functions take outcomes, not policies, so a training run or the testbed reuses them with the
learned policy's rollouts. docs/harness_s.md, "The three properties", shows the figures obtained.
"""
from __future__ import annotations

import collections
import pathlib
from typing import Any, Iterable, Sequence

import numpy as np

from hsjax.harness_s.router import Profiles
from hsjax.infra.metrics import write_json

CONTROL = "base"  # the base harness re-run on its own failures: a control, not a pool member


def _names(siblings: Iterable[Any] | None, outcomes: Sequence[dict]) -> list[str]:
    if siblings is None:
        return sorted({o["harness"] for o in outcomes} - {CONTROL})
    return [getattr(s, "name", s) for s in siblings if getattr(s, "name", s) != CONTROL]


def _failure_id(o: dict) -> tuple[str, int]:
    return str(o["task_id"]), int(o.get("sample_index", 0))


def mode_order(outcomes: Sequence[dict]) -> list[str]:
    """Base failure modes, most frequent first (distinct failures), then by name."""
    seen = {}
    for o in outcomes:
        seen[_failure_id(o)] = o["base_failure_mode"]
    counts = collections.Counter(seen.values())
    return sorted(counts, key=lambda m: (-counts[m], m))


# ---------------------------------------------------------------- locality

def locality(outcomes: Sequence[dict], siblings: Iterable[Any] | None = None,
             targets: dict[str, str | None] | None = None) -> dict:
    """Rescue rate of every (sibling, base failure mode) cell: successes / rollouts, with counts.

    `targets` ({sibling: failure mode}, e.g. `benchmark.target_modes(specs)`) adds each sibling's best mode and
    whether its target beats every other mode (`diagonal_dominant`)."""
    names = _names(siblings, outcomes)
    modes = mode_order(outcomes)
    cells = {(h, m): [0, 0] for h in names for m in modes}
    for o in outcomes:
        cell = cells.get((o["harness"], o["base_failure_mode"]))
        if cell is not None:
            cell[0] += bool(o["success"])
            cell[1] += 1
    rate = [[cells[h, m][0] / cells[h, m][1] if cells[h, m][1] else None for m in modes] for h in names]
    out = {"siblings": names, "modes": modes, "rate": rate,
           "successes": [[cells[h, m][0] for m in modes] for h in names],
           "n": [[cells[h, m][1] for m in modes] for h in names]}
    if targets is not None:
        per, dominant = {}, True
        for i, h in enumerate(names):
            row = {m: r for m, r in zip(modes, rate[i]) if r is not None}
            target = targets.get(h)
            best = max(row, key=lambda m: (row[m], m == target)) if row else None
            others = [r for m, r in row.items() if m != target]
            if target in row:
                ok = not others or row[target] > max(others)
                margin = row[target] - max(others) if others else row[target]
            else:
                ok, margin = None, None  # the target mode did not occur among the base failures
            dominant = dominant and ok is not False
            per[h] = {"target_mode": target, "best_mode": best, "target_rate": row.get(target),
                      "dominant": ok, "margin": margin}
        out["per_sibling"] = per
        out["diagonal_dominant"] = dominant
    return out


# ---------------------------------------------------------------- complementarity

def complementarity(outcomes: Sequence[dict], siblings: Iterable[Any] | None = None) -> dict:
    """Coverage: the share of base failures that a sibling rescues in at least one try; for the
    pool, in at least one try of at least one sibling (the union), beside the best single sibling."""
    names = _names(siblings, outcomes)
    failures: dict[tuple, str] = {}
    covered: dict[str, set] = {h: set() for h in names}
    for o in outcomes:
        fid = _failure_id(o)
        failures[fid] = o["base_failure_mode"]
        if o["success"] and o["harness"] in covered:
            covered[o["harness"]].add(fid)
    n = len(failures)
    union = set().union(*covered.values()) if covered else set()
    per = {h: len(c) / n if n else 0.0 for h, c in covered.items()}
    best = max(per, key=lambda h: (per[h], h)) if per else None
    modes = collections.Counter(failures.values())
    by_mode = {m: {"n": c, "union": sum(1 for f in union if failures[f] == m) / c,
                   "best_single": max((sum(1 for f in covered[h] if failures[f] == m) / c for h in names),
                                      default=0.0)}
               for m, c in sorted(modes.items(), key=lambda kv: (-kv[1], kv[0]))}
    return {"n_failures": n, "union": len(union) / n if n else 0.0, "union_count": len(union),
            "best_single": per.get(best, 0.0), "best_sibling": best, "gain": (len(union) / n if n else 0.0)
            - per.get(best, 0.0), "per_sibling": per, "by_mode": by_mode}


# ---------------------------------------------------------------- nonstationarity

def _profiles(outcomes: Sequence[dict]):
    p = Profiles(prior=(1.0, 1.0))
    p.update(outcomes)
    return p


def nonstationarity(outcomes_a: Sequence[dict], outcomes_b: Sequence[dict], siblings: Iterable[Any] | None = None,
                    labels: tuple[str, str] = ("a", "b")) -> dict:
    """Each sibling's profile under policy a and policy b: overall rescue rate, Beta(1, 1) posterior
    mean by base failure mode (with counts), their differences (b - a), the mean absolute change over
    modes seen under both, and per mode the best sibling under each policy (`flipped` if it differs)."""
    names = _names(siblings, list(outcomes_a) + list(outcomes_b))
    pa, pb = _profiles(outcomes_a), _profiles(outcomes_b)
    la, lb = labels

    def overall(p, h):
        if h not in p:
            return None, 0.0
        s, f = p[h].overall
        return (s / (s + f) if s + f else None), s + f

    def mode_cell(p, h, m):
        if h not in p or m not in p[h].by_mode:
            return None, 0.0
        a, b = p.posterior(h, "mode", m)
        return a / (a + b), sum(p[h].by_mode[m])

    modes = sorted(set(mode_order(outcomes_a)) | set(mode_order(outcomes_b)))
    per = {}
    for h in names:
        (ra, na), (rb, nb) = overall(pa, h), overall(pb, h)
        by_mode, deltas = {}, []
        for m in modes:
            (ma, ca), (mb, cb) = mode_cell(pa, h, m), mode_cell(pb, h, m)
            if ma is None and mb is None:
                continue
            delta = mb - ma if ma is not None and mb is not None else None
            if delta is not None:
                deltas.append(abs(delta))
            by_mode[m] = {la: ma, lb: mb, f"n_{la}": ca, f"n_{lb}": cb, "delta": delta}
        per[h] = {"overall": {la: ra, lb: rb, f"n_{la}": na, f"n_{lb}": nb,
                              "delta": rb - ra if ra is not None and rb is not None else None},
                  "by_mode": by_mode, "mean_abs_delta": sum(deltas) / len(deltas) if deltas else None}
    best = {}
    for m in modes:
        def top(p):
            scored = [(p.posterior(h, "mode", m), h) for h in names if h in p and m in p[h].by_mode]
            return max(scored, key=lambda x: (x[0][0] / sum(x[0]), x[1]))[1] if scored else None
        ba, bb = top(pa), top(pb)
        best[m] = {la: ba, lb: bb, "flipped": ba is not None and bb is not None and ba != bb}
    shifts = [v["mean_abs_delta"] for v in per.values() if v["mean_abs_delta"] is not None]
    return {"labels": [la, lb], "siblings": names, "modes": modes, "per_sibling": per, "best_by_mode": best,
            "mean_abs_delta": sum(shifts) / len(shifts) if shifts else None,
            "flipped_modes": sorted(m for m, v in best.items() if v["flipped"])}


# ---------------------------------------------------------------- router accuracy

def router_accuracy(router, groups: Sequence[tuple[Any, Sequence[dict]]], sibling_for_mode: dict[str, str]) -> dict:
    """Top-1 accuracy of `router` (an `hsjax.harness_s.router.Router`) on failed groups [(task, failed results)].

    A group whose rollouts all failed in one mode is right when the router's first choice is the
    sibling evolved for that mode (`accuracy`, over these groups). A group with several modes has
    no single right answer; it is right when the first choice repairs one of them (`mixed_accuracy`).
    Groups with a mode that has no sibling are not scored (`skipped`)."""
    counts = {"single": [0, 0], "mixed": [0, 0]}
    skipped = collections.Counter()
    per_mode: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    confusions = collections.Counter()
    for task, failed in groups:
        modes = sorted({r["failure_mode"] for r in failed})
        wanted = {sibling_for_mode.get(m) for m in modes}
        if None in wanted:
            skipped["+".join(modes)] += 1
            continue
        got = router.top_k(task, failed).harnesses[0]
        kind = "single" if len(modes) == 1 else "mixed"
        ok = got in wanted
        counts[kind][0] += ok
        counts[kind][1] += 1
        if kind == "single":
            per_mode[modes[0]][0] += ok
            per_mode[modes[0]][1] += 1
        if not ok:
            confusions[f"{'+'.join(modes)} -> {got}"] += 1
    (c1, n1), (c2, n2) = counts["single"], counts["mixed"]
    return {"accuracy": c1 / n1 if n1 else None, "correct": c1, "scored": n1,
            "mixed_accuracy": c2 / n2 if n2 else None, "mixed_correct": c2, "mixed_scored": n2,
            "per_mode": {m: {"correct": c, "n": n} for m, (c, n) in sorted(per_mode.items())},
            "skipped": dict(skipped), "confusions": dict(confusions)}


# ---------------------------------------------------------------- plots

def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_locality(loc: dict, path: str | pathlib.Path) -> pathlib.Path:
    plt = _plt()
    rate = np.array([[np.nan if r is None else r for r in row] for row in loc["rate"]], dtype=float)
    fig, ax = plt.subplots(figsize=(1.2 + 1.0 * len(loc["modes"]), 1.0 + 0.5 * len(loc["siblings"])))
    im = ax.imshow(rate, vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto")
    ax.set_xticks(range(len(loc["modes"])), loc["modes"], rotation=35, ha="right")
    ax.set_yticks(range(len(loc["siblings"])), loc["siblings"])
    targets = {h: v["target_mode"] for h, v in loc.get("per_sibling", {}).items()}
    for i, h in enumerate(loc["siblings"]):
        for j, m in enumerate(loc["modes"]):
            if loc["n"][i][j]:
                ax.text(j, i, f"{rate[i, j]:.2f}\n{loc['successes'][i][j]}/{loc['n'][i][j]}", ha="center",
                        va="center", fontsize=7, color="white" if rate[i, j] < 0.6 else "black",
                        fontweight="bold" if targets.get(h) == m else "normal")
    ax.set_title("locality: rescue rate, sibling x base failure mode")
    fig.colorbar(im, ax=ax, fraction=0.04)
    return _save(fig, path)


def plot_complementarity(comp: dict, path: str | pathlib.Path) -> pathlib.Path:
    plt = _plt()
    names = list(comp["per_sibling"])
    values = [comp["per_sibling"][h] for h in names] + [comp["union"]]
    fig, ax = plt.subplots(figsize=(1.5 + 0.8 * len(values), 3.5))
    colors = ["tab:blue"] * len(names) + ["tab:orange"]
    ax.bar(range(len(values)), values, color=colors)
    ax.set_xticks(range(len(values)), names + ["pool (union)"], rotation=35, ha="right")
    ax.set_ylim(0, 1)
    ax.set_ylabel(f"share of {comp['n_failures']} base failures rescued")
    ax.set_title(f"complementarity: union {comp['union']:.2f} vs best single {comp['best_single']:.2f}")
    return _save(fig, path)


def plot_nonstationarity(ns: dict, path: str | pathlib.Path) -> pathlib.Path:
    plt = _plt()
    la, lb = ns["labels"]
    names, modes = ns["siblings"], ns["modes"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(4 + 0.9 * (len(names) + len(modes)), 3.8))
    x = np.arange(len(names))
    for off, lab in ((-0.2, la), (0.2, lb)):
        vals = [ns["per_sibling"][h]["overall"][lab] or 0.0 for h in names]
        ax1.bar(x + off, vals, width=0.4, label=lab)
    ax1.set_xticks(x, names, rotation=35, ha="right")
    ax1.set_ylim(0, 1)
    ax1.set_title("rescue rate overall")
    ax1.legend()
    delta = np.array([[np.nan if (c := ns["per_sibling"][h]["by_mode"].get(m)) is None or c["delta"] is None
                       else c["delta"] for m in modes] for h in names], dtype=float)
    im = ax2.imshow(delta, vmin=-1, vmax=1, cmap="coolwarm", aspect="auto")
    ax2.set_xticks(range(len(modes)), modes, rotation=35, ha="right")
    ax2.set_yticks(range(len(names)), names)
    ax2.set_title(f"change of Beta mean by mode ({lb} - {la})")
    fig.colorbar(im, ax=ax2, fraction=0.04)
    return _save(fig, path)


def _save(fig, path) -> pathlib.Path:
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _plt().close(fig)
    return path


# ---------------------------------------------------------------- files

def write_properties(workdir: str | pathlib.Path, outcomes: Sequence[dict], siblings: Sequence[Any],
                     targets: dict[str, str | None],
                     outcomes_b: Sequence[dict] | None = None, labels: tuple[str, str] = ("a", "b")) -> dict:
    """Writes `analysis/{locality,complementarity,nonstationarity}.json` and `plots/*.png` under
    `workdir` (nonstationarity only with `outcomes_b`); returns the results and their `paths`."""
    workdir = pathlib.Path(workdir)
    if labels[0] == labels[1]:
        labels = (labels[0], labels[1] + "_b")
    results: dict[str, Any] = {"locality": locality(outcomes, siblings, targets),
                               "complementarity": complementarity(outcomes, siblings)}
    plots = {"locality": plot_locality, "complementarity": plot_complementarity}
    if outcomes_b is not None:
        results["nonstationarity"] = nonstationarity(outcomes, outcomes_b, siblings, labels)
        plots["nonstationarity"] = plot_nonstationarity
    paths = {}
    for name, data in results.items():
        paths[name] = write_json(workdir / "analysis" / f"{name}.json", data)
        paths[f"{name}_png"] = plots[name](data, workdir / "plots" / f"{name}.png")
    return {**results, "paths": paths}


def summary_text(props: dict) -> str:
    loc, comp = props["locality"], props["complementarity"]
    lines = [f"locality: diagonal-dominant={loc.get('diagonal_dominant')}"]
    for h, v in loc.get("per_sibling", {}).items():
        rate = "-" if v["target_rate"] is None else f"{v['target_rate']:.2f}"
        lines.append(f"  {h:24} target {v['target_mode']} rate {rate}, best mode {v['best_mode']}")
    lines.append(f"complementarity: union {comp['union']:.3f} ({comp['union_count']}/{comp['n_failures']}) vs best "
                 f"single {comp['best_single']:.3f} ({comp['best_sibling']})")
    ns = props.get("nonstationarity")
    if ns is not None:
        shift = "-" if ns["mean_abs_delta"] is None else f"{ns['mean_abs_delta']:.3f}"
        lines.append(f"nonstationarity ({' vs '.join(ns['labels'])}): mean |change| of by-mode Beta means {shift}, "
                     f"best sibling flipped for {ns['flipped_modes'] or 'no mode'}")
    return "\n".join(lines)
