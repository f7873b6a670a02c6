"""Supervised fine-tuning math: token streams packed around a shared prefix, the masked
next-token loss, length-bucketed batches and the jitted step.

Streams are `Segment`s laid out as the rollout engine lays out a token policy's episodes (loss
mask 1 on reply tokens). Every stream of an SFT set starts with the same instruction, so the step
runs that shared prefix once and the per-example suffixes on top of its KV cache: the same loss and
gradient as running every full row, at a fraction of the cost (`shared_prefix_len`, `sft_loss`).
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax

from hsjax.models import forward, init_cache


@dataclasses.dataclass(frozen=True)
class SFTData:
    """Every stream cut after a shared prefix: `prefix_P` (common to all rows) and right-padded
    suffixes `tokens_NxU`, `mask_NxU` (loss mask), `length_N` (valid suffix length)."""

    prefix_P: np.ndarray
    tokens_NxU: np.ndarray
    mask_NxU: np.ndarray
    length_N: np.ndarray

    @property
    def num_policy_tokens(self) -> int:
        return int(self.mask_NxU.sum())


def shared_prefix_len(segments: list) -> int:
    """Tokens every stream starts with, stopping one token before the first trained token of any
    stream: the first suffix token is then never trained, so the suffix logits predict every
    trained token and the prefix logits are not needed."""
    first = segments[0].tokens
    common = len(first)
    for seg in segments[1:]:
        n = min(common, len(seg.tokens))
        diff = np.nonzero(seg.tokens[:n] != first[:n])[0]
        common = int(diff[0]) if len(diff) else n
    first_trained = min(int(np.argmax(seg.loss_mask > 0)) for seg in segments)
    return max(0, min(common, first_trained) - 1)


def pack(segments: list, pad_id: int, multiple: int = 32, max_len: int = 0) -> SFTData:
    if not segments:
        raise ValueError("no SFT streams: the regime selected no task family present in the data")
    too_long = [len(s.tokens) for s in segments if max_len and len(s.tokens) > max_len]
    if too_long:
        raise ValueError(f"{len(too_long)} streams exceed sft.max_len={max_len} tokens (longest "
                         f"{max(too_long)}); raise sft.max_len")
    p = shared_prefix_len(segments)
    u = max(len(s.tokens) for s in segments) - p
    u = -(-u // multiple) * multiple
    tokens = np.full((len(segments), u), pad_id, np.int32)
    mask = np.zeros((len(segments), u), np.int32)
    length = np.zeros((len(segments),), np.int32)
    for i, seg in enumerate(segments):
        n = len(seg.tokens) - p
        tokens[i, :n], mask[i, :n], length[i] = seg.tokens[p:], seg.loss_mask[p:], n
    return SFTData(np.asarray(segments[0].tokens[:p], np.int32), tokens, mask, length)


def sft_loss(params, prefix_P, tokens_BxU, mask_BxU, length_B, *, cfg):
    """Masked next-token cross-entropy (sum, count) of rows `prefix_P + tokens_BxU[b, :length_B[b]]`.

    The prefix runs once (batch 1) into a KV cache broadcast to the batch; gradients flow through it.
    """
    P, (B, U) = prefix_P.shape[0], tokens_BxU.shape
    cache = init_cache(cfg, 1, P + U)
    if P:
        _, cache = forward(cfg, params, prefix_P[None], jnp.arange(P, dtype=jnp.int32)[None], cache=cache)
    cache = jax.tree.map(lambda x: jnp.broadcast_to(x, x.shape[:1] + (B,) + x.shape[2:]) if x.ndim == 5
                         else (jnp.broadcast_to(x, (B,) + x.shape[1:]) if x.ndim == 2 else x), cache)
    steps_U = jnp.arange(U, dtype=jnp.int32)
    positions_BxU = jnp.where(steps_U[None] < length_B[:, None], P + steps_U[None], -1)
    logits_BxUxV, _ = forward(cfg, params, tokens_BxU, positions_BxU, cache=cache)
    logp_BxUxV = jax.nn.log_softmax(logits_BxUxV[:, :-1].astype(jnp.float32), axis=-1)
    target_logp_BxU = jnp.take_along_axis(logp_BxUxV, tokens_BxU[:, 1:, None], axis=-1)[..., 0]
    trained_BxU = mask_BxU[:, 1:].astype(jnp.float32)
    return -jnp.sum(target_logp_BxU * trained_BxU), jnp.sum(trained_BxU)


class BucketedBatches:
    """Batches of `batch_size` rows drawn from one length bucket at a time, so a batch of short
    streams is not padded to the longest stream of the data. Buckets: suffix lengths up to the
    `split_quantile` quantile and the rest, each rounded up to `multiple` (two compiled shapes).
    Each bucket is walked in a fresh permutation per pass; the bucket of each step is drawn in
    proportion to its size. Deterministic given `seed`."""

    def __init__(self, data: SFTData, batch_size: int, seed: int, split_quantile: float = 0.8,
                 multiple: int = 32):
        lengths = data.length_N
        cut = int(-(-np.quantile(lengths, split_quantile) // multiple) * multiple)
        self.data, self.batch_size = data, batch_size
        self.buckets = [(cut, np.nonzero(lengths <= cut)[0]),
                        (data.tokens_NxU.shape[1], np.nonzero(lengths > cut)[0])]
        self.buckets = [(u, idx) for u, idx in self.buckets if len(idx)]
        self.rng = np.random.default_rng(seed)
        self._orders = [self.rng.permutation(idx) for _, idx in self.buckets]
        self._cursors = [0] * len(self.buckets)

    def skip(self, num_batches: int) -> None:
        """Advances the stream as `num_batches` calls of `next` would, without gathering rows: a
        resumed run draws exactly the batches the uninterrupted run would have drawn."""
        for _ in range(num_batches):
            self._next_rows()

    def next(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        u, rows = self._next_rows()
        d = self.data
        return d.tokens_NxU[rows, :u], d.mask_NxU[rows, :u], d.length_N[rows]

    def _next_rows(self) -> tuple[int, np.ndarray]:
        sizes = np.array([len(idx) for _, idx in self.buckets], np.float64)
        b = int(self.rng.choice(len(self.buckets), p=sizes / sizes.sum()))
        u, idx = self.buckets[b]
        if self._cursors[b] + self.batch_size > len(self._orders[b]):
            self._orders[b], self._cursors[b] = self.rng.permutation(idx), 0
        rows = self._orders[b][self._cursors[b]:self._cursors[b] + self.batch_size]
        if len(rows) < self.batch_size:  # a bucket smaller than a batch: repeat rows
            rows = self.rng.choice(idx, self.batch_size)
        self._cursors[b] += self.batch_size
        return u, rows


def make_train_step(cfg, tx):
    def step(params, opt_state, prefix_P, tokens_BxU, mask_BxU, length_B):
        def loss_fn(p):
            total, count = sft_loss(p, prefix_P, tokens_BxU, mask_BxU, length_B, cfg=cfg)
            return total / jnp.maximum(count, 1.0), count

        (loss, count), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, {"loss/sft": loss, "tokens/trained": count,
                                                                 "grad_norm": optax.tree.norm(grads)}

    return jax.jit(step, donate_argnums=(0, 1))
