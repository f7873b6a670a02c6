"""The KL term to a reference policy (`loss.beta > 0`): its gradient against the estimator's formula
on a tiny model, the reference's log-probs against the update's own, and a training run that
trains with it and resumes exactly."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hsjax.infra import experiments
from hsjax.infra.metrics import read_metrics
from hsjax.models.model import forward
from hsjax.rl import grpo, reference
from hsjax.modes import train
from hsjax.rl.losses import KL_ESTIMATORS, LossConfig, token_logp
from tests.modes.test_train import StoppedAfterCheckpoint, comparable, final_params, stopped_after_checkpoint
from tests.rl.test_train_step import CFG, grads_fn, make_batch, on_policy, params0, policy_logp

pytestmark = pytest.mark.filterwarnings("ignore:Some donated buffers were not usable")

PATTERN = [([1.0, 0.0], [0.0, 0.0]), ([0.0, 0.0], [1.0, 0.0])]


def perturbed(params, scale=0.05, seed=1):
    """Parameters a few updates away from `params`: the reference for a non-zero KL."""
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    return jax.tree.unflatten(tree, [x + scale * jax.random.normal(k, x.shape, x.dtype)
                                     for x, k in zip(leaves, keys)])


@pytest.mark.parametrize("estimator", sorted(KL_ESTIMATORS))
def test_the_kl_gradient_is_the_estimators_formula(estimator):
    """grad(loss with beta) - grad(loss without) = beta * grad of the token mean of the estimate of
    d = ref_logp - logp over the trained tokens, written out here from the model's own logits."""
    params = params0()
    batch = on_policy(make_batch(PATTERN), params)
    ref = perturbed(params)
    ref_logp = reference.jit_reference_logp(CFG, 1.0)(ref, batch)
    batch = batch.replace(ref_logp_BxT=ref_logp)
    beta = 0.3
    with_kl = LossConfig(beta=beta, kl_estimator=estimator)
    grads_kl, metrics = grads_fn(with_kl)(params, batch)
    grads_pg, _ = grads_fn(LossConfig())(params, batch)
    mask = np.asarray(grpo.group_terms(batch, with_kl)["mask_BxT"], np.float32)
    assert mask.sum() > 0

    def kl_formula(p):
        d = ref_logp - jnp.asarray(_model_logp(p, batch))
        estimate = {"k1": -d, "k2": 0.5 * d ** 2, "k3": jnp.exp(d) - d - 1.0}[estimator]
        return jnp.sum(estimate * mask) / mask.sum()

    expected = jax.grad(kl_formula)(params)
    difference = jax.tree.map(lambda a, b: (a - b) / beta, grads_kl, grads_pg)
    for got, want in zip(jax.tree.leaves(difference), jax.tree.leaves(expected)):
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-6)
    np.testing.assert_allclose(metrics["loss/kl"], kl_formula(params), rtol=1e-5)
    total = float(metrics["loss/pg"] + beta * metrics["loss/kl"])
    assert float(metrics["loss/total"]) == pytest.approx(total, rel=1e-6)


def _model_logp(params, batch):
    logits, _ = forward(CFG, params, batch.tokens_BxT, batch.positions_BxT,
                        segment_ids_BxT=batch.segment_ids_BxT)
    return token_logp(logits, batch.tokens_BxT)[0]


def test_the_reference_logp_is_the_updates_and_the_kl_of_the_policy_to_itself_is_zero():
    params = params0()
    batch = on_policy(make_batch(PATTERN), params)
    mask = np.asarray(batch.loss_mask_BxT, bool)
    whole = np.asarray(reference.jit_reference_logp(CFG, 1.0)(params, batch))
    np.testing.assert_allclose(whole[mask], policy_logp(params, batch)[mask], atol=1e-5)
    split = np.asarray(reference.jit_reference_logp(CFG, 1.0, num_micro_batches=2)(params, batch))
    np.testing.assert_allclose(split[mask], whole[mask], atol=1e-6)
    filled = reference.filler(params, CFG, temperature=1.0)(batch)
    _, metrics = grads_fn(LossConfig(beta=1.0))(params, filled)
    assert abs(float(metrics["loss/kl"])) < 1e-6 and abs(float(metrics["kl/log_ratio"])) < 1e-5


def test_the_held_reference_survives_the_donating_update():
    params = params0()
    held = reference.hold_reference(params)
    donated = jax.jit(lambda p: jax.tree.map(lambda x: x + 1.0, p), donate_argnums=0)
    donated(jax.tree.map(jnp.copy, params))
    for a, b in zip(jax.tree.leaves(held), jax.tree.leaves(params)):
        assert a is not b
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# The testbed's policy_only arm from its shipped warm start (some rollouts succeed, so rows train),
def kl_config():
    """Two steps, a checkpoint each; a learning rate that moves the policy off the reference at step 1."""
    config = experiments.get_config("testbed", "policy_only,smoke")
    config.total_steps = 2
    config.model.hf_dir = "assets/testbed_warmstart"
    config.rollout.max_new_tokens, config.rollout.groups, config.rollout.n = 64, 4, 4
    config.loss.beta = 0.1
    config.optim.learning_rate, config.optim.warmup_steps = 3e-4, 0
    config.eval.every = config.log.episodes_every = 0
    config.checkpoint.every = 1
    return config


def kl_run(workdir, monkeypatch, *, stop_after_step=None):
    """A training run in this process; with `stop_after_step`, one that ends right after that step's
    checkpoint, as a killed run would (its workdir holds nothing later)."""
    if stop_after_step is None:
        train.main(kl_config(), str(workdir))
        return
    with stopped_after_checkpoint(monkeypatch, stop_after_step), pytest.raises(StoppedAfterCheckpoint):
        train.main(kl_config(), str(workdir))


def test_a_run_with_a_kl_term_trains_reports_it_and_resumes_exactly(tmp_path, monkeypatch):
    """Two steps with beta > 0, straight, and stopped after step 1's checkpoint then resumed: the
    same metrics and parameters (the reference is loaded again, not restored)."""
    straight = tmp_path / "straight"
    kl_run(straight, monkeypatch)
    rows = read_metrics(straight)
    assert [r["step"] for r in rows] == [1, 2] and all(r["tokens/trained"] > 0 for r in rows)
    # Step 1 updates the starting policy itself: no divergence yet. Step 2 trains a policy one
    # update away from it.
    assert abs(rows[0]["loss/kl"]) < 1e-6
    assert rows[1]["loss/kl"] > 0 and np.isfinite(rows[1]["loss/kl"]) and rows[1]["kl/log_ratio"] != 0
    resumed = tmp_path / "resumed"
    kl_run(resumed, monkeypatch, stop_after_step=1)
    kl_run(resumed, monkeypatch)
    assert comparable(read_metrics(resumed)) == comparable(rows)
    a, b = final_params(straight), final_params(resumed)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
