"""The decoder: parameters as a plain pytree, a pure `forward`, and the KV cache.

Parameter tree (layer weights stacked on a leading L axis and run with `lax.scan`):

    embed              VxD
    layers/attn_norm   LxD          layers/mlp_norm   LxD
    layers/q_proj      LxDxNxH      layers/q_bias     LxNxH    (qkv_bias)
    layers/k_proj      LxDxKxH      layers/k_bias     LxKxH    (qkv_bias)
    layers/v_proj      LxDxKxH      layers/v_bias     LxKxH    (qkv_bias)
    layers/o_proj      LxNxHxD      layers/o_bias     LxD      (o_bias)
    layers/q_norm      LxH          layers/k_norm     LxH      (qk_norm)
    layers/gate_proj   LxDxF        layers/up_proj    LxDxF    layers/down_proj  LxFxD
    final_norm         D
    lm_head            DxV                                     (absent when tie_embeddings)

One decoder block, `block`, serves every caller: `forward` (training, prefill and cached steps,
under a `lax.scan` over the stacked layers) and `hsjax.models.decode.decode_step` (the sampler's
one-token step over unstacked layers). Callers differ only in `attend_fn`, which stores the new
keys/values where they keep them and attends, so a model flag can never reach one path and not the
other (the PPO ratio divides trainer log-probs by sampler log-probs). `logits` (final norm + head)
is shared the same way.
"""
from __future__ import annotations

import functools

import flax.struct
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from hsjax.models import memory_plan, rope
from hsjax.models.attention import MaskRule, attend, attend_chunked
from hsjax.models.config import ModelConfig

_INIT_STD = 0.02  # transformers' default initializer_range


def _layer_shapes(cfg: ModelConfig) -> dict[str, tuple[tuple[int, ...], tuple[str | None, ...]]]:
    """name -> (per-layer shape, per-layer logical axes) of every stacked layer weight."""
    d, f = cfg.hidden_size, cfg.intermediate_size
    n, k, h = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    shapes = {
        "attn_norm": ((d,), ("embed",)),
        "q_proj": ((d, n, h), ("embed", "heads", "head_dim")),
        "k_proj": ((d, k, h), ("embed", "kv_heads", "head_dim")),
        "v_proj": ((d, k, h), ("embed", "kv_heads", "head_dim")),
        "o_proj": ((n, h, d), ("heads", "head_dim", "embed")),
        "mlp_norm": ((d,), ("embed",)),
        "gate_proj": ((d, f), ("embed", "mlp")),
        "up_proj": ((d, f), ("embed", "mlp")),
        "down_proj": ((f, d), ("mlp", "embed")),
    }
    if cfg.qkv_bias:
        shapes["q_bias"] = ((n, h), ("heads", "head_dim"))
        shapes["k_bias"] = ((k, h), ("kv_heads", "head_dim"))
        shapes["v_bias"] = ((k, h), ("kv_heads", "head_dim"))
    if cfg.o_bias:
        shapes["o_bias"] = ((d,), ("embed",))
    if cfg.qk_norm:
        shapes["q_norm"] = ((h,), ("head_dim",))
        shapes["k_norm"] = ((h,), ("head_dim",))
    return shapes


def param_logical_axes(cfg: ModelConfig) -> dict:
    """Same tree as `init_params(cfg, rng)`, with a tuple of logical axis names at each leaf."""
    axes = {
        "embed": ("vocab", "embed"),
        "layers": {name: ("layers", *ax) for name, (_, ax) in _layer_shapes(cfg).items()},
        "final_norm": ("embed",),
    }
    if not cfg.tie_embeddings:
        axes["lm_head"] = ("embed", "vocab")
    return axes


def init_params(cfg: ModelConfig, rng: jax.Array) -> dict:
    """Random weights (normal, std 0.02; norms at one, biases at zero) in `cfg.param_dtype`."""
    dtype = jnp.dtype(cfg.param_dtype)
    num_layers = cfg.num_layers
    layer_shapes = _layer_shapes(cfg)
    keys = iter(jax.random.split(rng, len(layer_shapes) + 2))

    def normal(shape):
        return (_INIT_STD * jax.random.normal(next(keys), shape, jnp.float32)).astype(dtype)

    layers = {}
    for name, (shape, _) in layer_shapes.items():
        full_shape = (num_layers, *shape)
        if name.endswith("_norm"):
            layers[name] = jnp.ones(full_shape, dtype)
        elif name.endswith("_bias"):
            layers[name] = jnp.zeros(full_shape, dtype)
        else:
            layers[name] = normal(full_shape)
    params = {
        "embed": normal((cfg.vocab_size, cfg.hidden_size)),
        "layers": layers,
        "final_norm": jnp.ones((cfg.hidden_size,), dtype),
    }
    if not cfg.tie_embeddings:
        params["lm_head"] = normal((cfg.hidden_size, cfg.vocab_size))
    return params


