"""Token log-probabilities and the clipped policy loss of the GRPO update, as pure functions.

Alignment, decided once for the whole trainer: every `_BxT` array is aligned with `tokens_BxT`.
`loss_mask_BxT[b, t]` says whether token t is trained, `old_logp_BxT[b, t]` is the sampler's log
probability of token t, and `token_logp` returns the current policy's log probability of token t,
read from the logits at t - 1. That shift happens here and nowhere else; position 0 of a row and the
first token of each packed segment have no prediction and are never trained (`target_mask`).

Losses come back as (sum, denominator) pairs: the loss of a batch split into micro-batches is the
sum of the micro-batch sums over the sum of their denominators, exactly the full-batch value.
"""
import dataclasses
from typing import Callable, Dict, Optional, Tuple

import jax
import jax.numpy as jnp

from hsjax.models.memory_plan import MemoryPlan
from hsjax.models.model import device_plan, head_input, head_weight, logits
from hsjax.rl.advantages import get_advantage
from hsjax.rl.fused_head import fused_next_token_logp
from hsjax.rl.logprob_gap import sampler_gap_terms

AGGREGATIONS = ("token_mean", "sequence_mean")
RESCUE_BASELINES = ("rescue", "with_base")
IS_WEIGHTS = ("capped", "one")
RESCUE_ADVANTAGES = ("estimator", "sft")
# Per-token estimates of KL(pi || ref) from d = ref_logp - logp of a token sampled from pi
# (Schulman's k1, k2, k3; LossConfig.kl_estimator).
KL_ESTIMATORS = {
    "k1": lambda d: -d,
    "k2": lambda d: 0.5 * jnp.square(d),
    "k3": lambda d: jnp.exp(d) - d - 1.0,
}
SumDen = Tuple[jax.Array, jax.Array]


@dataclasses.dataclass(frozen=True)
class LossConfig:
    """Options of the GRPO loss (frozen, hashable: it is static under jit).

    advantage:          registered estimator name (`grpo`, `drgrpo`, `rloo`; see advantages.py)
    success_threshold:  reward at or above which a trajectory counts as a success
    eps_low, eps_high:  asymmetric PPO clip range [1 - eps_low, 1 + eps_high] (clip-higher)
    aggregation:        `token_mean` (every trained token weighs the same) or `sequence_mean`
                        (mean over each row's tokens, then over rows)
    beta:               weight of the KL estimate to `ref_logp_BxT` (0 disables it)
    kl_estimator:       the per-token estimate of KL(pi || ref) from d = ref_logp - logp on the
                        sampled tokens: `k3` = exp(d) - d - 1 (GRPO's; >= 0, unbiased), `k1` = -d
                        (unbiased, high variance, can be negative), `k2` = d^2 / 2 (biased, >= 0,
                        its gradient that of the reverse KL)
    temperature:        the sampler's temperature; logp is taken of softmax(logits / temperature)
    rescue_baseline:    statistics of a rescued group's advantages: `rescue` (over its active rescue
                        slots only: a rescue whose every slot succeeded gives no signal) or
                        `with_base` (over the rescue slots and the group's failed base slots, which
                        stay masked from the loss: each rescue success is credited against the
                        failures it replaced)
    is_cap:             cap c of the truncated importance weight on re-contextualised rescue rows
                        (`rescue_context='base'`, rows with `recontext_B`): w = min(pi_old(base) /
                        mu(sibling), c)
    is_weight:          `capped` (the truncated weight above) or `one`: w = 1, the re-contextualised
                        rows train as if the base harness had produced them (the floor of the
                        correction, as a positive control for transfer uses; docs/training.md)
    rescue_advantage:   the advantage of a rescued group's rescue slots: `estimator` (the configured
                        estimator over them, like any group) or `sft`: 1 for a successful rescue, and
                        a failed one leaves the loss -- rejection-sampled SFT on the successful hinted rollouts
                        (with `rescue_context='base'` and `is_weight='one'`, the gradient of their
                        token-mean log-likelihood in the base context), the distillation baseline
                        that base-context Harness-S arms are compared with (docs/results.md)
    """

    advantage: str = "grpo"
    success_threshold: float = 1.0
    eps_low: float = 0.2
    eps_high: float = 0.28
    aggregation: str = "token_mean"
    beta: float = 0.0
    temperature: float = 1.0
    is_cap: float = 2.0
    is_weight: str = "capped"
    rescue_baseline: str = "rescue"
    kl_estimator: str = "k3"
    rescue_advantage: str = "estimator"

    def __post_init__(self):
        get_advantage(self.advantage)  # Raises with the list of known estimators.
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(f"kl_estimator {self.kl_estimator!r} is not one of {tuple(KL_ESTIMATORS)}")
        if self.rescue_baseline not in RESCUE_BASELINES:
            raise ValueError(f"rescue_baseline {self.rescue_baseline!r} is not one of {RESCUE_BASELINES}")
        if self.rescue_advantage not in RESCUE_ADVANTAGES:
            raise ValueError(f"rescue_advantage {self.rescue_advantage!r} is not one of {RESCUE_ADVANTAGES}")
        if self.is_weight not in IS_WEIGHTS:
            raise ValueError(f"is_weight {self.is_weight!r} is not one of {IS_WEIGHTS}")
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(f"loss aggregation {self.aggregation!r} is not one of {AGGREGATIONS}")
        if not (0 <= self.eps_low < 1 and self.eps_high >= 0):
            raise ValueError(f"clip range needs 0 <= eps_low < 1 and eps_high >= 0, "
                             f"got eps_low={self.eps_low}, eps_high={self.eps_high}")
        if self.temperature <= 0 or self.is_cap <= 0 or self.beta < 0:
            raise ValueError("temperature and is_cap must be > 0 and beta >= 0, got "
                             f"{self.temperature}, {self.is_cap}, {self.beta}")


