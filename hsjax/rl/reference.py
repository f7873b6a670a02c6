"""The reference policy of the KL term (`loss.beta > 0`): its log-probability of every token of a
batch, which the update compares with the policy's (`losses.KL_ESTIMATORS`).

The reference is the parameters the run started from — the model the config names, loaded again
on resume, so it is never checkpointed — held as a copy beside the train state (one more copy of
the parameters in device memory; the update donates the state's buffers, so the loaded arrays
themselves cannot serve). Its log-probs are taken with the update's own forward and head
(`forward_hidden`, `hidden_token_logp`, the memory plan's blocks) at the loss's temperature, once
per step after the batch is packed and before the update, over the same micro-batches, so that the
pass needs no more memory than the update's forward.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from hsjax.models.model import forward_hidden
from hsjax.rl import grpo
from hsjax.rl.batch import TrainBatch
from hsjax.rl.losses import hidden_token_logp


def hold_reference(params):
    """A copy of `params` that no later update can donate or change (same shardings)."""
    return jax.tree.map(jnp.copy, params)


def reference_logp(ref_params, batch: TrainBatch, *, cfg, temperature: float,
                   num_micro_batches: int = 1) -> jax.Array:
    """log pi_ref(token t | tokens < t) for every position of the batch, aligned as the update's
    `logp_BxT` (column 0 and padding hold whatever the head gives; the loss masks them)."""
    def logp(rows):
        x_BxTxD, _ = forward_hidden(cfg, ref_params, rows["tokens_BxT"], rows["positions_BxT"],
                                    segment_ids_BxT=rows["segment_ids_BxT"])
        return hidden_token_logp(cfg, ref_params, x_BxTxD, rows["tokens_BxT"], temperature)[0]

    rows = dict(tokens_BxT=batch.tokens_BxT, positions_BxT=batch.positions_BxT,
                segment_ids_BxT=batch.segment_ids_BxT)
    if num_micro_batches == 1:
        return jax.lax.stop_gradient(logp(rows))
    B = batch.tokens_BxT.shape[0]
    # Micro-batch i holds rows i, i + M, ..., the update's own split.
    split = jax.tree.map(lambda x: grpo.split_micro(x, num_micro_batches), rows)
    logp_MxbxT = jax.lax.map(logp, split)
    return jax.lax.stop_gradient(jnp.moveaxis(logp_MxbxT, 0, 1).reshape(B, -1))


def jit_reference_logp(cfg, temperature: float, *, num_micro_batches: int = 1):
    """`reference_logp` jit-compiled: `fn(ref_params, batch) -> ref_logp_BxT`."""
    return jax.jit(functools.partial(reference_logp, cfg=cfg, temperature=temperature,
                                     num_micro_batches=num_micro_batches))


def filler(params, cfg, *, temperature: float, num_micro_batches: int = 1, copy: bool = True):
    """Holds a copy of `params` as the reference; returns `fn(batch) -> batch` with `ref_logp_BxT`
    filled in (jit-compiled; the batch placed as the update takes it). `copy=False` holds `params`
    themselves, for params no update donates or changes (the frozen base of a LoRA run: its
    reference costs no memory)."""
    ref_params = hold_reference(params) if copy else params
    logp = jit_reference_logp(cfg, temperature, num_micro_batches=num_micro_batches)
    return lambda batch: batch.replace(ref_logp_BxT=logp(ref_params, batch))
