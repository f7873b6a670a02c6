"""The jitted GRPO update on a tiny model: tracing, masking, accumulation, learning, sharding."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from hsjax.rl import grpo
from hsjax.rl.batch import GroupRollouts, group_by_length, pack
from hsjax.rl.losses import LossConfig, target_mask, token_logp
from hsjax.models.model import forward, init_params
from hsjax.models.presets import get_preset
from hsjax.rl.optim import decay_mask, make_optimizer
from hsjax.rollout.engine import Segment, Trajectory

pytestmark = pytest.mark.filterwarnings("ignore:Some donated buffers were not usable")

CFG = get_preset("tiny", num_layers=2)
T_BUCKET = 32
PAD = 0


def traj(reward, lengths, rng):
    """Prompt tokens (mask 0) then policy tokens (mask 1) in each segment."""
    segments = []
    for n in lengths:
        tokens = rng.integers(1, CFG.vocab_size, n).astype(np.int32)
        mask = (np.arange(n) >= 4).astype(np.int32)
        segments.append(Segment(tokens=tokens, loss_mask=mask,
                                logprobs=np.where(mask, -1.0, 0.0).astype(np.float32)))
    return Trajectory(result={"reward": float(reward)}, segments=segments, turns=[],
                      num_generated_tokens=0, timings={})


def make_batch(pattern, n=2, R=2, seed=0, rescue_context="as_generated"):
    """pattern: per group (base rewards, rescue rewards); lengths vary, some rows have 2 segments."""
    rng = np.random.default_rng(seed)
    groups = []
    for base_rewards, rescue_rewards in pattern:
        base = [traj(r, [int(rng.integers(8, 30))], rng) for r in base_rewards]
        rescue = [traj(r, [int(rng.integers(6, 14)), int(rng.integers(6, 14))], rng)
                  for r in rescue_rewards]
        rerendered = None
        if rescue_context == "base":
            rerendered = [traj(-1.0, [int(rng.integers(8, 30))], rng) for _ in rescue]
        groups.append(GroupRollouts(base=base, base_harness=0, rescue=rescue,
                                    rescue_harness=list(range(1, len(rescue) + 1)),
                                    rescue_in_base=rerendered))
    return pack(groups, G=len(pattern), n=n, R=R, T_buckets=T_BUCKET, pad_id=PAD,
                rescue_context=rescue_context)


@functools.lru_cache(maxsize=None)
def params0():
    return init_params(CFG, jax.random.key(0))


@jax.jit
def _logp(params, tokens, positions, segment_ids):
    logits, _ = forward(CFG, params, tokens, positions, segment_ids_BxT=segment_ids)
    return token_logp(logits, tokens)[0]


def policy_logp(params, batch):
    return np.asarray(_logp(params, batch.tokens_BxT, batch.positions_BxT, batch.segment_ids_BxT))


def on_policy(batch, params):
    """Sets old_logp to the model's own logp of the policy tokens, as the sampler would."""
    logp = policy_logp(params, batch)
    return batch.replace(old_logp_BxT=np.where(batch.loss_mask_BxT, logp, 0.0).astype(np.float32))


def grads_fn(loss_cfg, num_micro_batches=1):
    return jax.jit(functools.partial(grpo.compute_grads, cfg=CFG, loss_cfg=loss_cfg,
                                     num_micro_batches=num_micro_batches))


def assert_trees_close(a, b, rtol=1e-5, atol=1e-7):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol)


def assert_same_update(want_grads, want_metrics, grads, metrics):
    """Gradients equal up to float order (tolerance relative to the largest entry), metrics too."""
    scale = max(float(jnp.abs(g).max()) for g in jax.tree.leaves(want_grads))
    assert_trees_close(want_grads, grads, rtol=1e-4, atol=1e-5 * scale)
    for key in want_metrics:
        np.testing.assert_allclose(float(metrics[key]), float(want_metrics[key]),
                                   rtol=1e-5, atol=1e-6, err_msg=key)


def new_state(optimizer):
    return grpo.init_train_state(jax.tree.map(jnp.array, params0()), optimizer, jax.random.key(1))


PATTERNS = [
    [([1, 0], []), ([0, 0], [])],  # one mixed group, one all-fail without rescue
    [([0, 0], [1, 0]), ([0, 1], [])],  # rescue replaces group 0
    [([0, 0], [0, 0]), ([1, 1], [0, 1])],  # failed rescue; all-success group with masked rescue
]


