"""Group math and loss math of the GRPO update against plain NumPy references (no model)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hsjax.rl import advantages as adv_lib
from hsjax.rl.losses import LossConfig, aggregate, policy_loss_terms, target_mask, token_logp

ESTIMATORS = ("grpo", "drgrpo", "rloo")


# ---------------------------------------------------------------- NumPy references


def np_rescue_mask(reward, valid, is_rescue, group, G, threshold):
    ok = (reward >= threshold) & valid
    active = np.zeros_like(valid)
    present = all_fail = no_signal = triggered = trig_fail = rescued = 0
    for g in range(G):
        rows = group == g
        base, resc = rows & ~is_rescue & valid, rows & is_rescue & valid
        base_ok, resc_ok = (ok & base).any(), (ok & resc).any()
        if base_ok:
            active |= base
        elif resc_ok:
            active |= resc
        if base.any():
            present += 1
            all_fail += not base_ok
            no_signal += (not base_ok) and not resc_ok
            triggered += resc.any()
            trig_fail += resc.any() and not base_ok
            rescued += resc.any() and not base_ok and resc_ok
    div = lambda a, b: a / b if b else 0.0
    stats = {"groups/all_fail_frac": div(all_fail, present),
             "groups/no_signal_frac": div(no_signal, present),
             "rescue/triggered_frac": div(triggered, present),
             "rescue/success_frac": div(rescued, trig_fail), "groups/present": present}
    return active, stats


def np_advantage(name, reward, group, active, G):
    out = np.zeros(len(reward))
    for g in range(G):
        idx = np.where((group == g) & active)[0]
        r = reward[idx].astype(np.float64)
        if len(idx) == 0:
            continue
        if name == "drgrpo":
            out[idx] = r - r.mean()
        elif len(idx) < 2:
            out[idx] = 0.0
        elif name == "grpo":
            out[idx] = (r - r.mean()) / (r.std(ddof=1) + 1e-6)
        elif name == "rloo":
            out[idx] = r - (r.sum() - r) / (len(r) - 1)
    return out


def random_layout(rng, G=6, n=4, R=4, p_valid=0.8, p_success=0.3, shaped=False):
    S = n + R
    group = np.repeat(np.arange(G), S).astype(np.int32)
    is_rescue = np.tile(np.arange(S) >= n, G)
    valid = rng.random(G * S) < p_valid
    reward = (rng.random(G * S) < p_success).astype(np.float32)
    if shaped:  # partial credit below the success threshold must not count as success
        reward = np.where(reward > 0, 1.0, rng.uniform(0, 0.9, G * S)).astype(np.float32)
    reward = np.where(valid, reward, 0.0).astype(np.float32)
    return reward, valid, is_rescue, group


def check_group_math(reward, valid, is_rescue, group, G, threshold=1.0):
    ok = adv_lib.success(jnp.asarray(reward), jnp.asarray(valid), threshold)
    active, stats = jax.jit(adv_lib.rescue_mask, static_argnums=4)(
        ok, jnp.asarray(valid), jnp.asarray(is_rescue), jnp.asarray(group), G)
    ref_active, ref_stats = np_rescue_mask(reward, valid, is_rescue, group, G, threshold)
    np.testing.assert_array_equal(np.asarray(active), ref_active)
    for key, value in ref_stats.items():
        assert float(stats[key]) == pytest.approx(value), key
    for name in ESTIMATORS:
        got = np.asarray(adv_lib.get_advantage(name)(jnp.asarray(reward), jnp.asarray(group),
                                                     active, G))
        assert np.all(np.isfinite(got)), name
        np.testing.assert_allclose(got, np_advantage(name, reward, group, ref_active, G),
                                   rtol=1e-5, atol=1e-5, err_msg=name)
        assert np.all(got[~ref_active] == 0), name
    return ref_active, ref_stats


# ---------------------------------------------------------------- group math


@pytest.mark.parametrize("seed,shaped", [(s, s % 2 == 1) for s in range(8)])
def test_group_math_matches_numpy_on_random_batches(seed, shaped):
    rng = np.random.default_rng(seed)
    check_group_math(*random_layout(rng, p_valid=0.5 + 0.06 * seed, shaped=shaped), G=6)


def _case(base_rewards, rescue_rewards, base_valid=None, rescue_valid=None):
    """One group per entry; -1 marks an invalid slot."""
    G, n, R = len(base_rewards), len(base_rewards[0]), len(rescue_rewards[0])
    reward = np.array([r for g in range(G) for r in list(base_rewards[g]) + list(rescue_rewards[g])],
                      np.float32)
    valid = reward >= 0
    reward = np.where(valid, reward, 0).astype(np.float32)
    group = np.repeat(np.arange(G), n + R).astype(np.int32)
    is_rescue = np.tile(np.arange(n + R) >= n, G)
    return reward, valid, is_rescue, group, G


def test_all_groups_fail_without_rescue_give_no_signal():
    active, stats = check_group_math(*_case([[0, 0, 0]] * 3, [[-1, -1]] * 3))
    assert not active.any()
    assert stats["groups/all_fail_frac"] == 1 and stats["groups/no_signal_frac"] == 1
    assert stats["rescue/triggered_frac"] == 0 and stats["rescue/success_frac"] == 0


def test_all_succeed_keeps_base_with_zero_advantage():
    active, stats = check_group_math(*_case([[1, 1, 1]] * 2, [[0, 1]] * 2))
    assert active.reshape(2, 5)[:, :3].all() and not active.reshape(2, 5)[:, 3:].any()
    assert stats["groups/all_fail_frac"] == 0 and stats["rescue/triggered_frac"] == 1


def test_only_rescue_succeeds_replaces_base_slots():
    active, stats = check_group_math(*_case([[0, 0, 0], [1, 0, 0]], [[1, 0], [-1, -1]]))
    np.testing.assert_array_equal(active, [0, 0, 0, 1, 1, 1, 1, 1, 0, 0])
    assert stats["groups/all_fail_frac"] == 0.5
    assert stats["rescue/triggered_frac"] == 0.5 and stats["rescue/success_frac"] == 1.0


def test_failed_rescue_counts_in_success_frac():
    _, stats = check_group_math(*_case([[0, 0], [0, 0]], [[0, 0], [1, -1]]))
    assert stats["rescue/success_frac"] == 0.5 and stats["groups/no_signal_frac"] == 0.5


def test_single_valid_slot_and_padding_groups_are_finite():
    # group 0: one valid base slot (success); group 1: entirely padding; group 2: one rescue slot.
    active, stats = check_group_math(*_case([[1, -1, -1], [-1, -1, -1], [0, -1, -1]],
                                            [[-1, -1], [-1, -1], [1, -1]]))
    np.testing.assert_array_equal(np.nonzero(active)[0], [0, 13])
    assert stats["groups/present"] == 2


def test_shaped_reward_below_threshold_is_a_failure():
    reward, valid, is_rescue, group, G = _case([[0.9, 0.5]], [[1.0, 0.2]])
    active, _ = check_group_math(reward, valid, is_rescue, group, G, threshold=1.0)
    np.testing.assert_array_equal(active, [0, 0, 1, 1])


def test_unknown_estimator_names_the_choices():
    with pytest.raises(ValueError, match="grpo"):
        adv_lib.get_advantage("ppo")
    with pytest.raises(ValueError, match="already registered"):
        adv_lib.register_advantage("grpo")(lambda *a: None)


# ---------------------------------------------------------------- loss math


def test_token_logp_is_shifted_once_and_matches_numpy():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 5, 7)).astype(np.float32)
    tokens = rng.integers(0, 7, size=(2, 5)).astype(np.int32)
    logp, entropy = token_logp(jnp.asarray(logits), jnp.asarray(tokens), temperature=0.7)
    z = logits / 0.7
    log_sm = z - np.log(np.exp(z).sum(-1, keepdims=True))
    ref = np.zeros((2, 5))
    ref[:, 1:] = np.take_along_axis(log_sm[:, :-1], tokens[:, 1:, None], -1)[..., 0]
    np.testing.assert_allclose(np.asarray(logp), ref, rtol=1e-5, atol=1e-5)
    ref_ent = -(np.exp(log_sm) * log_sm).sum(-1)[:, :-1]
    np.testing.assert_allclose(np.asarray(entropy)[:, 1:], ref_ent, rtol=1e-5, atol=1e-5)


def test_target_mask_never_trains_segment_starts_or_padding():
    loss_mask = np.ones((1, 8), bool)
    seg = np.array([[1, 1, 1, 2, 2, 2, 0, 0]])
    np.testing.assert_array_equal(np.asarray(target_mask(loss_mask, seg)),
                                  [[0, 1, 1, 0, 1, 1, 0, 0]])


def _loss_inputs(rng, B=4, T=6):
    logp = rng.normal(-1.0, 0.3, (B, T)).astype(np.float32)
    old = (logp + rng.normal(0, 0.4, (B, T))).astype(np.float32)
    ref = (logp + rng.normal(0, 0.2, (B, T))).astype(np.float32)
    mask = rng.random((B, T)) < 0.6
    advantage = rng.normal(size=B).astype(np.float32)
    return logp, old, ref, mask, advantage


def np_pg(logp, old, mask, advantage, eps_low, eps_high, mode):
    ratio = np.exp(logp - old)
    a = advantage[:, None]
    pg = np.maximum(-a * ratio, -a * np.clip(ratio, 1 - eps_low, 1 + eps_high))
    if mode == "token_mean":
        return (pg * mask).sum() / mask.sum()
    rows = mask.sum(-1) > 0
    return ((pg * mask).sum(-1)[rows] / mask.sum(-1)[rows]).mean()


@pytest.mark.parametrize("mode", ["token_mean", "sequence_mean"])
def test_policy_loss_matches_numpy_and_splits_exactly(mode):
    rng = np.random.default_rng(1)
    logp, old, ref, mask, advantage = _loss_inputs(rng)
    cfg = LossConfig(aggregation=mode, eps_low=0.2, eps_high=0.28, beta=0.1)
    no_recontext = np.zeros(4, bool)
    terms, extrema = policy_loss_terms(jnp.asarray(logp), old, advantage, mask, no_recontext, cfg,
                                       ref_logp_BxT=ref)
    total, den = terms["loss/pg"]
    assert float(total / den) == pytest.approx(np_pg(logp, old, mask, advantage, 0.2, 0.28, mode),
                                               rel=1e-5)
    d = ref - logp
    kl_tok = np.exp(d) - d - 1
    if mode == "token_mean":
        assert float(terms["loss/kl"][0] / terms["loss/kl"][1]) == pytest.approx(
            (kl_tok * mask).sum() / mask.sum(), rel=1e-5)
    ratio = np.exp(logp - old)[mask]
    assert float(extrema["ratio/max"]) == pytest.approx(ratio.max(), rel=1e-5)
    # Rows split in two halves: sums and denominators add up to the full-batch values.
    halves = [policy_loss_terms(jnp.asarray(logp[s]), old[s], advantage[s], mask[s],
                                no_recontext[s], cfg, ref_logp_BxT=ref[s])[0]
              for s in (slice(0, 2), slice(2, 4))]
    for key in terms:
        np.testing.assert_allclose(sum(float(h[key][0]) for h in halves), float(terms[key][0]),
                                   rtol=1e-5, atol=1e-6)
        assert sum(float(h[key][1]) for h in halves) == float(terms[key][1])


def _pg_grad(logp, old, advantage, mask, recontext, cfg, ref=None):
    def loss(lp):
        terms, _ = policy_loss_terms(lp, old, advantage, mask, recontext, cfg, ref_logp_BxT=ref)
        out = terms["loss/pg"][0]
        if ref is not None:
            out = out + cfg.beta * terms["loss/kl"][0]
        return out
    return np.asarray(jax.grad(loss)(jnp.asarray(logp)))


def test_masked_tokens_get_exactly_zero_gradient_and_do_not_matter():
    rng = np.random.default_rng(2)
    logp, old, ref, mask, advantage = _loss_inputs(rng)
    cfg = LossConfig(beta=0.05)
    recontext = np.array([0, 1, 0, 1], bool)
    grad = _pg_grad(logp, old, advantage, mask, recontext, cfg, ref)
    assert np.all(grad[~mask] == 0) and np.all(np.isfinite(grad))
    # Perturb masked tokens wildly (huge old/ref logp would overflow exp if it reached them).
    old2, ref2 = old.copy(), ref.copy()
    old2[~mask] = rng.normal(0, 300, (~mask).sum())
    ref2[~mask] = rng.normal(0, 300, (~mask).sum())
    np.testing.assert_array_equal(grad, _pg_grad(logp, old2, advantage, mask, recontext, cfg, ref2))


def test_rescue_context_as_generated_clips_against_sibling_logp():
    cfg = LossConfig(eps_low=0.2, eps_high=0.2)
    logp = np.log(np.array([[0.5, 0.5, 0.5]], np.float32))
    old = np.log(np.array([[0.5, 0.1, 0.9]], np.float32))  # ratios 1.0, 5.0, 0.56
    mask, advantage = np.array([[1, 1, 1]], bool), np.array([1.0], np.float32)
    grad = _pg_grad(logp, old, advantage, mask, np.array([False]), cfg)
    # Ratio 5 with A > 0 is clipped: no gradient; ratio 0.56 < 1 - eps keeps -A * ratio.
    np.testing.assert_allclose(grad, [[-1.0, 0.0, -0.5 / 0.9]], rtol=1e-5)


def test_rescue_context_base_uses_truncated_importance_weight():
    cfg = LossConfig(eps_low=0.2, eps_high=0.2, is_cap=2.0)
    logp = np.log(np.array([[0.5, 0.5, 0.5]], np.float32))  # current policy in the base context
    behaviour = np.log(np.array([[0.5, 0.1, 0.9]], np.float32))  # sampler in the sibling context
    mask, advantage = np.array([[1, 1, 1]], bool), np.array([-2.0], np.float32)
    terms, _ = policy_loss_terms(jnp.asarray(logp), behaviour, advantage, mask, np.array([True]),
                                 cfg)
    weight = np.minimum(np.exp(logp - behaviour), 2.0)  # [1, 5 -> 2, 0.56]
    grad = _pg_grad(logp, behaviour, advantage, mask, np.array([True]), cfg)
    # Ratio to the proximal policy is 1 (never clipped); d/dlogp of -A * w * ratio is -A * w.
    np.testing.assert_allclose(grad, 2.0 * weight, rtol=1e-5)
    assert float(terms["loss/pg"][0]) == pytest.approx((2.0 * weight).sum(), rel=1e-5)
    assert float(terms["is_weight/mean"][0] / terms["is_weight/mean"][1]) == pytest.approx(
        weight.mean(), rel=1e-5)
    assert float(terms["pg_clipfrac"][0]) == 0.0


def test_is_weight_one_trains_recontextualised_rows_as_on_policy_base_rows():
    cfg = LossConfig(eps_low=0.2, eps_high=0.2, is_cap=2.0, is_weight="one")
    logp = np.log(np.array([[0.5, 0.5, 0.5]], np.float32))
    behaviour = np.log(np.array([[0.5, 0.1, 0.9]], np.float32))  # would give weights 1, 2 (capped), 0.56
    mask, advantage = np.array([[1, 1, 1]], bool), np.array([-2.0], np.float32)
    terms, _ = policy_loss_terms(jnp.asarray(logp), behaviour, advantage, mask, np.array([True]), cfg)
    grad = _pg_grad(logp, behaviour, advantage, mask, np.array([True]), cfg)
    np.testing.assert_allclose(grad, [[2.0, 2.0, 2.0]], rtol=1e-5)  # -A * 1 on every token
    assert float(terms["is_weight/mean"][0] / terms["is_weight/mean"][1]) == pytest.approx(1.0)
    # Rows that are not re-contextualised keep the ordinary clipped ratio to their sampler logp.
    plain = _pg_grad(logp, behaviour, advantage, mask, np.array([False]), cfg)
    np.testing.assert_allclose(plain, _pg_grad(logp, behaviour, advantage, mask, np.array([False]),
                                               LossConfig(eps_low=0.2, eps_high=0.2)), rtol=1e-6)


def test_unknown_is_weight_is_an_error():
    with pytest.raises(ValueError, match="is_weight"):
        LossConfig(is_weight="none")


def test_aggregation_of_empty_mask_is_zero_over_zero():
    total, den = aggregate(jnp.ones((2, 3)), jnp.zeros((2, 3), bool), "sequence_mean")
    assert float(total) == 0 and float(den) == 0
    assert float(adv_lib.safe_div(total, den)) == 0.0


def test_loss_config_rejects_bad_options():
    for bad in (dict(aggregation="mean"), dict(advantage="x"), dict(eps_low=1.5),
                dict(temperature=0.0), dict(rescue_advantage="bc")):
        with pytest.raises(ValueError):
            LossConfig(**bad)


def _terms_batch(reward, valid, is_rescue, group, G, T=4):
    from hsjax.rl.batch import TrainBatch

    B = len(reward)
    zeros_BxT = np.zeros((B, T), np.float32)
    return TrainBatch(
        tokens_BxT=np.zeros((B, T), np.int32), positions_BxT=np.tile(np.arange(T, dtype=np.int32), (B, 1)),
        segment_ids_BxT=np.ones((B, T), np.int32), loss_mask_BxT=np.ones((B, T), bool),
        old_logp_BxT=zeros_BxT, reward_B=reward, group_B=group, slot_B=np.zeros(B, np.int32),
        harness_B=np.zeros(B, np.int32), is_rescue_B=is_rescue, valid_B=valid,
        recontext_B=np.zeros(B, bool), overlong_B=np.zeros(B, bool), num_groups=G)


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_rescue_baseline_with_base_credits_an_all_success_rescue(estimator):
    from hsjax.rl.grpo import group_terms
    from hsjax.rl.losses import LossConfig

    # Group 0: base all failed, every rescue slot succeeded. Group 1: an ordinary mixed base group.
    batch = _terms_batch(*_case([[0, 0, 0], [1, 0, 0]], [[1, 1], [-1, -1]]))
    plain = group_terms(batch, LossConfig(advantage=estimator))
    assert np.all(np.asarray(plain["advantage_B"])[:5] == 0)  # the spec'd rule: no signal here
    credited = group_terms(batch, LossConfig(advantage=estimator, rescue_baseline="with_base"))
    adv = np.asarray(credited["advantage_B"])
    assert np.all(adv[3:5] > 0), adv  # rescue successes credited against the failed base slots
    assert np.all(adv[:3] == 0)  # the failed base slots stay out of the loss
    np.testing.assert_array_equal(np.asarray(credited["active_B"]), np.asarray(plain["active_B"]))
    np.testing.assert_allclose(adv[5:], np.asarray(plain["advantage_B"])[5:])  # other groups unchanged
    # Reference for group 0: the estimator over all five slots, read off at the rescue slots.
    reward5 = np.array([0, 0, 0, 1, 1], np.float32)
    ref = np_advantage(estimator, reward5, np.zeros(5, np.int32), np.ones(5, bool), 1)
    np.testing.assert_allclose(adv[3:5], ref[3:5], rtol=1e-5)


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_sft_rescue_advantage_trains_only_successful_rescues_with_weight_one(estimator):
    from hsjax.rl.grpo import group_terms
    from hsjax.rl.losses import LossConfig

    # Group 0: base all failed, rescue [success, failure]. Group 1: a mixed base group (its rescue
    # masked). Group 2: base and rescue all failed.
    batch = _terms_batch(*_case([[0, 0, 0], [1, 0, 0], [0, 0, 0]], [[1, 0], [1, 1], [0, 0]]))
    plain = group_terms(batch, LossConfig(advantage=estimator))
    sft = group_terms(batch, LossConfig(advantage=estimator, rescue_advantage="sft"))
    adv, active = np.asarray(sft["advantage_B"]), np.asarray(sft["active_B"])
    assert adv[:5].tolist() == [0, 0, 0, 1, 0]
    assert active[:5].tolist() == [False, False, False, True, False]  # the failed rescue leaves
    assert float(np.asarray(sft["mask_BxT"])[4].sum()) == 0  # ... and the token denominator
    np.testing.assert_allclose(adv[5:10], np.asarray(plain["advantage_B"])[5:10])  # base groups as before
    assert not active[10:].any()
    assert float(np.asarray(plain["advantage_B"])[4]) < 0  # the estimator would push the failure down
