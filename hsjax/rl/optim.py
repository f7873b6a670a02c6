"""The optimizer of the policy update: global-norm clipping, then AdamW on a warm-up + cosine schedule.

Built from a config mapping (an `ml_collections.ConfigDict` or a dict) and/or keyword arguments;
an unknown key is an error rather than a silently ignored setting.
"""
from typing import Any, Callable, Mapping, NamedTuple, Optional

import jax
import optax

DEFAULTS = dict(
    learning_rate=1e-6,  # peak learning rate, reached at the end of the warm-up
    warmup_steps=10,  # linear warm-up from 0
    total_steps=1000,  # steps of the whole schedule (warm-up included)
    end_lr_ratio=0.0,  # learning rate at total_steps, as a fraction of the peak
    weight_decay=0.01,  # decoupled (AdamW); not applied to norms or biases (see decay_mask)
    b1=0.9,
    b2=0.999,
    eps=1e-8,
    max_grad_norm=1.0,  # global-norm clipping threshold; 0 or None disables clipping
)


class Optimizer(NamedTuple):
    """The optax transformation and its learning-rate schedule (for the `lr` metric)."""

    tx: optax.GradientTransformation
    lr_schedule: Callable[[Any], Any]


def lr_schedule(learning_rate: float, warmup_steps: int, total_steps: int,
                end_lr_ratio: float = 0.0) -> optax.Schedule:
    """0 -> learning_rate linearly over warmup_steps, then cosine to end_lr_ratio * learning_rate."""
    if not 0 <= warmup_steps < total_steps:
        raise ValueError(f"need 0 <= warmup_steps < total_steps; got warmup_steps={warmup_steps}, "
                         f"total_steps={total_steps}")
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0, peak_value=learning_rate, warmup_steps=warmup_steps,
        decay_steps=total_steps, end_value=learning_rate * end_lr_ratio)


def decay_mask(params):
    """True for weights that get weight decay: everything but norms and biases (by key name;
    a shape rule would not do, since stacked per-layer norm scales are matrices too)."""
    def decays(path, _):
        name = str(getattr(path[-1], "key", path[-1])) if path else ""
        return "norm" not in name and "bias" not in name
    return jax.tree_util.tree_map_with_path(decays, params)


def make_optimizer(config: Optional[Mapping[str, Any]] = None, **overrides) -> Optimizer:
    """Builds the optimizer from `config` (any mapping) updated by `overrides`; see DEFAULTS."""
    settings = dict(DEFAULTS)
    given = dict(config or {})
    given.update(overrides)
    unknown = sorted(set(given) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"unknown optimizer settings {unknown}; known: {sorted(DEFAULTS)}")
    settings.update(given)
    schedule = lr_schedule(settings["learning_rate"], settings["warmup_steps"],
                           settings["total_steps"], settings["end_lr_ratio"])
    parts = []
    if settings["max_grad_norm"]:
        parts.append(optax.clip_by_global_norm(settings["max_grad_norm"]))
    parts.append(optax.adamw(schedule, b1=settings["b1"], b2=settings["b2"], eps=settings["eps"],
                             weight_decay=settings["weight_decay"], mask=decay_mask))
    return Optimizer(tx=optax.chain(*parts), lr_schedule=schedule)
