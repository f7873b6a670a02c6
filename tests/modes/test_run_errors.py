"""User mistakes end `run.py` with one line naming the thing and the fix (exit 2, no traceback),
and nothing of an existing workdir is overwritten by a launch that fails its checks."""
import json
import os
import pathlib
import subprocess
import sys

import pytest

from hsjax.infra import experiments
from hsjax.infra.errors import UserError
from hsjax.modes import train

REPO = pathlib.Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}


def run_py(tmp_path, *args, workdir=None):
    workdir = workdir or tmp_path / "w"
    cmd = [sys.executable, str(REPO / "run.py"), *args, f"--workdir={workdir}"]
    return subprocess.run(cmd, cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=300)


def garbage_hf_dir(tmp_path):
    d = tmp_path / "garbage"
    d.mkdir()
    (d / "config.json").write_text("{}")
    (d / "model.safetensors").write_text("not weights")
    return d


CASES = {
    "unknown key": (["--config.polcy.kind=oracle"], 'Did you mean "policy"'),
    "wrong type": (["--config.limit=abc"], "--config.limit=abc"),
    "bad split": (["--config.policy.kind=oracle", "--config.split=nosuch"], "unknown DBBench split 'nosuch'"),
    "bad pool": (["--config.policy.kind=oracle", "--config.pool={tmp}/pool.json"], "a pool file is an object"),
    "garbage checkpoint": (["--config.policy.kind=jax", "--config.policy.checkpoint={tmp}/garbage"],
                           "Point it at a Hugging Face model directory"),
    "missing checkpoint": (["--config.policy.kind=jax", "--config.policy.checkpoint={tmp}/none"],
                           "is neither an HF model directory"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_user_error_is_one_line(tmp_path, case):
    garbage_hf_dir(tmp_path)
    (tmp_path / "pool.json").write_text('{"base": 3}')
    overrides, expected = CASES[case]
    proc = run_py(tmp_path, "--config", f"{REPO}/experiments/dbbench.py:eval",
                  *[o.format(tmp=tmp_path) for o in overrides])
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("run.py: ") and expected in lines[0], proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr


def test_missing_experiment_file_and_unwritable_workdir(tmp_path):
    proc = run_py(tmp_path, "--config", f"{REPO}/experiments/nosuch.py:eval")
    assert proc.returncode == 2 and "experiments/nosuch.py" in proc.stderr and "Traceback" not in proc.stderr
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    proc = run_py(tmp_path, "--config", f"{REPO}/experiments/dbbench.py:eval", "--config.policy.kind=oracle",
                  workdir=blocker / "w")  # root may write anywhere, but not below a file
    assert proc.returncode == 2 and "is not writable" in proc.stderr and "Traceback" not in proc.stderr


def test_verbose_keeps_the_traceback(tmp_path):
    proc = run_py(tmp_path, "--config", f"{REPO}/experiments/dbbench.py:eval", "--config.policy.kind=jax",
                  f"--config.policy.checkpoint={tmp_path}/none", "--verbose")
    assert proc.returncode != 0 and "Traceback" in proc.stderr and "UserError" in proc.stderr


def test_a_failed_launch_leaves_the_workdir_config_alone(tmp_path):
    workdir = tmp_path / "run"
    workdir.mkdir()
    (workdir / "config.json").write_text('{"the": "config of the run to resume"}')
    config = experiments.load("dbbench").get_config("smoke")
    config.model.hf_dir = str(garbage_hf_dir(tmp_path))
    config.lock()
    with pytest.raises(UserError, match="model.hf_dir="):
        train.main(config, str(workdir))
    assert json.loads((workdir / "config.json").read_text()) == {"the": "config of the run to resume"}
