"""The blocked heads against `token_logp` on the full logits, values, entropies and gradients:
`token_logp_chunked` (a block of positions at a time, under remat), `token_logp_fused` (the head,
log-softmax and gather fused over vocabulary blocks, its own backward), and `hidden_token_logp`
(the one the update calls, picking by the device's memory plan)."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hsjax.models.memory_plan import MemoryPlan
from hsjax.models.model import forward, forward_hidden, head_weight, init_params, logits
from hsjax.models.presets import get_preset
from hsjax.rl.losses import hidden_token_logp, token_logp, token_logp_chunked, token_logp_fused

CFG = get_preset("tiny", num_layers=1)


def head_fn(params):
    return lambda x: logits(CFG, x, params["final_norm"], head_weight(CFG, params))


@pytest.mark.parametrize("T,chunk", [(16, 4), (37, 8), (21, 64), (33, 1)])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_logp_matches_dense_values_and_grads(T, chunk, temperature):
    params = init_params(CFG, jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (3, T, CFG.hidden_size))
    tokens = jax.random.randint(jax.random.key(2), (3, T), 0, CFG.vocab_size)
    w = jax.random.normal(jax.random.key(3), (3, T))

    # Compiled: op-by-op dispatch of the blocked backward is what would take the time here.
    @jax.jit
    def dense(p, x):
        return token_logp(head_fn(p)(x), tokens, temperature)

    @jax.jit
    def chunked(p, x):
        return token_logp_chunked(x, tokens, head_fn(p), temperature, chunk)

    (lp_d, ent_d), (lp_c, ent_c) = dense(params, x), chunked(params, x)
    np.testing.assert_allclose(lp_c, lp_d, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(ent_c, ent_d, rtol=1e-6, atol=1e-6)
    assert np.all(np.asarray(lp_c)[:, 0] == 0) and np.all(np.asarray(ent_c)[:, 0] == 0)

    loss = lambda f, p, x: jnp.sum(w * f(p, x)[0])  # noqa: E731
    g_d = jax.jit(jax.grad(functools.partial(loss, dense), argnums=(0, 1)))(params, x)
    g_c = jax.jit(jax.grad(functools.partial(loss, chunked), argnums=(0, 1)))(params, x)
    for a, b in zip(jax.tree.leaves(g_c), jax.tree.leaves(g_d)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * float(jnp.max(jnp.abs(b))))


@pytest.mark.parametrize("tie,T,block,temperature", [
    (True, 16, 128, 1.0), (False, 37, 128, 0.7), (True, 37, 256, 0.7), (False, 9, 512, 1.0)])
def test_fused_logp_matches_dense_values_and_grads(tie, T, block, temperature):
    """Vocabulary 500 in blocks of 128 (a padded last block), 256 or 512 (one block); tied and
    untied heads: the gradient reaches the embedding table or lm_head, and the final norm."""
    cfg = get_preset("tiny", num_layers=1, tie_embeddings=tie, vocab_size=500)
    params = init_params(cfg, jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (3, T, cfg.hidden_size))
    tokens = jax.random.randint(jax.random.key(2), (3, T), 0, cfg.vocab_size)
    w = jax.random.normal(jax.random.key(3), (3, T))

    @jax.jit
    def dense(p, x):
        return token_logp(logits(cfg, x, p["final_norm"], head_weight(cfg, p)), tokens, temperature)

    @jax.jit
    def fused(p, x):
        return token_logp_fused(cfg, p, x, tokens, temperature, block)

    (lp_d, ent_d), (lp_f, ent_f) = dense(params, x), fused(params, x)
    np.testing.assert_allclose(lp_f, lp_d, rtol=1e-6, atol=2e-6)
    np.testing.assert_allclose(ent_f, ent_d, rtol=1e-6, atol=2e-6)
    assert np.all(np.asarray(lp_f)[:, 0] == 0) and np.all(np.asarray(ent_f)[:, 0] == 0)

    loss = lambda f, p, x: jnp.sum(w * f(p, x)[0])  # noqa: E731
    g_d = jax.jit(jax.grad(functools.partial(loss, dense), argnums=(0, 1)))(params, x)
    g_f = jax.jit(jax.grad(functools.partial(loss, fused), argnums=(0, 1)))(params, x)
    for a, b in zip(jax.tree.leaves(g_f), jax.tree.leaves(g_d)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * float(jnp.max(jnp.abs(b))))


def test_fused_logp_in_bfloat16_stays_near_the_float32_values():
    """The compute dtype of the GPU benchmark: bf16 hidden states and head, float32 logits."""
    cfg = get_preset("tiny", num_layers=1, vocab_size=500, dtype="bfloat16")
    params = init_params(cfg, jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (2, 24, cfg.hidden_size)).astype(jnp.bfloat16)
    tokens = jax.random.randint(jax.random.key(2), (2, 24), 0, cfg.vocab_size)
    dense = token_logp(logits(cfg, x, params["final_norm"], head_weight(cfg, params)), tokens)
    fused = token_logp_fused(cfg, params, x, tokens, 1.0, 128)
    for a, b in zip(fused, dense):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    g = jax.grad(lambda x: jnp.sum(token_logp_fused(cfg, params, x, tokens, 1.0, 128)[0]))(x)
    assert g.dtype == jnp.bfloat16 and bool(jnp.all(jnp.isfinite(g.astype(jnp.float32))))


@pytest.mark.parametrize("plan,path", [
    (MemoryPlan(2 * 8 * 512 * 4, "positions"), "positions"),  # 8 positions a block
    (MemoryPlan(2 * 40 * 128 * 4, "vocab"), "vocab"),  # 128 vocabulary entries a block
    (MemoryPlan(1 << 30, "vocab"), "dense"),  # everything fits: the plain head
])
def test_hidden_logp_follows_the_plan_and_matches_forward(monkeypatch, plan, path):
    """`hidden_token_logp` takes the path the plan names; through the model, the same logp as
    `token_logp(forward(...))` on every path."""
    from hsjax.rl import losses

    params = init_params(CFG, jax.random.key(0))
    tokens = jax.random.randint(jax.random.key(2), (2, 40), 0, CFG.vocab_size)
    pos = jnp.tile(jnp.arange(40), (2, 1))
    full, _ = forward(CFG, params, tokens, pos)
    want = token_logp(full, tokens)
    taken = []
    for name in ("token_logp_chunked", "token_logp_fused"):
        real = getattr(losses, name)
        monkeypatch.setattr(losses, name, lambda *a, real=real, name=name: taken.append(
            (name, a[-1])) or real(*a))
    x, _ = forward_hidden(CFG, params, tokens, pos)
    got = hidden_token_logp(CFG, params, x, tokens, plan=plan)
    expected = {"positions": ("token_logp_chunked", 8), "vocab": ("token_logp_fused", 128),
                "dense": ("token_logp_chunked", 0)}[path]
    assert taken == [expected]
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
