"""The testbed v2 report reads arm workdirs and applies the pre-registered rules as docs/results.md
words them (here on workdirs written by hand, so each rule's boundary is known)."""
import json

import pytest

from harness_envs.synth import names
from studies.testbed import names_report as nr


def write_run(root, arm, seed, finals, rollouts=(320, 640), benchmark="synth_names", split="coined_heldout"):
    """A workdir whose evaluations give `finals` (primary measure at each eval) at `rollouts`."""
    workdir = root / arm / f"seed{seed}"
    workdir.mkdir(parents=True)
    (workdir / "config.json").write_text(json.dumps({"seed": seed, "rollout": {"n": 4}, "benchmark": {"name": benchmark},
                                                     "eval": {"split": split}}))
    opening = "opens_docs" if benchmark == "synth_apis" else "opens_show_tables"
    primary, mechanism, guardrail = nr.keys(split, opening)
    rows = []
    for step, (value, total) in enumerate(zip(finals, rollouts), start=1):
        rows.append({"step": step, "rollouts/total": total, primary: value, mechanism: value / 2,
                     guardrail: 0.6})
    (workdir / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")


def sweep(root, **means):
    """Three seeds per arm at mean +- 0.01."""
    for arm, m in means.items():
        for seed, delta in enumerate((-0.01, 0.0, 0.01)):
            write_run(root, arm, seed, [m / 2, m + delta])


ARMS = dict(names_policy_only=0.10, names_policy_only_n6=0.12, names_tables_first_base=0.45,
            names_schema_reminder=0.11, names_base_reroll=0.15, names_harness_s=0.30, names_harness_s_base=0.16)


def test_a_valid_testbed_where_one_harness_s_arm_works(tmp_path):
    sweep(tmp_path, **ARMS)
    out = nr.main(["--root", str(tmp_path), "--out", str(tmp_path / "out")])
    v = out["verdict"]
    assert v["positive_control_gap"] == pytest.approx(0.35)
    assert v["testbed"] == "invalid"  # no gates given: the rules need them to pass
    gates = tmp_path / "gates.json"
    gates.write_text(json.dumps({"gates": {g: {"pass": True} for g in ("G1", "G2", "G3", "G4")}}))
    v = nr.main(["--root", str(tmp_path), "--gates", str(gates), "--out", str(tmp_path / "out")])["verdict"]
    assert v["testbed"] == "valid" and v["negative_control_ok"]
    assert v["names_harness_s"]["comparator"] == "names_policy_only_n6"
    assert v["names_harness_s"]["works"] is True
    assert v["names_harness_s_base"]["works"] is False  # 4 points over policy_only_n6: below 10
    assert (tmp_path / "out" / "names_mechanism.png").stat().st_size > 0


def test_rules_fail_where_they_should(tmp_path):
    table = {arm: {"primary": [m - 0.01, m, m + 0.01], "guardrail": [0.6] * 3} for arm, m in ARMS.items()}
    assert nr.verdict(table, True)["testbed"] == "valid"
    weak_positive = {**table, "names_tables_first_base": {"primary": [0.28, 0.29, 0.30], "guardrail": [0.6] * 3}}
    assert nr.verdict(weak_positive, True)["testbed"] == "invalid"  # 19 points < 20
    assert nr.verdict(table, False)["testbed"] == "invalid"
    leaky = {**table, "names_schema_reminder": {"primary": [0.13, 0.14, 0.15], "guardrail": [0.6] * 3}}
    assert nr.verdict(leaky, True)["names_harness_s"]["works"] is False  # negative control transferred
    overlapping = {**table, "names_harness_s": {"primary": [0.10, 0.35, 0.45], "guardrail": [0.6] * 3}}
    assert nr.verdict(overlapping, True)["names_harness_s"]["seeds_ordered"] is False
    assert nr.verdict(table, True, warm_guardrail=0.70)["guardrail_failed"] == sorted(table)


def test_equal_rollouts_compares_at_the_smallest_final_budget(tmp_path):
    write_run(tmp_path, "names_policy_only", 0, [0.1, 0.2], rollouts=(320, 640))
    write_run(tmp_path, "names_harness_s", 0, [0.3, 0.5], rollouts=(500, 1000))
    budget, equal = nr.equal_rollouts(nr.load_sweep(tmp_path))
    assert budget == 640
    assert equal == {"names_policy_only": [0.2], "names_harness_s": [0.3]}


def test_logp_curves_are_read_plotted_and_summarised(tmp_path, capsys):
    sweep(tmp_path, names_policy_only=0.10, names_tables_first_base=0.45)
    curve = {"steps": [0, 5, 10], "rollouts": [0, 320, 640], "mean_logp": [-9.0, -6.5, -2.25],
             "per_prompt": [[-9.0], [-6.5], [-2.25]], "task_ids": ["t"], "reply": "SHOW TABLES"}
    (tmp_path / "names_tables_first_base" / "seed1" / "mechanism_logp.json").write_text(json.dumps(curve))
    out = nr.main(["--root", str(tmp_path), "--out", str(tmp_path / "out")])
    assert out["logp_curves"] == {"names_tables_first_base s1": {k: curve[k] for k in ("steps", "rollouts", "mean_logp")}}
    assert "| names_tables_first_base s1 | -9.00 -> -2.25 (step 10) |" in capsys.readouterr().out
    assert (tmp_path / "out" / "names_mechanism.png").stat().st_size > 0


def test_logp_at_budget_takes_each_seeds_last_checkpoint_within_the_rollouts():
    curves = {"names_harness_s s0": {"steps": [0, 5, 10, 15], "rollouts": [0, 200, 500, 700],
                                     "mean_logp": [-6.0, -3.0, -1.0, -0.5]},
              "names_harness_s s1": {"steps": [0, 5, 10], "rollouts": [0, 300, 640], "mean_logp": [-6.0, -5.0, -4.0]},
              "names_policy_only_n6 s0": {"steps": [0, 5], "rollouts": [0, 900], "mean_logp": [-6.0, -2.0]}}
    rows = nr.logp_at_budget(curves, 640)
    assert rows == {"names_harness_s": [{"seed": "0", "step": 10, "rollouts": 500, "mean_logp": -1.0},
                                        {"seed": "1", "step": 10, "rollouts": 640, "mean_logp": -4.0}],
                    "names_policy_only_n6": [{"seed": "0", "step": 0, "rollouts": 0, "mean_logp": -6.0}]}
    text = nr.format_logp_at_budget(rows, 640)
    assert "| names_harness_s | s0 -1.00 (10, 500), s1 -4.00 (10, 640) | -2.50 |" in text


def test_rank1_outputs_are_split_by_hidden_and_visible_names(tmp_path, capsys):
    sweep(tmp_path, names_policy_only=0.10, names_tables_first_base=0.45)
    hidden = len(names.NAMES_TYPES)  # the second block of task types hides the table name
    task = lambda i, chosen, base, r1: {"task_id": f"distinct_heldout-s0-{i:05d}", "chosen": chosen,
                                        "base_success": base > 0, "base_successes": base,
                                        "rank1_success": r1 > 0, "rank1_successes": r1}
    out = {"rollouts_per_task": 2, "tasks": [task(0, "base", 2, 2), task(1, "base", 1, 1),
                                             task(hidden, "tables_first", 0, 1), task(hidden + 1, "schema_reminder", 0, 0)]}
    path = tmp_path / "names_rank1.json"
    path.write_text(json.dumps(out))
    slices = nr.rank1_slices(out)
    assert slices["hidden"] == {"tasks": 2, "base": {"solved": 0.0, "per_rollout": 0.0},
                                "rank1": {"solved": 0.5, "per_rollout": 0.25},
                                "choices": {"tables_first": 1, "schema_reminder": 1}}
    assert slices["visible"]["base"] == {"solved": 1.0, "per_rollout": 0.75}
    report = nr.main(["--root", str(tmp_path), "--out", str(tmp_path / "out"), "--rank1", f"warm={path}"])
    assert report["rank1"] == {"warm": slices}
    assert "| warm | hidden | 2 | 0.0 (0.0) | 50.0 (25.0) | tables_first 1, schema_reminder 1 |" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        nr.main(["--root", str(tmp_path), "--out", str(tmp_path / "out"), "--rank1", str(path)])


def test_the_router_summary_pools_decisions_and_final_profiles(tmp_path, capsys):
    sweep(tmp_path, names_policy_only=0.10, names_harness_s=0.45)
    decisions = [{"step": 0, "harnesses": ["base_copy", "lenient_parse"]},
                 {"step": 2, "harnesses": ["tables_first", "schema_reminder"]},
                 {"step": 3, "harnesses": ["tables_first", "schema_reminder"]}]
    profiles = {"prior": [1.0, 1.0], "profiles": [{"name": "tables_first", "overall": [3.0, 1.0]},
                                                  {"name": "base_copy", "overall": [0.0, 2.0]}]}
    for seed in (0, 1):
        workdir = tmp_path / "names_harness_s" / f"seed{seed}"
        (workdir / "router_decisions.jsonl").write_text("\n".join(json.dumps(d) for d in decisions[seed:]) + "\n")
        (workdir / "profiles.json").write_text(json.dumps(profiles))
    out = nr.main(["--root", str(tmp_path), "--out", str(tmp_path / "out")])["router"]
    assert list(out) == ["names_harness_s"]  # policy_only has no router
    rows = out["names_harness_s"]
    assert list(rows)[:2] == ["schema_reminder", "tables_first"]  # most groups first, then by name
    assert rows["tables_first"] == {"chosen": 4, "steps": [2, 3], "profile": pytest.approx(4 / 6)}
    assert rows["base_copy"] == {"chosen": 1, "steps": [0], "profile": pytest.approx(1 / 4)}
    assert rows["schema_reminder"]["profile"] is None  # chosen, but not in the saved profiles
    assert "| names_harness_s | tables_first | 4 | 2, 3 | 0.67 |" in capsys.readouterr().out


def test_an_api_regime_sweep_is_read_on_its_own_opening(tmp_path, capsys):
    """Arms trained with the `apis` modifier log `hidden/opens_docs`; the report reads and labels it."""
    for arm, m in dict(names_policy_only=0.10, names_tables_first_base=0.45).items():
        for seed in range(2):
            write_run(tmp_path, arm, seed, [m / 2, m], benchmark="synth_apis", split="apis_heldout")
    out = nr.main(["--root", str(tmp_path), "--out", str(tmp_path / "out")])
    assert out["table"]["names_tables_first_base"]["mechanism"] == [pytest.approx(0.225)] * 2
    assert "| API list first % |" in capsys.readouterr().out