@flax.struct.dataclass
class KVCache:
    """Keys/values of every layer for S slots per row.

    `pos_BxS` is the position stored in each slot (-1: empty or padding); `end` counts the slots
    written so far (the same for every row: rows are left-padded, not ragged).
    """

    k_LxBxSxKxH: jax.Array
    v_LxBxSxKxH: jax.Array
    pos_BxS: jax.Array
    end: jax.Array


def init_cache(cfg: ModelConfig, batch_size: int, max_len: int, dtype=None) -> KVCache:
    """An empty cache of `max_len` slots per row, in `dtype` (default: the compute dtype).

    Typical use, under `jax.jit` (`cfg` static):
        cache = init_cache(cfg, B, P + N)
        logits_BxPxV, cache = forward(cfg, params, prompt_BxP, pos_BxP, cache)  # prefill
        logits_Bx1xV, cache = forward(cfg, params, tok_Bx1, pos_Bx1, cache)     # each decode step
    """
    dtype = jnp.dtype(dtype or cfg.dtype)
    shape = (cfg.num_layers, batch_size, max_len, cfg.num_kv_heads, cfg.head_dim)
    return KVCache(
        k_LxBxSxKxH=jnp.zeros(shape, dtype),
        v_LxBxSxKxH=jnp.zeros(shape, dtype),
        pos_BxS=jnp.full((batch_size, max_len), -1, jnp.int32),
        end=jnp.zeros((), jnp.int32),
    )


def rms_norm(x: jnp.ndarray, weight: jnp.ndarray, eps: float) -> jnp.ndarray:
    """x / rms(x) * weight, normalized in float32 then cast back before the weight, as HF does."""
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return weight * normed.astype(x.dtype)


def forward(
    cfg: ModelConfig,
    params: dict,
    tokens_BxT: jnp.ndarray,
    positions_BxT: jnp.ndarray,
    cache: KVCache | None = None,
    segment_ids_BxT: jnp.ndarray | None = None,
) -> tuple[jnp.ndarray, KVCache | None]:
    """Logits_BxTxV (float32) of every slot, and the updated cache (None without a cache).

    A slot with a negative position is padding: it sees nothing and nothing sees it (its logits
    are finite garbage), so left-padded rows of uneven lengths need no other argument. RoPE uses
    the given positions. `segment_ids_BxT` packs several sequences in a row: a token sees only
    earlier tokens of its own segment (positions restart at 0 in each segment).

    With `cache`, the T new keys/values go to slots [end, end + T) and the queries attend over all
    S cached slots under the same rule; the returned cache has `end += T`. The cache must have
    room: `end + T <= S` (checked when not traced).
    """
    x_BxTxD, cache = forward_hidden(cfg, params, tokens_BxT, positions_BxT, cache, segment_ids_BxT)
    logits_BxTxV = logits(cfg, x_BxTxD, params["final_norm"], head_weight(cfg, params))
    return logits_BxTxV.astype(jnp.float32), cache


