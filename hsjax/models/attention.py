"""Attention masks and grouped-query attention.

Mask rule (the whole contract): query slot i sees key slot j iff j <= i in slot order, both slots
hold a real token (position >= 0), and, when segment ids are given, both share a segment id.

Memory: dense attention holds float32 scores and probabilities of B x N x T x S. When those would
pass the device's block budget (`memory_plan.MemoryPlan.query_rows`), `forward` uses
`attend_chunked` instead: the same computation one block
of query rows at a time (each row still takes its softmax over all S keys, so the result is the
dense one up to float32 rounding), under `jax.checkpoint`, so neither the forward nor the backward
ever holds more than one block's scores. Each block builds its own slice of the mask; the compiled
update still keeps those slices for the backward, one float32 B x T x S bias in all
(docs/performance.md, "What the update keeps for its backward").
"""
from __future__ import annotations

from typing import NamedTuple

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


class MaskRule(NamedTuple):
    """The arguments of `causal_mask`, to build the mask one block of query rows at a time."""

    q_pos_BxT: jnp.ndarray
    k_pos_BxS: jnp.ndarray
    q_slot_T: jnp.ndarray
    k_slot_S: jnp.ndarray
    q_seg_BxT: jnp.ndarray | None = None
    k_seg_BxS: jnp.ndarray | None = None

    def dense(self) -> jnp.ndarray:
        return causal_mask(*self)


def attend_chunked(
    q_BxTxNxH: jnp.ndarray,
    k_BxSxKxH: jnp.ndarray,
    v_BxSxKxH: jnp.ndarray,
    rule: MaskRule,
    chunk: int,
) -> jnp.ndarray:
    """`attend(q, k, v, rule.dense(), "xla")`, `chunk` query rows at a time (any T: the last
    block is padded with queries that see nothing). Each block is rematerialised in the backward."""
    b, t, n, h = q_BxTxNxH.shape
    pad = -t % chunk
    blocks = (t + pad) // chunk
    q_pos_BxT, q_slot_T, q_seg_BxT = rule.q_pos_BxT, rule.q_slot_T, rule.q_seg_BxT
    if pad:
        q_BxTxNxH = jnp.pad(q_BxTxNxH, ((0, 0), (0, pad), (0, 0), (0, 0)))
        q_pos_BxT = jnp.pad(q_pos_BxT, ((0, 0), (0, pad)), constant_values=-1)
        q_slot_T = jnp.pad(q_slot_T, (0, pad))
        if q_seg_BxT is not None:
            q_seg_BxT = jnp.pad(q_seg_BxT, ((0, 0), (0, pad)))
    split_rows = lambda x_BxT: jnp.moveaxis(x_BxT.reshape(b, blocks, chunk, *x_BxT.shape[2:]), 1, 0)
    xs = (split_rows(q_BxTxNxH), split_rows(q_pos_BxT), q_slot_T.reshape(blocks, chunk),
          None if q_seg_BxT is None else split_rows(q_seg_BxT))

    @jax.checkpoint
    def one_block(args):
        q_BxCxNxH, q_pos_BxC, q_slot_C, q_seg_BxC = args
        mask_BxCxS = causal_mask(q_pos_BxC, rule.k_pos_BxS, q_slot_C, rule.k_slot_S, q_seg_BxC,
                                 rule.k_seg_BxS)
        return attend(q_BxCxNxH, k_BxSxKxH, v_BxSxKxH, mask_BxCxS, "xla")

    out_XxBxCxNxH = jax.lax.map(one_block, xs)
    return jnp.moveaxis(out_XxBxCxNxH, 0, 1).reshape(b, t + pad, n, h)[:, :t]


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
    # An additive bias, not `jnp.where(mask, scores, ...)`: the same values (|score| is far below the
    # spacing of float32 at 1e30), but the backward of an add needs neither operand, while a select
    # keeps its predicate broadcast to B x K x G x T x S for the backward (134 MiB of the blocked
    # update of 8 rows of 2,048 tokens, from XLA's buffer assignment).
    bias_Bx1x1xTxS = jnp.where(mask_BxTxS, 0.0, _MASKED_SCORE).astype(jnp.float32)[:, None, None]
    scores_BxKxGxTxS = scores_BxKxGxTxS + bias_Bx1x1xTxS
    probs_BxKxGxTxS = jax.nn.softmax(scores_BxKxGxTxS, axis=-1).astype(v_BxSxKxH.dtype)
    out_BxTxKxGxH = jnp.einsum(
        "bkgts,bskh->btkgh", probs_BxKxGxTxS, v_BxSxKxH, preferred_element_type=jnp.float32
    )
    return out_BxTxKxGxH.reshape(b, t, n, h)
