"""The testbed report on hand-made data and on a real small sweep (from the shipped warm start: the
warmstart, policy_only (two seeds) and harness_s arms in smoke size, two steps), and the ablation
notebook run against that sweep."""
import json
import pathlib

import numpy as np
import pytest

from harness_envs.synth import expert as ex
from harness_envs.synth.benchmark import Synth
from harness_envs.synth.tasks import by_type, make_tasks
from hsjax.harness_s import analysis
from hsjax.infra import experiments
from hsjax.policies.base import SamplingParams
from hsjax.rollout.runner import EpisodeRunner, Job, episode_record
from studies.testbed import behaviour as eb
from studies.testbed import report as tr
from studies.testbed import runs as tbr

REPO = pathlib.Path(__file__).resolve().parents[2]


def _turn(kind, sql=None, ok=None, error=None, observation=None):
    return {"kind": kind, "sql": sql, "ok": ok, "error": error, "observation": observation, "reply": ""}


# ---------------------------------------------------------------- action kinds and behaviour

@pytest.mark.parametrize("sql, kind", [
    ("SELECT * FROM games", "inspect"),
    ("select team, city from games limit 5", "inspect"),
    ("DESCRIBE games", "inspect"),
    ("SHOW COLUMNS FROM games", "inspect"),
    ("SELECT city FROM games WHERE team = 'eagles'", "select"),
    ("SELECT COUNT(*) FROM games", "select"),
    ("SELECT team FROM games ORDER BY points DESC LIMIT 1", "select"),
    ("SELECT ROUND(AVG(points), 2) FROM games", "select"),
    ("SELECT 1", "select"),  # reads no table
    ("SELECT team FROM games GROUP BY team", "select"),
    ("SELECT 'where order by' FROM games", "inspect"),  # keywords inside a string literal do not count
    ("INSERT INTO games (team) VALUES ('x')", "modify"),
    ("  update games SET city = 'doha' WHERE team = 'eagles'", "modify"),
    ("DELETE FROM games", "modify"),
    ("FROBNICATE games", "other"),
])
def test_action_kind_of_statements(sql, kind):
    assert eb.action_kind(_turn("sql", sql=sql, ok=True)) == kind


def test_action_kind_of_answers_and_malformed_replies():
    assert eb.action_kind(_turn("answer")) == "answer"
    assert eb.action_kind(_turn("malformed", error="no 'Action: Operation' line")) == "malformed"
    assert eb.action_kind({"kind": None}) == "other"


@pytest.mark.parametrize("text, cls", [
    ("1054 (42S22): Unknown column 'city_value' in 'field list'", "unknown_column"),
    ("1146 (42S02): Table 'games.teams' doesn't exist", "unknown_table"),
    ("1064 (42000): You have an error in your SQL syntax; near \"FORM\"", "syntax"),
    ("1136 (21S01): Column count doesn't match value count at row 1", "column_count"),
    ("3024 (HY000): Query execution was interrupted, maximum statement execution time exceeded", "timeout"),
    ("1105 (HY000): something else", "other"),
    (None, "other"),
])
def test_error_class(text, cls):
    assert eb.error_class(text) == cls


def test_behaviour_on_hand_made_records():
    records = [
        {"failure_mode": "success", "turns": [  # error, then a fix: recovered
            _turn("sql", "SELECT x_value FROM t WHERE k = 'a'", False, "1054 (42S22): Unknown column 'x_value'"),
            _turn("sql", "SELECT x FROM t WHERE k = 'a'", True), _turn("answer")]},
        {"failure_mode": "sql_error_loop", "turns": [  # errors only
            _turn("sql", "SELECT * FROM t", True),
            _turn("sql", "SELECT x FROM t WHERE", False, "1064 (42000): You have an error in your SQL syntax"),
            _turn("answer")]},
        {"failure_mode": "malformed_action", "turns": [_turn("malformed")]},
        {"failure_mode": "wrong_modification", "turns": [_turn("sql", "UPDATE t SET x = 1", True), _turn("answer")]},
    ]
    b = eb.behaviour(records)
    assert b["episodes"] == 4 and b["failed_statements"] == 2
    assert b["actions"] == pytest.approx({"select": 3 / 9, "inspect": 1 / 9, "modify": 1 / 9, "answer": 3 / 9,
                                          "malformed": 1 / 9})
    assert b["errors"] == {"unknown_column": 0.5, "syntax": 0.5}
    assert b["failure_modes"] == {m: 0.25 for m in ("success", "sql_error_loop", "malformed_action", "wrong_modification")}
    assert b["recovered_after_error"] == 0.25 and b["recovery_rate"] == 0.5
    for key in ("actions", "errors", "failure_modes"):
        assert sum(b[key].values()) == pytest.approx(1.0)
    empty = eb.behaviour([])
    assert empty["episodes"] == 0 and empty["actions"] == {} and empty["recovery_rate"] is None