def token_logp(
    logits_BxTxV: jax.Array, tokens_BxT: jax.Array, temperature: float = 1.0
) -> Tuple[jax.Array, jax.Array]:
    """Log probability and entropy of each token under the logits at the previous position.

    Returns `(logp_BxT, entropy_BxT)` aligned with `tokens_BxT`; column 0 is 0 (no prediction).
    Entropy is the full-distribution entropy of the prediction of token t, under stop_gradient.
    """
    next_BxT = jnp.pad(tokens_BxT[:, 1:], ((0, 0), (0, 1)))
    return _shift(*_next_token_logp(logits_BxTxV, next_BxT, temperature))


def hidden_token_logp(
    cfg, params, x_BxTxD: jax.Array, tokens_BxT: jax.Array, temperature: float = 1.0,
    plan: Optional[MemoryPlan] = None,
) -> Tuple[jax.Array, jax.Array]:
    """`token_logp` of the logits of the last hidden states `x_BxTxD` (`forward_hidden`), with
    B x T x V logits held only where the device's memory plan (default: `cfg`'s) lets them be.

    All the logits fit the plan's `block_bytes`: the plain head and `token_logp`. Else, by the
    plan's `head_blocking`: `vocab` (the default) runs the fused head over vocabulary blocks
    (`token_logp_fused`: matmuls of every position); `positions` runs `token_logp_chunked` (the
    plain head a block of positions at a time). docs/performance.md, "Memory plan per device",
    has the measurements behind the default.
    """
    plan = plan or device_plan(cfg)
    b, t, _ = x_BxTxD.shape
    head = head_weight(cfg, params)
    if plan.head_blocking == "vocab":
        block = plan.head_vocab(b * t, cfg.vocab_size)
        if block:
            return token_logp_fused(cfg, params, x_BxTxD, tokens_BxT, temperature, block)
    logits_fn = lambda x_BxCxD: logits(cfg, x_BxCxD, params["final_norm"], head)  # noqa: E731
    return token_logp_chunked(x_BxTxD, tokens_BxT, logits_fn, temperature,
                              plan.head_positions(b, t, cfg.vocab_size))


def token_logp_fused(cfg, params, x_BxTxD: jax.Array, tokens_BxT: jax.Array, temperature: float,
                     block: int) -> Tuple[jax.Array, jax.Array]:
    """`token_logp` of the head's logits, the head fused with the log-softmax and run `block`
    vocabulary entries at a time (`fused_head.py`): no pass holds more than B x T x block logits."""
    b, t, d = x_BxTxD.shape
    h_BxTxD = head_input(cfg, x_BxTxD, params["final_norm"])
    head = head_weight(cfg, params)
    head_VxD = (head if cfg.tie_embeddings else head.T).astype(h_BxTxD.dtype)
    next_BxT = jnp.pad(tokens_BxT[:, 1:], ((0, 0), (0, 1)))
    logp_N, entropy_N = fused_next_token_logp(h_BxTxD.reshape(b * t, d), head_VxD,
                                              next_BxT.reshape(b * t), temperature, block)
    return _shift(logp_N.reshape(b, t), entropy_N.reshape(b, t))


