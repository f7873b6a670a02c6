"""Batched sampling with a KV cache: one jit-compiled program per bucketed shape.

The program prefills the left-padded prompts (pad positions -1) with `forward`, samples the
first token, then runs a `lax.while_loop` of one-token `hsjax.models.decode.decode_step`s until
every row has stopped or the longest request's budget is spent. This module holds only the
sampling math, the shape buckets and that loop; the model math lives in `hsjax.models`. Per-row
sampling settings (temperature, top-p, top-k, greedy, max new tokens, stop sequences) are arrays,
so changing them never recompiles.

Logprob convention (what the trainer recomputes): for each generated token,
`log_softmax(logits / T)` in float32 with T the row's temperature (1 for greedy), taken BEFORE
top-k/top-p truncation. See docs/rollout.md. On request (`num_top_logprobs`) the program also
returns, per generated token, the most likely tokens and their logprobs under the same convention
(what an OpenAI `top_logprobs` reply reports).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from hsjax.models import decode as decode_lib
from hsjax.models import model as model_lib

log = logging.getLogger(__name__)


@dataclasses.dataclass
class SampleOutput:
    """One row's result: generated ids (int32), their logprobs (float32), "stop" or "length", and
    with `num_top_logprobs` k the k most likely ids and their logprobs at each step (NxK each)."""

    ids: np.ndarray
    logprobs: np.ndarray
    finish_reason: str
    top_ids: np.ndarray | None = None
    top_logprobs: np.ndarray | None = None


@dataclasses.dataclass
class Prefix:
    """Cached keys/values a generation starts from (KV reuse across the turns of an episode): one
    BxKxCxH key and value array per layer, in the decode loop's layout, and the position held by
    each slot (BxC, -1: empty). Row b of the batch continues the sequence whose keys/values are in
    row b; a row with no slot >= 0 starts fresh."""

    k: tuple
    v: tuple
    pos_BxC: jax.Array


@dataclasses.dataclass
class Kept:
    """The caches a generation ended with (`Sampler.generate(..., keep_cache=True)`): per layer
    BxKxSxH keys and values, the slot positions (BxS) and `gen_start`, the first generated slot
    (row b's generated token j sits at slot gen_start + j; slots past its last kept token hold
    garbage the caller must mask before reuse)."""

    k: tuple
    v: tuple
    pos_BxS: jax.Array
    gen_start: int


# ---------------------------------------------------------------------------------------------
# Shape buckets


def next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def bucket_length(n: int, minimum: int = 32, step: int = 512) -> int:
    """Powers of two from `minimum` up to `step`, then multiples of `step`."""
    if n <= step:
        return max(minimum, next_pow2(n))
    return -(-n // step) * step


def bucket_batch(n: int, buckets: Sequence[int] | None = None) -> int:
    """The smallest configured batch size >= n (powers of two when none are configured)."""
    if buckets:
        for b in sorted(buckets):
            if b >= n:
                return b
    return next_pow2(max(1, n))


# ---------------------------------------------------------------------------------------------
# Pure sampling math


def truncate_logits(scaled_BxV, top_p_B, top_k_B):
    """Sets to -inf the logits outside each row's top-k, then outside its top-p nucleus (mass
    computed over the top-k set, as `transformers` does). top_k 0 and top_p 1 keep everything."""
    vocab = scaled_BxV.shape[-1]
    sorted_BxV = -jnp.sort(-scaled_BxV, axis=-1)
    k_B = jnp.where(top_k_B > 0, jnp.minimum(top_k_B, vocab), vocab)
    in_k_BxV = jnp.arange(vocab)[None, :] < k_B[:, None]
    probs_BxV = jax.nn.softmax(jnp.where(in_k_BxV, sorted_BxV, -jnp.inf), axis=-1)
    mass_before_BxV = jnp.cumsum(probs_BxV, axis=-1) - probs_BxV
    keep_BxV = in_k_BxV & (mass_before_BxV < top_p_B[:, None])
    num_keep_B = jnp.maximum(keep_BxV.sum(-1), 1)
    thresh_B = jnp.take_along_axis(sorted_BxV, (num_keep_B - 1)[:, None], axis=-1)[:, 0]
    return jnp.where(scaled_BxV >= thresh_B[:, None], scaled_BxV, -jnp.inf)


def sample_logits(logits_BxV, keys_B, temperature_B, top_p_B, top_k_B, greedy_B):
    """Draws one token per row, each with its own key; returns (tokens_B, logprobs_B) under the
    module's convention."""
    logits_BxV = logits_BxV.astype(jnp.float32)
    temp_B = jnp.where(greedy_B, 1.0, temperature_B)
    scaled_BxV = logits_BxV / temp_B[:, None]
    logp_BxV = jax.nn.log_softmax(scaled_BxV, axis=-1)
    needs_trunc_B = ~greedy_B & ((top_p_B < 1.0) | (top_k_B > 0))
    # The sort behind top-k/top-p costs more than the rest of a small model's step: skip it when
    # no row asks for truncation.
    sample_from_BxV = jax.lax.cond(
        needs_trunc_B.any(),
        lambda: jnp.where(needs_trunc_B[:, None],
                          truncate_logits(scaled_BxV, top_p_B, top_k_B), scaled_BxV),
        lambda: scaled_BxV)
    sampled_B = jax.vmap(lambda key, row_V: jax.random.categorical(key, row_V))(keys_B, sample_from_BxV)
    tokens_B = jnp.where(greedy_B, jnp.argmax(logits_BxV, axis=-1), sampled_B).astype(jnp.int32)
    logprobs_B = jnp.take_along_axis(logp_BxV, tokens_B[:, None], axis=-1)[:, 0]
    return tokens_B, logprobs_B


