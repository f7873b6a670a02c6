"""End-to-end training through `run.py`: the smoke run, and exact resume after a SIGKILL."""
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np

from hsjax import checkpoint as ckpt_lib
from hsjax.metrics import read_metrics

REPO = pathlib.Path(__file__).resolve().parents[1]
# Timings and throughput differ between runs; everything else must be identical.
NONDETERMINISTIC = ("time/", "tokens/per_s")


def train_command(workdir, total_steps, *extra):
    return [sys.executable, str(REPO / "run.py"), "--config", str(REPO / "experiments/dbbench.py") + ":smoke",
            f"--config.total_steps={total_steps}", "--config.eval.limit=2", "--config.data.limit=8",
            "--config.rollout.max_new_tokens=16", f"--workdir={workdir}", *extra]


def env():
    return {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONUNBUFFERED": "1"}


def run(workdir, total_steps, *extra):
    proc = subprocess.run(train_command(workdir, total_steps, *extra), env=env(), cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]


def comparable(rows):
    return [{k: v for k, v in row.items() if not k.startswith(NONDETERMINISTIC)} for row in rows]


def final_params(workdir):
    params = ckpt_lib.load_params(pathlib.Path(workdir) / "checkpoints")
    return {jax_path: np.asarray(leaf) for jax_path, leaf in _flatten(params)}


def _flatten(tree, prefix=""):
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield from _flatten(value, f"{prefix}/{key}")
    else:
        yield prefix, tree


def kill_after_checkpoint(workdir, total_steps, step):
    """Starts a run and SIGKILLs it as soon as the checkpoint of `step` is complete."""
    proc = subprocess.Popen(train_command(workdir, total_steps), env=env(), cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    manifest = pathlib.Path(workdir) / "checkpoints" / str(step) / "hsjax_manifest.json"
    deadline = time.monotonic() + 600
    while not manifest.exists():
        assert proc.poll() is None, "the run ended before writing the checkpoint it was to be killed after"
        assert time.monotonic() < deadline, "no checkpoint within 10 minutes"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def test_smoke_trains_evaluates_checkpoints_and_extends(tmp_path):
    straight = tmp_path / "straight"
    run(straight, 4)
    rows = read_metrics(straight)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert all("loss/pg" in r and "reward/mean" in r and "rescue/triggered_frac" in r for r in rows)
    assert "eval/standard_heldout/base/success" in rows[1]
    assert json.loads((straight / "config.json").read_text())["mode"] == "train"
    assert (straight / "eval" / "standard_heldout_step000002.json").exists()
    assert list((straight / "tb").iterdir())
    assert (straight / "episodes" / "step_000002.jsonl").exists()
    assert ckpt_lib.Checkpointer(straight / "checkpoints").all_steps()[-1] == 4

    # Killed mid-run after the step-2 checkpoint, then resumed: the same parameters and metrics.
    resumed = tmp_path / "resumed"
    kill_after_checkpoint(resumed, 4, step=2)
    run(resumed, 4)
    assert comparable(read_metrics(resumed)) == comparable(rows)
    a, b = final_params(straight), final_params(resumed)
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)

    # A rerun with a larger total_steps continues where the run stopped.
    run(straight, 5)
    assert [r["step"] for r in read_metrics(straight)] == [1, 2, 3, 4, 5]
