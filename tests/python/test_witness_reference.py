"""The NumPy reference alone, against the hand examples and properties of
spec/segment-witnesses.md. The differential tests trust this oracle, so it is
pinned here first: a divergence from the spec fails before any comparison
with the native core is made."""

import math

import numpy as np
import pytest

from kvselect import reference as ref


def row(*values):
    return np.array([values], dtype=np.int32)


def lens(*values):
    return np.array(values, dtype=np.int32)


def edges(length, num_segments):
    s_eff = min(num_segments, length)
    return [-(-s * length // s_eff) for s in range(s_eff)]


# ---------------------------------------------------------------------------
# The spec's hand examples
# ---------------------------------------------------------------------------


def test_a_witness_fills_only_the_segment_the_learned_row_misses():
    got = ref.topology_witness_indices(row(0, 5, 9, -1), lens(16), 4)
    assert got.dtype == np.int32
    assert got.tolist() == [[-1, -1, -1, 12]]


def test_the_merge_keeps_the_prefix_and_writes_witnesses_into_the_tail():
    got = ref.apply_topology_witnesses(row(0, 5, 9, -1), lens(16), 2, 4, 2)
    assert got.dtype == np.int32
    assert got.tolist() == [[0, 5, 12, -1]]


def test_overwriting_a_sole_tail_occupant_uncovers_its_segment():
    buf = row(0, 1, 2, 3, 12, -1, -1, -1)
    ref.scatter_topology_witnesses(buf, lens(16), 4)
    assert buf.tolist() == [[0, 1, 2, 3, 4, 8, -1, -1]]
    assert ref.segment_coverage(buf[0], 16, 4) == 0.75


def test_an_out_of_range_learned_index_is_clamped_rather_than_refused():
    # segment_of is the map itself: σ(20) = 20 with L = 4, S = 8. The
    # occupancy pass clamps it to segment 7, outside the partition of
    # S_eff = 4 segments, so the entry 20 hides no witness, and it passes
    # through the merge.
    assert ref.segment_of(20, 4, 8) == 20
    assert ref.segment_of(20, 16, 4) == 5
    assert ref.segment_of(2**31 - 1, 2**31 - 1, 4) == 4
    assert ref.topology_witness_indices(row(20, -1), lens(4), 8).tolist() == [[0, 1, 2, 3, -1, -1, -1, -1]]
    merged = ref.apply_topology_witnesses(row(20, -1, -1, -1, -1), lens(4), 1, 8, 4)
    assert merged.tolist() == [[20, 0, 1, 2, 3]]


def test_rounding_an_edge_down_does_not_round_trip_but_rounding_up_does():
    assert ref.segment_of(2, 10, 4) == 0  # floor(1 * 10 / 4) = 2 lies in segment 0
    assert edges(10, 4) == [0, 3, 5, 8]
    assert [ref.segment_of(e, 10, 4) for e in edges(10, 4)] == [0, 1, 2, 3]


def test_coverage_and_recall_match_a_hand_computed_example():
    # L = 8, S = 4: segments [0,2) [2,4) [4,6) [6,8). Dyadic weights, exact in binary.
    a = np.array([1 / 2, 0, 1 / 4, 0, 1 / 8, 1 / 32, 1 / 16, 1 / 32])
    assert a.sum() == 1.0
    # The policy: the learned row holds token 0 and a reserved tail of padding.
    policy = ref.apply_topology_witnesses(row(0, -1, -1, -1, -1), lens(8), 1, 4, 4)[0]
    assert policy.tolist() == [0, 2, 4, 6, -1]
    budget = int((policy >= 0).sum())
    assert budget == 4
    null = ref.locality_null(8, budget)
    assert null.tolist() == [4, 5, 6, 7]

    assert ref.segment_coverage(policy, 8, 4) == 1.0
    assert ref.attention_mass_recall(policy, a) == 0.9375
    assert ref.segment_coverage(null, 8, 4) == 0.5
    assert ref.attention_mass_recall(null, a) == 0.25

    # Padding, duplicates and out-of-range entries count for nothing.
    noisy = np.concatenate([policy, [0, 2, 2, -1, -7, 8, 9, 1000]]).astype(np.int32)
    assert ref.segment_coverage(noisy, 8, 4) == 1.0
    assert ref.attention_mass_recall(noisy, a) == 0.9375


# ---------------------------------------------------------------------------
# The rest of the spec's pinned tests
# ---------------------------------------------------------------------------


def test_a_disabled_policy_is_the_identity():
    learned = row(0, 5, 9, 3)
    buf = learned.copy()
    ref.scatter_topology_witnesses(buf, lens(16), 0)
    assert buf.tolist() == learned.tolist()
    # B = 0 through max_replacements = 0, and through learned_keep = topk.
    assert ref.apply_topology_witnesses(learned, lens(16), 0, 4, 0).tolist() == learned.tolist()
    assert ref.apply_topology_witnesses(learned, lens(16), 4, 4, 4).tolist() == learned.tolist()
    empty = np.zeros((0, 4), dtype=np.int32)
    assert ref.apply_topology_witnesses(empty, lens(), 0, 4, 4).shape == (0, 4)


def test_short_and_empty_rows_follow_the_source_fallback():
    learned = np.full((3, 6), -1, dtype=np.int32)
    learned[2, 0] = 1
    w = ref.topology_witness_indices(learned, lens(0, -5, 3), 8)
    assert w[0].tolist() == [-1] * 8
    assert w[1].tolist() == [-1] * 8
    # L = 3 < S: every token the row does not hold is a witness.
    assert w[2].tolist() == [0, -1, 2, -1, -1, -1, -1, -1]
    merged = ref.apply_topology_witnesses(learned, lens(0, -5, 3), 0, 8, 6)
    assert merged[:2].tolist() == [[-1] * 6, [-1] * 6]
    assert merged[2].tolist() == [0, 2, -1, -1, -1, -1]


def test_malformed_calls_are_refused():
    learned = row(0, 5, 9, -1)
    with pytest.raises(ref.ReferenceWitnessError) as e:
        ref.topology_witness_indices(learned, lens(16, 16), 4)
    assert (e.value.variant, e.value.learned_len, e.value.topk, e.value.rows) == ("RowsMismatch", 4, 4, 2)
    assert e.value.argument == "context_lens"  # as natively
    with pytest.raises(ref.ReferenceWitnessError) as e:
        ref.topology_witness_indices(learned, lens(16), 0)
    assert (e.value.variant, e.value.num_segments, e.value.argument) == ("SegmentsOutOfRange", 0, "num_segments")
    for s in (0, 65):
        with pytest.raises(ref.ReferenceWitnessError) as e:
            ref.apply_topology_witnesses(learned, lens(16), 0, s, 4)
        assert (e.value.variant, e.value.num_segments, e.value.argument) == ("SegmentsOutOfRange", s, "num_segments")
    with pytest.raises(ref.ReferenceWitnessError) as e:
        ref.apply_topology_witnesses(learned, lens(16), 5, 4, 4)
    assert (e.value.variant, e.value.learned_keep, e.value.topk) == ("LearnedKeepOutOfRange", 5, 4)
    assert e.value.argument == "learned_keep"
    buf = learned.copy()
    with pytest.raises(ref.ReferenceWitnessError) as e:
        ref.scatter_topology_witnesses(buf, lens(16), 65)
    assert (e.value.variant, e.value.argument) == ("SegmentsOutOfRange", "num_segments")
    assert buf.tolist() == learned.tolist()
    assert isinstance(e.value, ValueError)


def test_more_than_64_segments_are_accepted_by_the_witness_indices():
    w = ref.topology_witness_indices(row(-1), lens(1000), 100)
    assert w.tolist() == [edges(1000, 100)]


@pytest.mark.parametrize("length", [1, 2, 3, 7, 10, 63, 64, 65, 127, 1000, 2**31 - 1])
def test_every_witness_lands_in_its_own_segment(length):
    for s in range(1, 65):
        w = ref.topology_witness_indices(np.full((1, 1), -1, np.int32), lens(length), s)[0]
        s_eff = min(s, length)
        assert w[:s_eff].tolist() == edges(length, s)
        assert (w[s_eff:] == -1).all()
        assert [ref.segment_of(int(e), length, s) for e in w[:s_eff]] == list(range(s_eff))


def random_rows(rng, rows, topk, length):
    learned = rng.integers(0, length, size=(rows, topk)).astype(np.int32)
    learned[rng.random((rows, topk)) < 0.3] = -1
    return learned


def test_witnesses_are_causal_distinct_disjoint_and_complete():
    rng = np.random.default_rng(7)
    for _ in range(200):
        length = int(rng.integers(1, 5000))
        s = int(rng.integers(1, 65))
        learned = random_rows(rng, 3, int(rng.integers(1, 40)), length)
        w = ref.topology_witness_indices(learned, lens(*[length] * 3), s)
        for k, wit in zip(learned, w):
            wit = wit[wit >= 0]
            assert ((0 <= wit) & (wit < length)).all()
            assert len(set(wit.tolist())) == len(wit)
            assert not set(wit.tolist()) & set(k.tolist())
            union = [x for x in k.tolist() + wit.tolist() if x >= 0]
            assert ref.segment_coverage(np.array(union), length, s) == 1.0


def test_the_serving_row_is_causal_distinct_ordered_and_within_budget():
    rng = np.random.default_rng(11)
    for _ in range(200):
        length = int(rng.integers(1, 5000))
        s = int(rng.integers(1, 65))
        topk = int(rng.integers(1, 100))
        learned = np.full((1, topk), -1, dtype=np.int32)
        distinct = rng.permutation(length)[: min(topk, length)]
        learned[0, : len(distinct)] = distinct
        buf = learned.copy()
        ref.scatter_topology_witnesses(buf, lens(length), s)
        keep = max(topk - s, 0)
        assert buf[0, :keep].tolist() == learned[0, :keep].tolist()
        changed = np.nonzero(buf[0] != learned[0])[0]
        assert ((changed >= keep) & (changed < keep + min(s, topk))).all()
        wit = ref.topology_witness_indices(learned, lens(length), s)[0]
        wit = wit[wit >= 0][: topk - keep]
        assert buf[0, keep : keep + len(wit)].tolist() == wit.tolist()
        assert (np.diff(wit) > 0).all()
        valid = buf[0][buf[0] >= 0]
        assert len(set(valid.tolist())) == len(valid)
        assert (valid < length).all()


def test_every_segment_is_covered_when_the_reserved_tail_is_padding():
    rng = np.random.default_rng(13)
    for _ in range(200):
        length = int(rng.integers(1, 5000))
        s = int(rng.integers(1, 65))
        keep = int(rng.integers(0, 50))
        learned = np.full((1, keep + s), -1, dtype=np.int32)
        learned[0, :keep] = rng.integers(-1, length, size=keep)
        buf = learned.copy()
        ref.scatter_topology_witnesses(buf, lens(length), s)
        assert ref.segment_coverage(buf[0], length, s) == 1.0


def test_permuting_the_learned_row_leaves_the_witness_set_unchanged():
    rng = np.random.default_rng(17)
    for _ in range(100):
        length = int(rng.integers(1, 3000))
        s = int(rng.integers(1, 65))
        learned = random_rows(rng, 1, int(rng.integers(1, 50)), length)
        shuffled = learned[:, rng.permutation(learned.shape[1])]
        a = ref.topology_witness_indices(learned, lens(length), s)
        b = ref.topology_witness_indices(shuffled, lens(length), s)
        assert a.tolist() == b.tolist()
    # The merge is positional: moving a token across the keep boundary
    # changes the retained set.
    first = ref.apply_topology_witnesses(row(0, 5, 9, -1), lens(16), 2, 4, 2)[0]
    moved = ref.apply_topology_witnesses(row(5, 9, 0, -1), lens(16), 2, 4, 2)[0]
    assert set(first.tolist()) - {-1} == {0, 5, 12}
    assert set(moved.tolist()) - {-1} == {5, 9, 12}


def test_the_locality_null_is_the_most_recent_tokens_at_the_policy_budget():
    for length in (0, 1, 5, 100):
        for budget in (0, 1, 4, 5, 200):
            k = min(budget, length)
            got = ref.locality_null(length, budget)
            assert got.dtype == np.int32
            assert got.tolist() == list(range(length - k, length))


# ---------------------------------------------------------------------------
# Decisions the spec leaves implicit
# ---------------------------------------------------------------------------


def test_any_negative_entry_is_padding_and_passes_through():
    w = ref.topology_witness_indices(row(-7, -(2**31), 5, -1), lens(16), 4)
    assert w.tolist() == [[0, -1, 8, 12]]
    merged = ref.apply_topology_witnesses(row(-7, -(2**31), 5, -1, -3, -3), lens(16), 2, 4, 4)
    assert merged.tolist() == [[-7, -(2**31), 0, 8, 12, -3]]


def test_slots_after_the_last_witness_are_left_unchanged():
    merged = ref.apply_topology_witnesses(row(0, 4, 8, 99, 77), lens(16), 3, 4, 2)
    assert merged.tolist() == [[0, 4, 8, 99, 77]]  # 99 marks segment 3: nothing is missing
    # Budget 3 reaches slot 4, but there are only two witnesses: slot 4 stays.
    merged = ref.apply_topology_witnesses(row(0, 4, 1, 2, 5), lens(16), 2, 4, 3)
    assert merged.tolist() == [[0, 4, 8, 12, 5]]


def test_witnesses_beyond_the_budget_are_dropped_in_ascending_segment_order():
    merged = ref.apply_topology_witnesses(row(-1, -1, -1, -1), lens(16), 1, 4, 2)
    assert merged.tolist() == [[-1, 0, 4, -1]]


def test_segment_of_reads_a_zero_length_as_one_and_zero_segments_as_segment_zero():
    assert ref.segment_of(5, 0, 4) == 5  # L' = 1, S_eff = 1, floor(5 * 1 / 1), no clamp
    assert ref.segment_of(0, 0, 4) == 0
    assert ref.segment_of(123, 10, 0) == 0
    big = 2**70
    assert ref.segment_of(big, big, 3) == 3
    assert ref.segment_of(big - 1, big, 3) == 2
    assert ref.segment_of(big // 3, big, 3) == 0


def test_coverage_is_one_without_segments_and_recall_is_nan_without_mass():
    assert ref.segment_coverage(np.array([], np.int32), 0, 4) == 1.0
    assert ref.segment_coverage(np.array([1], np.int32), 10, 0) == 1.0
    assert ref.segment_coverage(np.array([-1, 10], np.int32), 10, 4) == 0.0
    assert math.isnan(ref.attention_mass_recall(np.array([0], np.int32), np.zeros(3)))
    # The plain quotient, as the original: something kept from a row summing to 0.
    assert ref.attention_mass_recall(np.array([0], np.int32), np.array([1.0, -1.0])) == math.inf


def test_a_rows_mismatch_is_judged_on_the_entry_count():
    # topk = 0: no entry needs a range, so any number of rows is accepted.
    w = ref.topology_witness_indices(np.zeros((3, 0), np.int32), lens(16, 16), 4)
    assert w.tolist() == [[0, 4, 8, 12], [0, 4, 8, 12]]