def test_train_step_traces_once_for_all_rescue_patterns(monkeypatch):
    optimizer = make_optimizer(learning_rate=1e-3, warmup_steps=1, total_steps=10)
    traces = []
    compute_grads = grpo.compute_grads

    def counting_compute_grads(*args, **kwargs):
        traces.append(1)  # runs only while jax traces the step
        return compute_grads(*args, **kwargs)

    monkeypatch.setattr(grpo, "compute_grads", counting_compute_grads)
    jitted = grpo.jit_train_step(CFG, LossConfig(), optimizer)
    state = new_state(optimizer)
    for i, pattern in enumerate(PATTERNS):
        batch = make_batch(pattern, seed=i)
        assert batch.shape == (8, T_BUCKET)
        state, metrics = jitted(state, batch)
        assert all(np.isfinite(float(v)) for v in metrics.values())
    assert len(traces) == 1
    assert jitted._cache_size() == 1
    assert int(state.step) == 3
    # Pattern 3: group 0 rescue failed (no signal), group 1 all success (zero advantage).
    assert float(metrics["groups/no_signal_frac"]) == 0.5
    assert float(metrics["rescue/success_frac"]) == 0.0
    assert float(metrics["advantage/nonzero_frac"]) == 0.0


def test_masked_tokens_and_slots_do_not_change_the_gradient():
    # Group 0: base mixed, rescue present but masked; group 1: all fail, rescue failed.
    batch = on_policy(make_batch([([1, 0], [1, 0]), ([0, 0], [0])], seed=3), params0())
    compute = grads_fn(LossConfig(beta=0.1))
    rng = np.random.default_rng(0)
    batch = batch.replace(ref_logp_BxT=batch.old_logp_BxT + 0.1)
    grads, metrics = compute(params0(), batch)
    assert max(float(jnp.abs(g).max()) for g in jax.tree.leaves(grads)) > 0

    inactive_B = np.ones(8, bool)
    inactive_B[[0, 1]] = False  # only group 0's base slots are active
    untrained = ~batch.loss_mask_BxT | inactive_B[:, None]
    tokens = batch.tokens_BxT.copy()
    tokens[inactive_B] = rng.integers(1, CFG.vocab_size, tokens[inactive_B].shape)
    tokens[batch.positions_BxT < 0] = rng.integers(1, CFG.vocab_size)  # padding ids
    perturbed = batch.replace(
        tokens_BxT=tokens,
        old_logp_BxT=np.where(untrained, rng.normal(0, 50, untrained.shape), batch.old_logp_BxT
                              ).astype(np.float32),
        ref_logp_BxT=np.where(untrained, rng.normal(0, 50, untrained.shape), batch.ref_logp_BxT
                              ).astype(np.float32),
        reward_B=np.where(inactive_B & batch.is_rescue_B & (batch.group_B == 0),
                          1.0 - batch.reward_B, batch.reward_B).astype(np.float32),
    )
    grads2, metrics2 = compute(params0(), perturbed)
    for g, g2 in zip(jax.tree.leaves(grads), jax.tree.leaves(grads2)):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(g2))
    assert float(metrics["loss/pg"]) == float(metrics2["loss/pg"])


def test_micro_batched_gradients_equal_full_batch():
    # sequence_mean + KL is the harder case for exactness (token_mean splits are checked in
    # test_grpo.py at the loss level).
    loss_cfg, micro = LossConfig(aggregation="sequence_mean", beta=0.2, advantage="rloo"), 4
    batch = on_policy(make_batch([([1, 0], [1]), ([0, 0], [1, 0])], seed=5), params0())
    # Move the policy away from the sampler so that clipping and the KL are active.
    batch = batch.replace(old_logp_BxT=(batch.old_logp_BxT * 1.3).astype(np.float32),
                          ref_logp_BxT=(batch.old_logp_BxT * 0.8).astype(np.float32))
    full_grads, full_metrics = grads_fn(loss_cfg)(params0(), batch)
    micro_grads, micro_metrics = grads_fn(loss_cfg, micro)(params0(), batch)
    assert float(full_metrics["pg_clipfrac"]) > 0
    assert_same_update(full_grads, full_metrics, micro_grads, micro_metrics)


def length_mixed_batch():
    """16 rows (4 groups x (2 + 2) slots) of 9 to 40 tokens, 9 of them empty, T = 64."""
    rng = np.random.default_rng(7)
    groups = [GroupRollouts(base=[traj(1, [40], rng), traj(0, [10], rng)], base_harness=0),
              GroupRollouts(base=[traj(0, [12], rng), traj(0, [9], rng)], base_harness=0,
                            rescue=[traj(1, [8, 6], rng)], rescue_harness=[1]),
              GroupRollouts(base=[traj(0, [14], rng), traj(1, [20], rng)], base_harness=0)]
    batch = on_policy(pack(groups, G=4, n=2, R=2, T_buckets=(16, 32, 64), pad_id=PAD), params0())
    return batch.replace(old_logp_BxT=(batch.old_logp_BxT * 1.3).astype(np.float32))


