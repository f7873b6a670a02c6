"""LoRA adapters: a fresh adapter leaves the model as it was, the merge is W + (alpha/r) A B on
every projection's axis layout (checked against the low-rank path computed apart, x W + s (x A) B),
the update trains only the adapters through the merge, and the merged weights export to a model
that plain transformers runs to the same logits."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hsjax.models import lora
from hsjax.models.model import forward, init_params
from hsjax.models.presets import get_preset

CFG = get_preset("tiny", vocab_size=64)


def params_and_adapters(rank=4, targets=tuple(lora.INPUT_AXES), seed=0):
    params = init_params(CFG, jax.random.PRNGKey(seed))
    adapters = lora.init_adapters(params, rank, targets, jax.random.PRNGKey(seed + 1))
    # B random too, so the merge changes something
    adapters = jax.tree.map(lambda x: x, adapters)
    for i, name in enumerate(adapters["layers"]):
        b = adapters["layers"][name]["b"]
        adapters["layers"][name]["b"] = 0.1 * jax.random.normal(jax.random.PRNGKey(100 + i), b.shape)
    return params, adapters


def test_a_fresh_adapter_is_the_identity():
    params = init_params(CFG, jax.random.PRNGKey(0))
    adapters = lora.init_adapters(params, 8, lora.ATTENTION + lora.MLP, jax.random.PRNGKey(1))
    merged = lora.merge(params, adapters, lora.scale_of(16, 8))
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(merged)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # A holds layers x in axes x r, B layers x r x out axes
    q = adapters["layers"]["q_proj"]
    assert q["a"].shape == (CFG.num_layers, CFG.hidden_size, 8)
    assert q["b"].shape == (CFG.num_layers, 8, CFG.num_heads, CFG.head_dim)
    o = adapters["layers"]["o_proj"]
    assert o["a"].shape == (CFG.num_layers, CFG.num_heads, CFG.head_dim, 8) and o["b"].shape[1:] == (8, CFG.hidden_size)


@pytest.mark.parametrize("name", list(lora.INPUT_AXES))
def test_the_merge_equals_the_low_rank_path_computed_apart(name):
    params, adapters = params_and_adapters()
    scale = lora.scale_of(8, 4)
    merged = lora.merge(params, adapters, scale)
    n_in = lora.INPUT_AXES[name]
    w = np.asarray(params["layers"][name][0], np.float64)  # layer 0
    a = np.asarray(adapters["layers"][name]["a"][0], np.float64)
    b = np.asarray(adapters["layers"][name]["b"][0], np.float64)
    x = np.random.default_rng(0).normal(size=(5, *w.shape[:n_in]))
    x2 = x.reshape(5, -1)
    plain = x2 @ w.reshape(x2.shape[1], -1)
    low_rank = (x2 @ a.reshape(x2.shape[1], -1)) @ b.reshape(b.shape[0], -1)
    got = x2 @ np.asarray(merged["layers"][name][0], np.float64).reshape(x2.shape[1], -1)
    np.testing.assert_allclose(got, plain + scale * low_rank, atol=1e-5)
    assert np.abs(low_rank).max() > 1e-3  # the adapter does change this projection


def test_targets_rank_and_fit_are_checked():
    params = init_params(CFG, jax.random.PRNGKey(0))
    with pytest.raises(ValueError, match="each must be one of"):
        lora.init_adapters(params, 4, ("qproj",), jax.random.PRNGKey(0))
    with pytest.raises(ValueError, match="rank must be >= 1"):
        lora.init_adapters(params, 0, ("q_proj",), jax.random.PRNGKey(0))
    adapters = lora.init_adapters(params, 4, ("q_proj",), jax.random.PRNGKey(0))
    lora.check_fits(adapters, params)
    adapters["layers"]["q_proj"]["a"] = adapters["layers"]["q_proj"]["a"][:, :-1]
    with pytest.raises(ValueError, match="do not fit the weight"):
        lora.check_fits(adapters, params)
    assert lora.num_params(lora.init_adapters(params, 2, ("q_proj",), jax.random.PRNGKey(0))) == (
        CFG.num_layers * 2 * (CFG.hidden_size + CFG.num_heads * CFG.head_dim))


def test_forward_on_merged_weights_changes_only_through_the_adapters():
    params, adapters = params_and_adapters(targets=("v_proj", "down_proj"))
    tokens = jnp.arange(12, dtype=jnp.int32)[None] % CFG.vocab_size
    base_logits = forward(CFG, params, tokens, jnp.arange(12)[None])[0]
    merged_logits = forward(CFG, lora.merge(params, adapters, 2.0), tokens, jnp.arange(12)[None])[0]
    zero = forward(CFG, lora.merge(params, adapters, 0.0), tokens, jnp.arange(12)[None])[0]
    assert float(jnp.abs(merged_logits - base_logits).max()) > 1e-4
    np.testing.assert_allclose(np.asarray(zero), np.asarray(base_logits), atol=0)
    assert math.isfinite(float(merged_logits.sum()))


def test_the_update_trains_the_adapters_by_the_chain_rule():
    """The adapters' gradient through the merge is s A^T dL/dW and s dL/dW B^T of the full model's."""
    import functools

    from hsjax.rl import grpo
    from hsjax.rl.losses import LossConfig
    from tests.rl.test_train_step import CFG as TCFG, make_batch

    params = init_params(TCFG, jax.random.PRNGKey(0))
    adapters = lora.init_adapters(params, 3, ("q_proj", "o_proj", "down_proj"), jax.random.PRNGKey(1))
    for i, ab in enumerate(adapters["layers"].values()):
        ab["b"] = 0.05 * jax.random.normal(jax.random.PRNGKey(10 + i), ab["b"].shape)
    scale = lora.scale_of(6, 3)
    batch = make_batch([([1.0, 0.0], [1.0, 0.0]), ([0.0, 0.0], [1.0, 0.0])], seed=3)
    g_full, m_full = grpo.compute_grads(lora.merge(params, adapters, scale), batch, cfg=TCFG, loss_cfg=LossConfig())
    g_ad, m_ad = grpo.compute_grads(adapters, batch, cfg=TCFG, loss_cfg=LossConfig(), frozen=params,
                                    materialize=functools.partial(lora.merge, scale=scale))
    assert float(m_ad["loss/total"]) == pytest.approx(float(m_full["loss/total"]), abs=1e-6)
    assert set(g_ad["layers"]) == {"q_proj", "o_proj", "down_proj"}  # nothing of the base
    for name, ab in adapters["layers"].items():
        a = np.asarray(ab["a"]).reshape(ab["a"].shape[0], -1, ab["a"].shape[-1])
        b = np.asarray(ab["b"]).reshape(ab["b"].shape[0], ab["b"].shape[1], -1)
        g_w = np.asarray(g_full["layers"][name]).reshape(a.shape[0], a.shape[1], b.shape[-1])
        want_b = scale * np.einsum("lir,lio->lro", a, g_w)
        want_a = scale * np.einsum("lio,lro->lir", g_w, b)
        np.testing.assert_allclose(np.asarray(g_ad["layers"][name]["b"]).reshape(want_b.shape), want_b, atol=1e-6)
        np.testing.assert_allclose(np.asarray(g_ad["layers"][name]["a"]).reshape(want_a.shape), want_a, atol=1e-6)
        assert np.abs(want_b).max() > 1e-6