def test_behaviour_on_real_episodes_of_the_schema_recovery_expert(sqlite_backend):
    """The expert misnames a column first: the real backend's error is an unknown column; only the
    harness that appends the schema lets it recover."""
    bench = Synth()
    pool = bench.load_pool()
    tasks = by_type(make_tasks("synth_train", 20, seed=1), 1)
    out = {}
    for harness in ("base", "schema_reminder"):
        runner = EpisodeRunner(bench.make_episode, ex.ScriptedExpert(default_style="schema_recovery"),
                               SamplingParams())
        out[harness] = [episode_record(t) for t in runner.run([Job(pool[harness], t) for t in tasks])]
    base, rescued = eb.behaviour(out["base"]), eb.behaviour(out["schema_reminder"])
    assert base["errors"] == rescued["errors"] == {"unknown_column": 1.0}
    assert base["recovered_after_error"] == 0.0 and rescued["recovered_after_error"] == 1.0
    assert rescued["failure_modes"] == {"success": 1.0}
    modification = {"INSERT", "UPDATE"}
    for r in out["schema_reminder"]:  # the gold statement of each family is a filtered select or a modification
        kinds = [eb.action_kind(t) for t in r["turns"]]
        assert kinds == ["modify" if r["type"] in modification else "select"] * 2 + ["answer"], r["type"]


def test_constants_agree_with_experiments_testbed():
    testbed = experiments.load("testbed")
    assert tbr.FAMILIES_A == tuple(testbed.FAMILIES_A) and tbr.FAMILIES_B == tuple(testbed.FAMILIES_B)
    assert tbr.ARM_ORDER == tuple(testbed.TRAIN_ARMS)


# ---------------------------------------------------------------- curves and budgets on hand-made runs

def _run(arm, seed, points):
    """points: (step, rollouts/total, held-out success)."""
    metrics = [{"step": s, "rollouts/total": n, "eval/synth_heldout/base/success": v} for s, n, v in points]
    return tr.Run(pathlib.Path(f"/nowhere/{arm}/seed{seed}"), arm, seed, {}, metrics, {})


def test_curves_and_equal_budgets():
    runs = [tr.Run(pathlib.Path("/nowhere/warmstart/seed0"), "warmstart", 0, {},
                   [{"step": 0, "eval/synth_heldout/base/success": 0.1}], {}),
            _run("policy_only", 0, [(5, 160, 0.2), (10, 320, 0.4)]),
            _run("policy_only", 1, [(5, 160, 0.4), (10, 320, 0.6)]),
            _run("harness_s", 0, [(5, 240, 0.5), (10, 480, 0.7)])]
    c = tr.curves(runs, "synth_heldout")
    assert c["warmstart"] == [(0, 0.1, 0.0)]
    assert [p[0] for p in c["policy_only"]] == [0, 5, 10]
    assert c["policy_only"][2] == pytest.approx((10, 0.5, np.std([0.4, 0.6], ddof=1)))
    v = tr.success_vs_rollouts(runs, "synth_heldout")
    assert [p[0] for p in v["harness_s"]] == [0, 240, 480]
    at = tr.success_at_budget(runs, "synth_heldout", 320)
    assert at["policy_only"]["mean"] == pytest.approx(0.5) and at["policy_only"]["rollouts"] == 320
    assert at["harness_s"]["mean"] == pytest.approx(0.5) and at["harness_s"]["rollouts"] == 240
    assert tr.success_at_budget(runs, "synth_heldout", 100)["harness_s"]["mean"] == pytest.approx(0.1)  # warm start
    assert tr.success_at_budget(runs[1:], "synth_heldout", 100)["harness_s"] is None
    assert tr.default_budgets(runs) == [160.0, 320.0]