def forward_hidden(
    cfg: ModelConfig,
    params: dict,
    tokens_BxT: jnp.ndarray,
    positions_BxT: jnp.ndarray,
    cache: KVCache | None = None,
    segment_ids_BxT: jnp.ndarray | None = None,
) -> tuple[jnp.ndarray, KVCache | None]:
    """`forward` without the head: the last block's output x_BxTxD (before the final norm), for
    callers that apply `logits` to a few rows at a time (`hsjax.rl.losses.token_logp_chunked`)."""
    batch, seq = tokens_BxT.shape
    dtype = jnp.dtype(cfg.dtype)
    positions_BxT = positions_BxT.astype(jnp.int32)
    cos_BxTxH, sin_BxTxH = rope.cos_sin(positions_BxT, rope.inv_frequencies(cfg), dtype)
    x_BxTxD = params["embed"][tokens_BxT].astype(dtype)

    if cache is None:
        slots_T = jnp.arange(seq, dtype=jnp.int32)
        rule = MaskRule(positions_BxT, positions_BxT, slots_T, slots_T, segment_ids_BxT,
                        segment_ids_BxT)
    else:
        if segment_ids_BxT is not None:
            raise ValueError("segment_ids_BxT cannot be combined with a KV cache; pass cache=None.")
        _check_cache_room(cache, batch, seq)
        stored_BxT = jnp.where(positions_BxT >= 0, positions_BxT, -1)
        cache = cache.replace(
            pos_BxS=jax.lax.dynamic_update_slice(cache.pos_BxS, stored_BxT, (0, cache.end))
        )
        q_slots_T = cache.end + jnp.arange(seq, dtype=jnp.int32)
        k_slots_S = jnp.arange(cache.pos_BxS.shape[1], dtype=jnp.int32)
        rule = MaskRule(positions_BxT, cache.pos_BxS, q_slots_T, k_slots_S)
    # Long rows: the mask goes in as its rule and attention runs in query blocks (attention.py)
    # when the device's memory plan says the dense scores do not fit (memory_plan.py).
    chunked = cfg.attention_impl == "xla" and device_plan(cfg).query_rows(
        batch, cfg.num_heads, seq, rule.k_slot_S.shape[0]) > 0
    mask_BxTxS = rule if chunked else rule.dense()

    end = None if cache is None else cache.end
    layer = functools.partial(_scan_layer, cfg, cos_BxTxH, sin_BxTxH, mask_BxTxS, end)
    if cfg.remat:
        layer = jax.checkpoint(layer)
    if cache is None:
        carry = (x_BxTxD, None, None)
    else:
        carry = (x_BxTxD, cache.k_LxBxSxKxH, cache.v_LxBxSxKxH)
    layer_ids = jnp.arange(cfg.num_layers, dtype=jnp.int32)
    (x_BxTxD, k_cache, v_cache), _ = jax.lax.scan(layer, carry, (params["layers"], layer_ids))
    if cache is not None:
        cache = cache.replace(k_LxBxSxKxH=k_cache, v_LxBxSxKxH=v_cache, end=cache.end + seq)
    return x_BxTxD, cache


def _check_cache_room(cache: KVCache, batch: int, seq: int) -> None:
    slots = cache.pos_BxS.shape[1]
    if cache.pos_BxS.shape[0] != batch:
        raise ValueError(f"KV cache holds {cache.pos_BxS.shape[0]} rows but the batch has {batch}.")
    if seq > slots:
        raise ValueError(f"{seq} new tokens do not fit a KV cache of {slots} slots; enlarge init_cache.")
    if not isinstance(cache.end, jax.core.Tracer) and int(cache.end) + seq > slots:
        raise ValueError(
            f"KV cache full: {int(cache.end)} of {slots} slots used, {seq} more requested; "
            "enlarge max_len in init_cache."
        )


def _scan_layer(cfg: ModelConfig, cos_BxTxH, sin_BxTxH, mask_BxTxS, end, carry, xs):
    """`forward`'s scan body: one layer's weights cast to the compute dtype, then `block`.

    Without a cache (`end` None) attention sees only the T new keys/values; with one, it writes
    them into this layer's slice of the stacked LxBxSxKxH cache carried through the scan.
    """
    x_BxTxD, k_cache, v_cache = carry
    weights, layer_id = xs
    dtype = x_BxTxD.dtype
    p = jax.tree.map(lambda w: w.astype(dtype), weights)
    if end is None:
        attend_fn = functools.partial(_attend_uncached, cfg, mask_BxTxS)
    else:
        attend_fn = functools.partial(
            _attend_stacked_cache, cfg, mask_BxTxS, k_cache, v_cache, layer_id, end
        )
    x_BxTxD, caches = block(cfg, p, x_BxTxD, cos_BxTxH, sin_BxTxH, attend_fn)
    if end is not None:
        k_cache, v_cache = caches
    return (x_BxTxD, k_cache, v_cache), None


def _attend_uncached(cfg: ModelConfig, mask_BxTxS, q_BxTxNxH, k_BxTxKxH, v_BxTxKxH):
    """`attend_fn` without a cache: masked attention over the T new keys/values.

    The dense XLA path runs under `jax.checkpoint`: otherwise every layer keeps its B x N x T x T
    float32 scores and probabilities for the backward, up to a plan's `block_bytes` each (the blocked
    path takes over above that), i.e. several such tensors per layer stacked over the layers; the
    backward recomputes them from q, k, v and the mask, one layer at a time. Without a gradient it
    changes nothing. The cuDNN kernel keeps its own small residuals and is left as it is.
    """
    if cfg.attention_impl == "xla" and not isinstance(mask_BxTxS, MaskRule):
        dense = jax.checkpoint(functools.partial(attend, impl="xla"))
        return dense(q_BxTxNxH, k_BxTxKxH, v_BxTxKxH, mask_BxTxS), None
    return _attend(cfg, mask_BxTxS, q_BxTxNxH, k_BxTxKxH, v_BxTxKxH), None


