"""The one-token decode step the sampler runs in its loop, on the model's own decoder block.

Same math as `forward(cfg, params, tok_Bx1, pos_Bx1, cache)` (both run `model.block` and
`model.logits`; tests/models/test_decode.py checks the logits agree), with another memory layout:

- per-layer caches laid out BxKxSxH (`decode_caches` converts a prefilled `KVCache`), written at
  `slot` and read in place by grouped-query einsums. In the model's LxBxSxKxH layout XLA
  transposes the whole cache every step to put S next to H for the score and value contractions.
- weights cast to the compute dtype and split out of their stacked arrays once (`decode_weights`),
  then a Python loop over layers. Slicing the stacked weights inside the loop (as a layer `scan`
  does) copies every weight once per generated token.

Typical use, under `jax.jit` (`cfg` static), after prefilling `cache` with `forward`:
    weights = decode_weights(cfg, params)
    k_caches, v_caches = decode_caches(cache)
    logits_BxV, k_caches, v_caches, kpos_BxS = decode_step(
        cfg, weights, tok_B, pos_B, cache.end, k_caches, v_caches, cache.pos_BxS)
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from hsjax.models import rope
from hsjax.models.attention import _MASKED_SCORE
from hsjax.models.config import ModelConfig
from hsjax.models.model import KVCache, block, head_weight, logits


def decode_weights(cfg: ModelConfig, params: dict) -> dict:
    """Weights in the compute dtype with the layers split out of their stacked arrays:
    {"embed", "final_norm", "head" (from `head_weight`), "layers": one dict per layer}."""
    dtype = jnp.dtype(cfg.dtype)
    cast = lambda w: w.astype(dtype)  # noqa: E731
    return {"embed": cast(params["embed"]), "final_norm": cast(params["final_norm"]),
            "head": cast(head_weight(cfg, params)),
            "layers": [jax.tree.map(lambda w: cast(w[i]), params["layers"])
                       for i in range(cfg.num_layers)]}


def decode_caches(cache: KVCache) -> tuple[tuple[jax.Array, ...], tuple[jax.Array, ...]]:
    """(k_caches, v_caches): one BxKxSxH array per layer from a `KVCache`'s LxBxSxKxH arrays
    (one transpose per layer, once per generation, not once per token)."""
    num_layers = cache.k_LxBxSxKxH.shape[0]
    k_caches = tuple(cache.k_LxBxSxKxH[i].transpose(0, 2, 1, 3) for i in range(num_layers))
    v_caches = tuple(cache.v_LxBxSxKxH[i].transpose(0, 2, 1, 3) for i in range(num_layers))
    return k_caches, v_caches


def decode_step(cfg: ModelConfig, weights: dict, tok_B, pos_B, slot, k_caches, v_caches,
                kpos_BxS):
    """One token per row through the decoder (`weights` from `decode_weights`).

    Writes the new keys/values and `pos_B` at `slot` (every slot after it must be empty) and
    attends over slots <= `slot` holding a position >= 0, the mask rule of `forward`. Returns
    (logits_BxV float32, k_caches, v_caches, kpos_BxS).
    """
    dtype = jnp.dtype(cfg.dtype)
    num_slots = kpos_BxS.shape[1]
    kpos_BxS = jax.lax.dynamic_update_slice(kpos_BxS, pos_B[:, None], (0, slot))
    mask_BxS = (kpos_BxS >= 0) & (jnp.arange(num_slots)[None, :] <= slot)
    cos_Bx1xH, sin_Bx1xH = rope.cos_sin(pos_B[:, None], rope.inv_frequencies(cfg), dtype)
    x_Bx1xD = weights["embed"][tok_B[:, None]]
    new_k, new_v = [], []
    for p, k_cache_BxKxSxH, v_cache_BxKxSxH in zip(weights["layers"], k_caches, v_caches):
        attend_fn = functools.partial(_attend_in_place, cfg, mask_BxS, slot, k_cache_BxKxSxH,
                                      v_cache_BxKxSxH)
        x_Bx1xD, (k_cache_BxKxSxH, v_cache_BxKxSxH) = block(cfg, p, x_Bx1xD, cos_Bx1xH,
                                                            sin_Bx1xH, attend_fn)
        new_k.append(k_cache_BxKxSxH)
        new_v.append(v_cache_BxKxSxH)
    # `logits` takes BxTxD; XLA folds the T=1 axis into the matmul, so slicing after is free.
    logits_BxV = logits(cfg, x_Bx1xD, weights["final_norm"], weights["head"])[:, 0]
    return logits_BxV, tuple(new_k), tuple(new_v), kpos_BxS


def _attend_in_place(cfg: ModelConfig, mask_BxS, slot, k_cache_BxKxSxH, v_cache_BxKxSxH,
                     q_Bx1xNxH, k_Bx1xKxH, v_Bx1xKxH):
    """`block`'s attend_fn for one new token: writes its key/value at `slot` of this layer's
    BxKxSxH caches, then attends over them where they lie. Aux: the updated caches.

    The G = N/K query heads of a group share one cache head, so the einsums contract with the
    cache as stored (`bkgh,bksh->bkgs`, `bkgs,bksh->bkgh`): no transpose of S slots per step.
    The float ops of `attention.attend` at T=1 (float32 scores and softmax, probabilities cast to
    the compute dtype, float32 accumulation), without its zeroing of queries that see no key: a
    decode query at a position >= 0 always sees its own slot.
    """
    dtype = jnp.dtype(cfg.dtype)
    batch, num_kv, _, head_dim = k_cache_BxKxSxH.shape
    group = cfg.num_heads // num_kv
    k_cache_BxKxSxH = jax.lax.dynamic_update_slice(
        k_cache_BxKxSxH, k_Bx1xKxH.transpose(0, 2, 1, 3).astype(k_cache_BxKxSxH.dtype),
        (0, 0, slot, 0))
    v_cache_BxKxSxH = jax.lax.dynamic_update_slice(
        v_cache_BxKxSxH, v_Bx1xKxH.transpose(0, 2, 1, 3).astype(v_cache_BxKxSxH.dtype),
        (0, 0, slot, 0))
    q_BxKxGxH = q_Bx1xNxH.reshape(batch, num_kv, group, head_dim)
    scores_BxKxGxS = jnp.einsum("bkgh,bksh->bkgs", q_BxKxGxH, k_cache_BxKxSxH.astype(dtype),
                                preferred_element_type=jnp.float32) * head_dim**-0.5
    scores_BxKxGxS = jnp.where(mask_BxS[:, None, None], scores_BxKxGxS, _MASKED_SCORE)
    probs_BxKxGxS = jax.nn.softmax(scores_BxKxGxS, axis=-1).astype(dtype)
    attn_BxKxGxH = jnp.einsum("bkgs,bksh->bkgh", probs_BxKxGxS, v_cache_BxKxSxH.astype(dtype),
                              preferred_element_type=jnp.float32)
    attn_Bx1xNxH = attn_BxKxGxH.reshape(batch, 1, cfg.num_heads, head_dim).astype(dtype)
    return attn_Bx1xNxH, (k_cache_BxKxSxH, v_cache_BxKxSxH)