def top_logprobs(logits_BxV, temperature_B, greedy_B, k: int):
    """(logprobs_BxK, ids_BxK) of each row's k most likely tokens, under the module's convention."""
    temp_B = jnp.where(greedy_B, 1.0, temperature_B)
    logp_BxV = jax.nn.log_softmax(logits_BxV.astype(jnp.float32) / temp_B[:, None], axis=-1)
    return jax.lax.top_k(logp_BxV, k)


def stop_hit(window_BxL, stops_BxNxL, stop_mask_BxNxL):
    """Whether the last generated tokens (`window_BxL`, right-aligned, -1 before the first) end
    with any of the row's stop sequences (right-aligned, `stop_mask` marking their tokens)."""
    eq_BxNxL = (window_BxL[:, None, :] == stops_BxNxL) | ~stop_mask_BxNxL
    return (eq_BxNxL.all(-1) & stop_mask_BxNxL.any(-1)).any(-1)


# ---------------------------------------------------------------------------------------------
# The compiled program


def row_keys(key, episode_seed_B, turn_B):
    """One key per row: fold_in(fold_in(key, episode seed), turn). A row's draws depend on which
    episode and turn it is, never on its position in the batch or on its batch mates."""
    return jax.vmap(lambda s, t: jax.random.fold_in(jax.random.fold_in(key, s), t))(episode_seed_B, turn_B)


