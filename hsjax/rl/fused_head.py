"""The head, log-softmax and gather fused, a block of the vocabulary at a time.

`fused_next_token_logp(h_NxD, head_VxD, next_N, temperature, block)` is
`_next_token_logp(h @ head.T, next_N, temperature)` (losses.py) without ever holding N x V logits:
the forward runs over vocabulary blocks of `block` entries with an online log-sum-exp (the running
maximum m, the sum s of exp(logit - m), and for the entropy the sum of exp(logit - m) * logit,
rescaled whenever m grows), and keeps only the log-sum-exp per position for the backward. The
backward (`jax.custom_vjp`) goes over the same blocks: it recomputes a block's logits, its softmax
from the kept log-sum-exp, and the block's cotangent g * (onehot - softmax) / temperature, then
adds the block's share to the hidden states' gradient and writes the block's rows of the head's
gradient (the embedding table's, when tied). Memory: N x block float32 a pass, whatever V; the
matmuls stay N rows wide, which is what keeps an accelerator busy (blocks of positions make them
narrow). Liger's fused linear cross-entropy and Apple's Cut Cross-Entropy are the same idea.

The entropy is under stop_gradient, as in `_next_token_logp`: its cotangent is dropped.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


def fused_next_token_logp(h_NxD: jax.Array, head_VxD: jax.Array, next_N: jax.Array,
                          temperature: float, block: int):
    """(log probability of `next_N`, entropy) at each of N positions, from the normed hidden
    states `h_NxD` and the head `head_VxD` (both in the compute dtype; logits in float32),
    `block` vocabulary entries at a time (the last block is padded and its padding masked)."""
    return _fused(h_NxD, head_VxD, next_N, float(temperature), int(block))


def _blocks(head_VxD, block):
    """head_VxD padded with zero rows to whole blocks: (head_XxCxD, first entry of each block)."""
    vocab, width = head_VxD.shape
    count = -(-vocab // block)
    padded = jnp.pad(head_VxD, ((0, count * block - vocab), (0, 0)))
    return padded.reshape(count, block, width), jnp.arange(count, dtype=jnp.int32) * block


def _block_logits(h_NxD, head_CxD, start, vocab, temperature):
    """float32 logits / temperature of one block, -inf on its padding; and its entries' ids."""
    logits_NxC = jnp.einsum("nd,cd->nc", h_NxD, head_CxD, preferred_element_type=jnp.float32)
    if temperature != 1.0:
        logits_NxC = logits_NxC / temperature
    ids_C = start + jnp.arange(head_CxD.shape[0], dtype=jnp.int32)
    return jnp.where(ids_C < vocab, logits_NxC, -jnp.inf), ids_C


def _forward(h_NxD, head_VxD, next_N, temperature, block):
    vocab = head_VxD.shape[0]
    n = h_NxD.shape[0]

    def one_block(carry, xs):
        max_N, sum_N, weighted_N, target_N = carry
        head_CxD, start = xs
        logits_NxC, ids_C = _block_logits(h_NxD, head_CxD, start, vocab, temperature)
        new_max_N = jnp.maximum(max_N, jnp.max(logits_NxC, axis=-1))
        rescale_N = jnp.exp(max_N - new_max_N)  # 0 for the first block (max -inf)
        exp_NxC = jnp.exp(logits_NxC - new_max_N[:, None])  # 0 on the padding
        sum_N = sum_N * rescale_N + jnp.sum(exp_NxC, axis=-1)
        # exp * logit is 0 * -inf = NaN on the padding: select instead of multiplying there.
        weighted_N = weighted_N * rescale_N + jnp.sum(
            jnp.where(ids_C < vocab, exp_NxC * logits_NxC, 0.0), axis=-1)
        in_block_N = (next_N >= start) & (next_N < start + head_CxD.shape[0])
        local_N = jnp.clip(next_N - start, 0, head_CxD.shape[0] - 1)
        picked_N = jnp.take_along_axis(logits_NxC, local_N[:, None], axis=-1)[:, 0]
        target_N = target_N + jnp.where(in_block_N, picked_N, 0.0)
        return (new_max_N, sum_N, weighted_N, target_N), None

    zeros = jnp.zeros((n,), jnp.float32)
    init = (jnp.full((n,), -jnp.inf, jnp.float32), zeros, zeros, zeros)
    (max_N, sum_N, weighted_N, target_N), _ = jax.lax.scan(one_block, init, _blocks(head_VxD, block))
    lse_N = max_N + jnp.log(sum_N)
    # Entropy = lse - E_p[logit], with E_p[logit] = weighted / sum (both scaled by exp(-max)).
    entropy_N = lse_N - weighted_N / sum_N
    return (target_N - lse_N, entropy_N), lse_N


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _fused(h_NxD, head_VxD, next_N, temperature, block):
    return _forward(h_NxD, head_VxD, next_N, temperature, block)[0]


def _fused_fwd(h_NxD, head_VxD, next_N, temperature, block):
    outputs, lse_N = _forward(h_NxD, head_VxD, next_N, temperature, block)
    return outputs, (h_NxD, head_VxD, next_N, lse_N)


def _fused_bwd(temperature, block, residuals, cotangents):
    h_NxD, head_VxD, next_N, lse_N = residuals
    g_N = cotangents[0].astype(jnp.float32)  # the entropy's cotangent: stop_gradient, dropped
    vocab, width = head_VxD.shape
    dtype = h_NxD.dtype

    def one_block(dh_NxD, xs):
        head_CxD, start = xs
        logits_NxC, ids_C = _block_logits(h_NxD, head_CxD, start, vocab, temperature)
        probs_NxC = jnp.exp(logits_NxC - lse_N[:, None])
        onehot_NxC = (ids_C[None, :] == next_N[:, None]).astype(jnp.float32)
        # d logp / d logit = onehot - softmax, and logit = (h . head) / temperature.
        dlogits_NxC = (g_N[:, None] * (onehot_NxC - probs_NxC) / temperature).astype(dtype)
        dh_NxD = dh_NxD + jnp.einsum("nc,cd->nd", dlogits_NxC, head_CxD,
                                     preferred_element_type=jnp.float32)
        dhead_CxD = jnp.einsum("nc,nd->cd", dlogits_NxC, h_NxD, preferred_element_type=jnp.float32)
        return dh_NxD, dhead_CxD

    dh_NxD, dhead_XxCxD = jax.lax.scan(one_block, jnp.zeros(h_NxD.shape, jnp.float32),
                                       _blocks(head_VxD, block))
    dhead_VxD = dhead_XxCxD.reshape(-1, width)[:vocab]
    return dh_NxD.astype(dtype), dhead_VxD.astype(head_VxD.dtype), None


_fused.defvjp(_fused_fwd, _fused_bwd)