def _attend(cfg: ModelConfig, mask_BxTxS, q_BxTxNxH, keys_BxSxKxH, values_BxSxKxH):
    """Dense `attend` given a mask; `attend_chunked` given a `MaskRule` (long rows)."""
    if isinstance(mask_BxTxS, MaskRule):
        batch, seq, num_heads, _ = q_BxTxNxH.shape
        chunk = device_plan(cfg).query_rows(batch, num_heads, seq, keys_BxSxKxH.shape[1])
        return attend_chunked(q_BxTxNxH, keys_BxSxKxH, values_BxSxKxH, mask_BxTxS, chunk)
    return attend(q_BxTxNxH, keys_BxSxKxH, values_BxSxKxH, mask_BxTxS, cfg.attention_impl)


def _attend_stacked_cache(
    cfg: ModelConfig, mask_BxTxS, k_cache, v_cache, layer_id, end, q_BxTxNxH, k_BxTxKxH, v_BxTxKxH
):
    """`attend_fn` with the stacked cache: writes slots [end, end + T) of layer `layer_id` of the
    LxBxSxKxH caches, then attends over that layer's S slots. Aux: the updated caches."""
    dtype = q_BxTxNxH.dtype
    start = (layer_id, 0, end, 0, 0)
    k_cache = jax.lax.dynamic_update_slice(k_cache, k_BxTxKxH[None].astype(k_cache.dtype), start)
    v_cache = jax.lax.dynamic_update_slice(v_cache, v_BxTxKxH[None].astype(v_cache.dtype), start)
    keys_BxSxKxH = jax.lax.dynamic_index_in_dim(k_cache, layer_id, keepdims=False).astype(dtype)
    values_BxSxKxH = jax.lax.dynamic_index_in_dim(v_cache, layer_id, keepdims=False).astype(dtype)
    attn_BxTxNxH = _attend(cfg, mask_BxTxS, q_BxTxNxH, keys_BxSxKxH, values_BxSxKxH)
    return attn_BxTxNxH, (k_cache, v_cache)


def qkv(cfg: ModelConfig, p: dict, h_BxTxD, cos_BxTxH, sin_BxTxH):
    """Queries, keys and values of the normed input: projections, optional bias, optional q/k
    norm, then RoPE (values are not rotated). Returns (q_BxTxNxH, k_BxTxKxH, v_BxTxKxH)."""
    q_BxTxNxH = jnp.einsum("btd,dnh->btnh", h_BxTxD, p["q_proj"])
    k_BxTxKxH = jnp.einsum("btd,dkh->btkh", h_BxTxD, p["k_proj"])
    v_BxTxKxH = jnp.einsum("btd,dkh->btkh", h_BxTxD, p["v_proj"])
    if cfg.qkv_bias:
        q_BxTxNxH = q_BxTxNxH + p["q_bias"]
        k_BxTxKxH = k_BxTxKxH + p["k_bias"]
        v_BxTxKxH = v_BxTxKxH + p["v_bias"]
    if cfg.qk_norm:
        q_BxTxNxH = rms_norm(q_BxTxNxH, p["q_norm"], cfg.rms_norm_eps)
        k_BxTxKxH = rms_norm(k_BxTxKxH, p["k_norm"], cfg.rms_norm_eps)
    q_BxTxNxH = rope.apply_rope(q_BxTxNxH, cos_BxTxH, sin_BxTxH)
    k_BxTxKxH = rope.apply_rope(k_BxTxKxH, cos_BxTxH, sin_BxTxH)
    return q_BxTxNxH, k_BxTxKxH, v_BxTxKxH


def device_plan(cfg: ModelConfig) -> memory_plan.MemoryPlan:
    """The block sizes of this device for `cfg` (`cfg.memory_budget` GiB, or the device's memory)."""
    return memory_plan.plan_of(cfg.memory_budget)


