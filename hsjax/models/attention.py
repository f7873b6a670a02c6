"""Attention masks and grouped-query attention.

Mask rule (the whole contract): query slot i sees key slot j iff j <= i in slot order, both slots
hold a real token (position >= 0), and, when segment ids are given, both share a segment id.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

# Finite, so a fully masked row (a padding query) gets a uniform softmax instead of NaN.
_MASKED_SCORE = -1e30


def causal_mask(
    q_pos_BxT: jnp.ndarray,
    k_pos_BxS: jnp.ndarray,
    q_slot_T: jnp.ndarray,
    k_slot_S: jnp.ndarray,
    q_seg_BxT: jnp.ndarray | None = None,
    k_seg_BxS: jnp.ndarray | None = None,
) -> jnp.ndarray:
    """Boolean mask_BxTxS from positions (negative = padding or empty) and slot indices."""
    mask_BxTxS = (k_slot_S[None, None, :] <= q_slot_T[None, :, None])
    mask_BxTxS = mask_BxTxS & (q_pos_BxT >= 0)[:, :, None] & (k_pos_BxS >= 0)[:, None, :]
    if q_seg_BxT is not None:
        mask_BxTxS = mask_BxTxS & (q_seg_BxT[:, :, None] == k_seg_BxS[:, None, :])
    return mask_BxTxS


def attend(
    q_BxTxNxH: jnp.ndarray,
    k_BxSxKxH: jnp.ndarray,
    v_BxSxKxH: jnp.ndarray,
    mask_BxTxS: jnp.ndarray,
    impl: str = "xla",
) -> jnp.ndarray:
    """Softmax(q k^T / sqrt(H)) v with N query heads sharing K key/value heads (N % K == 0).

    Queries that see no key (padding) return zeros.
    """
    head_dim = q_BxTxNxH.shape[-1]
    scale = head_dim**-0.5
    if impl == "cudnn":
        out_BxTxNxH = jax.nn.dot_product_attention(
            q_BxTxNxH, k_BxSxKxH, v_BxSxKxH, mask=mask_BxTxS[:, None], scale=scale,
            implementation="cudnn",
        )
    elif impl == "xla":
        out_BxTxNxH = _attend_xla(q_BxTxNxH, k_BxSxKxH, v_BxSxKxH, mask_BxTxS, scale)
    else:
        raise ValueError(f"attention impl {impl!r}: expected 'xla' or 'cudnn'.")
    seen_BxT = jnp.any(mask_BxTxS, axis=-1)
    return jnp.where(seen_BxT[:, :, None, None], out_BxTxNxH, 0).astype(q_BxTxNxH.dtype)


def _attend_xla(q_BxTxNxH, k_BxSxKxH, v_BxSxKxH, mask_BxTxS, scale):
    b, t, n, h = q_BxTxNxH.shape
    k = k_BxSxKxH.shape[2]
    q_BxTxKxGxH = q_BxTxNxH.reshape(b, t, k, n // k, h)
    scores_BxKxGxTxS = jnp.einsum(
        "btkgh,bskh->bkgts", q_BxTxKxGxH, k_BxSxKxH, preferred_element_type=jnp.float32
    ) * scale
    scores_BxKxGxTxS = jnp.where(mask_BxTxS[:, None, None], scores_BxKxGxTxS, _MASKED_SCORE)
    probs_BxKxGxTxS = jax.nn.softmax(scores_BxKxGxTxS, axis=-1).astype(v_BxSxKxH.dtype)
    out_BxTxKxGxH = jnp.einsum(
        "bkgts,bskh->btkgh", probs_BxKxGxTxS, v_BxSxKxH, preferred_element_type=jnp.float32
    )
    return out_BxTxKxGxH.reshape(b, t, n, h)
