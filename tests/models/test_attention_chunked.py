"""The long-row paths against the dense ones, values and gradients: chunked attention (query
blocks under remat) under causal, padding and packed-segment masks, with and without a KV cache,
and the MLP over blocks of positions."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hsjax.models import attention, model
from hsjax.models.attention import MaskRule, attend, attend_chunked
from hsjax.models.memory_plan import MemoryPlan
from hsjax.models.model import forward, init_cache, init_params
from hsjax.models.presets import get_preset

CFG = get_preset("tiny", num_layers=2)


def rule_for(T, seed, segments):
    """Left padding of a few slots in some rows, optionally two packed segments per row."""
    rng = np.random.default_rng(seed)
    B = 3
    pos = np.tile(np.arange(T, dtype=np.int32), (B, 1))
    seg = np.ones((B, T), np.int32)
    for b in range(B):
        pad = int(rng.integers(0, T // 3))
        pos[b, :pad] = -1
        seg[b, :pad] = 0
        if segments:
            cut = int(rng.integers(pad + 1, T))
            seg[b, cut:] = 2
            pos[b, cut:] = np.arange(T - cut)
        pos[b, pad:] = pos[b, pad:] - pos[b, pad]
    slots = jnp.arange(T, dtype=jnp.int32)
    seg = jnp.asarray(seg) if segments else None
    return MaskRule(jnp.asarray(pos), jnp.asarray(pos), slots, slots, seg, seg)


def qkv(T, seed, N=4, K=2, H=8):
    keys = jax.random.split(jax.random.key(seed), 3)
    B = 3
    return (jax.random.normal(keys[0], (B, T, N, H)), jax.random.normal(keys[1], (B, T, K, H)),
            jax.random.normal(keys[2], (B, T, K, H)))


@pytest.mark.parametrize("T,chunk", [(16, 4), (37, 8), (50, 16), (9, 16)])
@pytest.mark.parametrize("segments", [False, True])
def test_chunked_attention_matches_dense_values_and_grads(T, chunk, segments):
    rule = rule_for(T, seed=T, segments=segments)
    q, k, v = qkv(T, seed=T + 1)
    w = jax.random.normal(jax.random.key(7), q.shape)  # a loss that weighs every output

    # Compiled: op-by-op dispatch of the blocked backward is what would take the time here.
    dense = jax.jit(lambda q, k, v: attend(q, k, v, rule.dense(), "xla"))
    chunked = jax.jit(lambda q, k, v: attend_chunked(q, k, v, rule, chunk))
    np.testing.assert_allclose(chunked(q, k, v), dense(q, k, v), rtol=1e-5, atol=1e-6)

    loss = lambda f, *a: jnp.sum(w * f(*a))  # noqa: E731
    g_dense = jax.jit(jax.grad(functools.partial(loss, dense), argnums=(0, 1, 2)))(q, k, v)
    g_chunked = jax.jit(jax.grad(functools.partial(loss, chunked), argnums=(0, 1, 2)))(q, k, v)
    for a, b in zip(g_chunked, g_dense):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    # Padding queries see nothing and return zeros on both paths.
    pad_BxT = np.asarray(rule.q_pos_BxT) < 0
    assert np.all(np.asarray(chunked(q, k, v))[pad_BxT] == 0)


def test_query_rows_budget():
    plan = MemoryPlan(64 << 20)
    assert plan.query_rows(2, 4, 16, 16) == 0  # dense scores fit
    rows = plan.query_rows(64, 4, 2048, 2048)
    assert rows == 32 and 64 * 4 * rows * 2048 * 4 <= plan.block_bytes
    assert MemoryPlan(4 * 8).query_rows(1, 1, 8, 8) == 1


@pytest.mark.parametrize("with_cache", [False, True])
def test_forward_chunked_matches_dense(monkeypatch, with_cache):
    """`forward` switches to query blocks once dense scores pass the budget; same logits and
    gradients as the dense path (T = 45 is not a multiple of the blocks)."""
    params = init_params(CFG, jax.random.key(0))
    T = 45
    rule = rule_for(T, seed=3, segments=not with_cache)
    tokens = jax.random.randint(jax.random.key(1), (3, T), 1, CFG.vocab_size)

    def run(p):
        if with_cache:
            cache = init_cache(CFG, 3, T + 3)
            logits, _ = forward(CFG, p, tokens, rule.q_pos_BxT, cache)
        else:
            logits, _ = forward(CFG, p, tokens, rule.q_pos_BxT, segment_ids_BxT=rule.q_seg_BxT)
        return logits

    def logits_and_grads():
        loss = lambda p: jnp.sum(jnp.sin(run(p)) * (rule.q_pos_BxT >= 0)[..., None])  # noqa: E731
        return jax.jit(run)(params), jax.jit(jax.grad(loss))(params)

    dense_logits, dense_grads = logits_and_grads()
    small = MemoryPlan(3 * 4 * 48 * 4 * 8)  # 8-row blocks of attention (and blocks of the MLP)
    monkeypatch.setattr(model, "device_plan", lambda cfg: small)
    seen = []
    real = attention.attend_chunked
    monkeypatch.setattr("hsjax.models.model.attend_chunked",
                        lambda *a: seen.append(a[-1]) or real(*a))
    chunk_logits, chunk_grads = logits_and_grads()
    assert seen and set(seen) == {8}
    valid = np.asarray(rule.q_pos_BxT) >= 0
    np.testing.assert_allclose(np.asarray(chunk_logits)[valid], np.asarray(dense_logits)[valid],
                               rtol=1e-5, atol=1e-5)
    for a, b in zip(jax.tree.leaves(chunk_grads), jax.tree.leaves(dense_grads)):
        # Float32 rounding of sums over every token: relative to the gradient's scale.
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * float(jnp.max(jnp.abs(b))))


def test_mlp_blocks_match_dense(monkeypatch):
    """`mlp` over blocks of positions (T = 45, blocks of 8) against the plain SwiGLU."""
    params = init_params(CFG, jax.random.key(0))
    p = jax.tree.map(lambda w: w[0], params["layers"])
    h = jax.random.normal(jax.random.key(4), (3, 45, CFG.hidden_size))
    w = jax.random.normal(jax.random.key(5), h.shape)
    loss = lambda p, h, plan: jnp.sum(w * model.mlp(p, h, plan))  # noqa: E731
    whole, blocks = MemoryPlan(1 << 30), MemoryPlan(3 * 8 * CFG.intermediate_size * 4)
    dense_out, dense_grads = model.mlp(p, h, whole), jax.grad(loss, argnums=(0, 1))(p, h, whole)
    calls = []
    real = model._mlp
    monkeypatch.setattr(model, "_mlp", lambda p, x: calls.append(x.shape) or real(p, x))
    out, grads = model.mlp(p, h, blocks), jax.grad(loss, argnums=(0, 1))(p, h, blocks)
    assert (3, 8, CFG.hidden_size) in calls
    np.testing.assert_allclose(out, dense_out, rtol=1e-5, atol=1e-5)
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(dense_grads)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * float(jnp.max(jnp.abs(b))))


def test_plain_mlp_keeps_only_its_two_projections_for_the_backward(capsys):
    """The plain path (T > 1) is the SwiGLU, values and gradients equal to the un-checkpointed one,
    and what its backward keeps of size B x T x F is the gate and up projections only."""
    params = init_params(CFG, jax.random.key(0))
    p = jax.tree.map(lambda w: w[0], params["layers"])
    h = jax.random.normal(jax.random.key(6), (2, 16, CFG.hidden_size))
    w = jax.random.normal(jax.random.key(7), h.shape)
    plain = lambda p, h: jnp.sum(w * model._mlp(p, h))  # noqa: E731
    whole = MemoryPlan(1 << 30)
    kept = lambda p, h: jnp.sum(w * model.mlp(p, h, whole))  # noqa: E731
    np.testing.assert_array_equal(model.mlp(p, h, whole), model._mlp(p, h))
    for a, b in zip(jax.tree.leaves(jax.grad(kept, argnums=(0, 1))(p, h)),
                    jax.tree.leaves(jax.grad(plain, argnums=(0, 1))(p, h))):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)

    def wide(f):  # the B x T x F arrays JAX keeps for f's backward (its only public report prints)
        capsys.readouterr()
        jax.ad_checkpoint.print_saved_residuals(f, p, h)
        return [line for line in capsys.readouterr().out.splitlines()
                if line.startswith(f"f32[2,16,{CFG.intermediate_size}]")]

    assert len(wide(kept)) == 2
    assert len(wide(plain)) > 2  # without the policy the backward keeps more (what the policy saves)


def test_the_additive_mask_gives_the_selected_scores_values_and_gradients():
    """`attend` adds a 0 / -1e30 bias instead of selecting -1e30: the same outputs and gradients
    as the select it replaced, padding rows included."""
    rule = rule_for(13, seed=3, segments=True)
    q, k, v = qkv(13, seed=3)
    mask = rule.dense()

    def selected(q, k, v):  # the masking as it was: jnp.where on the scores
        b, t, n, h = q.shape
        qg = q.reshape(b, t, k.shape[2], n // k.shape[2], h)
        s = jnp.einsum("btkgh,bskh->bkgts", qg, k, preferred_element_type=jnp.float32) * h**-0.5
        s = jnp.where(mask[:, None, None], s, -1e30)
        o = jnp.einsum("bkgts,bskh->btkgh", jax.nn.softmax(s, axis=-1), v).reshape(b, t, n, h)
        return jnp.where(jnp.any(mask, -1)[:, :, None, None], o, 0)

    np.testing.assert_array_equal(attend(q, k, v, mask), selected(q, k, v))
    w = jax.random.normal(jax.random.key(8), q.shape)
    grads = jax.grad(lambda *a: jnp.sum(w * attend(*a, mask)), argnums=(0, 1, 2))(q, k, v)
    ref = jax.grad(lambda *a: jnp.sum(w * selected(*a)), argnums=(0, 1, 2))(q, k, v)
    for a, b in zip(grads, ref):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_dense_training_attention_keeps_no_scores_for_the_backward(capsys, monkeypatch):
    """Short rows take the dense path; under `forward` (no cache) it is checkpointed, so the
    backward keeps q, k, v and the mask, never a B x K x G x T x T score or probability array
    (without the checkpoint each layer keeps several), and the gradients are the plain ones."""
    cfg = get_preset("tiny", num_layers=2)
    params = init_params(cfg, jax.random.key(0))
    B, T = 2, 24
    assert model.device_plan(cfg).query_rows(B, cfg.num_heads, T, T) == 0  # the dense path
    tokens = jax.random.randint(jax.random.key(1), (B, T), 0, cfg.vocab_size)
    positions = jnp.tile(jnp.arange(T), (B, 1)).at[0, :5].set(-1)
    loss = lambda p: jnp.sum(forward(cfg, p, tokens, positions)[0][:, :, :7])  # noqa: E731
    K, G = cfg.num_kv_heads, cfg.num_heads // cfg.num_kv_heads

    def kept_scores():  # the score-shaped residuals (stacked over the layers: L x B x K x G x T x T)
        capsys.readouterr()
        jax.ad_checkpoint.print_saved_residuals(loss, params)
        return [line for line in capsys.readouterr().out.splitlines()
                if line.split()[0].endswith(f"{B},{K},{G},{T},{T}]")]

    assert not kept_scores()
    g = jax.grad(loss)(params)

    # The reference: the same attention without the checkpoint keeps scores, same gradients.
    monkeypatch.setattr(model, "_attend_uncached",
                        lambda cfg_, mask, q, k, v: (attend(q, k, v, mask, "xla"), None))
    assert kept_scores()
    g_plain = jax.grad(loss)(params)
    for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(g_plain)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
