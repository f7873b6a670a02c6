"""hsjax logits and greedy decoding against transformers, on tiny random models of each family."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from hsjax.models import forward, init_cache, load_pretrained
from tests.models.conftest import CASES, build_hf_model, left_padded_batch, positions_from_mask

LOGIT_ATOL = 1e-4
NEW_TOKENS = 32
LENGTHS = [7, 12, 3]  # uneven: rows get 5, 0 and 9 pads on the left

jit_forward = jax.jit(forward, static_argnums=0)


def hf_logits(model, tokens_BxT, mask_BxT):
    positions = np.maximum(positions_from_mask(mask_BxT), 0)
    with torch.no_grad():
        out = model(
            input_ids=torch.tensor(tokens_BxT),
            attention_mask=torch.tensor(mask_BxT),
            position_ids=torch.tensor(positions),
        )
    return out.logits.float().numpy()


@pytest.fixture(scope="module")
def loaded(hf_case):
    name, model, path = hf_case
    cfg, params, tok = load_pretrained(path, tokenizer=False)
    assert tok is None
    return name, model, cfg, params


def test_logits_match_transformers_on_left_padded_batch(loaded):
    name, model, cfg, params = loaded
    tokens, mask = left_padded_batch(cfg.vocab_size, LENGTHS, seed=1)
    ref = hf_logits(model, tokens, mask)
    got, cache = jit_forward(cfg, params, jnp.asarray(tokens), jnp.asarray(positions_from_mask(mask)))
    got = np.asarray(got)
    assert cache is None
    assert got.dtype == np.float32 and got.shape == ref.shape
    assert np.isfinite(got).all(), "padding slots must give finite logits"
    diff = np.abs(got - ref)[mask > 0].max()
    assert diff <= LOGIT_ATOL, f"{name}: max |logit diff| {diff:.2e} on real tokens"


@pytest.fixture(scope="module")
def greedy_runs(loaded):
    """hsjax greedy decode (prefill + T=1 steps with the KV cache) and transformers generate()."""
    name, model, cfg, params = loaded
    tokens, mask = left_padded_batch(cfg.vocab_size, LENGTHS, seed=2)
    batch, prompt_len = tokens.shape
    positions = positions_from_mask(mask)

    cache = init_cache(cfg, batch, prompt_len + NEW_TOKENS)
    logits, cache = jit_forward(cfg, params, jnp.asarray(tokens), jnp.asarray(positions), cache)
    step_logits = [np.asarray(logits[:, -1])]
    next_B = jnp.argmax(logits[:, -1], axis=-1)
    pos_B = jnp.asarray(positions[:, -1])
    generated = []
    for _ in range(NEW_TOKENS):
        generated.append(np.asarray(next_B))
        pos_B = pos_B + 1
        logits, cache = jit_forward(cfg, params, next_B[:, None], pos_B[:, None], cache)
        step_logits.append(np.asarray(logits[:, 0]))
        next_B = jnp.argmax(logits[:, 0], axis=-1)
    ours = np.stack(generated, axis=1)

    with torch.no_grad():
        out = model.generate(
            input_ids=torch.tensor(tokens), attention_mask=torch.tensor(mask),
            max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0,
        )
    theirs = out[:, prompt_len:].numpy()
    return dict(name=name, cfg=cfg, params=params, tokens=tokens, mask=mask, ours=ours,
                theirs=theirs, step_logits=np.stack(step_logits[:-1], axis=1), cache=cache)


def test_greedy_continuation_matches_transformers_generate(greedy_runs):
    r = greedy_runs
    assert r["theirs"].shape == (len(LENGTHS), NEW_TOKENS)
    np.testing.assert_array_equal(r["ours"], r["theirs"], err_msg=r["name"])


def test_cached_decode_equals_uncached_forward(greedy_runs):
    """Logits predicting each generated token, from the cache, equal one full forward pass."""
    r = greedy_runs
    full_tokens = np.concatenate([r["tokens"], r["ours"]], axis=1)
    full_mask = np.concatenate([r["mask"], np.ones_like(r["ours"])], axis=1)
    logits, _ = jit_forward(
        r["cfg"], r["params"], jnp.asarray(full_tokens), jnp.asarray(positions_from_mask(full_mask))
    )
    prompt_len = r["tokens"].shape[1]
    uncached = np.asarray(logits)[:, prompt_len - 1 : prompt_len - 1 + NEW_TOKENS]
    diff = np.abs(uncached - r["step_logits"]).max()
    assert diff <= LOGIT_ATOL, f"{r['name']}: cached vs uncached max diff {diff:.2e}"
    assert int(r["cache"].end) == prompt_len + NEW_TOKENS
    np.testing.assert_array_equal(np.asarray(r["cache"].pos_BxS), positions_from_mask(full_mask))


@pytest.fixture(scope="module")
def llama_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama")
    model = build_hf_model(CASES["llama_gqa2_untied_rope_llama3"], seed=5)
    model.save_pretrained(path)
    cfg, params, _ = load_pretrained(path, tokenizer=False)
    return cfg, params


def test_packed_segments_equal_each_sequence_alone(llama_model):
    cfg, params = llama_model
    rng = np.random.default_rng(3)
    a, b = rng.integers(1, cfg.vocab_size, 9), rng.integers(1, cfg.vocab_size, 6)
    pad = 3
    packed = np.concatenate([a, b, np.zeros(pad, np.int64)])[None]
    positions = np.concatenate([np.arange(9), np.arange(6), -np.ones(pad, np.int64)])[None]
    segments = np.concatenate([np.zeros(9), np.ones(6), np.full(pad, 2)]).astype(np.int32)[None]
    got, _ = jit_forward(cfg, params, jnp.asarray(packed), jnp.asarray(positions), None,
                         jnp.asarray(segments))
    got = np.asarray(got)[0]
    alone_a, _ = jit_forward(cfg, params, jnp.asarray(a[None]), jnp.arange(9)[None])
    alone_b, _ = jit_forward(cfg, params, jnp.asarray(b[None]), jnp.arange(6)[None])
    np.testing.assert_allclose(got[:9], np.asarray(alone_a)[0], atol=1e-5)
    np.testing.assert_allclose(got[9:15], np.asarray(alone_b)[0], atol=1e-5)
    assert np.isfinite(got).all()
    # Without segment ids the second sequence would see the first: the ids must matter.
    unsegmented, _ = jit_forward(cfg, params, jnp.asarray(packed), jnp.asarray(positions))
    assert np.abs(np.asarray(unsegmented)[0, 9:15] - got[9:15]).max() > 1e-3


def test_padding_is_isolated_and_gradients_finite(llama_model):
    cfg, params = llama_model
    tokens, mask = left_padded_batch(cfg.vocab_size, [5, 8], seed=4)
    tokens = np.concatenate([tokens, np.zeros((1, 8), np.int64)])  # a row of padding only
    mask = np.concatenate([mask, np.zeros((1, 8), np.int64)])
    positions = jnp.asarray(positions_from_mask(mask))
    base, _ = jit_forward(cfg, params, jnp.asarray(tokens), positions)
    noisy_tokens = np.where(mask > 0, tokens, 7)  # change what sits in the pad slots
    noisy, _ = jit_forward(cfg, params, jnp.asarray(noisy_tokens), positions)
    real = mask > 0
    np.testing.assert_array_equal(np.asarray(base)[real], np.asarray(noisy)[real])
    assert np.isfinite(np.asarray(base)).all()

    def loss(p):
        logits, _ = forward(cfg, p, jnp.asarray(tokens), positions)
        return jnp.sum(jax.nn.log_softmax(logits) * jnp.asarray(mask)[..., None])

    grads = jax.jit(jax.grad(loss))(params)
    assert all(bool(jnp.isfinite(g).all()) for g in jax.tree.leaves(grads))


def test_remat_and_bfloat16_options(llama_model):
    cfg, params = llama_model
    tokens, mask = left_padded_batch(cfg.vocab_size, [6, 10], seed=6)
    tokens, positions = jnp.asarray(tokens), jnp.asarray(positions_from_mask(mask))

    def loss(c, p):
        return jnp.sum(forward(c, p, tokens, positions)[0] * jnp.asarray(mask)[..., None])

    # Compiled, as training runs them (op by op, the backward pass alone took most of a minute).
    g_plain = jax.jit(jax.grad(lambda p: loss(cfg, p)))(params)
    g_remat = jax.jit(jax.grad(lambda p: loss(dataclasses.replace(cfg, remat=True), p)))(params)
    for a, b in zip(jax.tree.leaves(g_plain), jax.tree.leaves(g_remat)):
        # Same math, different fusion: float32 rounding differs slightly.
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-4)

    f32, _ = jit_forward(cfg, params, tokens, positions)
    bf16_cfg = dataclasses.replace(cfg, dtype="bfloat16")
    bf16, _ = jit_forward(bf16_cfg, params, tokens, positions)
    assert bf16.dtype == jnp.float32
    real = mask > 0
    f32, bf16 = np.asarray(f32)[real], np.asarray(bf16)[real]
    assert np.abs(f32 - bf16).max() < 0.05 * np.abs(f32).max()
    assert (f32.argmax(-1) == bf16.argmax(-1)).mean() >= 0.8
    bf16_params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)
    cache = init_cache(dataclasses.replace(bf16_cfg, param_dtype="bfloat16"), 2, 12)
    assert cache.k_LxBxSxKxH.dtype == jnp.bfloat16
    out, cache = jit_forward(bf16_cfg, bf16_params, tokens, positions, cache)
    assert np.isfinite(np.asarray(out)).all() and int(cache.end) == tokens.shape[1]


def test_cache_errors_name_the_problem(llama_model):
    cfg, params = llama_model
    cache = init_cache(cfg, 1, 4)
    with pytest.raises(ValueError, match="enlarge"):
        forward(cfg, params, jnp.ones((1, 5), jnp.int32), jnp.arange(5)[None], cache)
    _, cache = forward(cfg, params, jnp.ones((1, 3), jnp.int32), jnp.arange(3)[None], cache)
    with pytest.raises(ValueError, match="KV cache full"):
        forward(cfg, params, jnp.ones((1, 2), jnp.int32), jnp.arange(3, 5)[None], cache)
    with pytest.raises(ValueError, match="segment_ids"):
        forward(cfg, params, jnp.ones((1, 1), jnp.int32), jnp.zeros((1, 1), jnp.int32), cache,
                jnp.zeros((1, 1), jnp.int32))


def test_attention_matches_jax_reference_with_the_cudnn_call_convention():
    """`attend` equals `jax.nn.dot_product_attention` given the same arguments the 'cudnn' path
    passes (mask_Bx1xTxS, scale, GQA layout), so only the kernel differs on GPU."""
    from hsjax.models.attention import attend, causal_mask

    rng = np.random.default_rng(8)
    b, t, n, k, h = 2, 7, 6, 2, 16
    q = jnp.asarray(rng.normal(size=(b, t, n, h)), jnp.float32)
    kv = [jnp.asarray(rng.normal(size=(b, t, k, h)), jnp.float32) for _ in range(2)]
    positions = jnp.asarray(positions_from_mask(left_padded_batch(50, [7, 4])[1]))
    slots = jnp.arange(t)
    mask = causal_mask(positions, positions, slots, slots)
    ours = attend(q, *kv, mask, impl="xla")
    ref = jax.nn.dot_product_attention(q, *kv, mask=mask[:, None], scale=h**-0.5,
                                       implementation="xla")
    real = np.asarray(positions) >= 0
    np.testing.assert_allclose(np.asarray(ours)[real], np.asarray(ref)[real], atol=1e-5)
    assert not np.asarray(ours)[~real].any(), "padding queries must give zeros"