def test_grouped_by_length_micro_batches_equal_the_padded_update():
    batch = length_mixed_batch()
    grouped, micro_T = group_by_length(batch, 4, (16, 32, 64))
    # Sorted lengths 40, 20, 14, 14 | 12, 10, 9, 0 | 0 x 8: two micro-batches are skipped.
    assert batch.shape == (16, 64) and micro_T == (64, 16, 0, 0)
    rows = lambda b: sorted(  # noqa: E731
        (int(g), int(s), float(r), tuple(t)) for g, s, r, t in
        zip(b.group_B, b.slot_B, b.reward_B, np.asarray(b.tokens_BxT)))
    assert rows(grouped) == rows(batch)  # a reordering, every field moved together
    loss_cfg = LossConfig(aggregation="sequence_mean", advantage="rloo")
    full_grads, full_metrics = grads_fn(loss_cfg, 4)(params0(), batch)
    cut = jax.jit(functools.partial(grpo.compute_grads, cfg=CFG, loss_cfg=loss_cfg,
                                    num_micro_batches=4, micro_T=micro_T))
    grads, metrics = cut(params0(), grouped)
    assert float(full_metrics["pg_clipfrac"]) > 0
    assert_same_update(full_grads, full_metrics, grads, metrics)
    with pytest.raises(ValueError, match="not all 0"):
        grpo.compute_grads(params0(), grouped, cfg=CFG, loss_cfg=loss_cfg, num_micro_batches=4,
                           micro_T=(0, 0, 0, 0))


def test_an_all_empty_batch_grouped_by_length_updates_like_the_padded_one():
    """A step whose batch holds no token (DAPO's draws found no group with a reward spread) runs
    one micro-batch at the smallest bucket: the same step as the padded update, not an error."""
    batch = on_policy(pack([], G=4, n=2, R=2, T_buckets=(16, 32, 64), pad_id=PAD), params0())
    grouped, micro_T = group_by_length(batch, 4, (16, 32, 64))
    assert micro_T == (16, 0, 0, 0)
    loss_cfg = LossConfig(aggregation="sequence_mean", advantage="rloo")
    full_grads, full_metrics = grads_fn(loss_cfg, 4)(params0(), batch)
    cut = jax.jit(functools.partial(grpo.compute_grads, cfg=CFG, loss_cfg=loss_cfg,
                                    num_micro_batches=4, micro_T=micro_T))
    grads, metrics = cut(params0(), grouped)
    assert all(float(jnp.abs(g).max()) == 0.0 for g in jax.tree.leaves(grads))
    assert_same_update(full_grads, full_metrics, grads, metrics)


def test_few_updates_raise_likelihood_of_rewarded_trajectories():
    optimizer = make_optimizer(learning_rate=3e-4, warmup_steps=0, total_steps=100,
                               weight_decay=0.0)
    batch = on_policy(make_batch([([1, 0, 1, 0], []), ([0, 1, 0, 0], [])], n=4, R=0, seed=7),
                      params0())
    step = grpo.jit_train_step(CFG, LossConfig(), optimizer)
    state = new_state(optimizer)
    mask = batch.loss_mask_BxT & (batch.positions_BxT > 0)

    def mean_logp(params, rows):
        logp = policy_logp(params, batch)
        return (logp * mask)[rows].sum() / mask[rows].sum()

    rewarded, unrewarded = batch.reward_B > 0, (batch.reward_B == 0) & batch.valid_B
    before = mean_logp(params0(), rewarded), mean_logp(params0(), unrewarded)
    for _ in range(5):
        state, metrics = step(state, batch)
    after = mean_logp(state.params, rewarded), mean_logp(state.params, unrewarded)
    assert float(metrics["lr"]) > 0
    assert after[0] > before[0] + 0.05, (before, after)
    assert after[1] < before[1], (before, after)


