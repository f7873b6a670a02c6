"""README's main job: the shipped warm start loads, and the demo trains from it and prints its table
(here one step of one arm on a few tasks; README's command runs the full demo)."""
import json
import os
import pathlib
import subprocess
import sys

import numpy as np

from hsjax.models import load_pretrained
from hsjax.infra import experiments
from studies.testbed.demo import arm_config, resolve_warm_start

REPO = pathlib.Path(__file__).resolve().parents[2]
WARM = REPO / "assets" / "testbed_warmstart"


def test_shipped_warm_start_is_a_trained_policy():
    cfg, params, tokenizer = load_pretrained(str(WARM))
    assert cfg.vocab_size == len(tokenizer)
    leaves = [np.asarray(x) for x in __import__("jax").tree.leaves(params)]
    assert all(np.isfinite(x).all() for x in leaves)
    assert resolve_warm_start("assets/testbed_warmstart") == str(WARM)


def test_missing_warm_start_is_named(tmp_path):
    try:
        resolve_warm_start(str(tmp_path / "nowhere"))
    except FileNotFoundError as err:
        assert "assets/testbed_warmstart" in str(err)
    else:
        raise AssertionError("a missing warm start must be an error")


def test_demo_prints_before_and_after(tmp_path):
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    cmd = [sys.executable, "run.py", "--config=experiments/testbed.py:demo", f"--workdir={tmp_path}",
           "--config.demo.arms=policy_only", "--config.demo.total_steps=1", "--config.demo.eval_limit=2", "--config.demo.groups=2"]
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    table = (tmp_path / "demo.txt").read_text()
    assert "warm start" in table and "policy_only" in table
    assert (tmp_path / "policy_only" / "seed0" / "metrics.jsonl").exists()
    row = json.loads((tmp_path / "policy_only" / "seed0" / "metrics.jsonl").read_text().splitlines()[-1])
    assert row["rollouts/total"] == 2 * 4  # demo.groups tasks of n = 4 rollouts
    assert row["batch/T"] in (512, 1024, 2048)  # the arms' buckets
    assert 0.05 < row["memory/host_gib"] <= row["memory/host_peak_gib"] < 8
    assert (tmp_path / "warmstart" / "seed0" / "eval" / "synth_heldout_step000000.json").exists()


def test_demo_sets_the_arms_micro_batches():
    """The demo's update runs 16 micro-batches (its memory goal); fewer when fewer rows would not
    split into 16; 0 leaves the arm's own."""
    demo = experiments.get_config("testbed", "demo")
    own = experiments.get_config("testbed", "harness_s").batch.micro_batches
    with demo.unlocked():
        assert arm_config(demo, "harness_s").batch.micro_batches == 16
        assert arm_config(demo, "policy_only").batch.micro_batches == 16
        demo.demo.groups = 2  # 8 base rows
        assert arm_config(demo, "harness_s").batch.micro_batches == 8
        demo.demo.micro_batches = 0
        assert arm_config(demo, "harness_s").batch.micro_batches == own
