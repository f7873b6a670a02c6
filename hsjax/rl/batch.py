"""`TrainBatch`: the fixed slot layout of one GRPO update, and `pack`, which fills it from rollouts.

Layout: G groups x S slots, S = n base + R rescue slots (R = k siblings x m rollouts each). Slot s
of group g is row g * S + s; base slots are 0..n-1, rescue slots n..S-1. Every shape depends only
on (G, S, T), never on how many groups were rescued: an absent trajectory is a row with
`valid_B = 0`, so batches with any rescue pattern run the same compiled update.

Token arrays are aligned with `tokens_BxT` (see `hsjax/rl/losses.py`): `loss_mask_BxT[b, t]` and
`old_logp_BxT[b, t]` describe token t itself. A trajectory with several segments (the harness
rewrote its history) is packed into one row: segment i gets `segment_ids = i + 1` and positions
restarting at 0; padding has segment id 0, position -1 and loss mask 0.
"""
import dataclasses
from typing import Any, Optional, Sequence, Union

import numpy as np
from flax import struct

RESCUE_CONTEXTS = ("as_generated", "base")
OVERLONG_POLICIES = ("error", "drop")


@struct.dataclass
class TrainBatch:
    """Dense arrays of one update; B = G * S rows, T a bucketed length.

    tokens_BxT       int32  token ids (pad_id on padding)
    positions_BxT    int32  position within the segment; -1 on padding
    segment_ids_BxT  int32  1, 2, ... per packed segment; 0 on padding
    loss_mask_BxT    bool   token t was produced by the policy and is trained
    old_logp_BxT     f32    the sampler's logp of token t, in the context it was generated in;
                            0 where the loss mask is 0
    reward_B         f32    episode reward of the slot (0 where invalid)
    group_B          int32  group index g of the row
    slot_B           int32  slot index s of the row
    harness_B        int32  id of the harness the trajectory ran under (host-side name table);
                            -1 for empty slots
    is_rescue_B      bool   s >= n
    valid_B          bool   the slot holds a trajectory
    recontext_B      bool   the row holds a rescue trajectory's actions re-rendered into the base
                            harness context (`rescue_context='base'`); its `old_logp_BxT` is still
                            the sampler's logp in the sibling context (the behaviour policy)
    overlong_B       bool   the slot's trajectory was dropped for exceeding the largest bucket
    num_groups       static G
    ref_logp_BxT     f32 or None: logp of token t under the reference policy (filled by the loop)
    """

    tokens_BxT: Any
    positions_BxT: Any
    segment_ids_BxT: Any
    loss_mask_BxT: Any
    old_logp_BxT: Any
    reward_B: Any
    group_B: Any
    slot_B: Any
    harness_B: Any
    is_rescue_B: Any
    valid_B: Any
    recontext_B: Any
    overlong_B: Any
    num_groups: int = struct.field(pytree_node=False)
    ref_logp_BxT: Any = None

    @property
    def shape(self) -> tuple:
        return tuple(self.tokens_BxT.shape)


@dataclasses.dataclass
class GroupRollouts:
    """The trajectories of one task: its base rollouts and the rescue rollouts, if any.

    base:            trajectories under the base harness, in slot order (at most n)
    base_harness:    harness id of the base harness
    rescue:          trajectories under sibling harnesses, in slot order (at most R = k * m)
    rescue_harness:  harness id of each rescue trajectory
    rescue_in_base:  for `rescue_context='base'`: per rescue trajectory, its actions re-rendered
                     into the base harness context, or None where that is impossible (the row is
                     then trained as generated). A re-rendering is trajectory-like (`segments` of
                     tokens, loss_mask, logprobs) whose loss-mask tokens are the rescue trajectory's
                     sampled tokens and whose logprobs are their sampler logprobs in the sibling
                     context. Rewards always come from `rescue`.

    Trajectories are duck-typed like `hsjax.rollout.engine.Trajectory`: `.segments` (each with equal-length
    `tokens`, `loss_mask`, `logprobs`) and `.result['reward']`.
    """

    base: Sequence[Any]
    base_harness: int
    rescue: Sequence[Any] = ()
    rescue_harness: Sequence[int] = ()
    rescue_in_base: Optional[Sequence[Optional[Any]]] = None


