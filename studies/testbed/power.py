"""Power of the testbed's decision rules, simulated from the v3 per-seed outcomes (issue 40, item 4).

    python -m studies.testbed.power [--sims 4000] [--seeds 3,5,8,10,12,15,20] [--out power.json]

A run's outcome (held-out hidden success under base, %) is nearly all-or-nothing: the run learns
the behaviour (success near the learnt level) or it does not (near 0). Each arm is therefore a
mixture: with probability `learn` a run draws from N(learnt_mean, learnt_sd), else from
N(0.5, 0.8), clipped to [0, 100] (v3: learnt runs 80.7-93.0%, the others 0.0-1.7%). A scenario
pairs a treatment arm with one comparator; power is the share of simulated experiments, `n` seeds
per arm, in which a rule says "works". With both arms drawn alike it is the rule's false-positive
rate.

The rules:
  ordered    v3's rule 2: mean difference >= 10 points and every (treatment, comparator) seed pair
             ordered -- a perfect method passes it only when no comparator seed learns
  mann_whitney   one-sided Mann-Whitney U on the per-seed values, p <= alpha (exact null
             distribution; at 3 seeds per arm its smallest p is 1/20 = alpha, reached only ordered)
  fisher     one-sided Fisher exact on the share of seeds that learn (> 50%), p <= alpha
  permutation    one-sided permutation test on the difference of means (1,000 random relabellings)
  works      the pre-registered rule of docs/results.md ("Testbed v4: pre-registration"),
             `studies.testbed.rules`: mann_whitney, the mean difference >= 10 points and its
             bootstrap 95% interval above 0
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import json
from typing import Callable, Dict, Sequence

import numpy as np
from scipy import stats

from studies.testbed import rules

ALPHA, MIN_EFFECT = rules.ALPHA, rules.MIN_EFFECT
LEARNT_AT = 50.0  # a run "learnt" the behaviour when its success is above this
NOT_LEARNT = (0.5, 0.8)  # mean, sd of a run that did not learn (v3: 0.0-1.7%)


@dataclasses.dataclass(frozen=True)
class Arm:
    learn: float  # probability that a run learns the behaviour
    learnt_mean: float = 85.0  # v3's learnt runs: harness_s_base 84.3 +- 3.5, tables_first 89.2 +- 5.7
    learnt_sd: float = 4.5

    def sample(self, rng: np.random.Generator, shape) -> np.ndarray:
        learnt = rng.random(shape) < self.learn
        high = rng.normal(self.learnt_mean, self.learnt_sd, shape)
        low = rng.normal(*NOT_LEARNT, shape)
        return np.clip(np.where(learnt, high, low), 0.0, 100.0)


# (treatment, comparator). The v3 learn rates: harness_s_base 3/3; the comparators without a
# repairing sibling 2/9 seeds (policy_only_n6 1/3, base_reroll 1/3, policy_only 0/3), so 0.2-0.33.
SCENARIOS: Dict[str, tuple[Arm, Arm]] = {
    "null: both learn 1/3": (Arm(1 / 3), Arm(1 / 3)),
    "null: both learn 0.9": (Arm(0.9), Arm(0.9)),
    "v3-like: 1.0 vs 1/3": (Arm(1.0), Arm(1 / 3)),
    "1.0 vs 0.2": (Arm(1.0), Arm(0.2)),
    "0.9 vs 1/3": (Arm(0.9), Arm(1 / 3)),
    "0.8 vs 1/3": (Arm(0.8), Arm(1 / 3)),
    "0.67 vs 1/3": (Arm(2 / 3), Arm(1 / 3)),
    "both 1.0, learnt 84 vs 74": (Arm(1.0, 84.0, 4.0), Arm(1.0, 74.0, 4.0)),  # harness_s_base vs positive control
}


@functools.lru_cache(maxsize=None)
def _fisher_p(k_treatment: int, k_comparator: int, n1: int, n2: int) -> float:
    table = [[k_treatment, n1 - k_treatment], [k_comparator, n2 - k_comparator]]
    return float(stats.fisher_exact(table, alternative="greater")[1])


def fisher_p(treatment: np.ndarray, comparator: np.ndarray) -> np.ndarray:
    kt, kc = (treatment > LEARNT_AT).sum(1), (comparator > LEARNT_AT).sum(1)
    n1, n2 = treatment.shape[1], comparator.shape[1]
    return np.array([_fisher_p(int(a), int(b), n1, n2) for a, b in zip(kt, kc)])


def permutation_p(treatment: np.ndarray, comparator: np.ndarray, rng: np.random.Generator,
                  permutations: int = 1000) -> np.ndarray:
    """One-sided p of the mean difference against random relabellings (the observed one counted)."""
    pooled = np.concatenate([treatment, comparator], 1)
    n1 = treatment.shape[1]
    observed = treatment.mean(1) - comparator.mean(1)
    keys = rng.random((permutations,) + pooled.shape)
    shuffled = np.take_along_axis(pooled[None], np.argsort(keys, -1), -1)
    diffs = shuffled[..., :n1].mean(-1) - shuffled[..., n1:].mean(-1)
    return (1 + (diffs >= observed[None] - 1e-9).sum(0)) / (permutations + 1)


def decisions(treatment: np.ndarray, comparator: np.ndarray, rng: np.random.Generator) -> Dict[str, np.ndarray]:
    """Each rule's verdict ("works": True) for every simulated experiment (rows)."""
    diff = treatment.mean(1) - comparator.mean(1)
    return {
        "ordered": (diff >= MIN_EFFECT) & (treatment.min(1) > comparator.max(1)),
        "mann_whitney": rules.mann_whitney_p(treatment, comparator) <= ALPHA,
        "fisher": fisher_p(treatment, comparator) <= ALPHA,
        "permutation": permutation_p(treatment, comparator, rng) <= ALPHA,
        # 1,000 resamples a simulated experiment (10,000 when the rule decides real runs).
        "works": rules.outcomes(treatment, comparator, rng, resamples=1000) == "works",
    }