def test_rescue_context_base_scales_by_truncated_importance_weight():
    # Base slots all fail, rescue succeeds: the only active rows are re-rendered rescue rows.
    batch = on_policy(make_batch([([0, 0], [1, 0])], seed=9, rescue_context="base"), params0())
    assert batch.recontext_B.tolist() == [False, False, True, True]
    cfg = LossConfig(is_cap=2.0)
    compute = grads_fn(cfg)
    as_generated = batch.replace(recontext_B=np.zeros(4, bool))
    grads_plain, _ = compute(params0(), as_generated)
    grads_same, metrics_same = compute(params0(), batch)
    # Sampler 4x less likely in the sibling context than the policy in the base one: w = min(4, 2).
    shifted = batch.replace(old_logp_BxT=np.where(batch.loss_mask_BxT, batch.old_logp_BxT - np.log(4.0),
                                                  0.0).astype(np.float32))
    grads_capped, metrics_capped = compute(params0(), shifted)
    assert float(metrics_same["rescue/success_frac"]) == 1.0
    assert float(metrics_same["is_weight/mean"]) == pytest.approx(1.0, abs=1e-5)
    assert float(metrics_capped["is_weight/mean"]) == pytest.approx(2.0, abs=1e-5)
    assert float(metrics_capped["pg_clipfrac"]) == 0.0
    scale = max(float(jnp.abs(g).max()) for g in jax.tree.leaves(grads_plain))
    assert_trees_close(grads_same, grads_plain, rtol=1e-4, atol=1e-5 * scale)
    assert_trees_close(grads_capped, jax.tree.map(lambda g: 2 * g, grads_plain), rtol=1e-4,
                       atol=1e-5 * scale)
    # As generated, the same shifted logp is a ratio of 4 to the sampler: clipped where A > 0.
    _, metrics_clipped = compute(params0(), shifted.replace(recontext_B=np.zeros(4, bool)))
    terms = grpo.group_terms(shifted, cfg)
    mask = np.asarray(terms["mask_BxT"])
    positive = np.asarray(terms["advantage_B"]) > 0
    assert float(metrics_clipped["pg_clipfrac"]) == pytest.approx(mask[positive].sum() / mask.sum())


def test_sft_rescue_advantage_is_the_token_mean_nll_of_successful_rescues_in_base_context():
    # Base slots all fail; rescue [success, failure], re-rendered into the base context.
    batch = on_policy(make_batch([([0, 0], [1, 0])], seed=9, rescue_context="base"), params0())
    grads, metrics = grads_fn(LossConfig(is_weight="one", rescue_advantage="sft"))(params0(), batch)
    mask = np.asarray(target_mask(batch.loss_mask_BxT, batch.segment_ids_BxT)) & (np.arange(4) == 2)[:, None]

    def nll(params):  # SFT on row 2 alone: the mean negative log-likelihood of its policy tokens
        logits, _ = forward(CFG, params, batch.tokens_BxT, batch.positions_BxT,
                            segment_ids_BxT=batch.segment_ids_BxT)
        return -jnp.sum(jnp.where(mask, token_logp(logits, batch.tokens_BxT)[0], 0.0)) / mask.sum()

    want = jax.grad(nll)(params0())
    scale = max(float(jnp.abs(g).max()) for g in jax.tree.leaves(want))
    assert_trees_close(grads, want, rtol=1e-4, atol=1e-5 * scale)
    assert float(metrics["tokens/trained"]) == mask.sum()


def test_train_step_under_a_mesh_matches_unsharded():
    optimizer = make_optimizer(learning_rate=1e-3, warmup_steps=1, total_steps=10)
    batch = on_policy(make_batch(PATTERNS[1], seed=11), params0())
    mesh = jax.make_mesh((1,), ("data",))
    state = new_state(optimizer)
    state_sharding = jax.tree.map(lambda _: NamedSharding(mesh, P()), state)
    batch_sharding = jax.tree.map(lambda _: NamedSharding(mesh, P("data")), batch)
    sharded = grpo.jit_train_step(CFG, LossConfig(), optimizer, num_micro_batches=2,
                                  state_sharding=state_sharding, batch_sharding=batch_sharding)
    with jax.set_mesh(mesh):
        state_a, metrics_a = sharded(state, batch)
    state_b, metrics_b = grpo.jit_train_step(CFG, LossConfig(), optimizer, num_micro_batches=2)(
        new_state(optimizer), batch)
    assert_trees_close(state_a.params, state_b.params, rtol=1e-6, atol=1e-7)
    assert float(metrics_a["loss/pg"]) == pytest.approx(float(metrics_b["loss/pg"]), rel=1e-6)


