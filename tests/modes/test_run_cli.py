"""`run.py --help` lists the modes (the library's and the studies'), the experiment files and their
variants; `--print-config` prints the resolved config of a command and runs nothing."""
import json
import os
import pathlib
import subprocess
import sys

import pytest

from hsjax.infra import experiments

REPO = pathlib.Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
LIBRARY_MODES = ("train", "eval", "evolve", "rank1", "serve", "export")
STUDY_MODES = ("sft", "copy_base", "probe", "testbed_demo", "testbed_gates")


def run_py(tmp_path, *args):
    cmd = [sys.executable, str(REPO / "run.py"), *args]
    return subprocess.run(cmd, cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=300)


def test_help_lists_the_modes_the_experiment_files_and_their_variants(tmp_path):
    proc = run_py(tmp_path, "--help")
    assert proc.returncode == 0, proc.stderr[-2000:]
    table = proc.stdout.split("\nModes (config.mode -> module")[1].split("\n\n")[0]
    mode_lines = {line.split()[0]: line.split()[1] for line in table.splitlines()[1:]}
    assert set(mode_lines) == {*LIBRARY_MODES, *STUDY_MODES}
    assert mode_lines["eval"] == "hsjax.modes.evaluate" and mode_lines["sft"] == "studies.testbed.warmstart"
    for name in ("dbbench", "appworld", "swegym", "evolve", "export", "serve", "testbed", "testbed_probe"):
        assert f"experiments/{name}.py:" in proc.stdout
    dbbench = next(line for line in proc.stdout.splitlines() if line.startswith("  experiments/dbbench.py: "))
    assert {"eval", "demo", "smoke", "policy_only", "dapo", "hint", "harness_s"} <= set(dbbench.split(": ")[1].split(", "))
    assert "names_rank1" in proc.stdout and "modifiers of a training arm: apis, gpu, smoke, v3, v4" in proc.stdout
    assert "--print-config" in proc.stdout


@pytest.mark.parametrize("name", experiments.files())
def test_every_listed_variant_builds_a_config_alone(name):
    """What --help lists is true: each variant of an experiment file's tables is a config by itself."""
    alone, _ = experiments.variants(experiments.load(name))
    for variant in alone:
        assert experiments.get_config(name, variant).mode, variant


def test_print_config_prints_the_resolved_config_and_runs_nothing(tmp_path):
    workdir = tmp_path / "w"
    proc = run_py(tmp_path, "--config", f"{REPO}/experiments/testbed.py:harness_s,smoke", "--config.rescue.k=3",
                  "--print-config", f"--workdir={workdir}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    printed = json.loads(proc.stdout)
    expected = experiments.get_config("testbed", "harness_s,smoke")
    expected.rescue.k = 3
    assert printed == json.loads(expected.to_json_best_effort())
    assert printed["mode"] == "train" and printed["rescue"]["k"] == 3
    assert not workdir.exists() and "log.txt" not in proc.stdout + proc.stderr


def test_print_config_needs_no_workdir_and_still_refuses_an_unknown_key(tmp_path):
    proc = run_py(tmp_path, "--config", f"{REPO}/experiments/dbbench.py:eval", "--print-config")
    assert proc.returncode == 0 and json.loads(proc.stdout)["mode"] == "eval", proc.stderr[-2000:]
    proc = run_py(tmp_path, "--config", f"{REPO}/experiments/dbbench.py:eval", "--config.polcy.kind=oracle",
                  "--print-config")
    assert proc.returncode == 2 and 'Did you mean "policy"' in proc.stderr and not proc.stdout
