import gc
import json
import logging
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from hsjax.infra import checkpoint as ckpt_lib
from hsjax.infra.errors import RunStopped


def make_state(seed: int):
    k1, k2 = jax.random.split(jax.random.PRNGKey(seed))
    params = {
        "embed": jax.random.normal(k1, (16, 8), jnp.float32),
        "layers": {"w_bf16": jax.random.normal(k2, (2, 8, 8)).astype(jnp.bfloat16),
                   "scale": jnp.full((2, 8), 1.0 + seed, jnp.float32)},
    }
    tx = optax.adamw(1e-2)
    opt_state = tx.init(params)
    # One real update so mu/nu/count are not trivially zero.
    grads = jax.tree.map(lambda p: jnp.ones_like(p) * 0.1, params)
    _, opt_state = tx.update(grads, opt_state, params)
    return {
        "params": params,
        "opt": opt_state,
        "step": jnp.asarray(100 + seed, jnp.int32),
        "rng": jax.random.key(seed),
        "rng_raw": jax.random.PRNGKey(seed + 1),
    }


def host_state(step):
    return {"data": {"epoch": 1, "position": step * 8, "order": [3, 1, 2]},
            "router": {"profiles": {"h1": {"alpha": 1.5, "beta": 2.0}}, "anchor": None},
            "note": "ünïcode ok", "flags": [True, False]}


def assert_bitwise_equal(a_tree, b_tree):
    a_leaves, a_def = jax.tree.flatten(a_tree)
    b_leaves, b_def = jax.tree.flatten(b_tree)
    assert a_def == b_def
    for a, b in zip(a_leaves, b_leaves):
        if isinstance(a, jax.Array) and jnp.issubdtype(a.dtype, jax.dtypes.prng_key):
            assert b.dtype == a.dtype
            a, b = jax.random.key_data(a), jax.random.key_data(b)
        a, b = np.asarray(a), np.asarray(b)
        assert a.dtype == b.dtype and a.shape == b.shape
        assert a.tobytes() == b.tobytes()


def save_steps(tmp_path, steps, keep=5):
    ckpt = ckpt_lib.Checkpointer(tmp_path / "checkpoints", keep=keep)
    for s in steps:
        ckpt.save(s, make_state(s), host_state(s))
    return ckpt


def test_exact_round_trip(tmp_path):
    state = make_state(3)
    with ckpt_lib.Checkpointer(tmp_path, keep=2) as ckpt:  # a workdir: resolves to checkpoints/
        ckpt.save(7, state, host_state(7))
        assert ckpt.directory == (tmp_path / "checkpoints").absolute()
        # Template of zeros with the same structure: values must come from disk.
        template = jax.tree.map(jnp.zeros_like, state)
        template["rng"] = jax.random.key(0)
        restored = ckpt.restore(7, template)
    assert restored.step == 7
    assert restored.host_state == host_state(7)
    assert_bitwise_equal(restored.state, state)
    assert restored.state["rng"].dtype == state["rng"].dtype  # typed key stays typed
    assert isinstance(restored.state["opt"][0], optax.ScaleByAdamState)
    # Abstract template (ShapeDtypeStruct with sharding) works too, via the module-level helper.
    abstract = ckpt_lib.abstract_state(state)
    again = ckpt_lib.restore_latest(tmp_path, abstract)
    assert again.step == 7
    assert_bitwise_equal(again.state, state)
    leaf = again.state["params"]["embed"]
    assert leaf.sharding == state["params"]["embed"].sharding


def test_keep_last_n_and_steps(tmp_path):
    ckpt = save_steps(tmp_path, [1, 2, 3, 4], keep=2)
    assert ckpt.all_steps() == [3, 4]
    assert sorted(p.name for p in ckpt.directory.iterdir()) == ["3", "4"]
    restored = ckpt.restore_latest(make_state(0))
    assert restored.step == 4 and restored.host_state == host_state(4)
    assert_bitwise_equal(restored.state, make_state(4))
    with pytest.raises(ckpt_lib.CheckpointError, match="No checkpoint step 1 .*saved steps: \\[3, 4\\]"):
        ckpt.restore(1, make_state(0))


def test_no_checkpoint_returns_none(tmp_path):
    assert ckpt_lib.restore_latest(tmp_path / "fresh_workdir", make_state(0)) is None
    assert ckpt_lib.Checkpointer(tmp_path / "checkpoints").restore_latest(make_state(0)) is None


def _largest_data_file(step_dir: pathlib.Path) -> pathlib.Path:
    files = [p for p in (step_dir / "state").rglob("*") if p.is_file() and "/d/" in str(p)]
    return max(files, key=lambda p: p.stat().st_size)


