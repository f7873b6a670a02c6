"""The pre-registered decision rule of testbed v4 (docs/results.md, "Testbed v4: pre-registration").

Per treatment and comparator, on per-seed values (held-out hidden success %, S640):
  works          one-sided exact Mann-Whitney p <= ALPHA (treatment > comparator), mean difference
                 >= MIN_EFFECT points, and the percentile bootstrap interval of the mean difference
                 (seeds resampled within each arm) above 0
  does_not_work  the interval's upper end below MIN_EFFECT: an effect of the required size is excluded
  inconclusive   otherwise
A claim works when its treatment works against every comparator, does not work when it does not
work against at least one, and is inconclusive otherwise (`main`: incomplete while a comparator
has not run and the others say works).

Rule 1 (validity, before any claim's arm; `validity`): the positive control works against each of
its regime's pre-registered comparators with a mean difference of at least RULE1_EFFECT points,
and the negative control does not work against policy_only: passes, fails, or incomplete while an
arm has not run.

`studies.testbed.power` simulates this same code; `decide` applies it to finished runs.
"""
from __future__ import annotations

import argparse
import functools
import json
import math
from typing import Dict, Mapping, Sequence

import numpy as np

from studies.testbed import lookup, names_report, runs

ALPHA = 0.05
MIN_EFFECT = 10.0
LEVEL = 0.95
RESAMPLES = 10_000
OUTCOMES = ("works", "does_not_work", "inconclusive")


@functools.lru_cache(maxsize=None)
def mann_whitney_tail(n1: int, n2: int) -> np.ndarray:
    """P(U >= u) for u = 0..n1*n2 under the null (no ties), by the counting recursion."""
    # counts[i][j][u]: orderings of i treatment and j comparator values with statistic u. The
    # largest value is a treatment one (it beats all j comparator values) or a comparator one.
    counts = [[None] * (n2 + 1) for _ in range(n1 + 1)]
    for i in range(n1 + 1):
        for j in range(n2 + 1):
            c = np.zeros(i * j + 1)
            if i == 0 or j == 0:
                c[0] = 1.0
            else:
                c[j:] += counts[i - 1][j]
                c[: i * (j - 1) + 1] += counts[i][j - 1]
            counts[i][j] = c
    dist = counts[n1][n2] / math.comb(n1 + n2, n1)
    return np.cumsum(dist[::-1])[::-1]


def mann_whitney_p(treatment: np.ndarray, comparator: np.ndarray) -> np.ndarray:
    """One-sided exact p of U (treatment > comparator), row-wise over [experiments, seeds] arrays.
    A tie counts one half; the null is the no-ties one (ties are rare in these values)."""
    u = u_statistic(treatment, comparator)
    return mann_whitney_tail(treatment.shape[1], comparator.shape[1])[np.ceil(u).astype(int)]


def u_statistic(treatment: np.ndarray, comparator: np.ndarray) -> np.ndarray:
    """Row-wise count of (treatment, comparator) pairs ordered treatment > comparator, a tie one half."""
    return ((treatment[:, :, None] > comparator[:, None, :]).sum((1, 2))
            + 0.5 * (treatment[:, :, None] == comparator[:, None, :]).sum((1, 2)))


def bootstrap_interval(treatment: np.ndarray, comparator: np.ndarray, rng: np.random.Generator,
                       resamples: int = RESAMPLES, level: float = LEVEL) -> tuple[np.ndarray, np.ndarray]:
    """Percentile bootstrap interval of the mean difference, row-wise, seeds resampled per arm."""
    experiments, n1 = treatment.shape
    n2 = comparator.shape[1]
    t = np.take_along_axis(treatment[None], rng.integers(0, n1, (resamples, experiments, n1)), -1).mean(-1)
    c = np.take_along_axis(comparator[None], rng.integers(0, n2, (resamples, experiments, n2)), -1).mean(-1)
    low, high = np.quantile(t - c, [(1 - level) / 2, (1 + level) / 2], axis=0)
    return low, high