def test_load_sweep_names_a_missing_or_empty_root(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        tr.load_sweep(tmp_path / "absent")
    with pytest.raises(FileNotFoundError, match="seed<k>/metrics.jsonl"):
        tr.load_sweep(tmp_path)


def test_plot_probe_draws_properties_when_present(tmp_path):
    assert tr.plot_probe(tmp_path / "probe", tmp_path / "out") == []
    outcomes = [{"harness": h, "task_id": f"t{i}", "sample_index": 0, "task_type": "counting",
                 "base_failure_mode": m, "success": s}
                for i, (h, m, s) in enumerate([("lenient_parse", "malformed_action", True),
                                               ("lenient_parse", "sql_error_loop", False),
                                               ("schema_reminder", "sql_error_loop", True)])]
    props = {"locality": analysis.locality(outcomes), "complementarity": analysis.complementarity(outcomes)}
    (tmp_path / "probe").mkdir()
    (tmp_path / "probe" / "properties_hf.json").write_text(json.dumps(props))
    paths = tr.plot_probe(tmp_path / "probe", tmp_path / "out")
    assert sorted(p.name for p in paths) == ["probe_complementarity_hf.png", "probe_locality_hf.png"]
    assert all(p.stat().st_size > 0 for p in paths)


# ---------------------------------------------------------------- a real sweep

ARMS = [("warmstart", 0), ("policy_only", 0), ("policy_only", 1), ("harness_s", 0)]
# Steps of each training arm (the smoke modifier has 3). Each is evaluated: two give the curves
# more than one point past the warm start's step 0 to line up across seeds.
STEPS = 2


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """`<arm>/seed<k>/` workdirs, each what `python run.py --config experiments/testbed.py:<arm>,smoke
    --config.total_steps=2 ...` writes. The runs are made in this process, one after the other: they
    share the programs compiled in memory and pay no process start (as four run.py processes they
    took 20 s more of about 130 on the 2-core CPU); the report reads only their files, and
    test_train covers training through run.py."""
    from hsjax.modes import train

    root = tmp_path_factory.mktemp("testbed_sweep") / "sweep"
    testbed = experiments.load("testbed")
    for arm, seed in ARMS:
        c = testbed.get_config(f"{arm},smoke")  # the warm start is only scored (total_steps=0)
        # The shipped warm start: an SFT smoke run would cost a run more, and test_sft covers it.
        c.model.hf_dir = str(REPO / "assets" / "testbed_warmstart")
        c.seed = seed
        if arm != "warmstart":
            c.total_steps = STEPS
        train.main(c, str(root / arm / f"seed{seed}"))
    return root


def _rows(path):
    return [json.loads(line) for line in open(path)]


def test_sweep_loads_in_arm_order(sweep):
    runs = tr.load_sweep(sweep)
    assert [(r.arm, r.seed) for r in runs] == ARMS
    warm = runs[0]
    assert warm.eval_steps("synth_heldout") == [0] and warm.eval_steps("synth_train") == [0]
    steps = list(range(1, STEPS + 1))
    assert runs[1].eval_steps("synth_heldout") == steps
    assert runs[1].episode_steps() == steps
    assert len(list(runs[1].episodes(1))) == _rows(sweep / "policy_only/seed0/metrics.jsonl")[0]["rollouts/base"]


def test_results_table_cross_checks_the_metrics_files(sweep):
    runs = tr.load_sweep(sweep)
    rows = {r["arm"]: r for r in tr.results_table(runs)}
    assert list(rows) == ["warmstart", "policy_only", "harness_s"]
    warm = rows["warmstart"]
    assert warm["step"] == 0 and warm["rollouts"]["mean"] == 0 and warm["wall_s"]["mean"] == 0
    assert warm["heldout"]["mean"] == _rows(sweep / "warmstart/seed0/metrics.jsonl")[0]["eval/synth_heldout/base/success"]
    for arm, seeds in (("policy_only", [0, 1]), ("harness_s", [0])):
        metrics = [_rows(sweep / arm / f"seed{s}" / "metrics.jsonl") for s in seeds]
        totals = [m[-1]["rollouts/total"] for m in metrics]
        assert rows[arm]["seeds"] == seeds and rows[arm]["step"] == STEPS
        assert rows[arm]["rollouts"]["mean"] == pytest.approx(np.mean(totals))
        assert rows[arm]["rescue_rollouts"]["mean"] == pytest.approx(np.mean([m[-1]["rollouts/rescue_total"] for m in metrics]))
        walls = [sum(r.get(k, 0.0) for r in m for k in ("time/rollout", "time/update", "time/eval")) for m in metrics]
        assert rows[arm]["wall_s"]["mean"] == pytest.approx(np.mean(walls))
        assert rows[arm]["wall_s"]["std"] == pytest.approx(np.std(walls, ddof=1) if len(walls) > 1 else 0.0)
        for split, col in (("synth_heldout", "heldout"), ("synth_train", "train")):
            assert rows[arm][col]["mean"] == pytest.approx(np.mean([m[-1][f"eval/{split}/base/success"] for m in metrics]))
        episodes = json.loads((sweep / arm / f"seed0/eval/synth_train_step{STEPS:06d}.json").read_text())["episodes"]
        b_types = {e["type"] for e in episodes} & set(tbr.FAMILIES_B)
        assert b_types, "the smoke eval should hold some family-B tasks"
    assert rows["policy_only"]["rescue_rollouts"]["mean"] == 0 and rows["harness_s"]["rescue_rollouts"]["mean"] > 0
    table = tr.markdown_table(list(rows.values()))
    # arm | seeds | steps: harness_s's single seed tells the two columns apart
    assert table.count("\n") == 1 + len(rows)
    assert f"| policy_only | 2 | {STEPS} |" in table and f"| harness_s | 1 | {STEPS} |" in table


def test_curves_and_behaviour_on_the_sweep(sweep):
    runs = tr.load_sweep(sweep)
    c = tr.curves(runs, "synth_heldout")
    assert [p[0] for p in c["policy_only"]] == list(range(STEPS + 1))  # the warm start's step 0 first
    v = tr.success_vs_rollouts(runs, "synth_train")
    po = [_rows(sweep / f"policy_only/seed{s}/metrics.jsonl") for s in (0, 1)]
    assert [p[0] for p in v["policy_only"]][1:] == [np.mean([m[i]["rollouts/total"] for m in po]) for i in range(STEPS)]
    rows = tr.behaviour_table(runs)
    for row in rows:
        for key in ("actions", "failure_modes"):
            assert sum(row[key].values()) == pytest.approx(1.0), (row["arm"], row["harness"], key)
        assert not row["errors"] or sum(row["errors"].values()) == pytest.approx(1.0)
    rescue_harnesses = {e["harness"] for e in tbr.load_run(sweep / "harness_s/seed0").episodes()} - {"base"}
    assert {r["harness"] for r in rows if r["arm"] == "harness_s" and r["source"] == "rescue rollouts"} == rescue_harnesses
    assert rescue_harnesses and not [r for r in rows if r["arm"] == "policy_only" and r["harness"] != "base"]
    final = [r for r in rows if r["arm"] == "policy_only" and r["harness"] == "base"][0]
    assert final["episodes"] == sum(len(ev["episodes"]) for run in runs if run.arm == "policy_only"
                                    for ev in (run.final_eval("synth_heldout"), run.final_eval("synth_train")))
    cases = tr.inspect_cases(runs, "synth_heldout", n=2)
    assert len(cases) == 2 and all(set(case["arms"]) == {"warmstart", "policy_only", "harness_s"} for case in cases)


def test_cli_writes_plots_and_report(sweep, tmp_path, capsys):
    out = tr.main(["--root", str(sweep), "--out", str(tmp_path)])
    printed = capsys.readouterr().out
    assert "## Results" in printed and "## Behaviour" in printed and "| harness_s |" in printed
    report = json.loads((tmp_path / "report.json").read_text())
    assert [r["arm"] for r in report["results"]] == ["warmstart", "policy_only", "harness_s"]
    assert report["budgets"] == out["budgets"] and report["budgets"]
    for name in ("curves.png", "success_vs_rollouts.png", "behaviour.png"):
        assert (tmp_path / name).stat().st_size > 0


def test_notebook_runs_against_the_sweep(sweep, tmp_path, monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    monkeypatch.setenv("HSJAX_SWEEP_ROOT", str(sweep))
    monkeypatch.setenv("HSJAX_REPORT_OUT", str(tmp_path / "report"))
    nb = nbformat.read(REPO / "studies" / "testbed" / "ablations.ipynb", as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), "commit the notebook without outputs"
    NotebookClient(nb, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(REPO / "studies" / "testbed")}}).execute()  # raises on a failing cell
    text = json.dumps([c.get("outputs", []) for c in nb.cells])
    assert "policy_only" in text and "image/png" in text
    assert (tmp_path / "report" / "curves.png").exists()
    # the names regime's section reads the archived v3 runs committed under docs/runs/
    assert "names_tables_first_base" in text and "SHOW TABLES after a failed first statement" in text
    assert (tmp_path / "report" / "names" / "names_mechanism.png").exists()


def test_dapo_totals_count_dropped_groups():
    rows = [{"step": 1, "rollouts/base": 16, "rollouts/rescue": 0, "rollouts/total": 16, "dapo/drawn_groups": 24},
            {"step": 2, "rollouts/base": 8, "rollouts/rescue": 0, "rollouts/total": 24, "dapo/drawn_groups": 16},
            {"step": 2, "eval/synth_train/base/success": 0.5}]
    fixed = tbr.executed_rollouts(rows, n=4)
    assert [r.get("rollouts/total") for r in fixed] == [96, 160, None]
    plain = [{"step": 1, "rollouts/base": 32, "rollouts/rescue": 8, "rollouts/total": 40}]
    assert tbr.executed_rollouts(plain, n=4) == plain
