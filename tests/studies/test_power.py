"""The power simulation of the testbed's decision rules (studies/testbed/power.py)."""
import numpy as np
import pytest
from scipy import stats

from studies.testbed import power


@pytest.mark.parametrize("n1,n2", [(3, 3), (3, 5), (6, 4)])
def test_mann_whitney_p_is_scipys_exact_one_sided_p(n1, n2):
    rng = np.random.default_rng(n1 * 10 + n2)
    t, c = rng.normal(0.5, 1, (40, n1)), rng.normal(0, 1, (40, n2))
    ours = power.mann_whitney_p(t, c)
    want = [stats.mannwhitneyu(a, b, alternative="greater", method="exact").pvalue for a, b in zip(t, c)]
    np.testing.assert_allclose(ours, want, rtol=1e-9)


def test_the_ordering_rule_passes_a_perfect_method_only_when_no_comparator_seed_learns():
    # Comparator seeds that learn land above every treatment seed: "ordered" holds iff none learns,
    # (1 - 1/3)^3 = 0.296 at 3 seeds (the "a perfect method passes 30-51% of the time").
    scenario = (power.Arm(1.0, 85.0, 1e-3), power.Arm(1 / 3, 95.0, 1e-3))
    got = power.power(scenario, n=3, sims=4000, seed=1)
    assert got["ordered"] == pytest.approx((2 / 3) ** 3, abs=0.03)
    assert got["mann_whitney"] == got["ordered"]  # at 3 seeds the exact test is the ordering


def test_the_rules_keep_their_false_positive_rate_and_find_a_reliable_method():
    null = power.power((power.Arm(1 / 3), power.Arm(1 / 3)), n=10, sims=2000, seed=2)
    for rule in ("mann_whitney", "fisher", "permutation", "works"):
        assert null[rule] <= power.ALPHA + 0.015, (rule, null[rule])
    effect = power.power((power.Arm(1.0), power.Arm(1 / 3)), n=15, sims=1000, seed=3)
    assert effect["works"] > 0.9 and effect["ordered"] < 0.05


def test_main_prints_the_table_with_its_command(tmp_path):
    lines = []
    out = power.main(["--sims", "50", "--seeds", "3", "--out", str(tmp_path / "p.json")], lines.append)
    assert lines[0].startswith("python -m studies.testbed.power")
    assert "| v3-like: 1.0 vs 1/3 | 3 |" in lines[1]
    assert set(out) == set(power.SCENARIOS) and (tmp_path / "p.json").exists()
