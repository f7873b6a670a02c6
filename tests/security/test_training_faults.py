"""Red-team tests of training (issue 36, item 4a): a non-finite update, a full disk during a save,
and a checkpoint directory whose every manifest is corrupt each end a real `run.py` training run
with one line naming the cause and the fix, and nothing non-finite or half-written is ever saved
or restored. Each failed on d648ba9 (see docs/reliability.md)."""
import json
import os
import subprocess
import uuid

import jax.numpy as jnp
import numpy as np
import pytest

from hsjax.infra import checkpoint as ckpt_lib
from hsjax.infra.metrics import read_metrics
from tests.modes.test_train import env, final_params, train_command

# The smoke run cut to what these tests need: no evaluation or episode files, a checkpoint every
# step, and a learning rate that is finite (the config check passes it) but grows the weights to
# ~1e35 at step 1, so that step 2's update overflows them to inf while the loss stays 0.
FAST = ("--config.eval.every=0", "--config.log.episodes_every=0", "--config.checkpoint.every=1")
OVERFLOW = ("--config.optim.learning_rate=1e38", "--config.optim.warmup_steps=0")


def run_py(workdir, total_steps, *extra):
    return subprocess.run(train_command(workdir, total_steps, *FAST, *extra), env=env(),
                          capture_output=True, text=True, timeout=600)


def assert_one_line(proc, *expected):
    """rc 2 and one line on stderr holding every `expected`, no traceback anywhere."""
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, (proc.returncode, proc.stderr[-3000:])
    assert all(text in lines[0] for text in expected), lines[0]
    assert "Traceback" not in proc.stdout + proc.stderr and "Event loop" not in proc.stderr


def all_finite(params):
    return all(np.isfinite(np.asarray(leaf, np.float32)).all() for _, leaf in _walk(params))


def _walk(tree, prefix=""):
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield from _walk(value, f"{prefix}/{key}")
    else:
        yield prefix, tree


def test_nonfinite_update_stops_before_saving_then_skip_mode_skips_and_counts(tmp_path):
    """On d648ba9 this run ended rc 0 with "loss 0" and every weight of checkpoint 2 inf."""
    workdir = tmp_path / "w"
    stopped = run_py(workdir, 2, *OVERFLOW)
    assert_one_line(stopped, "step 2: the update was not finite", "parameters overflowed",
                    "checkpoint, step 1, is intact", "loss.nonfinite=skip")
    assert ckpt_lib.Checkpointer(workdir / "checkpoints").all_steps() == [1]
    assert all_finite(ckpt_lib.load_params(workdir / "checkpoints", 1))
    assert [r["step"] for r in read_metrics(workdir)] == [1]  # the stopped step is not reported

    # The same command with skip resumes from step 1, skips step 2's update and counts it: the
    # checkpoint of step 2 holds exactly step 1's params.
    skipped = run_py(workdir, 2, *OVERFLOW, "--config.loss.nonfinite=skip")
    assert skipped.returncode == 0, skipped.stderr[-3000:]
    rows = read_metrics(workdir)
    assert [(r["step"], r["train/nonfinite"], r["train/nonfinite_steps"]) for r in rows] == [
        (1, 0.0, 0), (2, 1.0, 1)]
    after = final_params(workdir)
    assert all(np.isfinite(leaf.astype(np.float32)).all() for leaf in after.values())
    before = {path: leaf for path, leaf in _walk(ckpt_lib.load_params(workdir / "checkpoints", 1))}
    assert after.keys() == before.keys()
    for path, leaf in after.items():
        np.testing.assert_array_equal(leaf, np.asarray(before[path]), err_msg=path)


@pytest.fixture
def small_disk(tmp_path):
    """A 6 MiB tmpfs: room for one checkpoint of the smoke model (3.9 MB), not for two."""
    mount_point = tmp_path / f"disk-{uuid.uuid4().hex[:6]}"
    mount_point.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(mount_point)],
                          capture_output=True, text=True)
    if done.returncode:
        pytest.skip(f"cannot mount a size-limited tmpfs here ({done.stderr.strip()}); needs root")
    yield mount_point
    subprocess.run(["umount", str(mount_point)], check=True)


def test_disk_full_during_a_save_is_one_line_and_keeps_the_last_checkpoint(small_disk):
    """On d648ba9: rc 1, a traceback of ~160 frames and "Event loop is closed" spam, the cause
    (os_error_code=28) buried in it."""
    workdir = small_disk / "w"
    proc = run_py(workdir, 2)
    assert_one_line(proc, "No space left on device for checkpoint step 2", str(workdir / "checkpoints"),
                    "MiB are free", "checkpoint, step 1, is intact", "--workdir on a larger disk")
    checkpointer = ckpt_lib.Checkpointer(workdir / "checkpoints")
    assert checkpointer.all_steps() == [1]
    assert not list((workdir / "checkpoints").glob("*tmp*"))  # nothing half-written left behind
    assert all_finite(ckpt_lib.load_params(workdir / "checkpoints", 1))


def test_disk_filling_while_orbax_writes_is_one_line_and_leaves_nothing_half_written(small_disk):
    """The first save of a run has no earlier step to size it by, so orbax starts writing and
    runs into ENOSPC itself; the error is still one `DiskFull` and the step's partial files go."""
    checkpointer = ckpt_lib.Checkpointer(small_disk / "checkpoints")
    checkpointer.save(1, {"w": jnp.ones(16)})
    noise = {"w": jnp.asarray(np.random.default_rng(0).normal(size=2 << 20), jnp.float32)}  # 8 MB
    with pytest.raises(ckpt_lib.DiskFull, match="No space left on device for checkpoint step 2") as err:
        checkpointer.save(2, noise)
    assert "\n" not in str(err.value) and "step 1, is intact" in str(err.value)
    assert checkpointer.all_steps() == [1]
    assert not list((small_disk / "checkpoints").glob("*tmp*"))
    assert checkpointer.restore_latest({"w": jnp.zeros(16)}).step == 1


def test_every_manifest_corrupt_is_one_line_naming_the_directory_and_the_fix(tmp_path):
    """On d648ba9: a traceback ending in a multi-line CheckpointError."""
    workdir = tmp_path / "w"
    checkpointer = ckpt_lib.Checkpointer(workdir / "checkpoints")
    for step in (1, 2):
        checkpointer.save(step, {"w": jnp.ones(4)})
        manifest = checkpointer.step_dir(step) / ckpt_lib.MANIFEST_NAME
        manifest.write_text(json.dumps({"step": step})[:-3])  # cut short: not JSON any more
    proc = run_py(workdir, 3)
    assert_one_line(proc, "All 2 checkpoints in", str(workdir / "checkpoints"), "unusable",
                    "hsjax_manifest.json is unreadable", "Move or delete")
    assert sorted(os.listdir(workdir / "checkpoints")) == ["1", "2"]  # left as they were
