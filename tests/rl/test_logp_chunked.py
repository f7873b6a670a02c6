"""`token_logp_chunked` (the head a block of positions at a time, under remat) against
`token_logp` on the full logits: values, entropies and gradients."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hsjax.models.model import forward, forward_hidden, head_weight, init_params, logits
from hsjax.models.presets import get_preset
from hsjax.rl import losses
from hsjax.rl.losses import token_logp, token_logp_chunked

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


def test_default_chunk_fits_budget_and_matches_forward(monkeypatch):
    """chunk=0 sizes blocks from LOGITS_CHUNK_BYTES; through the model, the same logp as
    `token_logp(forward(...))`."""
    params = init_params(CFG, jax.random.key(0))
    tokens = jax.random.randint(jax.random.key(2), (2, 40), 0, CFG.vocab_size)
    pos = jnp.tile(jnp.arange(40), (2, 1))
    full, _ = forward(CFG, params, tokens, pos)
    want = token_logp(full, tokens)
    monkeypatch.setattr(losses, "LOGITS_CHUNK_BYTES", 2 * 8 * CFG.vocab_size * 4)  # 8 positions
    calls = []
    fn = head_fn(params)
    x, _ = forward_hidden(CFG, params, tokens, pos)
    got = token_logp_chunked(x, tokens, lambda h: calls.append(h.shape) or fn(h))
    assert (2, 8, CFG.hidden_size) in calls
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
