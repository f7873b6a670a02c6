"""The GRPO update: one jit-compiled step from (train state, TrainBatch) to (train state, metrics).

Inside the step, in order: success and rescue masking per group, advantages by the configured
estimator (both on the whole batch, see `advantages.py`), the token weights of the loss and their
global denominators, then forward/backward over micro-batches (`lax.scan`), each micro-batch
contributing sum / global denominator so that the accumulated gradient equals the full-batch one,
and finally the optimizer update, kept only when loss, gradient and new params are all finite
(docs/training.md, "Non-finite updates"). The math of the loss lives in `losses.py`.
"""
import functools
from typing import Any, Callable, Dict, Optional, Tuple

import jax
import jax.numpy as jnp
import optax
from flax import struct

from hsjax.rl.advantages import get_advantage, group_sum, rescue_mask, safe_div, success
from hsjax.rl.batch import TrainBatch
from hsjax.rl.losses import LossConfig, aggregate, hidden_token_logp, policy_loss_terms, target_mask
from hsjax.models.model import forward_hidden
from hsjax.rl.optim import Optimizer


@struct.dataclass
class TrainState:
    """Everything an update changes; checkpointed as a whole."""

    step: jax.Array
    params: Any
    opt_state: Any
    rng: jax.Array


def init_train_state(params, optimizer: Optimizer, rng: jax.Array) -> TrainState:
    return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                      opt_state=optimizer.tx.init(params), rng=rng)


def group_terms(batch: TrainBatch, loss_cfg: LossConfig) -> Dict[str, Any]:
    """Per-row advantages, active slots, final token weights and group statistics of a batch."""
    success_B = success(batch.reward_B, batch.valid_B, loss_cfg.success_threshold)
    active_B, stats = rescue_mask(success_B, batch.valid_B, batch.is_rescue_B, batch.group_B,
                                  batch.num_groups)
    baseline_B = active_B
    if loss_cfg.rescue_baseline == "with_base":
        rescued_G = group_sum((active_B & batch.is_rescue_B).astype(jnp.int32), batch.group_B,
                              batch.num_groups) > 0
        failed_base_B = batch.valid_B & ~batch.is_rescue_B & rescued_G[batch.group_B]
        baseline_B = active_B | failed_base_B
    advantage_B = get_advantage(loss_cfg.advantage)(batch.reward_B, batch.group_B, baseline_B,
                                                    batch.num_groups)
    if loss_cfg.rescue_advantage == "sft":
        # SFT on the successful rescues of a rescued group, weight 1 each; the failed ones are not
        # in an SFT data set, so they leave the loss and its token denominator too.
        active_B = active_B & (~batch.is_rescue_B | success_B)
        advantage_B = jnp.where(batch.is_rescue_B, 1.0, advantage_B)
    advantage_B = jnp.where(active_B, advantage_B, 0.0)
    predicted_BxT = target_mask(batch.loss_mask_BxT, batch.segment_ids_BxT)
    mask_BxT = predicted_BxT & active_B[:, None]
    valid_f = jnp.sum(batch.valid_B.astype(jnp.float32))
    overlong_f = jnp.sum(batch.overlong_B.astype(jnp.float32))
    stats.update({
        "advantage/nonzero_frac": safe_div(
            jnp.sum(((advantage_B != 0) & batch.valid_B).astype(jnp.float32)), valid_f),
        "batch/active_frac": safe_div(jnp.sum(active_B.astype(jnp.float32)), valid_f),
        "batch/valid_frac": valid_f / batch.valid_B.shape[0],
        "batch/overlong_frac": safe_div(overlong_f, valid_f + overlong_f),
        "tokens/trained": jnp.sum(mask_BxT.astype(jnp.float32)),
    })
    # Every policy token of a valid row, trained or not: where the sampler-vs-trainer gap is read.
    sampled_BxT = predicted_BxT & batch.valid_B[:, None]
    return dict(advantage_B=advantage_B, active_B=active_B, mask_BxT=mask_BxT, sampled_BxT=sampled_BxT,
                stats=stats)


def _micro_loss(params, rows, *, cfg, loss_cfg: LossConfig, pg_denominator):
    """Loss of one micro-batch, normalised by the whole batch's denominator, and its terms."""
    x_BxTxD, _ = forward_hidden(cfg, params, rows["tokens_BxT"], rows["positions_BxT"],
                                segment_ids_BxT=rows["segment_ids_BxT"])
    # The head in blocks where the device's memory plan says B x T x V logits do not fit.
    logp_BxT, entropy_BxT = hidden_token_logp(cfg, params, x_BxTxD, rows["tokens_BxT"],
                                              loss_cfg.temperature)
    terms, extrema = policy_loss_terms(
        logp_BxT, rows["old_logp_BxT"], rows["advantage_B"], rows["mask_BxT"],
        rows["recontext_B"], loss_cfg, ref_logp_BxT=rows.get("ref_logp_BxT"),
        entropy_BxT=entropy_BxT, gap_mask_BxT=rows["sampled_BxT"])
    objective = terms["loss/pg"][0]
    if "loss/kl" in terms and loss_cfg.beta > 0:
        objective = objective + loss_cfg.beta * terms["loss/kl"][0]
    return safe_div(objective, pg_denominator), (terms, extrema)


