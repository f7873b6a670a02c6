"""The sweep runner's plan and its per-workdir lock (two sweeps must not run one workdir)."""
import pytest

from hsjax.infra import experiments

sweep = experiments.load("testbed_sweep")


def test_warmstart_runs_once_and_arms_per_seed():
    assert sweep.plan_runs(["warmstart", "policy_only"], [0, 1, 2]) == [
        ("warmstart", 0), ("policy_only", 0), ("policy_only", 1), ("policy_only", 2)]


def test_a_claimed_workdir_cannot_be_claimed_again(tmp_path):
    first = sweep.claim(tmp_path / "arm" / "seed0")
    assert first is not None
    assert sweep.claim(tmp_path / "arm" / "seed0") is None
    first.close()
    again = sweep.claim(tmp_path / "arm" / "seed0")
    assert again is not None
    again.close()


def test_missing_warm_start_is_refused(tmp_path, capsys):
    try:
        sweep.main(["--warm", str(tmp_path), "--root", str(tmp_path / "r"), "--arms", "policy_only"])
    except SystemExit as exit_:
        assert exit_.code == 2
    else:
        raise AssertionError("a warm start without config.json must be refused")
    assert "not an HF directory" in capsys.readouterr().err


def test_an_archived_run_reads_back_as_the_run_without_its_bulk(tmp_path):
    from studies.testbed import runs

    work = tmp_path / "w" / "names_policy_only" / "seed1"
    (work / "checkpoints" / "5").mkdir(parents=True)
    (work / "checkpoints" / "5" / "state").write_bytes(b"\0" * 1024)
    (work / "episodes").mkdir()
    (work / "episodes" / "step_000001.jsonl").write_text("{}\n")
    (work / "config.json").write_text('{"seed": 1, "rollout": {"n": 4}}')
    (work / "metrics.jsonl").write_text('{"step": 1, "rollouts/total": 32}\n{"step": 2, "rollouts/total": 64}\n')
    (work / "mechanism_logp.json").write_text('{"steps": [0, 2]}')
    (work / "budget_curve.json").write_text('{"budgets": [160]}')
    dest = tmp_path / "archive" / "names_policy_only" / "seed1"
    copied = runs.archive_run(work, dest)
    assert sorted(p.name for p in copied) == ["budget_curve.json", "config.json", "mechanism_logp.json",
                                              "metrics.jsonl"]
    assert sorted(p.name for p in dest.iterdir()) == sorted(p.name for p in copied)
    [run] = runs.load_sweep(tmp_path / "archive")
    original = runs.load_run(work)
    assert (run.arm, run.seed, run.metrics, run.config) == (original.arm, 1, original.metrics, original.config)
    with pytest.raises(FileNotFoundError, match="no metrics.jsonl"):
        runs.archive_run(tmp_path / "nothing", dest)


def test_names_runs_are_measured_after_training(tmp_path):
    modules = lambda arm: [cmd[2].rsplit(".", 1)[1] for cmd in sweep.analysis_commands(arm, tmp_path)]
    assert modules("names_harness_s") == ["mechanism", "budget_curve", "names_behaviour"]
    assert modules("names_warmstart") == ["names_behaviour"]  # no checkpoints: no curves
    assert modules("policy_only") == []  # the first regime has its own report
    # An API-regime run (its config.json names synth_apis): the curves, no SQL-turn behaviour.
    (tmp_path / "config.json").write_text('{"benchmark": {"name": "synth_apis"}}')
    assert modules("names_harness_s") == ["mechanism", "budget_curve"]


def test_modifiers_follow_every_arm_in_its_config_name(tmp_path):
    config_of = lambda *mods: sweep.run_command("names_policy_only", 3, "W/hf", tmp_path, ["total_steps=2"],
                                                *mods)[2]
    assert config_of().endswith("testbed.py:names_policy_only")
    assert config_of("apis").endswith("testbed.py:names_policy_only,apis")
    assert config_of(" apis, smoke ").endswith("testbed.py:names_policy_only,apis,smoke")
    # Every (arm, modifiers) names a config of experiments/testbed.py.
    assert experiments.get_config("testbed", "names_policy_only,apis").benchmark.name == "synth_apis"