def _generate_program(cfg, params, tokens_BxP, positions_BxP, temperature_B, top_p_B, top_k_B,
                      greedy_B, max_new_B, stops_BxNxL, stop_mask_BxNxL, key, episode_seed_B, turn_B,
                      prefix_k, prefix_v, prefix_pos_BxC, *, max_new: int, pad_id: int,
                      num_top: int = 0, kv_dtype: str = ""):
    batch, prompt_len = tokens_BxP.shape
    keys_B = row_keys(key, episode_seed_B, turn_B)
    # A prefix (the kept cache of an earlier turn, `Prefix`) fills slots [0, C); the prompt's new
    # tokens follow it, then the generated ones. C = 0: a fresh prefill.
    num_prefix = prefix_pos_BxC.shape[1]
    cache = model_lib.init_cache(cfg, batch, num_prefix + prompt_len + max_new, kv_dtype or None)
    if num_prefix:  # static
        def place(stacked, layers):
            prefix = jnp.stack([x.transpose(0, 2, 1, 3) for x in layers]).astype(stacked.dtype)
            return stacked.at[:, :, :num_prefix].set(prefix)
        cache = cache.replace(k_LxBxSxKxH=place(cache.k_LxBxSxKxH, prefix_k),
                              v_LxBxSxKxH=place(cache.v_LxBxSxKxH, prefix_v),
                              pos_BxS=cache.pos_BxS.at[:, :num_prefix].set(prefix_pos_BxC),
                              end=jnp.int32(num_prefix))
    # Prefill all but the last prompt token, then the last one alone: the first call's logits are
    # unused, so XLA drops its BxPxV vocabulary projection (the largest prefill tensor).
    _, cache = model_lib.forward(cfg, params, tokens_BxP[:, :-1], positions_BxP[:, :-1],
                                 cache=cache)
    logits_Bx1xV, cache = model_lib.forward(cfg, params, tokens_BxP[:, -1:],
                                            positions_BxP[:, -1:], cache=cache)
    # The decode loop keeps its own layout (per-layer BxKxSxH caches, unstacked weights): see
    # hsjax.models.decode for why. It runs the same decoder block as `forward`.
    weights = decode_lib.decode_weights(cfg, params)
    k_caches, v_caches = decode_lib.decode_caches(cache)
    window_len = stops_BxNxL.shape[-1]

    def cond(state):
        i, done_B = state[0], state[2]
        return (i < max_new) & ~done_B.all()

    def body(state):
        (i, logits_BxV, done_B, pos_B, length_B, stopped_B, window_BxL, out_BxM, lp_BxM,
         top_ids_BxMxK, top_lp_BxMxK, k_caches, v_caches, kpos_BxS) = state
        step_keys_B = jax.vmap(jax.random.fold_in, in_axes=(0, None))(keys_B, i)
        tok_B, lp_B = sample_logits(logits_BxV, step_keys_B, temperature_B, top_p_B, top_k_B,
                                    greedy_B)
        tok_B = jnp.where(done_B, pad_id, tok_B)
        lp_B = jnp.where(done_B, 0.0, lp_B)
        out_BxM = out_BxM.at[:, i].set(tok_B)
        lp_BxM = lp_BxM.at[:, i].set(lp_B)
        if num_top:  # static: the programs that report no alternatives do not compute them
            top_lp_BxK, top_ids_BxK = top_logprobs(logits_BxV, temperature_B, greedy_B, num_top)
            top_ids_BxMxK = top_ids_BxMxK.at[:, i].set(top_ids_BxK.astype(jnp.int32))
            top_lp_BxMxK = top_lp_BxMxK.at[:, i].set(top_lp_BxK)
        length_B = length_B + (~done_B).astype(jnp.int32)
        shifted_BxL = jnp.concatenate([window_BxL[:, 1:], tok_B[:, None]], axis=1)
        window_BxL = jnp.where(done_B[:, None], window_BxL, shifted_BxL)
        hit_B = ~done_B & stop_hit(window_BxL, stops_BxNxL, stop_mask_BxNxL)
        stopped_B = stopped_B | hit_B
        done_B = done_B | hit_B | (length_B >= max_new_B)
        pos_B = pos_B + 1
        logits_BxV, k_caches, v_caches, kpos_BxS = decode_lib.decode_step(
            cfg, weights, tok_B, pos_B, num_prefix + prompt_len + i, k_caches, v_caches, kpos_BxS)
        return (i + 1, logits_BxV, done_B, pos_B, length_B, stopped_B, window_BxL, out_BxM,
                lp_BxM, top_ids_BxMxK, top_lp_BxMxK, k_caches, v_caches, kpos_BxS)

    state = (jnp.int32(0), logits_Bx1xV[:, 0], max_new_B <= 0, positions_BxP[:, -1],
             jnp.zeros((batch,), jnp.int32), jnp.zeros((batch,), bool),
             jnp.full((batch, window_len), -1, jnp.int32),
             jnp.full((batch, max_new), pad_id, jnp.int32),
             jnp.zeros((batch, max_new), jnp.float32),
             jnp.zeros((batch, max_new, num_top), jnp.int32),
             jnp.zeros((batch, max_new, num_top), jnp.float32), k_caches, v_caches, cache.pos_BxS)
    state = jax.lax.while_loop(cond, body, state)
    return (state[7], state[8], state[4], state[5], state[9], state[10]), (state[11], state[12], state[13])


@functools.lru_cache(maxsize=None)
def compiled_program(cfg):
    """The jitted generation program of a model config, shared by all samplers of that config
    (a policy rebuilt with new params reuses what was compiled)."""
    return jax.jit(functools.partial(_generate_program, cfg),
                   static_argnames=("max_new", "pad_id", "num_top", "kv_dtype"))