def token_logp_chunked(
    x_BxTxD: jax.Array,
    tokens_BxT: jax.Array,
    logits_fn: Callable[[jax.Array], jax.Array],
    temperature: float = 1.0,
    chunk: int = 0,
) -> Tuple[jax.Array, jax.Array]:
    """`token_logp(logits_fn(x_BxTxD), tokens_BxT, temperature)`, `chunk` positions at a time.

    `logits_fn` maps hidden states BxCxD to logits BxCxV (e.g. `hsjax.models.model.logits` with
    the final norm and head bound). Each block's logits are rematerialised in the backward, so
    neither pass holds more than B x chunk x V of them. `chunk=0` (or >= T): every position in one
    block, exactly `token_logp` (`MemoryPlan.head_positions` picks it).
    """
    b, t, _ = x_BxTxD.shape
    chunk = chunk or t
    next_BxT = jnp.pad(tokens_BxT[:, 1:], ((0, 0), (0, 1)))
    if chunk >= t:
        return _shift(*_next_token_logp(logits_fn(x_BxTxD), next_BxT, temperature))
    pad = -t % chunk
    blocks = (t + pad) // chunk
    split = lambda x: jnp.moveaxis(  # noqa: E731
        jnp.pad(x, ((0, 0), (0, pad)) + ((0, 0),) * (x.ndim - 2)).reshape(b, blocks, chunk, *x.shape[2:]),
        1, 0)

    @jax.checkpoint
    def one_block(args):
        x_BxCxD, next_BxC = args
        return _next_token_logp(logits_fn(x_BxCxD), next_BxC, temperature)

    logp_XxBxC, entropy_XxBxC = jax.lax.map(one_block, (split(x_BxTxD), split(next_BxT)))
    join = lambda y_XxBxC: jnp.moveaxis(y_XxBxC, 0, 1).reshape(b, t + pad)[:, :t]  # noqa: E731
    return _shift(join(logp_XxBxC), join(entropy_XxBxC))


def _next_token_logp(logits_BxTxV, next_BxT, temperature):
    """Log probability of `next_BxT` and entropy (under stop_gradient) at each position."""
    logits_BxTxV = logits_BxTxV.astype(jnp.float32)
    if temperature != 1.0:
        logits_BxTxV = logits_BxTxV / temperature
    lse_BxT = jax.nn.logsumexp(logits_BxTxV, axis=-1)
    target_BxT = jnp.take_along_axis(logits_BxTxV, next_BxT[..., None], axis=-1)[..., 0]
    logits_sg_BxTxV, lse_sg_BxT = jax.lax.stop_gradient((logits_BxTxV, lse_BxT))
    probs_BxTxV = jnp.exp(logits_sg_BxTxV - lse_sg_BxT[..., None])
    entropy_BxT = lse_sg_BxT - jnp.sum(probs_BxTxV * logits_sg_BxTxV, axis=-1)
    return target_BxT - lse_BxT, entropy_BxT


def _shift(logp_BxT, entropy_BxT):
    """Results at t - 1 (the prediction of token t) moved to t; column 0 gets 0."""
    shift = lambda x_BxT: jnp.pad(x_BxT[:, :-1], ((0, 0), (1, 0)))  # noqa: E731
    return shift(logp_BxT), shift(entropy_BxT)


def target_mask(loss_mask_BxT: jax.Array, segment_ids_BxT: jax.Array) -> jax.Array:
    """Tokens that can be trained: loss mask set, and predicted from a token of the same segment."""
    same_segment_BxT = segment_ids_BxT[:, 1:] == segment_ids_BxT[:, :-1]
    predicted_BxT = jnp.pad(same_segment_BxT & (segment_ids_BxT[:, 1:] > 0), ((0, 0), (1, 0)))
    return loss_mask_BxT.astype(bool) & predicted_BxT


def aggregate(x_BxT: jax.Array, mask_BxT: jax.Array, mode: str) -> SumDen:
    """(sum, denominator) of `x` over the masked tokens, for `token_mean` or `sequence_mean`."""
    mask_BxT = mask_BxT.astype(jnp.float32)
    total_BxT = jnp.where(mask_BxT > 0, x_BxT, 0.0) * mask_BxT
    if mode == "token_mean":
        return jnp.sum(total_BxT), jnp.sum(mask_BxT)
    if mode == "sequence_mean":
        tokens_B = jnp.sum(mask_BxT, axis=-1)
        row_mean_B = jnp.sum(total_BxT, axis=-1) / jnp.maximum(tokens_B, 1.0)
        return jnp.sum(row_mean_B), jnp.sum((tokens_B > 0).astype(jnp.float32))
    raise ValueError(f"loss aggregation {mode!r} is not one of {AGGREGATIONS}")