def test_a_finished_run_is_archived_and_its_checkpoints_dropped(tmp_path, monkeypatch):
    import sys

    warm = tmp_path / "warm"
    warm.mkdir()
    (warm / "config.json").write_text("{}")

    def fake_run(arm, seed, warm, workdir, overrides, modifiers):  # a run that keeps a checkpoint and writes metrics
        return [sys.executable, "-c", f"import pathlib; w = pathlib.Path({str(workdir)!r}); "
                "(w / 'checkpoints' / '1').mkdir(parents=True); (w / 'metrics.jsonl').write_text('{}\\n')"]

    monkeypatch.setattr(sweep, "run_command", fake_run)
    monkeypatch.setattr(sweep, "analysis_commands", lambda arm, workdir: [])
    root, archive = tmp_path / "root", tmp_path / "archive"
    assert sweep.main(["--warm", str(warm), "--root", str(root), "--arms", "names_policy_only", "--seeds", "0",
                       "--archive", str(archive), "--drop-checkpoints"]) == 0
    run = root / "names_policy_only" / "seed0"
    assert (run / "DONE").exists() and not (run / "checkpoints").exists()
    assert (archive / "names_policy_only" / "seed0" / "metrics.jsonl").exists()


def test_a_trained_run_whose_analysis_failed_gets_only_its_analyses_again(tmp_path, monkeypatch):
    import sys

    warm = tmp_path / "warm"
    warm.mkdir()
    (warm / "config.json").write_text("{}")
    trainings = tmp_path / "trainings"

    def fake_run(arm, seed, warm, workdir, overrides, modifiers):  # counts its trainings
        return [sys.executable, "-c", f"open({str(trainings)!r}, 'a').write('x'); import pathlib; "
                f"(pathlib.Path({str(workdir)!r}) / 'metrics.jsonl').write_text('{{}}\\n')"]

    def fake_analyses(fail):  # the budget curve, failing (a killed evaluation) or writing its file
        def commands(arm, workdir):
            if (workdir / sweep.OUTPUTS["budget_curve"]).exists():
                return []
            write = f"(pathlib.Path({str(workdir)!r}) / 'budget_curve.json').write_text('{{}}')"
            return [[sys.executable, "-c", "raise SystemExit(1)" if fail else f"import pathlib; {write}"]]
        return commands

    monkeypatch.setattr(sweep, "run_command", fake_run)
    argv = ["--warm", str(warm), "--root", str(tmp_path / "root"), "--arms", "names_policy_only", "--seeds", "0"]
    monkeypatch.setattr(sweep, "analysis_commands", fake_analyses(fail=True))
    assert sweep.main(argv) == 1
    run = tmp_path / "root" / "names_policy_only" / "seed0"
    assert (run / "DONE").exists() and not (run / "budget_curve.json").exists()
    monkeypatch.setattr(sweep, "analysis_commands", fake_analyses(fail=False))
    assert sweep.main(argv) == 0
    assert (run / "budget_curve.json").exists() and trainings.read_text() == "x"  # trained once
    assert sweep.main(argv) == 0 and trainings.read_text() == "x"  # nothing left: skipped


def test_an_analysis_whose_output_exists_is_not_run_again(tmp_path):
    from studies.testbed import budget_curve, mechanism, names_behaviour

    assert sweep.OUTPUTS == {"mechanism": mechanism.OUTPUT, "budget_curve": budget_curve.OUTPUT,
                             "names_behaviour": names_behaviour.OUTPUT}
    (tmp_path / mechanism.OUTPUT).write_text("{}")
    assert [cmd[2].rsplit(".", 1)[1] for cmd in sweep.analysis_commands("names_harness_s", tmp_path)] == [
        "budget_curve", "names_behaviour"]
