"""Low-rank adapters (LoRA, Hu et al. 2021) on the decoder's projections, as plain pytrees.

An adapter of a projection W (per layer: `in` axes x `out` axes, e.g. q_proj D x N x H, o_proj
N x H x D) is a pair A (in axes x r) and B (r x out axes), stacked over layers like W:

    W' = W + (alpha / r) * A B

B starts at zero, so a fresh adapter leaves the model unchanged, and A at N(0, 1/in). The
adapters tree mirrors `params["layers"]` for the targeted projections only:
`{"layers": {"q_proj": {"a": L x D x r, "b": L x r x N x H}, ...}}`.

Why merged weights rather than a separate low-rank path in the forward: the decoder block, the
sampler's decode step and the KV-cache code all read `params` (hsjax/models/model.py), and one
function that turns (base, adapters) into params keeps every one of them the same model, so the
PPO ratio never compares two differently computed forwards. The update merges inside its loss
(one L x in x out product per target per micro-batch, cheap next to the forward), and the
gradient reaches A and B through the merge; the base is an argument of the jitted update, never
trained and never in the optimizer state or the checkpoint. The cost is one transient copy of the
targeted weights inside the update; the saving is the optimizer state (Adam's two moments) and
the checkpoint of everything but the adapters. No dropout on the adapter path: with merged
weights there is no separate path to drop.
"""
from __future__ import annotations

import math
from typing import Sequence

import jax
import jax.numpy as jnp


# projection -> how many leading axes (after the layer axis) are its input
INPUT_AXES = {"q_proj": 1, "k_proj": 1, "v_proj": 1, "o_proj": 2, "gate_proj": 1, "up_proj": 1, "down_proj": 1}
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")


def check_targets(targets: Sequence[str]) -> tuple[str, ...]:
    """`targets` as a tuple, or a ValueError naming the projections that exist."""
    unknown = [t for t in targets if t not in INPUT_AXES]
    if unknown or not targets:
        raise ValueError(f"LoRA targets {list(targets)}: each must be one of {list(INPUT_AXES)} (at least one)")
    return tuple(dict.fromkeys(targets))


def init_adapters(params: dict, rank: int, targets: Sequence[str], rng: jax.Array, dtype=jnp.float32) -> dict:
    """Fresh adapters of rank `rank` for the `targets` of `params` (A random, B zero)."""
    if rank < 1:
        raise ValueError(f"LoRA rank must be >= 1, got {rank}")
    layers = {}
    for name, key in zip(check_targets(targets), jax.random.split(rng, len(targets))):
        w = params["layers"][name]
        n_in = INPUT_AXES[name]
        in_shape, out_shape = w.shape[1:1 + n_in], w.shape[1 + n_in:]
        fan_in = math.prod(in_shape)
        a = jax.random.normal(key, (w.shape[0], *in_shape, rank), jnp.float32) / math.sqrt(fan_in)
        layers[name] = {"a": a.astype(dtype), "b": jnp.zeros((w.shape[0], rank, *out_shape), dtype)}
    return {"layers": layers}


def delta(name: str, a: jax.Array, b: jax.Array) -> jax.Array:
    """A B of one projection, layer by layer: L x in axes x out axes, in float32."""
    n_in = INPUT_AXES[name]
    a2 = a.reshape(a.shape[0], -1, a.shape[-1]).astype(jnp.float32)  # L x in x r
    b2 = b.reshape(b.shape[0], b.shape[1], -1).astype(jnp.float32)  # L x r x out
    return jnp.einsum("lir,lro->lio", a2, b2).reshape(*a.shape[:1 + n_in], *b.shape[2:])


def merge(params: dict, adapters: dict, scale: float) -> dict:
    """`params` with W + scale * A B for every adapted projection (computed in float32, stored in
    W's dtype); the other leaves are the same arrays."""
    layers = dict(params["layers"])
    for name, ab in adapters["layers"].items():
        w = layers[name]
        layers[name] = (w.astype(jnp.float32) + scale * delta(name, ab["a"], ab["b"])).astype(w.dtype)
    return {**params, "layers": layers}


def scale_of(alpha: float, rank: int) -> float:
    """The adapters' scale, alpha / r (the rank-stabilised variant would use alpha / sqrt(r))."""
    return float(alpha) / int(rank)


def num_params(tree) -> int:
    return sum(int(x.size) for x in jax.tree.leaves(tree))


def check_fits(adapters: dict, params: dict) -> None:
    """ValueError unless every adapter's A and B fit the projection it adapts in `params`."""
    for name, ab in adapters.get("layers", {}).items():
        if name not in INPUT_AXES or name not in params["layers"]:
            raise ValueError(f"adapter of {name!r}: the model has no such projection")
        w, n_in = params["layers"][name], INPUT_AXES[name]
        if (ab["a"].shape[:-1] != w.shape[:1 + n_in] or ab["b"].shape[2:] != w.shape[1 + n_in:]
                or ab["a"].shape[-1] != ab["b"].shape[1]):
            raise ValueError(f"adapter of {name!r} has A {ab['a'].shape} and B {ab['b'].shape}, which do not "
                             f"fit the weight {w.shape}")
