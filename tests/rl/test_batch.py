"""TrainBatch packing: slot layout, segments, buckets, overlong handling, rescue contexts."""
import jax
import numpy as np
import pytest

from hsjax.rl.batch import GroupRollouts, TrainBatch, bucket_length, group_by_length, pack
from hsjax.rollout.engine import Segment, Trajectory

PAD = 0


def traj(reward, *lengths, seed=0, policy_from=2):
    """A trajectory with one segment per length; tokens after `policy_from` are policy tokens."""
    rng = np.random.default_rng(seed)
    segments = []
    for n in lengths:
        tokens = rng.integers(1, 100, n).astype(np.int32)
        mask = (np.arange(n) >= policy_from).astype(np.int32)
        logp = np.where(mask, -rng.random(n), 0.0).astype(np.float32)
        segments.append(Segment(tokens=tokens, loss_mask=mask, logprobs=logp))
    return Trajectory(result={"reward": reward}, segments=segments, turns=[],
                      num_generated_tokens=0, timings={})


def test_slot_layout_rows_and_padding():
    groups = [GroupRollouts(base=[traj(1.0, 5), traj(0.0, 7)], base_harness=0),
              GroupRollouts(base=[traj(0.0, 3)], base_harness=0,
                            rescue=[traj(1.0, 4)], rescue_harness=[3])]
    batch = pack(groups, G=3, n=2, R=2, T_buckets=8, pad_id=PAD)
    S = 4
    assert batch.shape == (12, 8) and batch.num_groups == 3
    np.testing.assert_array_equal(batch.group_B, np.repeat(np.arange(3), S))
    np.testing.assert_array_equal(batch.slot_B, np.tile(np.arange(S), 3))
    np.testing.assert_array_equal(batch.is_rescue_B, np.tile([0, 0, 1, 1], 3))
    np.testing.assert_array_equal(batch.valid_B, [1, 1, 0, 0, 1, 0, 1, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(batch.harness_B, [0, 0, -1, -1, 0, -1, 3, -1] + [-1] * 4)
    np.testing.assert_array_equal(batch.reward_B[[0, 1, 4, 6]], [1, 0, 0, 1])
    # Row 1 (group 0, slot 1): 7 tokens then one pad.
    assert list(batch.positions_BxT[1]) == list(range(7)) + [-1]
    assert list(batch.segment_ids_BxT[1]) == [1] * 7 + [0]
    assert batch.tokens_BxT[1, 7] == PAD and not batch.loss_mask_BxT[1, 7]
    # Invalid rows are all padding.
    assert (batch.positions_BxT[2] == -1).all() and not batch.loss_mask_BxT[2].any()
    # Token arrays keep the trajectory's values, aligned with the tokens.
    seg = groups[0].base[1].segments[0]
    np.testing.assert_array_equal(batch.tokens_BxT[1, :7], seg.tokens)
    np.testing.assert_array_equal(batch.loss_mask_BxT[1, :7], seg.loss_mask.astype(bool))
    np.testing.assert_array_equal(batch.old_logp_BxT[1, :7], seg.logprobs)


def test_segments_pack_into_one_row_with_restarting_positions():
    batch = pack([GroupRollouts(base=[traj(0.0, 3, 4)], base_harness=1)], G=1, n=1, R=0,
                 T_buckets=[4, 8, 16], pad_id=PAD)
    assert batch.shape == (1, 8)
    assert list(batch.positions_BxT[0]) == [0, 1, 2, 0, 1, 2, 3, -1]
    assert list(batch.segment_ids_BxT[0]) == [1, 1, 1, 2, 2, 2, 2, 0]


def test_shapes_do_not_depend_on_the_rescue_pattern():
    base = [traj(0.0, 6, seed=i) for i in range(2)]
    no_rescue = pack([GroupRollouts(base=base, base_harness=0)] * 2, G=2, n=2, R=2,
                     T_buckets=16, pad_id=PAD)
    rescued = pack([GroupRollouts(base=base, base_harness=0, rescue=[traj(1.0, 9)] * 2,
                                  rescue_harness=[1, 2])] * 2, G=2, n=2, R=2, T_buckets=16,
                   pad_id=PAD)
    assert jax.tree.structure(no_rescue) == jax.tree.structure(rescued)
    assert [x.shape for x in jax.tree.leaves(no_rescue)] == [x.shape for x in jax.tree.leaves(rescued)]


def test_bucket_length():
    assert bucket_length(1, 128) == 128 and bucket_length(129, 128) == 256
    assert bucket_length(0, 128) == 128
    assert bucket_length(300, [256, 512, 1024]) == 512
    assert bucket_length(2000, [256, 512, 1024]) is None
    with pytest.raises(ValueError):
        bucket_length(5, [])


def test_overlong_rows_error_or_drop_with_count():
    groups = [GroupRollouts(base=[traj(1.0, 5), traj(0.0, 20)], base_harness=0)]
    with pytest.raises(ValueError, match="largest bucket 16"):
        pack(groups, G=1, n=2, R=0, T_buckets=[8, 16], pad_id=PAD)
    batch = pack(groups, G=1, n=2, R=0, T_buckets=[8, 16], pad_id=PAD, overlong="drop")
    assert batch.shape == (2, 8)
    np.testing.assert_array_equal(batch.valid_B, [1, 0])
    np.testing.assert_array_equal(batch.overlong_B, [0, 1])


def test_rescue_context_base_packs_re_renderings_with_rescue_rewards():
    rescue = [traj(1.0, 6, seed=1), traj(0.0, 6, seed=2)]
    rerendered = [traj(-5.0, 10, seed=3), None]  # the second one could not be re-rendered
    group = GroupRollouts(base=[traj(0.0, 4)], base_harness=0, rescue=rescue,
                          rescue_harness=[4, 5], rescue_in_base=rerendered)
    batch = pack([group], G=1, n=1, R=2, T_buckets=16, pad_id=PAD, rescue_context="base")
    np.testing.assert_array_equal(batch.recontext_B, [0, 1, 0])
    np.testing.assert_array_equal(batch.reward_B, [0.0, 1.0, 0.0])
    np.testing.assert_array_equal(batch.tokens_BxT[1, :10], rerendered[0].segments[0].tokens)
    np.testing.assert_array_equal(batch.tokens_BxT[2, :6], rescue[1].segments[0].tokens)
    np.testing.assert_array_equal(batch.harness_B, [0, 4, 5])
    with pytest.raises(ValueError, match="rescue_in_base"):
        pack([GroupRollouts(base=[traj(0.0, 4)], base_harness=0, rescue=rescue,
                            rescue_harness=[4, 5])], G=1, n=1, R=2, T_buckets=16, pad_id=PAD,
             rescue_context="base")
    with pytest.raises(ValueError, match="as_generated"):
        pack([group], G=1, n=1, R=2, T_buckets=16, pad_id=PAD)


@pytest.mark.parametrize("kwargs,match", [
    (dict(G=1), "do not fit"),
    (dict(n=1), "base slots"),
    (dict(R=0), "rescue slots"),
])
def test_layout_overflow_is_an_error(kwargs, match):
    groups = [GroupRollouts(base=[traj(0.0, 3)] * 2, base_harness=0, rescue=[traj(1.0, 3)],
                            rescue_harness=[1])] * 2
    args = dict(G=2, n=2, R=1, T_buckets=8, pad_id=PAD) | kwargs
    with pytest.raises(ValueError, match=match):
        pack(groups, **args)


def test_missing_reward_and_ragged_segment_are_named():
    bad = traj(0.0, 3)
    bad.result = {}
    with pytest.raises(ValueError, match=r"group 0 slot 0.*reward"):
        pack([GroupRollouts(base=[bad], base_harness=0)], G=1, n=1, R=0, T_buckets=8, pad_id=PAD)
    with pytest.raises(ValueError, match="rescue_harness"):
        pack([GroupRollouts(base=[traj(0.0, 3)], base_harness=0, rescue=[traj(1.0, 3)])],
             G=1, n=1, R=1, T_buckets=8, pad_id=PAD)


def test_empty_batch_is_all_invalid():
    batch = pack([], G=2, n=2, R=1, T_buckets=[16, 32], pad_id=PAD)
    assert isinstance(batch, TrainBatch) and batch.shape == (6, 16)
    assert not batch.valid_B.any() and batch.ref_logp_BxT is None


def test_group_by_length_orders_rows_into_micro_batches_and_names_a_bad_split():
    groups = [GroupRollouts(base=[traj(1.0, 5), traj(0.0, 30)], base_harness=0),
              GroupRollouts(base=[traj(0.0, 12), traj(1.0, 3)], base_harness=0)]
    batch = pack(groups, G=3, n=2, R=0, T_buckets=(8, 16, 32), pad_id=PAD)
    grouped, micro_T = group_by_length(batch, 3, (8, 16, 32))
    # Lengths 30, 12 | 5, 3 | 0, 0; micro-batch i is rows i and i + 3.
    assert micro_T == (32, 8, 0)
    lengths = (grouped.positions_BxT >= 0).sum(1)
    assert [sorted(lengths[i::3].tolist()) for i in range(3)] == [[12, 30], [3, 5], [0, 0]]
    assert grouped.reward_B[np.argmax(lengths)] == 0.0 and grouped.num_groups == 3
    with pytest.raises(ValueError, match="does not split into num_micro_batches=4"):
        group_by_length(batch, 4, (8, 16, 32))
