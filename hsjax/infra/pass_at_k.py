"""pass@k and mean@k of a sampled evaluation: k episodes of every task, scored as a whole.

`pass_at_k(n, c, k)` is the unbiased estimator of Chen et al. 2021 ("Evaluating Large Language
Models Trained on Code", eq. 1): of n samples of a task, c succeeded; the chance that k samples drawn
from them without replacement hold at least one success is 1 - C(n-c, k) / C(n, k). It is computed
as the product 1 - prod_{i=n-c+1..n} (1 - k/i), which never forms the binomials (C(200, 100) is
past a float). A benchmark's pass@k is its tasks' mean; mean@k is the success rate over all n
samples of every task, which equals pass@1 (c/n a task) when every task has n samples.

`sampled_summary(records, n)` gives both for a list of episode records (`task_id`, `success`),
at the k of `reported_ks(n)`: 1, 2, 4, ... below n, and n.
"""
from __future__ import annotations

from typing import Iterable, Mapping


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of one task with `c` successes among `n` samples (1 <= k <= n)."""
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n; got n={n}, c={c}, k={k}")
    if n - c < k:  # every draw of k samples holds a success
        return 1.0
    miss = 1.0
    for i in range(n - c + 1, n + 1):
        miss *= 1.0 - k / i
    return 1.0 - miss


def reported_ks(n: int) -> list[int]:
    """The k a summary of n samples a task reports: the powers of two below n, and n."""
    ks, k = [], 1
    while k < n:
        ks.append(k)
        k *= 2
    return ks + [n]


def sampled_summary(records: Iterable[Mapping], n: int, key: str = "task_id") -> dict:
    """{"tasks", "samples", "pass@1", "pass@2", ..., f"pass@{n}", f"mean@{n}"} of episode records
    holding `n` samples of each task (told apart by `key`); the rates are 0.0 without records."""
    by_task: dict[str, list[bool]] = {}
    for r in records:
        by_task.setdefault(str(r[key]), []).append(bool(r["success"]))
    uneven = {task: len(s) for task, s in by_task.items() if len(s) != n}
    if uneven:
        raise ValueError(f"pass@k needs {n} samples of every task; got {dict(list(uneven.items())[:5])}")
    out: dict = {"tasks": len(by_task), "samples": n}
    for k in reported_ks(n):
        out[f"pass@{k}"] = (sum(pass_at_k(n, sum(s), k) for s in by_task.values()) / len(by_task)
                            if by_task else 0.0)
    successes = [x for s in by_task.values() for x in s]
    out[f"mean@{n}"] = sum(successes) / len(successes) if successes else 0.0
    return out


def rates(summary: Mapping) -> dict[str, float]:
    """The pass@k and mean@k entries of a `sampled_summary`, in its order (no counts)."""
    return {name: value for name, value in summary.items() if name.startswith(("pass@", "mean@"))}


def format_sampled_table(summaries: Mapping[str, Mapping]) -> str:
    """A plain-text table of `sampled_summary` results, one row per name (a harness or a split), the
    rates in %: `name  tasks  pass@1  pass@2 ... mean@k`."""
    if not summaries:
        return ""
    columns = list(rates(next(iter(summaries.values()))))
    width = max(len("harness"), *(len(name) for name in summaries))
    lines = [f"{'harness':<{width}}  {'tasks':>5}  " + "  ".join(f"{c:>8}" for c in columns)]
    for name, summary in summaries.items():
        lines.append(f"{name:<{width}}  {summary['tasks']:>5}  "
                     + "  ".join(f"{100 * summary[c]:>8.1f}" for c in columns))
    return "\n".join(lines)