def test_optimizer_schedule_clipping_and_decay_mask():
    opt = make_optimizer({"learning_rate": 1e-3, "warmup_steps": 10}, total_steps=110,
                         end_lr_ratio=0.1)
    assert float(opt.lr_schedule(0)) == 0.0
    assert float(opt.lr_schedule(10)) == pytest.approx(1e-3)
    assert float(opt.lr_schedule(110)) == pytest.approx(1e-4)
    mask = decay_mask(params0())
    assert mask["layers"]["q_proj"] and mask["embed"]
    assert not mask["layers"]["attn_norm"] and not mask["layers"]["q_bias"]
    assert not mask["final_norm"]
    with pytest.raises(ValueError, match="unknown optimizer settings"):
        make_optimizer(lr=1e-3)
    with pytest.raises(ValueError, match="warmup_steps"):
        make_optimizer(warmup_steps=10, total_steps=5)
    # Global-norm clipping before Adam: with eps=1 the Adam step is g / (|g| + 1), so it shows
    # whether g was clipped to norm 0.5 (step 1/3) or not (step ~1).
    clip = make_optimizer(learning_rate=1.0, warmup_steps=0, total_steps=10, max_grad_norm=0.5,
                          b1=0.0, eps=1.0, weight_decay=0.0)
    grads = {"w": jnp.full((1,), 1e3)}
    updates, _ = clip.tx.update(grads, clip.tx.init(grads), grads)
    np.testing.assert_allclose(np.asarray(updates["w"]), [-1 / 3], rtol=1e-5)


@pytest.mark.parametrize("poison", ["nan_reward", "huge_lr"])
def test_a_nonfinite_update_is_not_applied_and_is_flagged(poison):
    """A NaN reward (NaN loss and gradients) or a learning rate that overflows the weights while the
    loss stays finite: the jitted step keeps params and optimizer state, flags the step, and the
    next finite step updates as usual."""
    lr = 1e38 if poison == "huge_lr" else 3e-4
    optimizer = make_optimizer(learning_rate=lr, warmup_steps=0, total_steps=100, weight_decay=0.5)
    batch = on_policy(make_batch([([1, 0], []), ([0, 1], [])], seed=3), params0())
    if poison == "nan_reward":
        batch = batch.replace(reward_B=np.where(np.arange(batch.reward_B.shape[0]) == 1, np.nan,
                                                batch.reward_B).astype(np.float32))
    step = grpo.jit_train_step(CFG, LossConfig(), optimizer)
    state = new_state(optimizer)
    before = jax.tree.map(np.asarray, (state.params, state.opt_state))
    state, metrics = step(state, batch)
    if poison == "huge_lr":  # the first step only grows the weights to ~1e37; the second overflows
        assert float(metrics["train/nonfinite"]) == 0.0
        before = jax.tree.map(np.asarray, (state.params, state.opt_state))
        state, metrics = step(state, batch)
    else:
        assert not np.isfinite(float(metrics["loss/total"]))
    assert float(metrics["train/nonfinite"]) == 1.0
    assert int(state.step) == (2 if poison == "huge_lr" else 1)
    for x, y in zip(jax.tree.leaves(before), jax.tree.leaves((state.params, state.opt_state))):
        np.testing.assert_array_equal(x, np.asarray(y))
    assert bool(grpo.all_finite(state.params))
    if poison == "nan_reward":
        state, metrics = step(state, on_policy(make_batch([([1, 0], []), ([0, 1], [])], seed=3), params0()))
        assert float(metrics["train/nonfinite"]) == 0.0
        assert any(not np.array_equal(x, np.asarray(y))
                   for x, y in zip(jax.tree.leaves(before[0]), jax.tree.leaves(state.params)))


def test_all_finite_looks_at_every_float_leaf_not_a_norm():
    assert bool(grpo.all_finite({"a": jnp.full(3, 1e30), "n": jnp.arange(3)}))  # its norm would be inf
    assert not bool(grpo.all_finite({"a": jnp.ones(3), "b": jnp.array([1.0, jnp.inf])}))
    assert not bool(grpo.all_finite([jnp.array([jnp.nan], jnp.bfloat16)]))


def test_the_sampler_gap_is_read_on_rows_that_do_not_train():
    """Groups that all fail, without rescue, train nothing; the gap between the sampler's logprobs
    (-1 on every policy token here) and the trainer's is still read over their tokens."""
    params = params0()
    batch = make_batch([([0.0, 0.0], []), ([0.0, 0.0], [])])
    _, metrics = grads_fn(LossConfig())(params, batch)
    assert float(metrics["tokens/trained"]) == 0.0
    counted = (np.asarray(target_mask(batch.loss_mask_BxT, batch.segment_ids_BxT))
               & np.asarray(batch.valid_B)[:, None])
    gap = policy_logp(params, batch)[counted] - np.asarray(batch.old_logp_BxT)[counted]
    assert counted.sum() > 0
    np.testing.assert_allclose(float(metrics["logprob_gap/abs_mean"]), np.abs(gap).mean(), rtol=1e-5)
    np.testing.assert_allclose(float(metrics["logprob_gap/abs_max"]), np.abs(gap).max(), rtol=1e-5)
