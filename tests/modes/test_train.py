"""End-to-end training through `run.py`: the smoke run, and exact resume after a SIGKILL."""
import contextlib
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np

from hsjax.harness_s.router.profiles import Profiles
from hsjax.infra import checkpoint as ckpt_lib
from hsjax.infra.metrics import read_metrics

REPO = pathlib.Path(__file__).resolve().parents[2]
# Timings and throughput differ between runs; everything else must be identical.
NONDETERMINISTIC = ("time/", "tokens/per_s", "router/latency", "memory/")


def train_command(workdir, total_steps, *extra, arg="smoke"):
    return [sys.executable, str(REPO / "run.py"), "--config", str(REPO / "experiments/dbbench.py") + ":" + arg,
            f"--config.total_steps={total_steps}", "--config.eval.limit=2", "--config.data.limit=8",
            "--config.rollout.max_new_tokens=16", f"--workdir={workdir}", *extra]


def env():
    return {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONUNBUFFERED": "1"}


def run(workdir, total_steps, *extra, arg="smoke"):
    proc = subprocess.run(train_command(workdir, total_steps, *extra, arg=arg), env=env(), cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


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


def kill_after_checkpoint(workdir, total_steps, *extra, step, arg):
    """Starts a run and SIGKILLs it as soon as the checkpoint of `step` is complete."""
    proc = subprocess.Popen(train_command(workdir, total_steps, *extra, arg=arg), env=env(), cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    manifest = pathlib.Path(workdir) / "checkpoints" / str(step) / "hsjax_manifest.json"
    deadline = time.monotonic() + 600
    while not manifest.exists():
        assert proc.poll() is None, "the run ended before writing the checkpoint it was to be killed after"
        assert time.monotonic() < deadline, "no checkpoint within 10 minutes"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()


class StoppedAfterCheckpoint(Exception):
    pass


@contextlib.contextmanager
def stopped_after_checkpoint(monkeypatch, step):
    """Inside it, an in-process `train.main` ends with `StoppedAfterCheckpoint` as soon as the
    checkpoint of `step` is saved, as a run killed then would; yields {step: host state saved}."""
    saved = {}
    save = ckpt_lib.Checkpointer.save

    def save_then_stop(self, at, state, host_state=None):
        save(self, at, state, host_state)
        saved[at] = host_state
        if at == step:
            raise StoppedAfterCheckpoint

    with monkeypatch.context() as patch:
        patch.setattr(ckpt_lib.Checkpointer, "save", save_then_stop)
        yield saved


def decisions(workdir):
    rows = [json.loads(line) for line in (pathlib.Path(workdir) / "router_decisions.jsonl").open()]
    return [{k: v for k, v in row.items() if k != "latency_s"} for row in rows]


def test_smoke_trains_evaluates_checkpoints_and_extends(tmp_path):
    """Two steps (the smoke config evaluates, checkpoints and writes episodes every 2), then one more."""
    workdir = tmp_path / "smoke"
    proc = run(workdir, 2)
    rows = read_metrics(workdir)
    # The console shows a line per step and the evaluations; library INFO records go to log.txt.
    assert "step 1/2 | reward" in proc.stdout and "step 2/2 | reward" in proc.stdout
    assert "standard_heldout" in proc.stdout
    assert "INFO" not in proc.stderr and "orbax" not in proc.stderr
    log = (workdir / "log.txt").read_text()
    assert "hsjax.modes.train" in log and "absl" in log
    assert [r["step"] for r in rows] == [1, 2]
    assert all("loss/pg" in r and "reward/mean" in r and "rescue/triggered_frac" in r for r in rows)
    evaluated = "eval/standard_heldout/base/success"
    assert evaluated not in rows[0] and evaluated in rows[1]
    assert json.loads((workdir / "config.json").read_text())["mode"] == "train"
    assert (workdir / "eval" / "standard_heldout_step000002.json").exists()
    assert list((workdir / "tb").iterdir())
    assert (workdir / "episodes" / "step_000002.jsonl").exists()
    assert ckpt_lib.Checkpointer(workdir / "checkpoints").all_steps()[-1] == 2
    # A rerun with a larger total_steps continues where the run stopped.
    run(workdir, 3)
    assert [r["step"] for r in read_metrics(workdir)] == [1, 2, 3]


def test_harness_s_resumes_exactly_after_sigkill(tmp_path):
    """Rescue through the router with two local voter servers, re-anchoring and checkpointing every
    step; two steps, so the resumed run's one step decides on the profiles re-anchored at step 1
    (restored from the checkpoint, not rebuilt)."""
    every_step = ("--config.router.reanchor_every=1", "--config.checkpoint.every=1")
    straight = tmp_path / "straight"
    run(straight, 2, *every_step, arg="smoke_harness_s")
    rows = read_metrics(straight)
    assert all(r["router/decisions"] > 0 for r in rows)
    assert rows[-1]["router/total/reanchors"] >= 1
    assert rows[-1]["router/total/voter/ok"] > 0  # the rule voter answered
    # The router's profiles as of the last checkpoint, for Rank-1 (`rank1.profiles`).
    profiles = Profiles.load(straight)
    chosen = {h for d in decisions(straight) for h in d["harnesses"]}
    assert chosen and chosen <= set(profiles.profiles)
    observed = sum(sum(p.overall) for p in profiles.profiles.values())
    assert 0 < observed <= rows[-1]["rollouts/rescue_total"]  # re-anchoring decays older counts

    # Killed mid-run after the step-1 checkpoint, then resumed: the same parameters, metrics and
    # router decisions (the router's profiles and voter records come back from the checkpoint).
    resumed = tmp_path / "resumed"
    kill_after_checkpoint(resumed, 2, *every_step, step=1, arg="smoke_harness_s")
    run(resumed, 2, *every_step, arg="smoke_harness_s")
    assert comparable(read_metrics(resumed)) == comparable(rows)
    assert decisions(resumed) == decisions(straight)
    a, b = final_params(straight), final_params(resumed)
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
