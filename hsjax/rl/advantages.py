"""Group math of the GRPO update: success, group-rescue masking and advantage estimators.

Every function here is pure and jit-friendly. Groups are explicit (`group_B` holds each row's group
index in [0, num_groups)), reductions are segment sums over it, and nothing loops over groups in
Python, so the compiled program is the same whichever groups were rescued.

Row vocabulary (see `hsjax/rl/batch.py` for the layout):
  valid_B      the slot holds a trajectory (absent rescue slots and padding groups are 0)
  is_rescue_B  the slot belongs to the rescue part of its group (rolled under a sibling harness)
  active_B     the slot takes part in the update (output of `rescue_mask`)
"""
from typing import Callable, Dict

import jax
import jax.numpy as jnp

ADVANTAGE_EPS = 1e-6
STD_DDOF = 1

_ADVANTAGES: Dict[str, Callable] = {}


def group_sum(x_B: jax.Array, group_B: jax.Array, num_groups: int) -> jax.Array:
    """Sums `x_B` per group -> `[num_groups]`; rows with a group id outside the range are dropped."""
    return jax.ops.segment_sum(x_B, group_B, num_segments=num_groups)


def safe_div(num: jax.Array, den: jax.Array) -> jax.Array:
    """num / den where den > 0, else 0 (never NaN, also under jax.grad)."""
    positive = den > 0
    return jnp.where(positive, num / jnp.where(positive, den, 1), 0)


def success(reward_B: jax.Array, valid_B: jax.Array, threshold: float = 1.0) -> jax.Array:
    """A valid slot succeeded iff its reward reaches `threshold`.

    The decision must come from the binary outcome, not from a shaped score: a shaped reward (partial
    credit, format bonus, length penalty) can differ inside a group whose every trajectory failed the
    task, and a group judged "not all failed" on such a score is neither rescued nor dropped; it then
    trains on advantages that only rank degrees of failure (the phantom-gradient problem reported
    for shaped-score group filtering). Pass the task's success reward as `threshold`.
    """
    return (reward_B >= threshold) & valid_B.astype(bool)


def rescue_mask(
    success_B: jax.Array,
    valid_B: jax.Array,
    is_rescue_B: jax.Array,
    group_B: jax.Array,
    num_groups: int,
) -> tuple[jax.Array, Dict[str, jax.Array]]:
    """Chooses the active slots of every group: the base slots, the rescue slots, or none.

    Per group: if a valid base slot succeeded, the base slots are active and rescue slots masked;
    otherwise, if a valid rescue slot succeeded, the rescue slots replace the base slots; otherwise
    the group contributes nothing. Returns `active_B` (bool) and per-batch group statistics:

      groups/all_fail_frac   groups whose every valid base slot failed / present groups
      groups/no_signal_frac  groups with no active slot (all failed, no rescue success) / present
      rescue/triggered_frac  groups holding at least one valid rescue slot / present groups
      rescue/success_frac    triggered all-fail groups with a rescue success / triggered all-fail
      groups/present         groups with at least one valid base slot (a count)

    A group is present when it has a valid base slot; padding groups never count. Fractions with
    an empty denominator are 0.
    """
    valid = valid_B.astype(bool)
    rescue = is_rescue_B.astype(bool)
    ok = success_B.astype(bool) & valid
    base_valid_G = group_sum((valid & ~rescue).astype(jnp.int32), group_B, num_groups) > 0
    rescue_valid_G = group_sum((valid & rescue).astype(jnp.int32), group_B, num_groups) > 0
    base_ok_G = group_sum((ok & ~rescue).astype(jnp.int32), group_B, num_groups) > 0
    rescue_ok_G = group_sum((ok & rescue).astype(jnp.int32), group_B, num_groups) > 0

    use_rescue_G = ~base_ok_G & rescue_ok_G
    active_B = valid & jnp.where(rescue, use_rescue_G[group_B], base_ok_G[group_B])

    present_G = base_valid_G
    all_fail_G = present_G & ~base_ok_G
    triggered_G = present_G & rescue_valid_G
    triggered_fail_G = triggered_G & all_fail_G
    f32 = lambda x: jnp.sum(x.astype(jnp.float32))
    num_present = f32(present_G)
    stats = {
        "groups/all_fail_frac": safe_div(f32(all_fail_G), num_present),
        "groups/no_signal_frac": safe_div(f32(all_fail_G & ~rescue_ok_G), num_present),
        "rescue/triggered_frac": safe_div(f32(triggered_G), num_present),
        "rescue/success_frac": safe_div(f32(triggered_fail_G & rescue_ok_G), f32(triggered_fail_G)),
        "groups/present": num_present,
    }
    return active_B, stats