def bucket_length(length: int, T_buckets: Union[int, Sequence[int]]) -> Optional[int]:
    """The padded length for a longest row of `length` tokens; None if no bucket fits.

    An int bucket rounds up to its next multiple (at least one multiple); a sequence picks its
    smallest entry that fits.
    """
    if isinstance(T_buckets, (int, np.integer)):
        if T_buckets < 2:
            raise ValueError(f"T_buckets={T_buckets}: a bucket multiple must be >= 2")
        return max(1, -(-length // int(T_buckets))) * int(T_buckets)
    buckets = sorted(int(b) for b in T_buckets)
    if not buckets or buckets[0] < 2:
        raise ValueError(f"T_buckets={list(T_buckets)}: give at least one bucket, each >= 2")
    return next((b for b in buckets if b >= length), None)


def _row_arrays(trajectory, where: str):
    """Concatenates a trajectory's segments into (tokens, positions, segment_ids, mask, logp)."""
    parts = []
    for i, seg in enumerate(trajectory.segments):
        tokens = np.asarray(seg.tokens, np.int32)
        mask = np.asarray(seg.loss_mask).astype(bool)
        logp = np.asarray(seg.logprobs, np.float32)
        if not (tokens.ndim == 1 and tokens.shape == mask.shape == logp.shape):
            raise ValueError(f"{where}, segment {i}: tokens, loss_mask and logprobs must be 1-D of "
                             f"equal length, got {tokens.shape}, {mask.shape}, {logp.shape}")
        n = len(tokens)
        parts.append((tokens, np.arange(n, dtype=np.int32), np.full(n, i + 1, np.int32), mask,
                      np.where(mask, logp, 0.0).astype(np.float32)))
    if not parts:
        empty = np.zeros(0, np.int32)
        return empty, empty, empty, np.zeros(0, bool), np.zeros(0, np.float32)
    return tuple(np.concatenate(cols) for cols in zip(*parts))


def _reward(trajectory, where: str) -> float:
    try:
        return float(trajectory.result["reward"])
    except (KeyError, TypeError, AttributeError):
        raise ValueError(f"{where}: trajectory.result has no 'reward'; the episode must report "
                         "its reward under result['reward']") from None


def _slot_contents(group: GroupRollouts, g: int, n: int, R: int, rescue_context: str):
    """Yields (slot, trajectory for tokens, reward, harness id, recontext) for the filled slots."""
    if len(group.base) > n:
        raise ValueError(f"group {g} has {len(group.base)} base trajectories but n={n} base slots")
    if len(group.rescue) > R:
        raise ValueError(f"group {g} has {len(group.rescue)} rescue trajectories but R={R} rescue "
                         "slots (k siblings x m each)")
    if len(group.rescue_harness) != len(group.rescue):
        raise ValueError(f"group {g}: rescue_harness has {len(group.rescue_harness)} ids for "
                         f"{len(group.rescue)} rescue trajectories")
    rerendered = group.rescue_in_base
    if rescue_context == "base" and group.rescue and rerendered is None:
        raise ValueError(f"group {g}: rescue_context='base' needs GroupRollouts.rescue_in_base "
                         "(one re-rendering or None per rescue trajectory)")
    if rescue_context == "as_generated" and rerendered is not None:
        raise ValueError(f"group {g} carries rescue_in_base, but rescue_context='as_generated' "
                         "would ignore it; pack with rescue_context='base' or drop the re-renderings")
    if rerendered is not None and len(rerendered) != len(group.rescue):
        raise ValueError(f"group {g}: rescue_in_base has {len(rerendered)} entries for "
                         f"{len(group.rescue)} rescue trajectories")
    for s, traj in enumerate(group.base):
        yield s, traj, _reward(traj, f"group {g} slot {s}"), group.base_harness, False
    for j, traj in enumerate(group.rescue):
        alt = rerendered[j] if rerendered is not None else None
        reward = _reward(traj, f"group {g} slot {n + j}")
        yield n + j, (traj if alt is None else alt), reward, group.rescue_harness[j], alt is not None


def pack(
    groups: Sequence[GroupRollouts],
    G: int,
    n: int,
    R: int,
    T_buckets: Union[int, Sequence[int]],
    pad_id: int,
    *,
    rescue_context: str = "as_generated",
    overlong: str = "error",
) -> TrainBatch:
    """Packs up to G groups into the fixed (G * (n + R)) x T layout; missing groups stay invalid.

    T is the bucket of the longest row (`bucket_length`). A row longer than every bucket is never
    truncated: `overlong='error'` raises, `overlong='drop'` leaves its slot invalid with
    `overlong_B = 1` (its reward then no longer counts for the group; the update reports
    `batch/overlong_frac`). Returns host (NumPy) arrays; the loop places them on devices.
    """
    if rescue_context not in RESCUE_CONTEXTS:
        raise ValueError(f"rescue_context={rescue_context!r} is not one of {RESCUE_CONTEXTS}")
    if overlong not in OVERLONG_POLICIES:
        raise ValueError(f"overlong={overlong!r} is not one of {OVERLONG_POLICIES}")
    if G < 1 or n < 1 or R < 0:
        raise ValueError(f"need G >= 1, n >= 1, R >= 0; got G={G}, n={n}, R={R}")
    if len(groups) > G:
        raise ValueError(f"{len(groups)} groups do not fit a batch of G={G} groups")
    S = n + R
    B = G * S
    rows = {}
    for g, group in enumerate(groups):
        for s, traj, reward, harness, recontext in _slot_contents(group, g, n, R, rescue_context):
            rows[g * S + s] = (_row_arrays(traj, f"group {g} slot {s}"), reward, harness, recontext)

    max_bucket = None if isinstance(T_buckets, (int, np.integer)) else max(T_buckets)
    overlong_B = np.zeros(B, bool)
    for b, (arrays, *_) in list(rows.items()):
        if bucket_length(len(arrays[0]), T_buckets) is None:
            if overlong == "error":
                raise ValueError(
                    f"group {b // S} slot {b % S} has {len(arrays[0])} tokens, more than the largest "
                    f"bucket {max_bucket}; add a larger bucket, lower the rollout's context limit, "
                    "or pack with overlong='drop'")
            overlong_B[b] = True
            del rows[b]
    T = bucket_length(max([len(a[0]) for a, *_ in rows.values()], default=1), T_buckets)

    tokens = np.full((B, T), pad_id, np.int32)
    positions = np.full((B, T), -1, np.int32)
    segment_ids = np.zeros((B, T), np.int32)
    loss_mask = np.zeros((B, T), bool)
    old_logp = np.zeros((B, T), np.float32)
    reward = np.zeros(B, np.float32)
    harness = np.full(B, -1, np.int32)
    valid = np.zeros(B, bool)
    recontext = np.zeros(B, bool)
    for b, ((tok, pos, seg, mask, logp), r, h, rc) in rows.items():
        L = len(tok)
        tokens[b, :L], positions[b, :L], segment_ids[b, :L] = tok, pos, seg
        loss_mask[b, :L], old_logp[b, :L] = mask, logp
        reward[b], harness[b], valid[b], recontext[b] = r, h, True, rc
    slot = np.tile(np.arange(S, dtype=np.int32), G)
    return TrainBatch(
        tokens_BxT=tokens, positions_BxT=positions, segment_ids_BxT=segment_ids,
        loss_mask_BxT=loss_mask, old_logp_BxT=old_logp, reward_B=reward,
        group_B=np.repeat(np.arange(G, dtype=np.int32), S), slot_B=slot, harness_B=harness,
        is_rescue_B=slot >= n, valid_B=valid, recontext_B=recontext, overlong_B=overlong_B,
        num_groups=G,
    )


def group_by_length(batch: TrainBatch, num_micro_batches: int,
                    T_buckets: Union[int, Sequence[int]]) -> tuple[TrainBatch, tuple[int, ...]]:
    """Rows reordered so that each micro-batch holds rows of similar length, and its own length.

    The update pads every row to the batch's longest bucket; with multi-turn episodes one long row
    triples the cost of all the others, and empty slots (rescues that did not happen) cost as much
    as full ones. Here the rows are sorted by length, longest first, and micro-batch i (rows i,
    i + M, ..., as `grpo` splits them) gets the i-th block of that order; the second value gives,
    per micro-batch, the bucket of its longest row (`bucket_length`), or 0 when it holds only empty
    slots, which the update then skips (when every slot is empty, the first micro-batch runs at
    the smallest bucket). The reordering changes no result: every group statistic
    of the update goes through `group_B`, never through a row's position.
    """
    B = batch.tokens_BxT.shape[0]
    if num_micro_batches < 1 or B % num_micro_batches:
        raise ValueError(f"batch of {B} rows does not split into num_micro_batches={num_micro_batches}")
    length_B = np.asarray(batch.positions_BxT >= 0).sum(axis=1)
    order = np.argsort(-length_B, kind="stable")
    rows = B // num_micro_batches
    # Strided layout: micro-batch i is rows i, i + M, ... (grpo.split_micro), so row j * M + i
    # takes the j-th row of the i-th block of the sorted order.
    perm = order.reshape(num_micro_batches, rows).T.reshape(-1)
    longest = length_B[order].reshape(num_micro_batches, rows).max(axis=1)
    micro_T = tuple(int(bucket_length(int(n), T_buckets)) if n else 0 for n in longest)
    if not any(micro_T):
        # No row holds a token (e.g. DAPO found no group with a reward spread in its draws): run
        # one micro-batch at the smallest bucket, as the padded update runs the whole empty batch,
        # so the step is the same (no gradient; the optimizer still counts it) with or without
        # grouping instead of an update that has nothing to run.
        micro_T = (int(bucket_length(1, T_buckets)),) + (0,) * (num_micro_batches - 1)
    reordered = batch.replace(**{
        field.name: np.asarray(getattr(batch, field.name))[perm]
        for field in dataclasses.fields(batch)
        if field.name != "num_groups" and getattr(batch, field.name) is not None})
    return reordered, micro_T


def group_rollouts(tasks, groups, rescued, base_harness: int, harness_ids: dict, rerender=None):
    """The packer's view of each group of a step: its base trajectories, and its rescues as
    (trajectory, harness name) pairs with their harness ids; `rerender(task, traj)` gives a rescue
    in the base context (for `loss.rescue_context='base'`), or None to train rescues as generated."""
    out = []
    for task, trajs, rescue in zip(tasks, groups, rescued):
        in_base = [rerender(task, t) for t, _ in rescue] if rerender is not None and rescue else None
        out.append(GroupRollouts(base=trajs, base_harness=base_harness, rescue=[t for t, _ in rescue],
                                 rescue_harness=[harness_ids[name] for _, name in rescue],
                                 rescue_in_base=in_base))
    return out
