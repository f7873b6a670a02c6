"""KV reuse across the turns of an episode: the next turn prefills only its new tokens.

A multi-turn episode's prompt at turn t+1 is its prompt at turn t, the reply, and the new
observation (the rollout engine's token-exact segment). Without reuse the sampler prefills the whole
conversation every turn, so an episode costs the square of its length. `TurnCache` keeps the caches
the last generation ended with (`sampler.Kept`) and, per episode (its seed), which row holds it and the
tokens it covers. On the next call, a row whose prompt extends those tokens starts from them
(`sampler.Prefix`, gathered on the device) and prefills only the rest; any other row (a new episode,
a harness that rewrote its history and so started a new segment) prefills in full.

The caches are those of the params that produced them: `JaxPolicy` clears the store when its params
change and at every phase (`reseed`). Results equal a full prefill up to float rounding
(tests/policies/test_kv_reuse.py).
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from hsjax.policies.sampler import Kept, Prefix, bucket_length


@dataclasses.dataclass(frozen=True)
class _Row:
    row: int  # the row of the kept caches
    tokens: tuple  # the token ids its slots hold, in order
    end: int  # one past its last filled slot


class TurnCache:
    """The kept caches of one policy's last seeded generation (see the module docstring)."""

    def __init__(self, sampler):
        self.sampler = sampler
        self.clear()

    def clear(self) -> None:
        self._kept: Kept | None = None
        self._rows: dict[int, _Row] = {}

    def plan(self, prompts: Sequence[Sequence[int]], turn_seeds: Sequence[tuple[int, int]]):
        """(prompts to prefill, their offsets, `Prefix` or None): the new tokens of every row that
        continues a kept sequence, the whole prompt of the others."""
        hits = []
        for prompt, (sid, _) in zip(prompts, turn_seeds):
            hit = self._rows.get(int(sid))
            ok = (hit is not None and len(prompt) > len(hit.tokens)
                  and tuple(prompt[:len(hit.tokens)]) == hit.tokens)
            hits.append(hit if ok else None)
        if not any(hits):
            return [list(p) for p in prompts], [0] * len(prompts), None
        news = [list(p[len(h.tokens):]) if h else list(p) for p, h in zip(prompts, hits)]
        offsets = [len(h.tokens) if h else 0 for h in hits]
        batch = self.sampler.batch_size(len(prompts))
        # Compacted: the key of position p goes to slot p. The kept caches hold each turn's padding
        # (a left-padded prompt bucket, the unused generation budget); carried over as they are, a
        # row's slots would grow by a whole bucket every turn (4,256 slots for 900 tokens after 8
        # turns), and every decode step reads all of them. Attention masks by position, not slot.
        kept = self._kept
        old_pos = np.asarray(kept.pos_BxS)
        slots = bucket_length(max(int(old_pos[h.row].max()) + 1 for h in hits if h),
                              self.sampler.prompt_min, self.sampler.prompt_step)
        rows = np.zeros((batch,), np.int32)
        slot_of = np.zeros((batch, slots), np.int32)  # the kept slot that holds position p
        pos = np.full((batch, slots), -1, np.int32)
        for i, h in enumerate(hits):
            if h:
                held = np.nonzero(old_pos[h.row] >= 0)[0]
                rows[i] = h.row
                slot_of[i, old_pos[h.row, held]] = held
                pos[i, old_pos[h.row, held]] = old_pos[h.row, held]
        k = tuple(_gather(x, rows, slot_of) for x in kept.k)
        v = tuple(_gather(x, rows, slot_of) for x in kept.v)
        return news, offsets, Prefix(k, v, jnp.asarray(pos))

    def record(self, prompts: Sequence[Sequence[int]], turn_seeds: Sequence[tuple[int, int]],
               kept_ids: Sequence[Sequence[int]], kept: Kept) -> None:
        """Keeps `kept` for the next call: row i covers prompts[i] + kept_ids[i] (the reply as the
        policy returned it, after any stop-string cut); slots past that hold no key."""
        ends = np.zeros((kept.pos_BxS.shape[0],), np.int32)
        self._rows = {}
        for i, (prompt, (sid, _), ids) in enumerate(zip(prompts, turn_seeds, kept_ids)):
            ends[i] = kept.gen_start + len(ids)
            self._rows[int(sid)] = _Row(i, tuple(int(t) for t in prompt) + tuple(int(t) for t in ids), int(ends[i]))
        slot_S = jnp.arange(kept.pos_BxS.shape[1])
        pos = jnp.where(slot_S[None, :] < jnp.asarray(ends)[:, None], kept.pos_BxS, -1)
        self._kept = Kept(kept.k, kept.v, pos, kept.gen_start)


@jax.jit
def _gather(x_BxKxSxH, rows_B, slot_of_BxC):
    """x[rows[b], :, slot_of[b, c], :] as a BxKxCxH array."""
    x = jnp.take(x_BxKxSxH, rows_B, axis=0)
    return jnp.take_along_axis(x, slot_of_BxC[:, None, :, None], axis=2)