def power(scenario: tuple[Arm, Arm], n: int, sims: int, seed: int = 0, chunk: int = 200) -> Dict[str, float]:
    rng = np.random.default_rng(seed)
    treatment_arm, comparator_arm = scenario
    t, c = treatment_arm.sample(rng, (sims, n)), comparator_arm.sample(rng, (sims, n))
    # In chunks of experiments: the relabellings and resamples of all of them at once would not fit.
    parts = [decisions(t[i:i + chunk], c[i:i + chunk], rng) for i in range(0, sims, chunk)]
    return {rule: float(np.concatenate([p[rule] for p in parts]).mean()) for rule in parts[0]}


def table(results: Dict[str, Dict[int, Dict[str, float]]], rules: Sequence[str]) -> str:
    lines = ["| scenario (learn rate: treatment vs comparator) | seeds per arm | "
             + " | ".join(rules) + " |", "| --- | --- |" + " --- |" * len(rules)]
    for name, by_n in results.items():
        for n, row in by_n.items():
            lines.append(f"| {name} | {n} | " + " | ".join(f"{row[r]:.2f}" for r in rules) + " |")
    return "\n".join(lines)


def main(argv=None, print_fn: Callable[[str], None] = print) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sims", type=int, default=4000)
    parser.add_argument("--seeds", default="3,5,8,10,12,15,20")
    parser.add_argument("--out", default="")
    args = parser.parse_args(argv)
    ns = [int(s) for s in args.seeds.split(",")]
    results = {name: {n: power(scenario, n, args.sims, seed=i * 1000 + n)
                      for n in ns} for i, (name, scenario) in enumerate(SCENARIOS.items())}
    print_fn(f"python -m studies.testbed.power --sims {args.sims} --seeds {args.seeds}")
    print_fn(table(results, ("ordered", "mann_whitney", "fisher", "permutation", "works")))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"sims": args.sims, "results": results}, f, indent=1)
    return results


if __name__ == "__main__":
    main()