def register_advantage(name: str) -> Callable:
    """Decorator: registers `fn(reward_B, group_B, active_B, num_groups) -> advantage_B` as `name`."""

    def register(fn: Callable) -> Callable:
        if name in _ADVANTAGES:
            raise ValueError(f"advantage estimator {name!r} is already registered")
        _ADVANTAGES[name] = fn
        return fn

    return register


def get_advantage(name: str) -> Callable:
    """Returns the advantage estimator registered as `name`."""
    try:
        return _ADVANTAGES[name]
    except KeyError:
        raise ValueError(
            f"unknown advantage estimator {name!r}; choose one of {sorted(_ADVANTAGES)} "
            "or register a new one with @register_advantage"
        ) from None


def _group_moments(reward_B, group_B, active_B, num_groups):
    """Masked rewards and per-group (count_G, sum_G, mean_G) over the active rows."""
    reward_B = jnp.where(active_B, reward_B.astype(jnp.float32), 0.0)
    count_G = group_sum(active_B.astype(jnp.float32), group_B, num_groups)
    sum_G = group_sum(reward_B, group_B, num_groups)
    return reward_B, count_G, sum_G, safe_div(sum_G, count_G)


@register_advantage("grpo")
def grpo_advantage(reward_B, group_B, active_B, num_groups):
    """(r - mean) / (std + eps) over the active slots of the group; std with ddof=1.

    ddof=1 (the unbiased estimate, as in the common GRPO implementations) only rescales a group;
    a group with fewer than two active slots has r == mean and gets advantage 0.
    """
    active_B = active_B.astype(bool)
    reward_B, count_G, _, mean_G = _group_moments(reward_B, group_B, active_B, num_groups)
    centered_B = jnp.where(active_B, reward_B - mean_G[group_B], 0.0)
    var_G = safe_div(group_sum(centered_B**2, group_B, num_groups), count_G - STD_DDOF)
    std_B = jnp.sqrt(var_G)[group_B]
    return jnp.where(active_B & (count_G[group_B] > 1), centered_B / (std_B + ADVANTAGE_EPS), 0.0)


@register_advantage("drgrpo")
def drgrpo_advantage(reward_B, group_B, active_B, num_groups):
    """r - mean over the active slots of the group (Dr. GRPO: no division by the std)."""
    active_B = active_B.astype(bool)
    reward_B, _, _, mean_G = _group_moments(reward_B, group_B, active_B, num_groups)
    return jnp.where(active_B, reward_B - mean_G[group_B], 0.0)


@register_advantage("rloo")
def rloo_advantage(reward_B, group_B, active_B, num_groups):
    """r - mean of the other active slots of the group (leave-one-out); 0 with one active slot."""
    active_B = active_B.astype(bool)
    reward_B, count_G, sum_G, _ = _group_moments(reward_B, group_B, active_B, num_groups)
    count_B = count_G[group_B]
    others_mean_B = safe_div(sum_G[group_B] - reward_B, count_B - 1)
    return jnp.where(active_B & (count_B > 1), reward_B - others_mean_B, 0.0)