def test_truncated_latest_falls_back(tmp_path, caplog):
    ckpt = save_steps(tmp_path, [10, 20])
    victim = _largest_data_file(ckpt.step_dir(20))
    size = victim.stat().st_size
    with open(victim, "r+b") as f:
        f.truncate(size // 2)
    with pytest.raises(ckpt_lib.CheckpointError) as err:
        ckpt.restore(20, make_state(0))
    message = str(err.value)
    assert "step 20" in message and str(ckpt.step_dir(20)) in message
    assert victim.name in message and "truncated" in message
    with caplog.at_level(logging.WARNING, logger="hsjax.infra.checkpoint"):
        restored = ckpt.restore_latest(make_state(0))
    assert restored.step == 10
    assert_bitwise_equal(restored.state, make_state(10))
    assert any("step 20" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)


def test_zeroed_file_and_missing_metadata(tmp_path):
    ckpt = save_steps(tmp_path, [1, 2, 3])
    victim = _largest_data_file(ckpt.step_dir(3))
    victim.write_bytes(b"\0" * victim.stat().st_size)  # same size, different bytes
    (ckpt.step_dir(2) / "state" / "_METADATA").unlink()
    with pytest.raises(ckpt_lib.CheckpointError, match="does not match the sha256"):
        ckpt.restore(3, make_state(0))
    with pytest.raises(ckpt_lib.CheckpointError, match="step 2 .*_METADATA is missing"):
        ckpt.restore(2, make_state(0))
    assert ckpt.restore_latest(make_state(0)).step == 1


def test_all_corrupt_is_a_clear_error(tmp_path):
    ckpt = save_steps(tmp_path, [5, 6])
    for step in (5, 6):
        victim = _largest_data_file(ckpt.step_dir(step))
        with open(victim, "r+b") as f:
            f.truncate(3)
    with pytest.raises(ckpt_lib.CheckpointError) as err:
        ckpt.restore_latest(make_state(0))
    message = str(err.value)
    assert "All 2 checkpoints" in message and "step 5" in message and "step 6" in message
    # One line that run.py prints as such (a RunStopped), naming the directory and the fix.
    assert isinstance(err.value, ckpt_lib.NoUsableCheckpoint) and isinstance(err.value, RunStopped)
    assert "\n" not in message and f"Move or delete {ckpt.directory}" in message


def test_nonfinite_state_is_never_saved(tmp_path):
    ckpt = save_steps(tmp_path, [1])
    state = make_state(2)
    state["params"]["layers"]["w_bf16"] = state["params"]["layers"]["w_bf16"].at[0, 0, 0].set(jnp.inf)
    with pytest.raises(ckpt_lib.NonFiniteState, match=r"step 2: 1 arrays hold NaN or inf .*w_bf16"):
        ckpt.save(2, state, host_state(2))
    assert ckpt.all_steps() == [1]


def test_crash_mid_save_is_never_restored(tmp_path):
    ckpt = save_steps(tmp_path, [1, 2])
    # Crash after orbax's rename but before the manifest: step 2 is finalized, not verified.
    (ckpt.step_dir(2) / ckpt_lib.MANIFEST_NAME).unlink()
    # Crash inside orbax's save: only a temporary directory exists for step 3.
    tmp_dir = ckpt.directory / "3.orbax-checkpoint-tmp-1234567"
    (tmp_dir / "state").mkdir(parents=True)
    (tmp_dir / "state" / "_METADATA").write_text("{")
    reopened = ckpt_lib.Checkpointer(ckpt.directory, keep=5)
    assert 3 not in reopened.all_steps()
    with pytest.raises(ckpt_lib.CheckpointError, match="step 2 .*no hsjax_manifest.json"):
        reopened.restore(2, make_state(0))
    assert reopened.restore_latest(make_state(0)).step == 1
    # Training resumes from 1 and reaches step 2 again: the unverified step is replaced.
    reopened.save(2, make_state(22), host_state(22))
    assert not tmp_dir.exists()  # orbax removes stale temporary directories on start-up
    restored = reopened.restore_latest(make_state(0))
    assert restored.step == 2 and restored.host_state == host_state(22)
    with pytest.raises(ckpt_lib.CheckpointError, match="already exists"):
        reopened.save(2, make_state(2), host_state(2))


# orbax leaves its aborted read coroutines to the garbage collector; collect them here.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_template_mismatch_names_the_step(tmp_path):
    ckpt = save_steps(tmp_path, [4])
    wrong = make_state(0)
    wrong["params"]["embed"] = jnp.zeros((3, 3))
    with pytest.raises(ckpt_lib.CheckpointError, match="step 4 .*could not be restored"):
        ckpt.restore(4, wrong)
    ckpt.close()
    gc.collect()


def test_host_state_must_be_json(tmp_path):
    ckpt = ckpt_lib.Checkpointer(tmp_path / "checkpoints")
    with pytest.raises(TypeError, match="host_state for step 1 must be plain JSON"):
        ckpt.save(1, make_state(1), {"position": np.int64(3)})
    assert ckpt.all_steps() == []


def test_load_params_without_template(tmp_path):
    save_steps(tmp_path, [1, 2])
    ckpt_dir = tmp_path / "checkpoints"
    params = ckpt_lib.load_params(ckpt_dir)
    assert_bitwise_equal(params, make_state(2)["params"])
    assert params["layers"]["w_bf16"].dtype == jnp.bfloat16
    whole = ckpt_lib.load_params(ckpt_dir, step=1, subtree=None)
    assert_bitwise_equal(whole["params"], make_state(1)["params"])
    assert int(whole["step"]) == 101
    with pytest.raises(ckpt_lib.CheckpointError, match="no 'weights'"):
        ckpt_lib.load_params(ckpt_dir, subtree="weights")
    manifest = json.loads((ckpt_dir / "2" / ckpt_lib.MANIFEST_NAME).read_text())
    assert manifest["step"] == 2 and any(k.startswith("state/") for k in manifest["files"])
