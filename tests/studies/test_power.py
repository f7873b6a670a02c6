"""The power simulation of the testbed's decision rules (studies/testbed/power.py)."""
import numpy as np
import pytest
from scipy import stats

from studies.testbed import power, rules


@pytest.mark.parametrize("n1,n2", [(3, 3), (3, 5), (6, 4)])
def test_mann_whitney_p_is_scipys_exact_one_sided_p(n1, n2):
    rng = np.random.default_rng(n1 * 10 + n2)
    t, c = rng.normal(0.5, 1, (40, n1)), rng.normal(0, 1, (40, n2))
    ours = rules.mann_whitney_p(t, c)
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


def test_the_rule_decides_works_does_not_work_and_inconclusive():
    learnt = [84.0, 86.5, 88.0, 81.0, 90.0, 85.5, 83.0, 87.0]
    none = [0.0, 0.3, 1.0, 0.7, 0.0, 1.3, 0.3, 0.0]
    works = rules.decide(learnt, none)
    assert works["outcome"] == "works" and works["cles"] == 1.0
    assert works["p"] == pytest.approx(1 / 12870)  # every ordering of 8 and 8: C(16, 8)
    assert works["interval"][0] > 80
    same = rules.decide(learnt, [v + 0.5 for v in learnt])
    assert same["outcome"] == "does_not_work" and same["interval"][1] < 10
    # A lottery comparator (2 of 5 seeds learnt): neither a 10-point effect nor its absence is shown.
    lottery = rules.decide(learnt[:5], [85.0, 0.0, 88.0, 0.5, 0.0])
    assert lottery["outcome"] == "inconclusive", lottery
    claim = rules.decide_claim(learnt, {"policy_only": none, "sft": [v + 0.5 for v in learnt]})
    assert claim["outcome"] == "does_not_work"
    assert rules.decide_claim(learnt, {"policy_only": none})["outcome"] == "works"


def test_the_rule_reads_a_sweep_and_decides_each_claim(tmp_path):
    import json

    def run(arm, seed, final, budget=None):
        work = tmp_path / arm / f"seed{seed}"
        work.mkdir(parents=True)
        (work / "config.json").write_text(json.dumps({"seed": seed, "eval": {"split": "distinct_heldout"}}))
        key = "eval/distinct_heldout/base/hidden/success"
        (work / "metrics.jsonl").write_text(json.dumps({"step": 20, "rollouts/total": 700, key: final}) + "\n")
        if budget is not None:
            (work / "budget_curve.json").write_text(json.dumps({"budgets": [320, 640],
                                                                "metrics": [{key: 0.0}, {key: budget}]}))

    for seed in range(6):
        run("names_harness_s_base", seed, 0.85 + seed / 100, budget=0.8)
        run("names_policy_only", seed, seed / 1000, budget=0.0)
        run("names_schema_reminder", seed, 0.0)
    values = rules.per_seed_values(tmp_path)
    assert values["names_harness_s_base"][2] == pytest.approx(87.0)
    assert rules.per_seed_values(tmp_path, "S640")["names_harness_s_base"] == {s: 80.0 for s in range(6)}
    lines = []
    out = rules.main(["--root", str(tmp_path)], lines.append)
    assert out["(b) base-context distillation"]["comparators"]["names_policy_only"]["outcome"] == "works"
    assert out["(b) base-context distillation"]["outcome"] == "incomplete"
    # Its other comparators did not run: the claim stays undecided by them, and the table says so.
    assert any("not run: names_sft_hinted" in line for line in lines)
    assert out["negative control"]["outcome"] == "does_not_work"
    assert any("names_harness_s_router | – |" in line and "not run" in line for line in lines)


def test_rule_one_needs_a_large_positive_effect_and_a_negative_control_that_does_not_work():
    learnt, none = [80.0 + s for s in range(5)], [float(s % 2) for s in range(5)]
    values = lambda **arms: {name: dict(enumerate(v)) for name, v in arms.items()}
    apis = values(names_tables_first_base=learnt, names_policy_only=none, names_schema_reminder=none)
    assert rules.validity(apis, "apis")["outcome"] == "passes"
    # The same runs miss three of the names regime's pre-registered comparators.
    names = rules.validity(apis, "names")
    assert names["outcome"] == "incomplete" and "names_base_reroll" in names["missing"]
    # A positive control that works by less than 20 points fails rule 1; so does a negative control that works.
    small = [v - 65.0 for v in learnt]
    assert rules.validity({**apis, **values(names_tables_first_base=small)}, "apis")["outcome"] == "fails"
    assert rules.validity({**apis, **values(names_schema_reminder=learnt)}, "apis")["outcome"] == "fails"
    assert rules.validity(values(names_policy_only=none), "apis")["outcome"] == "incomplete"


def test_the_rules_read_the_sweeps_regime_and_print_rule_one(tmp_path):
    import json

    key = "eval/apis_heldout/base/hidden/success"
    for arm, value in (("names_tables_first_base", 0.9), ("names_policy_only", 0.0), ("names_schema_reminder", 0.0)):
        for seed in range(5):
            work = tmp_path / arm / f"seed{seed}"
            work.mkdir(parents=True)
            (work / "config.json").write_text(json.dumps({"seed": seed, "benchmark": {"name": "synth_apis"},
                                                          "eval": {"split": "apis_heldout"}}))
            (work / "metrics.jsonl").write_text(json.dumps({"step": 20, key: value + seed / 100}) + "\n")
    assert rules.root_regime(tmp_path) == "apis"
    lines = []
    out = rules.main(["--root", str(tmp_path)], lines.append)
    assert out["rule 1"]["outcome"] == "passes"
    assert any("Rule 1 (validity, the apis regime): **passes**" in line for line in lines)
    # A names-regime run in the same root: one sweep, one regime.
    (tmp_path / "names_policy_only" / "seed9").mkdir()
    (tmp_path / "names_policy_only" / "seed9" / "config.json").write_text('{"seed": 9}')
    (tmp_path / "names_policy_only" / "seed9" / "metrics.jsonl").write_text('{"step": 1}\n')
    with pytest.raises(ValueError, match="mixes runs"):
        rules.root_regime(tmp_path)
