"""pass@k: the product form against brute-force enumeration of every k-subset of the samples, the
edge cases, and the summary of episode records."""
import itertools
import math

import pytest

from hsjax.infra.pass_at_k import format_sampled_table, pass_at_k, reported_ks, sampled_summary


def brute_force(n, c, k):
    """The share of k-subsets of n samples (the first c successes) holding a success."""
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(samples[i] for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", range(1, 9))
def test_the_product_matches_enumeration_over_subsets(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(brute_force(n, c, k), abs=1e-12), (n, c, k)
            assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k), abs=1e-12)


def test_edge_cases():
    assert pass_at_k(10, 0, 1) == 0.0 and pass_at_k(10, 0, 10) == 0.0  # no success: never
    assert pass_at_k(10, 10, 1) == 1.0 and pass_at_k(10, 10, 10) == 1.0  # every sample succeeded
    assert pass_at_k(10, 1, 10) == 1.0  # k = n draws every sample, the one success included
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)  # pass@1 is c / n
    # Binomials past a float (C(400, 200) ~ 1e119 is fine, C(2000, 1000) is not): the product stays finite.
    assert pass_at_k(2000, 3, 1000) == pytest.approx(1 - (1000 * 999 * 998) / (2000 * 1999 * 1998))
    for bad in ((4, 5, 1), (4, -1, 1), (4, 2, 0), (4, 2, 5)):
        with pytest.raises(ValueError, match="pass@k needs"):
            pass_at_k(*bad)


def test_reported_ks():
    assert reported_ks(1) == [1]
    assert reported_ks(2) == [1, 2]
    assert reported_ks(4) == [1, 2, 4]
    assert reported_ks(6) == [1, 2, 4, 6]
    assert reported_ks(16) == [1, 2, 4, 8, 16]


def test_the_summary_of_records():
    # Task a: 1 of 4 samples succeeded; task b: 4 of 4; task c: none.
    successes = {"a": [True, False, False, False], "b": [True] * 4, "c": [False] * 4}
    records = [{"task_id": t, "success": s} for i in range(4) for t, ss in successes.items() for s in [ss[i]]]
    out = sampled_summary(records, 4)
    assert out["tasks"] == 3 and out["samples"] == 4
    assert set(out) == {"tasks", "samples", "pass@1", "pass@2", "pass@4", "mean@4"}
    assert out["pass@1"] == pytest.approx((0.25 + 1 + 0) / 3) == pytest.approx(out["mean@4"])
    assert out["pass@2"] == pytest.approx((0.5 + 1 + 0) / 3)
    assert out["pass@4"] == pytest.approx(2 / 3)
    assert out["pass@1"] <= out["pass@2"] <= out["pass@4"]
    assert sampled_summary([], 4)["pass@4"] == 0.0
    with pytest.raises(ValueError, match="4 samples of every task"):
        sampled_summary(records[:-1], 4)


def test_the_table_lists_every_k_in_percent():
    records = [{"task_id": t, "success": s} for t, s in
               [("a", True), ("a", False), ("a", False), ("a", False), ("b", False), ("b", False), ("b", False), ("b", False)]]
    table = format_sampled_table({"base": sampled_summary(records, 4), "hint": sampled_summary(records[:4], 4)})
    header, base, hint = table.splitlines()
    assert header.split() == ["harness", "tasks", "pass@1", "pass@2", "pass@4", "mean@4"]
    assert base.split() == ["base", "2", "12.5", "25.0", "50.0", "12.5"]
    assert hint.split() == ["hint", "1", "25.0", "50.0", "100.0", "25.0"]
    assert format_sampled_table({}) == ""
