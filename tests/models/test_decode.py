"""The sampler's decode step (`hsjax.models.decode`) against `forward` with a KV cache at T=1."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hsjax.models import (decode_caches, decode_step, decode_weights, forward, init_cache,
                          load_pretrained)
from tests.models.conftest import left_padded_batch, positions_from_mask

LOGIT_ATOL = 1e-5  # same block, same float ops: only XLA fusion may differ
STEPS = 4
LENGTHS = [7, 12, 3]

jit_forward = jax.jit(forward, static_argnums=0)
jit_decode_step = jax.jit(decode_step, static_argnums=0)


@pytest.fixture(scope="module")
def loaded(hf_case):
    name, _, path = hf_case
    cfg, params, _ = load_pretrained(path, tokenizer=False)
    return name, cfg, params


def test_decode_step_equals_cached_forward_at_t1(loaded):
    """After one prefill, each decode step gives `forward(tok_Bx1, pos_Bx1, cache)`'s logits and
    leaves the same keys, values and positions in its per-layer caches."""
    name, cfg, params = loaded
    assert cfg.dtype == "float32"
    tokens_BxP, mask_BxP = left_padded_batch(cfg.vocab_size, LENGTHS, seed=3)
    positions_BxP = positions_from_mask(mask_BxP)
    batch, prompt_len = tokens_BxP.shape
    cache = init_cache(cfg, batch, prompt_len + STEPS)
    logits_BxPxV, cache = jit_forward(cfg, params, jnp.asarray(tokens_BxP),
                                      jnp.asarray(positions_BxP), cache)
    weights = decode_weights(cfg, params)
    k_caches, v_caches = decode_caches(cache)
    kpos_BxS = cache.pos_BxS
    tok_B = jnp.argmax(logits_BxPxV[:, -1], axis=-1).astype(jnp.int32)
    pos_B = jnp.asarray(positions_BxP[:, -1], jnp.int32)
    for step in range(STEPS):
        pos_B = pos_B + 1
        slot = jnp.int32(prompt_len + step)
        logits_BxV, k_caches, v_caches, kpos_BxS = jit_decode_step(
            cfg, weights, tok_B, pos_B, slot, k_caches, v_caches, kpos_BxS)
        ref_Bx1xV, cache = jit_forward(cfg, params, tok_B[:, None], pos_B[:, None], cache)
        assert logits_BxV.dtype == jnp.float32 and logits_BxV.shape == (batch, cfg.vocab_size)
        diff = float(jnp.abs(logits_BxV - ref_Bx1xV[:, 0]).max())
        assert diff <= LOGIT_ATOL, f"{name} step {step}: max |logit diff| {diff:.2e}"
        tok_B = jnp.argmax(ref_Bx1xV[:, 0], axis=-1).astype(jnp.int32)

    np.testing.assert_array_equal(np.asarray(kpos_BxS), np.asarray(cache.pos_BxS))
    want_k, want_v = decode_caches(cache)
    for got, want in zip(k_caches + v_caches, want_k + want_v):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=LOGIT_ATOL,
                                   err_msg=name)


def test_decode_weights_unstack_and_cast(loaded):
    _, cfg, params = loaded
    weights = decode_weights(cfg, params)
    assert len(weights["layers"]) == cfg.num_layers
    assert set(weights["layers"][0]) == set(params["layers"])
    head = params["embed"] if cfg.tie_embeddings else params["lm_head"]
    np.testing.assert_array_equal(np.asarray(weights["head"]), np.asarray(head))
    last = cfg.num_layers - 1
    for name, stacked in params["layers"].items():
        np.testing.assert_array_equal(np.asarray(weights["layers"][last][name]),
                                      np.asarray(stacked[last]))