def split_micro(x, num_micro_batches):
    """[B, ...] -> [M, B/M, ...], micro-batch i holding rows i, i + M, ... (strided, so a batch
    sharded over B keeps every micro-batch spread across the same devices)."""
    b = x.shape[0]
    return jnp.moveaxis(x.reshape(b // num_micro_batches, num_micro_batches, *x.shape[1:]), 1, 0)


def compute_grads(params, batch: TrainBatch, *, cfg, loss_cfg: LossConfig,
                  num_micro_batches: int = 1, micro_T: Optional[Tuple[int, ...]] = None,
                  frozen=None, materialize: Optional[Callable] = None):
    """Gradient of the batch loss w.r.t. params and the metrics of the batch (no optimizer).

    With `materialize`, `params` are the trainable leaves only (LoRA adapters) and the model runs
    on `materialize(frozen, params)` (`hsjax.models.lora.merge`): the gradient reaches `params`
    through it and `frozen` gets none.

    `micro_T` (static; from `batch.group_by_length`): per micro-batch, the length its rows are cut
    to, 0 to skip it (only empty slots). The micro-batches then run one after another, each at its
    own length, instead of in a `lax.scan` at the batch's length.
    """
    B = batch.tokens_BxT.shape[0]
    if B % num_micro_batches:
        raise ValueError(f"batch of {B} rows does not split into num_micro_batches="
                         f"{num_micro_batches}; pick a divisor of G * (n + R)")
    if micro_T is not None and (len(micro_T) != num_micro_batches or not any(micro_T)
                                or max(micro_T) > batch.tokens_BxT.shape[1]):
        raise ValueError(f"micro_T={micro_T} must give {num_micro_batches} lengths of at most "
                         f"T={batch.tokens_BxT.shape[1]}, not all 0")
    if loss_cfg.beta > 0 and batch.ref_logp_BxT is None:
        raise ValueError("loss_cfg.beta > 0 needs batch.ref_logp_BxT (reference-policy logp per "
                         "token); compute it in the loop or set beta=0")
    groups = group_terms(batch, loss_cfg)
    pg_denominator = aggregate(jnp.zeros(groups["mask_BxT"].shape), groups["mask_BxT"],
                               loss_cfg.aggregation)[1]
    rows = dict(tokens_BxT=batch.tokens_BxT, positions_BxT=batch.positions_BxT,
                segment_ids_BxT=batch.segment_ids_BxT, old_logp_BxT=batch.old_logp_BxT,
                advantage_B=groups["advantage_B"], mask_BxT=groups["mask_BxT"],
                sampled_BxT=groups["sampled_BxT"], recontext_B=batch.recontext_B)
    if batch.ref_logp_BxT is not None:
        rows["ref_logp_BxT"] = batch.ref_logp_BxT
    loss = functools.partial(_micro_loss, cfg=cfg, loss_cfg=loss_cfg, pg_denominator=pg_denominator)
    if materialize is not None:
        loss = lambda trainable, rows, loss=loss: loss(materialize(frozen, trainable), rows)  # noqa: E731
    grad_fn = jax.grad(loss, has_aux=True)

    if num_micro_batches == 1 and micro_T is None:
        grads, (terms, extrema) = grad_fn(params, rows)
    else:
        micro_rows = jax.tree.map(lambda x: split_micro(x, num_micro_batches), rows)
        first = jax.tree.map(lambda x: x[0], micro_rows)
        zeros = lambda tree: jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), tree)
        grads_shape, (terms_shape, extrema_shape) = jax.eval_shape(grad_fn, params, first)
        carry = (zeros(grads_shape), zeros(terms_shape),
                 {k: jnp.full((), -jnp.inf if k.endswith("max") else jnp.inf)
                  for k in extrema_shape})

        def body(carry, mb_rows):
            acc_grads, acc_terms, acc_ext = carry
            g, (t, e) = grad_fn(params, mb_rows)
            acc_grads = jax.tree.map(jnp.add, acc_grads, g)
            acc_terms = jax.tree.map(jnp.add, acc_terms, t)
            acc_ext = {k: (jnp.maximum if k.endswith("max") else jnp.minimum)(acc_ext[k], e[k])
                       for k in acc_ext}
            return (acc_grads, acc_terms, acc_ext), None

        if micro_T is None:
            carry, _ = jax.lax.scan(body, carry, micro_rows)
        else:
            for i, length in enumerate(micro_T):
                if length:  # cut to the micro-batch's own length: only padding is dropped
                    mb_rows = jax.tree.map(lambda x: x[i, :, :length] if x.ndim == 3 else x[i],
                                           micro_rows)
                    carry, _ = body(carry, mb_rows)
        grads, terms, extrema = carry

    metrics = dict(groups["stats"])
    for name, (total, denominator) in terms.items():
        metrics[name] = safe_div(total, denominator)
    for name, value in extrema.items():
        metrics[name] = jnp.where(jnp.isfinite(value), value, 0.0)
    metrics["loss/total"] = metrics["loss/pg"] + loss_cfg.beta * metrics.get("loss/kl", 0.0)
    return grads, metrics


