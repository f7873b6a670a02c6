"""One-step-off rollouts (`rollout.staleness=1`): step t+1's rollouts are collected during step t's
update with the params before it, change nothing else, and a run stopped after a checkpoint resumes
exactly (the checkpoint carries the batch collected ahead)."""
import hashlib
import json
import os
import signal

import jax
import numpy as np
import pytest

from hsjax import builders
from hsjax.harness_s import step_rollouts
from hsjax.infra import checkpoint as ckpt_lib
from hsjax.infra.errors import UserError
from hsjax.infra import experiments
from hsjax.modes import train
from hsjax.rl import grpo
from tests.modes.test_train import StoppedAfterCheckpoint, stopped_after_checkpoint
from tests.rollout.test_runner import FlakyEnvironments

pytestmark = pytest.mark.filterwarnings("ignore:Some donated buffers were not usable")
# Timings, throughput and memory differ between runs; rollout/staleness is what the arms differ in.
VARYING = ("time/", "tokens/per_s", "memory/", "router/latency", "rollout/staleness")


def async_config(total_steps, staleness, learning_rate=None):
    # The v3 warm start with the tables_first sibling: some rollouts succeed, so updates move the params.
    config = experiments.get_config("testbed", "names_tables_first,smoke,v3")
    config.total_steps = total_steps
    config.rollout.staleness = staleness
    config.optim.schedule_steps = 3  # one schedule for runs stopped and resumed
    config.optim.warmup_steps = 0  # the first update moves the params too
    if learning_rate is not None:
        config.optim.learning_rate = learning_rate
    config.checkpoint.every, config.checkpoint.keep = 1, 5
    config.eval.every = 0
    config.rollout.groups, config.rollout.max_new_tokens = 4, 64
    return config


def rows(workdir):
    return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


def comparable(workdir):
    return [{k: v for k, v in row.items() if not k.startswith(VARYING)} for row in rows(workdir)]


def fingerprint(params) -> str:
    digest = hashlib.sha256()
    for leaf in jax.tree.leaves(params):
        digest.update(np.asarray(leaf).tobytes())
    return digest.hexdigest()


def recording_collect(patch, seen: dict) -> None:
    """Patches `collect` to note {step: fingerprint of the params the policy held when that step's
    rollouts were collected} in `seen`."""
    collect = step_rollouts.collect

    def recording(ctx, step, version):
        seen[step] = fingerprint(ctx.runner.policy.params)
        return collect(ctx, step, version)

    patch.setattr(step_rollouts, "collect", recording)


@pytest.fixture
def sampled_with(monkeypatch):
    seen = {}
    recording_collect(monkeypatch, seen)
    return seen


@pytest.fixture(scope="module")
def one_step_off(tmp_path_factory):
    """A 3-step run with staleness 1 and what each step's rollouts sampled: (workdir, sampled_with)."""
    workdir, seen = tmp_path_factory.mktemp("async") / "run", {}
    with pytest.MonkeyPatch.context() as patch:
        recording_collect(patch, seen)
        train.main(async_config(3, staleness=1), str(workdir))
    return workdir, seen


def test_one_step_off_samples_with_the_params_one_update_behind(one_step_off):
    workdir, sampled_with = one_step_off
    saved = {step: fingerprint(ckpt_lib.load_params(workdir / "checkpoints", step)) for step in (1, 2, 3)}
    assert len({sampled_with[0], *saved.values()}) == 4  # every update moved the params
    # step 0 samples the initial params; step t >= 1 the params after t - 1 updates, while update t runs
    assert (sampled_with[1], sampled_with[2]) == (sampled_with[0], saved[1])
    assert [r["rollout/staleness"] for r in rows(workdir)] == [0, 1, 1]
    assert all(np.isfinite(r["loss/pg"]) and "logprob_gap/abs_mean" in r for r in rows(workdir))


def test_synchronous_steps_sample_the_params_of_their_own_step(tmp_path, sampled_with):
    workdir = tmp_path / "sync"
    train.main(async_config(2, staleness=0), str(workdir))
    assert sampled_with[1] == fingerprint(ckpt_lib.load_params(workdir / "checkpoints", 1))
    assert [r["rollout/staleness"] for r in rows(workdir)] == [0, 0]


def test_with_params_that_never_move_one_step_off_changes_nothing(tmp_path):
    # Learning rate 0: both arms sample the same params, so any other difference is the pipeline's.
    # Two steps: step 2's batch is the one collected ahead.
    train.main(async_config(2, staleness=0, learning_rate=0.0), str(tmp_path / "sync"))
    train.main(async_config(2, staleness=1, learning_rate=0.0), str(tmp_path / "async"))
    assert [r["rollout/staleness"] for r in rows(tmp_path / "async")] == [0, 1]
    assert comparable(tmp_path / "sync") == comparable(tmp_path / "async")