def policy_loss_terms(
    logp_BxT: jax.Array,
    old_logp_BxT: jax.Array,
    advantage_B: jax.Array,
    mask_BxT: jax.Array,
    recontext_B: jax.Array,
    cfg: LossConfig,
    ref_logp_BxT: Optional[jax.Array] = None,
    entropy_BxT: Optional[jax.Array] = None,
    gap_mask_BxT: Optional[jax.Array] = None,
) -> Tuple[Dict[str, SumDen], Dict[str, jax.Array]]:
    """Clipped policy-gradient loss, KL and diagnostics as (sum, denominator) pairs.

    `mask_BxT` is the final token weight (loss mask, target mask and active slots already applied).
    Ordinary rows: ratio = exp(logp - old_logp), loss = max(-A ratio, -A clip(ratio)) per token.
    Rows with `recontext_B` (rescue actions re-rendered into the base harness context; their
    `old_logp` is the sampler's logp in the sibling context where they were generated): the PPO
    anchor is the current policy in the base context, stop_gradient(logp) -- exact for the one
    update per rollout batch that hsjax does -- and the loss is multiplied by the truncated
    importance weight w = min(exp(stop_gradient(logp) - old_logp), is_cap). docs/training.md derives it.

    Returns `(terms, extrema)`: `terms` maps `loss/pg`, `loss/kl` (only with a reference),
    `entropy`, `pg_clipfrac`, `ratio/mean`, `is_weight/mean` to (sum, denominator); `loss/pg` and
    `loss/kl` use `cfg.aggregation`, the diagnostics are token means. `extrema` holds `ratio/max`
    and `ratio/min` over the masked tokens. The sampler-vs-trainer gap (`logprob_gap/*`) is read
    over `gap_mask_BxT` (the update passes every policy token of a valid row, trained or not, so a
    step whose groups all failed still reports it), else over `mask_BxT`.
    """
    mask_BxT = mask_BxT.astype(bool)
    recontext_BxT = recontext_B.astype(bool)[:, None] & mask_BxT
    anchor_BxT = jnp.where(recontext_BxT, jax.lax.stop_gradient(logp_BxT), old_logp_BxT)
    # Masked tokens get log-ratio 0 before exp, so no inf/NaN can reach the gradient from them.
    ratio_BxT = jnp.exp(jnp.where(mask_BxT, logp_BxT - anchor_BxT, 0.0))
    behaviour_gap_BxT = jnp.where(recontext_BxT, jax.lax.stop_gradient(logp_BxT) - old_logp_BxT, 0.0)
    capped_BxT = jnp.minimum(jnp.exp(behaviour_gap_BxT), cfg.is_cap) if cfg.is_weight == "capped" else 1.0
    weight_BxT = jnp.where(recontext_BxT, capped_BxT, 1.0)

    adv_Bx1 = advantage_B.astype(jnp.float32)[:, None]
    clipped_ratio_BxT = jnp.clip(ratio_BxT, 1.0 - cfg.eps_low, 1.0 + cfg.eps_high)
    unclipped_BxT = -adv_Bx1 * ratio_BxT
    clipped_BxT = -adv_Bx1 * clipped_ratio_BxT
    pg_BxT = weight_BxT * jnp.maximum(unclipped_BxT, clipped_BxT)

    token_mean = lambda x_BxT, m_BxT=mask_BxT: aggregate(x_BxT, m_BxT, "token_mean")
    terms = {
        "loss/pg": aggregate(pg_BxT, mask_BxT, cfg.aggregation),
        "pg_clipfrac": token_mean((clipped_BxT > unclipped_BxT).astype(jnp.float32)),
        "ratio/mean": token_mean(jax.lax.stop_gradient(ratio_BxT)),
        "is_weight/mean": token_mean(weight_BxT, recontext_BxT),
    }
    if ref_logp_BxT is not None:
        # d = ref - logp on the sampled tokens; masked tokens get 0 (every estimator is 0 there).
        diff_BxT = jnp.where(mask_BxT, ref_logp_BxT - logp_BxT, 0.0)
        terms["loss/kl"] = aggregate(KL_ESTIMATORS[cfg.kl_estimator](diff_BxT), mask_BxT, cfg.aggregation)
        terms["kl/log_ratio"] = token_mean(jax.lax.stop_gradient(-diff_BxT))  # log pi / ref, k1's mean
    if entropy_BxT is not None:
        terms["entropy"] = token_mean(entropy_BxT)
    ratio_sg_BxT = jax.lax.stop_gradient(ratio_BxT)
    extrema = {
        "ratio/max": jnp.max(jnp.where(mask_BxT, ratio_sg_BxT, -jnp.inf)),
        "ratio/min": jnp.min(jnp.where(mask_BxT, ratio_sg_BxT, jnp.inf)),
    }
    # How far the sampler's logprobs are from this recomputation (a rollout backend's error).
    gap_mask_BxT = mask_BxT if gap_mask_BxT is None else gap_mask_BxT
    gap_terms, gap_extrema = sampler_gap_terms(logp_BxT, old_logp_BxT, gap_mask_BxT, recontext_B)
    terms.update(gap_terms)
    extrema.update(gap_extrema)
    return terms, extrema