class Sampler:
    """Compiles and caches one generation program per bucketed shape.

    Shapes: batch padded to `batch_buckets` (powers of two by default), prompt length to
    `bucket_length(n, prompt_min, prompt_step)`, the generation budget to a power of two
    >= `max_new_min`, stop sequences to powers of two in count and length (>= 4), the number of
    top logprobs reported to a power of two (0 when none are asked for). Each new shape is logged; `num_compilations` counts the shapes this sampler has run (each is one compiled
    program, shared with other samplers of the same config).
    """

    def __init__(self, cfg, *, eos_ids: Sequence[int] = (), pad_id: int = 0,
                 batch_buckets: Sequence[int] | None = None, prompt_min: int = 32,
                 prompt_step: int = 512, max_new_min: int = 16, kv_dtype: str = ""):
        self.cfg = cfg
        self.eos_ids = tuple(int(i) for i in eos_ids)
        self.pad_id = int(pad_id)
        self.batch_buckets = tuple(batch_buckets) if batch_buckets else None
        self.prompt_min, self.prompt_step, self.max_new_min = prompt_min, prompt_step, max_new_min
        # The KV cache's dtype ("" = the compute dtype). bfloat16 halves the bytes a decode step
        # reads; keys and values are rounded to 8 mantissa bits, so logprobs move by a bounded
        # amount (tests/policies/test_sampler.py) and the trainer's recomputation sees the gap.
        if kv_dtype and jnp.dtype(kv_dtype) not in (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16)):
            raise ValueError(f"kv_dtype={kv_dtype!r} is not '', 'float32' or 'bfloat16'")
        self.kv_dtype = jnp.dtype(kv_dtype).name if kv_dtype else ""
        self._program = compiled_program(cfg)
        self._shapes: set[tuple] = set()

    @property
    def num_compilations(self) -> int:
        return len(self._shapes)

    @property
    def compiled_shapes(self) -> list[tuple]:
        """(batch, prefix slots, prompt_len, max_new, num_stop_seqs, stop_len, num_top) of every
        compiled program (prefix slots: the kept cache a turn continues, 0 for a fresh prefill)."""
        return sorted(self._shapes)

    def generate(self, params, prompts: list[list[int]], sampling, rng,
                 stop_sequences: Sequence[Sequence] | None = None,
                 num_top_logprobs: int = 0,
                 turn_seeds: Sequence[tuple[int, int]] | None = None,
                 prefix: Prefix | None = None, offsets: Sequence[int] | None = None,
                 keep_cache: bool = False):
        """Samples one continuation per prompt.

        `sampling` is one `SamplingParams` or one per prompt; `stop_sequences[i]` (optional) adds
        stop ids / id tuples for row i to its `stop_token_ids` and the sampler's `eos_ids`. With
        `num_top_logprobs` k > 0 each output also holds the k most likely ids and their logprobs at
        each step (the ids sampled do not change). Deterministic for a given `rng` and inputs.

        `turn_seeds[i]` = (episode seed, turn) keys row i's draws (`row_keys`), so a row samples the same
        tokens whatever batch it shares and wherever it sits in it (the training loop keys each
        episode by its index in the step, which is what lets several processes split a step's
        episodes and draw what one process would). Default: (row index, 0).

        KV reuse: with `prefix` (batch dimension `batch_size(len(prompts))`), `prompts[i]` holds
        only the tokens that follow row i's cached sequence and `offsets[i]` is that sequence's
        length (the first new token's position). `keep_cache=True` returns (outputs, `Kept`).
        """
        n = len(prompts)
        if n == 0:
            return []
        per_row = list(sampling) if isinstance(sampling, (list, tuple)) else [sampling] * n
        if len(per_row) != n:
            raise ValueError(f"got {len(per_row)} SamplingParams for {n} prompts")
        for i, p in enumerate(prompts):
            if len(p) == 0:
                raise ValueError(f"prompt {i} is empty; every prompt needs at least one token")
        extra = list(stop_sequences) if stop_sequences is not None else [()] * n
        rows_stops = []
        for s, ex in zip(per_row, extra):
            seqs = {(t,) if isinstance(t, (int, np.integer)) else tuple(t)
                    for t in (*s.stop_token_ids, *self.eos_ids, *ex)}
            rows_stops.append(sorted(q for q in seqs if q))

        batch = bucket_batch(n, self.batch_buckets)
        prompt_len = bucket_length(max(len(p) for p in prompts), self.prompt_min,
                                   self.prompt_step)
        max_new = max(self.max_new_min, next_pow2(max(s.max_new_tokens for s in per_row)))
        num_stops = max(4, next_pow2(max(len(r) for r in rows_stops)))
        stop_len = max(4, next_pow2(max((len(q) for r in rows_stops for q in r), default=1)))
        if num_top_logprobs < 0 or num_top_logprobs > self.cfg.vocab_size:
            raise ValueError(f"num_top_logprobs={num_top_logprobs} must be in [0, vocab_size={self.cfg.vocab_size}]")
        num_top = min(next_pow2(num_top_logprobs), self.cfg.vocab_size) if num_top_logprobs else 0

        tokens = np.full((batch, prompt_len), self.pad_id, np.int32)
        positions = np.full((batch, prompt_len), -1, np.int32)
        tokens[n:, -1], positions[n:, -1] = self.pad_id, 0  # filler rows: one token, never sampled
        stops = np.full((batch, num_stops, stop_len), -1, np.int32)
        stop_mask = np.zeros((batch, num_stops, stop_len), bool)
        temperature = np.ones((batch,), np.float32)
        top_p = np.ones((batch,), np.float32)
        top_k = np.zeros((batch,), np.int32)
        greedy = np.zeros((batch,), bool)
        max_new_rows = np.zeros((batch,), np.int32)
        for i, (p, s) in enumerate(zip(prompts, per_row)):
            tokens[i, prompt_len - len(p):] = p
            temperature[i], top_p[i], top_k[i] = s.temperature, s.top_p, s.top_k
            greedy[i], max_new_rows[i] = s.greedy, s.max_new_tokens
            for j, q in enumerate(rows_stops[i]):
                stops[i, j, stop_len - len(q):] = q
                stop_mask[i, j, stop_len - len(q):] = True

        episode_seed = np.arange(batch, dtype=np.uint32)
        turn = np.zeros((batch,), np.uint32)
        if turn_seeds is not None:
            if len(turn_seeds) != n:
                raise ValueError(f"got {len(turn_seeds)} turn seeds for {n} prompts")
            for i, (sid, t) in enumerate(turn_seeds):
                if not (0 <= sid < 2**32 and 0 <= t < 2**32):
                    raise ValueError(f"turn seed {(sid, t)} of row {i}: both must be in [0, 2**32)")
                episode_seed[i], turn[i] = sid, t

        offsets = [0] * n if offsets is None else list(offsets)
        if len(offsets) != n:
            raise ValueError(f"got {len(offsets)} offsets for {n} prompts")
        if prefix is None:
            prefix = self.empty_prefix(batch)
        elif prefix.pos_BxC.shape[0] != batch:
            raise ValueError(f"prefix rows {prefix.pos_BxC.shape[0]} != batch bucket {batch}")
        for i, (p, off) in enumerate(zip(prompts, offsets)):
            positions[i, prompt_len - len(p):] = off + np.arange(len(p))
        num_prefix = int(prefix.pos_BxC.shape[1])

        shape = (batch, num_prefix, prompt_len, max_new, num_stops, stop_len, num_top)
        if shape not in self._shapes:
            self._shapes.add(shape)
            log.info("sampler: compiling program %d for batch=%d prefix=%d prompt_len=%d max_new=%d "
                     "stops=%dx%d top_logprobs=%d", len(self._shapes), *shape)
        results, caches = self._program(
            params, tokens, positions, temperature, top_p, top_k, greedy, max_new_rows, stops,
            stop_mask, rng, episode_seed, turn, prefix.k, prefix.v, prefix.pos_BxC, max_new=max_new,
            pad_id=self.pad_id, num_top=num_top, kv_dtype=self.kv_dtype)
        out, lp, length, stopped, top_ids, top_lp = jax.device_get(results)
        k = num_top_logprobs
        outputs = [SampleOutput(ids=out[i, :length[i]].copy(), logprobs=lp[i, :length[i]].copy(),
                             finish_reason="stop" if stopped[i] else "length",
                             top_ids=top_ids[i, :length[i], :k].copy() if k else None,
                             top_logprobs=top_lp[i, :length[i], :k].copy() if k else None)
                   for i in range(n)]
        if keep_cache:
            return outputs, Kept(caches[0], caches[1], caches[2], num_prefix + prompt_len)
        return outputs

    def batch_size(self, n: int) -> int:
        """The bucketed batch a call with n prompts runs at (a `Prefix` has this many rows)."""
        return bucket_batch(n, self.batch_buckets)

    def empty_prefix(self, batch: int) -> Prefix:
        """A prefix of no slots: a fresh prefill."""
        dtype = jnp.dtype(self.kv_dtype or self.cfg.dtype)
        empty = jnp.zeros((batch, self.cfg.num_kv_heads, 0, self.cfg.head_dim), dtype)
        layers = (empty,) * self.cfg.num_layers
        return Prefix(layers, layers, jnp.zeros((batch, 0), jnp.int32))