def test_one_step_off_resumes_exactly(one_step_off, tmp_path, monkeypatch):
    straight, _ = one_step_off
    with stopped_after_checkpoint(monkeypatch, 2) as saved, pytest.raises(StoppedAfterCheckpoint):
        train.main(async_config(3, staleness=1), str(tmp_path / "resumed"))
    assert "collected_ahead" in saved[2]  # the batch of step 3, sampled with the params of step 1
    train.main(async_config(3, staleness=1), str(tmp_path / "resumed"))
    assert comparable(tmp_path / "resumed") == comparable(straight)
    assert [r["rollout/staleness"] for r in rows(tmp_path / "resumed")] == [0, 1, 1]
    for a, b in zip(jax.tree.leaves(ckpt_lib.load_params(straight / "checkpoints", subtree=None)),
                    jax.tree.leaves(ckpt_lib.load_params(tmp_path / "resumed" / "checkpoints", subtree=None))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_sigterm_saves_the_step_in_flight_and_the_run_resumes_exactly(one_step_off, tmp_path, monkeypatch):
    """A scheduler's SIGTERM during step 2's update (while step 3's rollouts are collected ahead):
    step 2 finishes, is checkpointed though checkpoint.every is 5, with the batch collected ahead,
    and the run ends with exit status 143; the same command ends where an uninterrupted run does."""
    straight, _ = one_step_off
    def config():
        c = async_config(3, staleness=1)
        c.checkpoint.every = 5
        return c

    jit_train_step = grpo.jit_train_step

    def signalling_jit(*args, **kwargs):
        update, calls = jit_train_step(*args, **kwargs), []

        def step(*a, **k):
            calls.append(1)
            if len(calls) == 2:
                os.kill(os.getpid(), signal.SIGTERM)
            return update(*a, **k)
        return step

    workdir = tmp_path / "termed"
    handler = signal.getsignal(signal.SIGTERM)
    with monkeypatch.context() as patch:
        patch.setattr(grpo, "jit_train_step", signalling_jit)
        with pytest.raises(SystemExit) as stopped:
            train.main(config(), str(workdir))
    assert stopped.value.code == 143 and stopped.value.step == 2
    assert signal.getsignal(signal.SIGTERM) == handler  # the loop's handler is gone with it
    checkpointer = ckpt_lib.Checkpointer(workdir / "checkpoints", read_only=True)
    assert checkpointer.all_steps() == [2]
    assert [r["step"] for r in rows(workdir)] == [1, 2]
    train.main(config(), str(workdir))
    assert comparable(workdir) == comparable(straight)
    for a, b in zip(jax.tree.leaves(ckpt_lib.load_params(straight / "checkpoints", subtree=None)),
                    jax.tree.leaves(ckpt_lib.load_params(workdir / "checkpoints", subtree=None))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_environment_failures_are_run_again_with_their_seeds_and_change_nothing(one_step_off, tmp_path, monkeypatch):
    """The training runner re-runs an episode whose environment failed with its own episode seed, so
    a run whose sandboxes fail to start sometimes trains exactly as one whose sandboxes never fail;
    the re-runs are counted, not as rollouts. (The warm start samples nearly deterministically, so
    that the re-runs keep their episode seeds is checked with a random model in
    tests/rollout/test_runner.py.)"""
    straight, _ = one_step_off
    make_benchmark = builders.make_benchmark
    monkeypatch.setattr(builders, "make_benchmark", lambda config: FlakyEnvironments(make_benchmark(config), 2))
    workdir = tmp_path / "flaky"
    train.main(async_config(3, staleness=1), str(workdir))
    without = lambda w: [{k: v for k, v in r.items() if k != "rollouts/env_reruns"} for r in comparable(w)]
    assert without(workdir) == without(straight)
    reruns = [r["rollouts/env_reruns"] for r in rows(workdir)]
    assert reruns[0] > 0 and all(r["rollouts/env_errors"] == 0 for r in rows(workdir))
    assert all(r["rollouts/env_reruns"] == 0 for r in rows(straight))
    for a, b in zip(jax.tree.leaves(ckpt_lib.load_params(straight / "checkpoints", subtree=None)),
                    jax.tree.leaves(ckpt_lib.load_params(workdir / "checkpoints", subtree=None))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_staleness_the_loop_cannot_keep_is_refused(tmp_path):
    config = async_config(1, staleness=2)
    with pytest.raises(UserError, match="rollout.staleness=2"):
        train.main(config, str(tmp_path / "run"))
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_a_batch_collected_ahead_survives_the_checkpoints_json():
    rng = np.random.default_rng(0)
    B, T = 4, 8
    batch = step_rollouts.batch_lib.TrainBatch(
        tokens_BxT=rng.integers(0, 50, (B, T), dtype=np.int32), positions_BxT=np.tile(np.arange(T, dtype=np.int32), (B, 1)),
        segment_ids_BxT=np.ones((B, T), np.int32), loss_mask_BxT=rng.random((B, T)) < 0.5,
        old_logp_BxT=-rng.random((B, T)).astype(np.float32), reward_B=np.array([1, 0, 0.5, 0], np.float32),
        group_B=np.array([0, 0, 1, 1], np.int32), slot_B=np.array([0, 1, 0, 1], np.int32),
        harness_B=np.zeros(B, np.int32), is_rescue_B=np.zeros(B, bool), valid_B=np.ones(B, bool),
        recontext_B=np.zeros(B, bool), overlong_B=np.zeros(B, bool), num_groups=2)
    ahead = step_rollouts.StepBatch(step=3, version=2, batch=batch, micro_T=(8, 4),
                                    metrics={"reward/mean": np.float32(0.25), "router/score": float("nan"),
                                             "rollouts/base": np.int64(8)},
                                    decisions=[{"step": 3, "chose": ["a", "b"]}], episodes=None)
    text = json.dumps(ahead.to_json(), allow_nan=False)  # the checkpoint's host state is strict JSON
    back = step_rollouts.StepBatch.from_json(json.loads(text))
    assert (back.step, back.version, back.micro_T, back.decisions) == (3, 2, (8, 4), ahead.decisions)
    assert back.metrics["reward/mean"] == 0.25 and back.metrics["rollouts/base"] == 8
    assert np.isnan(back.metrics["router/score"])
    for field in ("tokens_BxT", "loss_mask_BxT", "old_logp_BxT", "reward_B", "recontext_B"):
        got, want = getattr(back.batch, field), getattr(batch, field)
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
    assert back.batch.num_groups == 2 and back.batch.ref_logp_BxT is None
