"""The sweep runner's plan and its per-workdir lock (two sweeps must not run one workdir)."""
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
