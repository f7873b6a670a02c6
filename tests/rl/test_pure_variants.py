"""The pure update functions give the same numbers traced and untraced (`chex.variants`), with the
shapes their names promise and finite values, against the NumPy references of test_grpo.py."""
import chex
import jax.numpy as jnp
import numpy as np

from hsjax.rl import advantages as adv_lib
from hsjax.rl.losses import LossConfig, policy_loss_terms
from tests.rl.test_grpo import ESTIMATORS, _loss_inputs, np_advantage, np_pg, np_rescue_mask, random_layout

G = 6


class GroupMathTest(chex.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    def test_rescue_mask_and_advantages(self):
        reward, valid, is_rescue, group = random_layout(np.random.default_rng(3), G=G)
        B = len(reward)

        @self.variant
        def group_math(reward_B, valid_B, is_rescue_B, group_B):
            ok_B = adv_lib.success(reward_B, valid_B, 1.0)
            active_B, stats = adv_lib.rescue_mask(ok_B, valid_B, is_rescue_B, group_B, G)
            advantages = {name: adv_lib.get_advantage(name)(reward_B, group_B, active_B, G) for name in ESTIMATORS}
            return active_B, stats, advantages

        active_B, stats, advantages = group_math(jnp.asarray(reward), jnp.asarray(valid), jnp.asarray(is_rescue),
                                                 jnp.asarray(group))
        chex.assert_shape(active_B, (B,))
        chex.assert_tree_all_finite(advantages)
        ref_active, ref_stats = np_rescue_mask(reward, valid, is_rescue, group, G, 1.0)
        np.testing.assert_array_equal(np.asarray(active_B), ref_active)
        for key, value in ref_stats.items():
            np.testing.assert_allclose(float(stats[key]), value, rtol=1e-6, err_msg=key)
        for name, got in advantages.items():
            chex.assert_shape(got, (B,))
            np.testing.assert_allclose(np.asarray(got), np_advantage(name, reward, group, ref_active, G),
                                       rtol=1e-5, atol=1e-5, err_msg=name)


class LossTest(chex.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    def test_policy_loss_terms(self):
        logp, old, ref, mask, advantage = _loss_inputs(np.random.default_rng(4))
        cfg = LossConfig(aggregation="token_mean", eps_low=0.2, eps_high=0.28, beta=0.1)

        @self.variant
        def terms(logp_BxT, old_BxT, advantage_B, mask_BxT, ref_BxT):
            return policy_loss_terms(logp_BxT, old_BxT, advantage_B, mask_BxT, jnp.zeros(4, bool), cfg,
                                     ref_logp_BxT=ref_BxT)

        out, extrema = terms(jnp.asarray(logp), jnp.asarray(old), jnp.asarray(advantage), jnp.asarray(mask),
                             jnp.asarray(ref))
        chex.assert_tree_all_finite((out, extrema))
        total, den = out["loss/pg"]
        chex.assert_shape((total, den), ())
        np.testing.assert_allclose(float(total / den), np_pg(logp, old, mask, advantage, 0.2, 0.28, "token_mean"),
                                   rtol=1e-5)