def outcomes(treatment: np.ndarray, comparator: np.ndarray, rng: np.random.Generator,
             resamples: int = RESAMPLES) -> np.ndarray:
    """The rule's outcome (an OUTCOMES string) for every row of [experiments, seeds] arrays."""
    low, high = bootstrap_interval(treatment, comparator, rng, resamples)
    return _verdict(mann_whitney_p(treatment, comparator), treatment.mean(1) - comparator.mean(1), low, high)


def _verdict(p: np.ndarray, diff: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    works = (p <= ALPHA) & (diff >= MIN_EFFECT) & (low > 0)
    return np.where(works, "works", np.where(high < MIN_EFFECT, "does_not_work", "inconclusive"))


def decide(treatment: Sequence[float], comparator: Sequence[float], seed: int = 0) -> Dict[str, object]:
    """The rule on one treatment's and one comparator's per-seed values, with what it read."""
    t, c = np.asarray([treatment], float), np.asarray([comparator], float)
    low, high = bootstrap_interval(t, c, np.random.default_rng(seed))
    p, diff = mann_whitney_p(t, c), t.mean(1) - c.mean(1)
    return {"outcome": str(_verdict(p, diff, low, high)[0]), "p": float(p[0]), "mean_difference": float(diff[0]),
            "interval": (float(low[0]), float(high[0])),
            "cles": float(u_statistic(t, c)[0]) / (t.shape[1] * c.shape[1]), "seeds": (t.shape[1], c.shape[1])}


def decide_claim(treatment: Sequence[float], comparators: Mapping[str, Sequence[float]],
                 seed: int = 0) -> Dict[str, object]:
    """A claim's outcome: works against every comparator, does not work against one, else inconclusive."""
    each = {name: decide(treatment, values, seed) for name, values in comparators.items()}
    found = [d["outcome"] for d in each.values()]
    outcome = ("works" if all(o == "works" for o in found)
               else "does_not_work" if "does_not_work" in found else "inconclusive")
    return {"outcome": outcome, "comparators": each}


# The pre-registered claims: (treatment, comparators). A missing arm is reported, not decided.
CLAIMS = {
    "(a) transfer, router with a validity floor": ("names_harness_s_floor", ("names_policy_only", "names_base_reroll")),
    "(a) transfer, issue-40 router": ("names_harness_s_router", ("names_policy_only", "names_base_reroll")),
    "(a) transfer, published router": ("names_harness_s", ("names_policy_only", "names_base_reroll")),
    "(b) base-context distillation": ("names_harness_s_base", ("names_sft_hinted", "names_tables_first_base_is",
                                                                "names_tables_first_base", "names_policy_only")),
    "negative control": ("names_schema_reminder", ("names_policy_only",)),
}


# Rule 1's arms, as pre-registered in docs/results.md: v4's positive control against every
# comparator rule 2 uses; the API regime's against policy_only.
POSITIVE_CONTROL, NEGATIVE_CONTROL = "names_tables_first_base", "names_schema_reminder"
RULE1_EFFECT = 20.0
RULE1_COMPARATORS = {
    "names": ("names_policy_only", "names_base_reroll", "names_sft_hinted", "names_tables_first_base_is"),
    "apis": ("names_policy_only",),
}


def validity(values: Mapping[str, Mapping[int, float]], regime: str, seed: int = 0) -> Dict[str, object]:
    """Rule 1 on a sweep's per-seed values: {"outcome": passes | fails | incomplete, "positive",
    "negative" (their `decide_claim`s or None), "missing" (arms not run)}."""
    comparators = RULE1_COMPARATORS[regime]
    missing = [a for a in (POSITIVE_CONTROL, NEGATIVE_CONTROL, *comparators) if a not in values]
    arm = lambda name: list(values[name].values())
    present = {c: arm(c) for c in comparators if c in values}
    positive = decide_claim(arm(POSITIVE_CONTROL), present, seed) if POSITIVE_CONTROL in values and present else None
    negative = (decide_claim(arm(NEGATIVE_CONTROL), {"names_policy_only": arm("names_policy_only")}, seed)
                if NEGATIVE_CONTROL in values and "names_policy_only" in values else None)
    failed = ((positive is not None and any(d["outcome"] != "works" or d["mean_difference"] < RULE1_EFFECT
                                            for d in positive["comparators"].values()))
              or (negative is not None and negative["outcome"] == "works"))
    outcome = "fails" if failed else "incomplete" if missing else "passes"
    return {"outcome": outcome, "positive": positive, "negative": negative, "missing": missing}


def root_regime(root) -> str:
    """The lookup regime of a sweep's runs (`lookup.regime_of` their configs); one per sweep."""
    found = {lookup.regime_of(run.config) for run in runs.load_sweep(root)}
    if len(found) > 1:
        raise ValueError(f"{root} mixes runs of the {sorted(found)} regimes; decide each regime's sweep on its own")
    return found.pop() if found else "names"


def per_seed_values(root, endpoint: str = "final") -> Dict[str, Dict[int, float]]:
    """{arm: {seed: held-out hidden success %}} of a sweep: at its last evaluation (`final`) or at a
    budget of its `budget_curve.json` (`S640`: the budget 640)."""
    out: Dict[str, Dict[int, float]] = {}
    for run in runs.load_sweep(root):
        primary = names_report.run_keys(run)[0]
        if endpoint == "final":
            final = run.last(primary)
        else:
            path = run.workdir / "budget_curve.json"
            if not path.exists():
                continue
            curve = json.loads(path.read_text())
            final = dict(zip(curve["budgets"], curve["metrics"])).get(int(endpoint.lstrip("S")), {}).get(primary)
        if final is not None:
            out.setdefault(run.arm, {})[run.seed] = 100.0 * float(final)
    return out


def main(argv=None, print_fn=print) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", required=True, help="a sweep root (or its archive) of names_* arms")
    parser.add_argument("--endpoint", default="final", help="final (the last evaluation) or S<budget>")
    args = parser.parse_args(argv)
    values = per_seed_values(args.root, args.endpoint)
    print_fn(f"python -m studies.testbed.rules --root {args.root} --endpoint {args.endpoint}")
    regime = root_regime(args.root)
    rule1 = validity(values, regime)
    print_fn(f"\nRule 1 (validity, the {regime} regime): **{rule1['outcome']}**"
             + (f" (not run: {', '.join(rule1['missing'])})" if rule1["missing"] else ""))
    print_fn("| control | comparator | seeds | mean difference (95% interval) | p | outcome |\n|---|---|---|---|---|---|")
    for control, decided in ((POSITIVE_CONTROL, rule1["positive"]), (NEGATIVE_CONTROL, rule1["negative"])):
        for name, d in (decided or {"comparators": {}})["comparators"].items():
            lo, hi = d["interval"]
            print_fn(f"| {control} | {name} | {d['seeds'][0]} vs {d['seeds'][1]} | {d['mean_difference']:+.1f} "
                     f"({lo:+.1f}, {hi:+.1f}) | {d['p']:.3f} | {d['outcome']} |")
    print_fn("\n| claim | treatment | comparator | seeds | mean difference (95% interval) | p | CLES | outcome |\n"
             "|---|---|---|---|---|---|---|---|")
    out = {"rule 1": rule1}
    for claim, (treatment, comparators) in CLAIMS.items():
        present = {c: list(values[c].values()) for c in comparators if c in values}
        if treatment not in values or not present:
            print_fn(f"| {claim} | {treatment} | – | – | – | – | – | not run |")
            continue
        decided = decide_claim(list(values[treatment].values()), present)
        missing = [c for c in comparators if c not in present]
        if missing and decided["outcome"] == "works":  # works only against the comparators that ran
            decided["outcome"] = "incomplete"
        out[claim] = decided
        for name, d in decided["comparators"].items():
            lo, hi = d["interval"]
            print_fn(f"| {claim} | {treatment} | {name} | {d['seeds'][0]} vs {d['seeds'][1]} | "
                     f"{d['mean_difference']:+.1f} ({lo:+.1f}, {hi:+.1f}) | {d['p']:.3f} | {d['cles']:.2f} | "
                     f"{d['outcome']} |")
        print_fn(f"| {claim} | **{decided['outcome']}** | " + (f"not run: {', '.join(missing)}" if missing else "")
                 + " | | | | | |")
    return out


if __name__ == "__main__":
    main()
