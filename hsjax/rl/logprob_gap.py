"""How far the sampler's logprobs are from the trainer's: the metric that tells a rollout backend
(vLLM, another dtype, another kernel) apart from the model it is meant to sample.

hsjax makes one update per rollout batch and computes every micro-batch's gradient at the same
params, so on ordinary rows logp (the trainer's recomputation) - old_logp (the sampler's, carried
by the batch) is exactly the sampler-vs-trainer gap, with no policy change mixed in. Rows that
were re-contextualised (rescue actions re-rendered in the base context) are left out: their
old_logp belongs to another context.

Terms are (sum, denominator) token means, as `hsjax.rl.losses.policy_loss_terms` returns them, so
micro-batching stays exact:
- `logprob_gap/abs_mean`: mean |logp - old_logp|;
- `logprob_gap/mean`: mean (logp - old_logp) (its sign says which side is more confident);
- `logprob_gap/kl`: the k3 estimate of KL(sampler || trainer) from the sampler's own tokens,
  exp(d) - d - 1 with d = logp - old_logp (>= 0, unbiased).
`logprob_gap/abs_max` (its name ends in "max", so `hsjax.rl.grpo` combines micro-batches with
maximum) is the largest |logp - old_logp| over the counted tokens.
"""
from __future__ import annotations

from typing import Dict, Tuple

import jax
import jax.numpy as jnp

SumDen = Tuple[jax.Array, jax.Array]


def sampler_gap_terms(logp_BxT: jax.Array, old_logp_BxT: jax.Array, mask_BxT: jax.Array,
                      recontext_B: jax.Array) -> Tuple[Dict[str, SumDen], Dict[str, jax.Array]]:
    """(terms, extrema) of the sampler-vs-trainer logprob gap; gradients never flow through it."""
    counted_BxT = mask_BxT.astype(bool) & ~recontext_B.astype(bool)[:, None]
    d_BxT = jnp.where(counted_BxT, jax.lax.stop_gradient(logp_BxT) - old_logp_BxT, 0.0)
    w_BxT = counted_BxT.astype(jnp.float32)
    n = jnp.sum(w_BxT)
    terms = {
        "logprob_gap/abs_mean": (jnp.sum(jnp.abs(d_BxT) * w_BxT), n),
        "logprob_gap/mean": (jnp.sum(d_BxT * w_BxT), n),
        "logprob_gap/kl": (jnp.sum((jnp.exp(d_BxT) - d_BxT - 1.0) * w_BxT), n),
    }
    extrema = {"logprob_gap/abs_max": jnp.max(jnp.where(counted_BxT, jnp.abs(d_BxT), 0.0))}
    return terms, extrema