def mlp(p: dict, h_BxTxD, plan: memory_plan.MemoryPlan):
    """SwiGLU: down(silu(gate(h)) * up(h)). Rows whose B x T x F activations pass the plan's
    `block_bytes` run blocks of positions under `jax.checkpoint`, so no pass holds all of them (a
    decode step's T = 1 never does: its program is the plain one)."""
    batch, seq, _ = h_BxTxD.shape
    if seq == 1:
        return _mlp(p, h_BxTxD)
    chunk = plan.mlp_positions(batch, seq, p["up_proj"].shape[-1], h_BxTxD.dtype.itemsize)
    if not chunk:
        return _mlp_keep_projections(p, h_BxTxD)
    pad = -seq % chunk
    h_XxBxCxD = jnp.moveaxis(jnp.pad(h_BxTxD, ((0, 0), (0, pad), (0, 0))).reshape(
        batch, (seq + pad) // chunk, chunk, -1), 1, 0)
    out_XxBxCxD = jax.lax.map(jax.checkpoint(functools.partial(_mlp, p)), h_XxBxCxD)
    return jnp.moveaxis(out_XxBxCxD, 0, 1).reshape(batch, seq + pad, -1)[:, :seq]


def _mlp(p: dict, h_BxTxD):
    gate_BxTxF = jax.nn.silu(checkpoint_name(jnp.einsum("btd,df->btf", h_BxTxD, p["gate_proj"]), "mlp_gate"))
    up_BxTxF = checkpoint_name(jnp.einsum("btd,df->btf", h_BxTxD, p["up_proj"]), "mlp_up")
    return jnp.einsum("btf,fd->btd", gate_BxTxF * up_BxTxF, p["down_proj"])


# Without a policy the backward keeps six BxTxF float32 tensors a layer (the projections, silu,
# its derivative's pieces, the product: 805 MiB of 1.5 GiB for 8 rows of 2,048 tokens of the tiny
# policy, from XLA's buffer assignment); keeping the two projections and recomputing the
# element-wise rest in the backward costs no matmul and keeps two (docs/performance.md, "Memory").
_mlp_keep_projections = jax.checkpoint(
    _mlp, policy=jax.checkpoint_policies.save_only_these_names("mlp_gate", "mlp_up"))


def block(cfg: ModelConfig, p: dict, x_BxTxD, cos_BxTxH, sin_BxTxH, attend_fn):
    """One pre-norm decoder block: x + attn(norm(x)), then + mlp(norm(x)). Returns (x_BxTxD, aux).

    `p` holds one layer's weights (the per-layer slices of the stacked tree) in the compute
    dtype. `attend_fn(q_BxTxNxH, k_BxTxKxH, v_BxTxKxH) -> (attn_BxTxNxH, aux)` is where the caller
    stores the new keys/values (or not) and attends; `aux` (e.g. the updated caches) is passed
    through. Every path through the model runs this function, so they cannot drift apart.
    """
    eps = cfg.rms_norm_eps
    h_BxTxD = rms_norm(x_BxTxD, p["attn_norm"], eps)
    q_BxTxNxH, k_BxTxKxH, v_BxTxKxH = qkv(cfg, p, h_BxTxD, cos_BxTxH, sin_BxTxH)
    attn_BxTxNxH, aux = attend_fn(q_BxTxNxH, k_BxTxKxH, v_BxTxKxH)
    out_BxTxD = jnp.einsum("btnh,nhd->btd", attn_BxTxNxH, p["o_proj"])
    if cfg.o_bias:
        out_BxTxD = out_BxTxD + p["o_bias"]
    x_BxTxD = x_BxTxD + out_BxTxD
    x_BxTxD = x_BxTxD + mlp(p, rms_norm(x_BxTxD, p["mlp_norm"], eps), device_plan(cfg))
    return x_BxTxD, aux


def head_weight(cfg: ModelConfig, params: dict) -> jax.Array:
    """The output projection: `embed` (VxD) when tied, else `lm_head` (DxV)."""
    return params["embed"] if cfg.tie_embeddings else params["lm_head"]


def logits(cfg: ModelConfig, x_BxTxD, final_norm_D, head):
    """Final RMSNorm and the vocabulary projection: logits_BxTxV, float32.

    `head` comes from `head_weight`. The weights are cast to the dtype of `x_BxTxD` (the compute
    dtype), a no-op for the decode step's pre-cast weights.
    """
    dtype = x_BxTxD.dtype
    spec = "btd,vd->btv" if cfg.tie_embeddings else "btd,dv->btv"
    return jnp.einsum(spec, head_input(cfg, x_BxTxD, final_norm_D), head.astype(dtype),
                      preferred_element_type=jnp.float32)


def head_input(cfg: ModelConfig, x_BxTxD, final_norm_D):
    """The final RMSNorm, in the compute dtype: what the head multiplies (`logits`, and
    `hsjax.rl.fused_head`, which multiplies it a block of the vocabulary at a time)."""
    return rms_norm(x_BxTxD, final_norm_D.astype(x_BxTxD.dtype), cfg.rms_norm_eps)