def all_finite(tree) -> jax.Array:
    """True when no floating-point leaf of `tree` holds a NaN or an infinity. Leaf by leaf, not
    through a norm: the square of a huge but finite weight overflows a norm to inf."""
    flags = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)
             if jnp.issubdtype(jnp.asarray(x).dtype, jnp.inexact)]
    return jnp.all(jnp.stack(flags)) if flags else jnp.asarray(True)


def train_step(state: TrainState, batch: TrainBatch, frozen=None, *, cfg, loss_cfg: LossConfig,
               optimizer: Optimizer, num_micro_batches: int = 1,
               micro_T: Optional[Tuple[int, ...]] = None, materialize: Optional[Callable] = None):
    """One GRPO update; pure. Returns the new state and a dict of scalar metrics. With
    `materialize` (LoRA), `state.params` are the adapters and `frozen` the base (`compute_grads`).

    A non-finite update leaves params and optimizer state as they were (`step` and `rng` still
    advance, so the schedule follows the loop's steps) and sets `metrics["train/nonfinite"]` to 1.
    """
    grads, metrics = compute_grads(state.params, batch, cfg=cfg, loss_cfg=loss_cfg,
                                   num_micro_batches=num_micro_batches, micro_T=micro_T,
                                   frozen=frozen, materialize=materialize)
    updates, opt_state = optimizer.tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    rng, _ = jax.random.split(state.rng)
    metrics["grad_norm"] = optax.tree.norm(grads)
    # A non-finite loss or gradient (a NaN reward, an overflow) or non-finite new params (a
    # learning rate that blows the weights up while the loss stays 0) is never applied: the step
    # keeps the params and optimizer state it started with and says so in `train/nonfinite`; the
    # loop then stops or goes on (`loss.nonfinite`). Checked here, so no extra host sync.
    finite = (jnp.isfinite(metrics["loss/total"]) & jnp.isfinite(metrics["grad_norm"])
              & all_finite(params))
    params, opt_state = jax.tree.map(lambda new, old: jnp.where(finite, new, old),
                                     (params, opt_state), (state.params, state.opt_state))
    metrics["train/nonfinite"] = 1.0 - finite.astype(jnp.float32)
    metrics["lr"] = jnp.asarray(optimizer.lr_schedule(state.step), jnp.float32)
    new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state, rng=rng)
    return new_state, metrics


def jit_train_step(cfg, loss_cfg: LossConfig, optimizer: Optimizer, *, num_micro_batches: int = 1,
                   state_sharding: Optional[Any] = None, batch_sharding: Optional[Any] = None,
                   materialize: Optional[Callable] = None):
    """`train_step` jit-compiled with the state donated; `fn(state, batch, frozen=None, micro_T=None)
    -> (state, metrics)`, `micro_T` static (one compilation per distinct tuple). With `materialize`
    (LoRA) pass the base params as `frozen`: an argument, not a constant folded into the program.

    Under a mesh, pass the shardings of the state and of the batch (pytrees of `NamedSharding`
    matching them, e.g. from `hsjax.infra.sharding`); the new state keeps `state_sharding`.
    """
    step = functools.partial(train_step, cfg=cfg, loss_cfg=loss_cfg, optimizer=optimizer,
                             num_micro_batches=num_micro_batches, materialize=materialize)
    shardings = {}
    if state_sharding is not None or batch_sharding is not None:
        # the LoRA base (a third positional argument) keeps the sharding it was placed with
        ins = (state_sharding, batch_sharding) + ((None,) if materialize is not None else ())
        shardings = dict(in_shardings=ins, out_shardings=(state_sharding, None))
    return jax.jit(step, donate_argnums=0, static_argnames=("micro_T",), **shardings)
