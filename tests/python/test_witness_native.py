"""The native witness functions against the NumPy reference, and the binding
contract of docs/conventions.md: refusals, the in-place and zero-copy contract of the
serving entry point, lossless integer conversion, ``out=`` buffers, and the
properties of the random null (whose draws NumPy cannot reproduce).

The randomised configurations are reproducible: a failing case names its seed,
and ``make_case(seed)`` rebuilds it."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import kvselect as ks
from kvselect import reference as ref

I32_MAX = 2**31 - 1
I32_MIN = -(2**31)
U64_MAX = 2**64 - 1

N_CASES = 1200
SEED_BASE = 20251129


# ---------------------------------------------------------------------------
# Randomised configurations
# ---------------------------------------------------------------------------


def _pick(rng, weighted):
    """One of ``weighted``'s values, chosen with its weight."""
    weights = np.array([w for w, _ in weighted], dtype=float)
    i = rng.choice(len(weighted), p=weights / weights.sum())
    value = weighted[i][1]
    return value() if callable(value) else value


def _context_len(rng, s):
    return int(
        _pick(
            rng,
            [
                (3, lambda: int(rng.choice([0, -1, -2, I32_MIN, int(rng.integers(I32_MIN, 0))]))),
                (4, lambda: int(rng.integers(1, s)) if s > 1 else 1),  # L < S: S_eff = L
                (4, lambda: int(rng.integers(1, 200))),
                (4, lambda: int(rng.integers(1, 100_000))),
                (2, lambda: I32_MAX - int(rng.integers(0, 3))),
                (3, lambda: int(rng.integers(1, I32_MAX, endpoint=True))),
            ],
        )
    )


def _learned_row(rng, topk, length):
    """A learned row: in-range tokens, padding (-1 and other negatives),
    out-of-range entries and duplicates, in proportions that vary per row."""
    hi = max(length, 1)
    row = rng.integers(0, hi, size=topk, dtype=np.int64)
    if rng.random() < 0.3:
        row.sort()
    u = rng.random(topk)
    p_pad, p_neg, p_oor, p_dup = rng.random(4) * np.array([0.6, 0.1, 0.1, 0.3])
    neg = rng.integers(I32_MIN, 0, size=topk)
    neg[rng.random(topk) < 0.5] = I32_MIN
    oor_lo = max(length, 0)
    oor = rng.integers(oor_lo, I32_MAX, size=topk, endpoint=True)
    row = np.where(u < p_pad, -1, row)
    row = np.where((u >= p_pad) & (u < p_pad + p_neg), neg, row)
    row = np.where((u >= p_pad + p_neg) & (u < p_pad + p_neg + p_oor), oor, row)
    if topk > 1:
        dup = rng.random(topk) < p_dup
        row[dup] = row[rng.integers(0, topk, size=int(dup.sum()))]
    if rng.random() < 0.25:  # a serving row: the reserved tail is padding
        row[max(topk - int(rng.integers(1, 65)), 0) :] = -1
    return row


def make_case(seed):
    rng = np.random.default_rng([SEED_BASE, seed])
    rows = _pick(rng, [(1, 0), (4, 1), (8, lambda: int(rng.integers(2, 9))), (7, lambda: int(rng.integers(9, 41)))])
    topk = _pick(
        rng,
        [
            (1, 0),
            (6, lambda: int(rng.integers(1, 9))),
            (8, lambda: int(rng.integers(9, 129))),
            (3, lambda: int(rng.integers(129, 2049))),
            (1, 2048),
        ],
    )
    while rows * topk > 60_000:
        rows //= 2
    s = _pick(rng, [(2, 1), (2, 64), (3, lambda: int(rng.integers(1, 9))), (8, lambda: int(rng.integers(1, 65)))])
    s_wit = s if rng.random() < 0.7 else int(rng.choice([65, 100, 128, 300, int(rng.integers(65, 1025))]))
    context_lens = np.array([_context_len(rng, s) for _ in range(rows)], dtype=np.int64)
    learned = np.zeros((rows, topk), dtype=np.int64)
    for r in range(rows):
        learned[r] = _learned_row(rng, topk, int(context_lens[r]))
    keep = _pick(
        rng,
        [
            (3, 0),
            (4, max(topk - s, 0)),
            (2, topk),
            (4, lambda: int(rng.integers(0, topk + 1))),
        ],
    )
    max_replacements = _pick(
        rng,
        [
            (2, 0),
            (3, s),
            (3, topk - keep),
            (2, lambda: topk - keep + int(rng.integers(1, 100))),  # more than the tail holds
            (3, lambda: int(rng.integers(0, s + 1))),
            (1, U64_MAX),
        ],
    )
    scatter_s = s if rng.random() < 0.95 else 0  # the off switch
    # One fault at a time, in a few cases, so refusals are compared as well.
    fault = _pick(rng, [(92, None), (2, "rows"), (2, "segments"), (2, "keep"), (2, "zero")])
    if fault == "rows" and topk > 0:
        context_lens = np.append(context_lens, 5)
    elif fault == "segments":
        s = int(rng.integers(65, 200))
        scatter_s = s
    elif fault == "keep":
        keep = topk + int(rng.integers(1, 10))
    elif fault == "zero":
        s = 0
        s_wit = 0
    return dict(
        seed=seed,
        learned=learned.astype(np.int32),
        context_lens=context_lens.astype(np.int32),
        s=s,
        s_wit=s_wit,
        scatter_s=scatter_s,
        keep=keep,
        max_replacements=max_replacements,
        rng=rng,
    )


def both(native_call, reference_call):
    """Runs both; returns their results, or asserts they refuse alike."""
    try:
        want = reference_call()
    except ref.ReferenceWitnessError as e:
        with pytest.raises(ks.WitnessError) as got:
            native_call()
        assert (got.value.variant, got.value.argument) == (e.variant, e.argument), str(got.value)
        for field in ("learned_len", "topk", "rows", "num_segments", "learned_keep"):
            if hasattr(e, field):
                assert getattr(got.value, field) == getattr(e, field), field
        return None, None
    return native_call(), want


def assert_same_array(got, want):
    assert isinstance(got, np.ndarray)
    assert got.dtype == np.int32
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("seed", range(N_CASES))
def test_native_equals_the_reference_on_a_random_configuration(seed):
    c = make_case(seed)
    learned, lens, s = c["learned"], c["context_lens"], c["s"]
    rng = c["rng"]
    learned_before = learned.copy()

    got, want = both(
        lambda: ks.topology_witness_indices(learned, lens, c["s_wit"]),
        lambda: ref.topology_witness_indices(learned, lens, c["s_wit"]),
    )
    if want is not None:
        assert_same_array(got, want)

    got, want = both(
        lambda: ks.apply_topology_witnesses(learned, lens, c["keep"], s, c["max_replacements"]),
        lambda: ref.apply_topology_witnesses(learned, lens, c["keep"], s, c["max_replacements"]),
    )
    np.testing.assert_array_equal(learned, learned_before)  # the input is not written
    merged = learned if want is None else want
    if want is not None:
        assert_same_array(got, want)
        assert not np.shares_memory(got, learned)

    native_buf, ref_buf = learned.copy(), learned.copy()
    got, _ = both(
        lambda: ks.scatter_topology_witnesses(native_buf, lens, c["scatter_s"]),
        lambda: ref.scatter_topology_witnesses(ref_buf, lens, c["scatter_s"]),
    )
    assert got is None
    np.testing.assert_array_equal(native_buf, ref_buf)

    # Metrics and nulls on this case's rows (the merged ones where there are).
    for r in range(min(len(lens), merged.shape[0], 4)):
        length = max(int(lens[r]), 0)
        cand = merged[r]
        for seg in (s, c["s_wit"], 0, int(rng.integers(1, 200))):
            seg = max(seg, 0)
            assert ks.segment_coverage(cand, length, seg) == ref.segment_coverage(cand, length, seg)
        m = int(rng.choice([0, 1, min(length, 4096), int(rng.integers(0, 3000))]))
        a = rng.random(m) * (rng.random(m) < rng.random())
        if rng.random() < 0.1:
            a[:] = 0.0
        if rng.random() < 0.3:
            a = a / max(a.sum(), 1e-300)
        got_recall = ks.attention_mass_recall(cand, a)
        want_recall = ref.attention_mass_recall(cand, a)
        assert math.isnan(got_recall) == math.isnan(want_recall)
        np.testing.assert_allclose(got_recall, want_recall, rtol=1e-12, atol=0)
        for token in list(cand[:3]) + [length, length - 1, I32_MAX]:
            token = max(int(token), 0)
            for seg in (s, c["s_wit"], 0):
                assert ks.segment_of(token, length, seg) == ref.segment_of(token, length, seg)
        budget = int(rng.integers(0, 3000))
        assert_same_array(ks.locality_null(length, budget), ref.locality_null(length, budget))

    # segment_of on the whole u64 range, where the products exceed 64 bits.
    for _ in range(3):
        token, length = (int(v) for v in rng.integers(0, U64_MAX, size=2, endpoint=True, dtype=np.uint64))
        seg = int(rng.choice([1, 64, 65, 1000, int(rng.integers(0, U64_MAX, endpoint=True, dtype=np.uint64))]))
        assert ks.segment_of(token, length, seg) == ref.segment_of(token, length, seg)


def test_the_random_configurations_reach_every_edge():
    """The generator is only as good as what it reaches: count the edges."""
    seen = dict.fromkeys(
        [
            "no rows",
            "one row",
            "forty rows",
            "topk 2048",
            "S 1",
            "S 64",
            "S > 64",
            "L <= 0",
            "L < S",
            "L = 2**31-1",
            "padding -1",
            "other negative",
            "out of range",
            "duplicates",
            "keep 0",
            "keep topk-S",
            "keep topk",
            "max_replacements 0",
            "max_replacements > topk-keep",
            "off switch",
            "refusal",
        ],
        0,
    )
    for seed in range(N_CASES):
        c = make_case(seed)
        learned, lens, s = c["learned"], c["context_lens"], c["s"]
        rows, topk = learned.shape
        seen["no rows"] += rows == 0
        seen["one row"] += rows == 1
        seen["forty rows"] += rows == 40
        seen["topk 2048"] += topk == 2048
        seen["S 1"] += s == 1
        seen["S 64"] += s == 64
        seen["S > 64"] += c["s_wit"] > 64
        seen["L <= 0"] += bool((lens <= 0).any())
        seen["L < S"] += bool(((lens > 0) & (lens < s)).any())
        seen["L = 2**31-1"] += bool((lens == I32_MAX).any())
        seen["padding -1"] += bool((learned == -1).any())
        seen["other negative"] += bool((learned < -1).any())
        n = min(rows, len(lens))
        seen["out of range"] += bool(((learned[:n] >= lens[:n, None]) & (lens[:n, None] > 0)).any())
        seen["duplicates"] += any(len(set(r[r >= 0].tolist())) < int((r >= 0).sum()) for r in learned)
        seen["keep 0"] += c["keep"] == 0
        seen["keep topk-S"] += c["keep"] == topk - s and topk > s
        seen["keep topk"] += c["keep"] == topk
        seen["max_replacements 0"] += c["max_replacements"] == 0
        seen["max_replacements > topk-keep"] += c["max_replacements"] > topk - c["keep"] >= 0
        seen["off switch"] += c["scatter_s"] == 0
        seen["refusal"] += len(lens) != rows or not 1 <= s <= 64 or c["keep"] > topk
    assert all(v >= 5 for v in seen.values()), seen


# ---------------------------------------------------------------------------
# Hypothesis: scatter and apply against the reference
# ---------------------------------------------------------------------------

entries = st.one_of(
    st.integers(-3, 100),
    st.integers(I32_MIN, I32_MAX),
    st.sampled_from([-1, I32_MIN, I32_MAX, 0]),
)
lengths = st.one_of(st.integers(-3, 100), st.integers(1, I32_MAX), st.just(I32_MAX))


@st.composite
def witness_problems(draw):
    rows = draw(st.integers(0, 6))
    topk = draw(st.integers(0, 70))
    learned = draw(hnp.arrays(np.int32, (rows, topk), elements=entries))
    lens = draw(hnp.arrays(np.int32, (rows,), elements=lengths))
    s = draw(st.integers(1, 64))
    return learned, lens, s


HYP = settings(max_examples=250, deadline=None)


@HYP
@given(witness_problems())
def test_scatter_equals_the_reference_on_generated_rows(problem):
    learned, lens, s = problem
    buf, want = learned.copy(), learned.copy()
    assert ks.scatter_topology_witnesses(buf, lens, s) is None
    ref.scatter_topology_witnesses(want, lens, s)
    np.testing.assert_array_equal(buf, want)


@HYP
@given(witness_problems(), st.data())
def test_apply_equals_the_reference_on_generated_rows(problem, data):
    learned, lens, s = problem
    topk = learned.shape[1]
    keep = data.draw(st.integers(0, topk))
    max_replacements = data.draw(st.one_of(st.integers(0, 80), st.just(U64_MAX)))
    got = ks.apply_topology_witnesses(learned, lens, keep, s, max_replacements)
    want = ref.apply_topology_witnesses(learned, lens, keep, s, max_replacements)
    assert_same_array(got, want)


@HYP
@given(witness_problems(), st.integers(1, 400))
def test_witness_indices_equal_the_reference_on_generated_rows(problem, s):
    learned, lens, _ = problem
    assert_same_array(ks.topology_witness_indices(learned, lens, s), ref.topology_witness_indices(learned, lens, s))


# ---------------------------------------------------------------------------
# The spec's hand examples, natively
# ---------------------------------------------------------------------------


def test_the_native_module_reproduces_the_spec_hand_examples():
    learned = np.array([[0, 5, 9, -1]], np.int32)
    lens = np.array([16], np.int32)
    assert ks.topology_witness_indices(learned, lens, 4).tolist() == [[-1, -1, -1, 12]]
    assert ks.apply_topology_witnesses(learned, lens, 2, 4, 2).tolist() == [[0, 5, 12, -1]]
    buf = np.array([[0, 1, 2, 3, 12, -1, -1, -1]], np.int32)
    ks.scatter_topology_witnesses(buf, lens, 4)
    assert buf.tolist() == [[0, 1, 2, 3, 4, 8, -1, -1]]
    assert ks.segment_coverage(buf[0], 16, 4) == 0.75
    # segment_of is σ itself (the original's): 20 maps to 20 with L = 4, S = 8;
    # only the merge's occupancy pass clamps it (to 7, outside the partition).
    assert ks.segment_of(20, 4, 8) == 20
    assert ks.segment_of(20, 16, 4) == 5
    assert ks.segment_of(2**31 - 1, 2**31 - 1, 4) == 4
    assert ks.segment_of(2, 10, 4) == 0
    assert ks.MAX_TOPOLOGY_SEGMENTS == 64


# ---------------------------------------------------------------------------
# Refusals
# ---------------------------------------------------------------------------

LEARNED = np.array([[0, 5, 9, -1], [1, 2, -1, -1]], np.int32)
LENS = np.array([16, 8], np.int32)


def test_witness_error_is_a_value_error():
    assert issubclass(ks.WitnessError, ValueError)


def test_a_rows_mismatch_names_its_fields_in_every_entry_point():
    lens = np.array([16, 8, 4], np.int32)
    calls = [
        lambda: ks.topology_witness_indices(LEARNED, lens, 4),
        lambda: ks.apply_topology_witnesses(LEARNED, lens, 0, 4, 4),
        lambda: ks.scatter_topology_witnesses(LEARNED.copy(), lens, 4),
    ]
    for call in calls:
        with pytest.raises(ks.WitnessError) as e:
            call()
        assert (e.value.variant, e.value.argument) == ("RowsMismatch", "context_lens")
        assert (e.value.learned_len, e.value.topk, e.value.rows) == (8, 4, 3)


@pytest.mark.parametrize("s", [0, 65, 1000])
def test_the_merge_refuses_a_segment_count_outside_1_to_64(s):
    with pytest.raises(ks.WitnessError) as e:
        ks.apply_topology_witnesses(LEARNED, LENS, 0, s, 4)
    assert (e.value.variant, e.value.num_segments, e.value.argument) == ("SegmentsOutOfRange", s, "num_segments")
    if s:
        buf = LEARNED.copy()
        with pytest.raises(ks.WitnessError) as e:
            ks.scatter_topology_witnesses(buf, LENS, s)
        assert (e.value.variant, e.value.num_segments, e.value.argument) == ("SegmentsOutOfRange", s, "num_segments")
        np.testing.assert_array_equal(buf, LEARNED)


def test_the_witness_indices_refuse_zero_segments_and_accept_more_than_64():
    with pytest.raises(ks.WitnessError) as e:
        ks.topology_witness_indices(LEARNED, LENS, 0)
    assert (e.value.variant, e.value.num_segments, e.value.argument) == ("SegmentsOutOfRange", 0, "num_segments")
    assert_same_array(ks.topology_witness_indices(LEARNED, LENS, 65), ref.topology_witness_indices(LEARNED, LENS, 65))


def test_a_retained_prefix_wider_than_the_row_is_refused():
    with pytest.raises(ks.WitnessError) as e:
        ks.apply_topology_witnesses(LEARNED, LENS, 5, 4, 4)
    assert (e.value.variant, e.value.learned_keep, e.value.topk) == ("LearnedKeepOutOfRange", 5, 4)
    assert e.value.argument == "learned_keep"


def test_rows_are_judged_on_the_entry_count_so_zero_width_rows_never_mismatch():
    # RowsMismatch means learned.size != topk * len(context_lens); with
    # topk = 0 that never holds, in any entry point.
    for shape, n in [((3, 0), 2), ((0, 0), 2), ((3, 0), 0)]:
        learned = np.zeros(shape, np.int32)
        lens = np.full(n, 16, np.int32)
        assert_same_array(ks.topology_witness_indices(learned, lens, 4), ref.topology_witness_indices(learned, lens, 4))
        assert_same_array(
            ks.apply_topology_witnesses(learned, lens, 0, 4, 4), ref.apply_topology_witnesses(learned, lens, 0, 4, 4)
        )
        assert ks.scatter_topology_witnesses(learned, lens, 4) is None


def test_counts_given_as_numpy_integers_are_accepted():
    got = ks.apply_topology_witnesses(LEARNED, LENS, np.int64(1), np.uint8(4), np.int32(3))
    assert_same_array(got, ref.apply_topology_witnesses(LEARNED, LENS, 1, 4, 3))
    assert ks.segment_of(np.int64(20), np.int16(4), np.uint64(8)) == 20
    assert ks.locality_null(np.int64(10), np.int8(3)).tolist() == [7, 8, 9]


def test_recall_converts_float32_rows_and_array_likes_to_float64():
    rng = np.random.default_rng(3)
    a32 = rng.random(100).astype(np.float32)
    cand = rng.integers(-2, 120, size=40).astype(np.int32)
    want = ref.attention_mass_recall(cand, a32.astype(np.float64))
    np.testing.assert_allclose(ks.attention_mass_recall(cand, a32), want, rtol=1e-12)
    np.testing.assert_allclose(
        ks.attention_mass_recall(cand.tolist(), a32.astype(np.float64).tolist()), want, rtol=1e-12
    )
    strided = np.repeat(a32.astype(np.float64), 2)[::2]
    np.testing.assert_allclose(ks.attention_mass_recall(cand, strided), want, rtol=1e-12)


def test_an_out_aliasing_the_input_is_refused_untouched_or_computed_correctly():
    want = ref.apply_topology_witnesses(LEARNED, LENS, 1, 4, 3)
    learned = LEARNED.copy()
    try:
        got = ks.apply_topology_witnesses(learned, LENS, 1, 4, 3, out=learned)
    except ks.WitnessError:
        np.testing.assert_array_equal(learned, LEARNED)
    else:
        assert got is learned
        np.testing.assert_array_equal(learned, want)


NEGATIVE_OR_HUGE = [-1, -(2**31), 2**64, 2**70]


@pytest.mark.parametrize("bad", NEGATIVE_OR_HUGE)
def test_a_negative_or_oversized_count_is_a_witness_error_never_an_overflow(bad):
    calls = [
        ("num_segments", lambda: ks.topology_witness_indices(LEARNED, LENS, bad)),
        ("learned_keep", lambda: ks.apply_topology_witnesses(LEARNED, LENS, bad, 4, 4)),
        ("num_segments", lambda: ks.apply_topology_witnesses(LEARNED, LENS, 0, bad, 4)),
        ("max_replacements", lambda: ks.apply_topology_witnesses(LEARNED, LENS, 0, 4, bad)),
        ("num_segments", lambda: ks.scatter_topology_witnesses(LEARNED.copy(), LENS, bad)),
        ("token", lambda: ks.segment_of(bad, 10, 4)),
        ("context_len", lambda: ks.segment_of(1, bad, 4)),
        ("num_segments", lambda: ks.segment_of(1, 10, bad)),
        ("context_len", lambda: ks.random_null(bad, 4, 0)),
        ("budget", lambda: ks.random_null(10, bad, 0)),
        ("seed", lambda: ks.random_null(10, 4, bad)),
        ("context_len", lambda: ks.locality_null(bad, 4)),
        ("budget", lambda: ks.locality_null(10, bad)),
        ("context_len", lambda: ks.segment_coverage(LEARNED[0], bad, 4)),
        ("num_segments", lambda: ks.segment_coverage(LEARNED[0], 16, bad)),
    ]
    for argument, call in calls:
        with pytest.raises(ks.WitnessError) as e:
            call()
        assert e.value.argument == argument, (argument, str(e.value))


def test_the_largest_u64_is_accepted_where_a_count_may_be_that_large():
    assert ks.segment_of(U64_MAX, U64_MAX, U64_MAX) == ref.segment_of(U64_MAX, U64_MAX, U64_MAX)
    assert_same_array(
        ks.apply_topology_witnesses(LEARNED, LENS, 0, 4, U64_MAX),
        ref.apply_topology_witnesses(LEARNED, LENS, 0, 4, U64_MAX),
    )
    a = ks.random_null(10, 3, U64_MAX)
    assert a.tolist() == ks.random_null(10, 3, U64_MAX).tolist()
    assert len(a) == 3


@pytest.mark.parametrize("bad", [1.0, 4.5, "4", None])
def test_a_non_integer_count_is_a_type_error(bad):
    calls = [
        ("num_segments", lambda: ks.topology_witness_indices(LEARNED, LENS, bad)),
        ("learned_keep", lambda: ks.apply_topology_witnesses(LEARNED, LENS, bad, 4, 4)),
        ("token", lambda: ks.segment_of(bad, 10, 4)),
        ("budget", lambda: ks.random_null(10, bad, 0)),
        ("context_len", lambda: ks.locality_null(bad, 4)),
    ]
    for argument, call in calls:
        with pytest.raises(TypeError, match=f"^{argument} must be an integer"):
            call()


def test_float_indices_are_a_type_error():
    fl = LEARNED.astype(np.float64)
    flens = LENS.astype(np.float64)
    calls = [
        ("learned", lambda: ks.topology_witness_indices(fl, LENS, 4)),
        ("context_lens", lambda: ks.topology_witness_indices(LEARNED, flens, 4)),
        ("learned", lambda: ks.apply_topology_witnesses(fl, LENS, 0, 4, 4)),
        ("context_lens", lambda: ks.apply_topology_witnesses(LEARNED, flens, 0, 4, 4)),
        ("candidates", lambda: ks.segment_coverage(fl[0], 16, 4)),
        ("candidates", lambda: ks.attention_mass_recall(fl[0], np.ones(16))),
    ]
    for argument, call in calls:
        with pytest.raises(TypeError, match=f"^{argument} must hold integers"):
            call()
    buf = LEARNED.copy()
    with pytest.raises(TypeError, match="^context_lens must hold integers"):
        ks.scatter_topology_witnesses(buf, flens, 4)
    np.testing.assert_array_equal(buf, LEARNED)


def test_int64_indices_are_accepted_when_their_values_fit_in_int32():
    lens64 = np.array([I32_MAX, 8], np.int64)
    learned64 = np.array([[0, I32_MAX, I32_MIN, -1], [1, 2, -1, -1]], np.int64)
    want = ref.topology_witness_indices(learned64, lens64, 4)
    assert_same_array(ks.topology_witness_indices(learned64, lens64, 4), want)
    want = ref.apply_topology_witnesses(learned64, lens64, 1, 4, 3)
    assert_same_array(ks.apply_topology_witnesses(learned64, lens64, 1, 4, 3), want)
    assert_same_array(ks.apply_topology_witnesses(learned64.tolist(), lens64.tolist(), 1, 4, 3), want)
    for dtype in (np.int8, np.int16, np.uint16, np.uint32, np.int64):
        assert_same_array(
            ks.apply_topology_witnesses(LEARNED.clip(0).astype(dtype), LENS.astype(dtype), 1, 4, 3),
            ref.apply_topology_witnesses(LEARNED.clip(0), LENS, 1, 4, 3),
        )
    buf = LEARNED.copy()
    ks.scatter_topology_witnesses(buf, LENS.astype(np.int64), 4)
    want = LEARNED.copy()
    ref.scatter_topology_witnesses(want, LENS, 4)
    np.testing.assert_array_equal(buf, want)
    assert ks.segment_coverage(np.array([0, 9], np.int64), 16, 4) == 0.5
    assert ks.attention_mass_recall(np.array([0], np.int64), np.ones(4)) == 0.25


@pytest.mark.parametrize("value", [I32_MAX + 1, I32_MIN - 1, 2**40])
def test_int64_indices_outside_int32_are_a_value_error(value):
    learned = LEARNED.astype(np.int64)
    learned[0, 1] = value
    lens = LENS.astype(np.int64)
    lens[0] = value
    calls = [
        ("learned", lambda: ks.topology_witness_indices(learned, LENS, 4)),
        ("context_lens", lambda: ks.topology_witness_indices(LEARNED, lens, 4)),
        ("learned", lambda: ks.apply_topology_witnesses(learned, LENS, 0, 4, 4)),
        ("context_lens", lambda: ks.apply_topology_witnesses(LEARNED, lens, 0, 4, 4)),
        ("candidates", lambda: ks.segment_coverage(learned[0], 16, 4)),
        ("candidates", lambda: ks.attention_mass_recall(learned[0], np.ones(16))),
    ]
    for argument, call in calls:
        with pytest.raises(ValueError) as e:
            call()
        assert e.value.argument == argument, (argument, str(e.value))
    buf = LEARNED.copy()
    with pytest.raises(ValueError) as e:
        ks.scatter_topology_witnesses(buf, lens, 4)
    assert e.value.argument == "context_lens"
    np.testing.assert_array_equal(buf, LEARNED)


# ---------------------------------------------------------------------------
# The serving buffer: in place, zero copy, untouched on every refusal
# ---------------------------------------------------------------------------


def test_scatter_writes_into_the_callers_buffer_and_returns_none():
    rng = np.random.default_rng(5)
    base = rng.integers(-1, 50, size=(10, 96)).astype(np.int32)
    base[:, 90:] = -1
    buf = base[2:7]  # a C-contiguous view into a larger array
    assert buf.flags.c_contiguous and not buf.flags.owndata
    view = buf.view()
    address = buf.__array_interface__["data"][0]
    lens = np.array([50, 3, 0, 2**31 - 1, 49], np.int32)
    want = buf.copy()
    ref.scatter_topology_witnesses(want, lens, 6)
    assert not np.array_equal(want, buf)  # the case does write something
    before = base.copy()

    assert ks.scatter_topology_witnesses(buf, lens, 6) is None

    assert buf.__array_interface__["data"][0] == address
    assert np.shares_memory(buf, view) and np.shares_memory(buf, base)
    np.testing.assert_array_equal(view, want)  # seen through every alias
    np.testing.assert_array_equal(base[2:7], want)
    np.testing.assert_array_equal(base[:2], before[:2])  # nothing outside the view
    np.testing.assert_array_equal(base[7:], before[7:])
    changed_cols = np.nonzero((base != before).any(axis=0))[0]
    assert changed_cols.min() >= 96 - 6 and changed_cols.max() < 96  # only the tail


def test_scatter_changes_at_most_budget_slots_all_inside_the_tail():
    rng = np.random.default_rng(6)
    for _ in range(200):
        topk = int(rng.integers(1, 200))
        s = int(rng.integers(1, 65))
        length = int(rng.integers(1, 10_000))
        buf = rng.integers(-2, length + 5, size=(3, topk)).astype(np.int32)
        before = buf.copy()
        ks.scatter_topology_witnesses(buf, np.full(3, length, np.int32), s)
        keep = max(topk - s, 0)
        np.testing.assert_array_equal(buf[:, :keep], before[:, :keep])
        assert ((buf != before).sum(axis=1) <= min(s, topk)).all()


def _assert_refused_untouched(buf, call, exc, argument):
    """``call`` raises ``exc`` naming ``argument`` (its ``.argument``; a
    TypeError's message) and leaves ``buf`` byte-identical."""
    before = buf.tobytes()
    with pytest.raises(exc) as e:
        call()
    if isinstance(e.value, TypeError):
        assert str(e.value).startswith(f"{argument} "), (argument, str(e.value))
    else:
        assert e.value.argument == argument, (argument, str(e.value))
    assert buf.tobytes() == before


@pytest.mark.parametrize("s", [0, 4])
def test_a_buffer_of_the_wrong_type_is_a_type_error_and_left_untouched(s):
    for dtype in (np.int64, np.uint32, np.float32, np.int16):
        buf = LEARNED.astype(dtype)
        _assert_refused_untouched(buf, lambda: ks.scatter_topology_witnesses(buf, LENS, s), TypeError, "topk_indices")
    as_list = LEARNED.tolist()
    with pytest.raises(TypeError, match="^topk_indices must be a numpy.ndarray"):
        ks.scatter_topology_witnesses(as_list, LENS, s)
    assert as_list == LEARNED.tolist()


@pytest.mark.parametrize("s", [0, 4])
def test_a_buffer_of_the_wrong_layout_is_a_witness_error_and_left_untouched(s):
    wide = np.tile(LEARNED, (1, 2))
    bad = {
        "1-D": LEARNED.reshape(-1).copy(),
        "3-D": LEARNED.reshape(2, 2, 2).copy(),
        "Fortran": np.asfortranarray(np.tile(LEARNED, (1, 1))),
        "strided": wide[:, ::2],
        "read-only": LEARNED.copy(),
    }
    bad["read-only"].flags.writeable = False
    assert not bad["Fortran"].flags.c_contiguous
    for name, buf in bad.items():
        lens = LENS if buf.ndim != 1 else np.array([16], np.int32)
        before = (wide.tobytes(), buf.tobytes())
        with pytest.raises(ks.WitnessError) as e:
            ks.scatter_topology_witnesses(buf, lens, s)
        assert e.value.variant is None and e.value.argument == "topk_indices", (name, str(e.value))
        assert (wide.tobytes(), buf.tobytes()) == before, name


def test_context_lens_overlapping_the_buffer_is_a_witness_error_and_changes_nothing():
    buf = np.array([[16, 16, 16, 16], [0, 5, -1, -1], [1, -1, -1, -1], [2, -1, -1, -1]], np.int32)
    before = buf.tobytes()
    with pytest.raises(ks.WitnessError) as e:
        ks.scatter_topology_witnesses(buf, buf[0], 4)
    assert e.value.argument == "topk_indices", str(e.value)
    assert buf.tobytes() == before
    with pytest.raises(ks.WitnessError) as e:
        ks.scatter_topology_witnesses(buf, buf.reshape(-1)[4:8], 2)
    assert e.value.argument == "topk_indices", str(e.value)
    assert buf.tobytes() == before


def test_the_off_switch_returns_before_the_row_checks_and_writes_nothing():
    buf = LEARNED.copy()
    before = buf.tobytes()
    assert ks.scatter_topology_witnesses(buf, np.array([1, 2, 3], np.int32), 0) is None
    assert ks.scatter_topology_witnesses(buf, LENS, 0) is None
    assert buf.tobytes() == before


@pytest.mark.parametrize(
    "lens, s, variant, argument",
    [
        (np.array([16], np.int32), 4, "RowsMismatch", "context_lens"),
        (LENS, 65, "SegmentsOutOfRange", "num_segments"),
    ],
)
def test_a_refused_scatter_leaves_the_buffer_byte_identical(lens, s, variant, argument):
    buf = LEARNED.copy()
    before = buf.tobytes()
    with pytest.raises(ks.WitnessError) as e:
        ks.scatter_topology_witnesses(buf, lens, s)
    assert (e.value.variant, e.value.argument) == (variant, argument)
    assert buf.tobytes() == before


# ---------------------------------------------------------------------------
# out= buffers
# ---------------------------------------------------------------------------


def test_witness_indices_write_into_out_and_return_it():
    out = np.full((2, 70), 12345, np.int32)
    got = ks.topology_witness_indices(LEARNED, LENS, 70, out=out)
    assert got is out
    np.testing.assert_array_equal(out, ref.topology_witness_indices(LEARNED, LENS, 70))


def test_apply_writes_into_out_and_returns_it():
    out = np.full(LEARNED.shape, 12345, np.int32)
    got = ks.apply_topology_witnesses(LEARNED, LENS, 1, 4, 3, out=out)
    assert got is out
    np.testing.assert_array_equal(out, ref.apply_topology_witnesses(LEARNED, LENS, 1, 4, 3))
    # Reusing it: the second call overwrites every slot, also with B = 0.
    got = ks.apply_topology_witnesses(LEARNED, LENS, 4, 4, 3, out=out)
    assert got is out
    np.testing.assert_array_equal(out, LEARNED)


def test_a_refused_call_leaves_out_untouched():
    refusals = [
        ("learned_keep", lambda out: ks.apply_topology_witnesses(LEARNED, LENS, 5, 4, 4, out=out)),
        ("num_segments", lambda out: ks.apply_topology_witnesses(LEARNED, LENS, 0, 65, 4, out=out)),
        ("context_lens", lambda out: ks.apply_topology_witnesses(LEARNED, LENS[:1], 0, 4, 4, out=out)),
    ]
    for argument, call in refusals:
        out = np.full(LEARNED.shape, 777, np.int32)
        _assert_refused_untouched(out, lambda: call(out), ks.WitnessError, argument)
    out = np.full((2, 4), 777, np.int32)
    _assert_refused_untouched(
        out, lambda: ks.topology_witness_indices(LEARNED, LENS, 0, out=out), ks.WitnessError, "out"
    )
    _assert_refused_untouched(
        out, lambda: ks.topology_witness_indices(LEARNED, LENS[:1], 4, out=out), ks.WitnessError, "out"
    )


def test_an_out_of_the_wrong_kind_is_refused_and_left_untouched():
    bad = [
        np.full((2, 5), 777, np.int32),  # wrong shape
        np.full((4, 2), 777, np.int32),  # right size, wrong shape
        np.full((2, 4), 777, np.int64),  # wrong dtype
        np.asfortranarray(np.full((2, 4), 777, np.int32).T.copy().T),  # Fortran order
        np.full((2, 8), 777, np.int32)[:, ::2],  # strided
    ]
    ro = np.full((2, 4), 777, np.int32)
    ro.flags.writeable = False
    bad.append(ro)
    for out in bad:
        _assert_refused_untouched(
            out, lambda: ks.apply_topology_witnesses(LEARNED, LENS, 1, 4, 3, out=out), (TypeError, ValueError), "out"
        )
        _assert_refused_untouched(
            out, lambda: ks.topology_witness_indices(LEARNED, LENS, 4, out=out), (TypeError, ValueError), "out"
        )


# ---------------------------------------------------------------------------
# The nulls
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("length, budget", [(0, 5), (1, 1), (10, 3), (10, 10), (10, 50), (1000, 64), (I32_MAX, 100)])
def test_the_random_null_is_distinct_ascending_in_range_and_spends_the_budget(length, budget):
    for seed in range(20):
        got = ks.random_null(length, budget, seed)
        assert isinstance(got, np.ndarray) and got.dtype == np.int32 and got.ndim == 1
        assert len(got) == min(budget, length)
        assert (np.diff(got.astype(np.int64)) > 0).all()  # strictly ascending, so distinct
        assert ((got >= 0) & (got < length)).all()
        if budget >= length:
            assert got.tolist() == list(range(length))


def test_the_random_null_is_deterministic_per_seed_and_differs_between_seeds():
    draws = [ks.random_null(100_000, 16, seed).tolist() for seed in range(50)]
    assert draws == [ks.random_null(100_000, 16, seed).tolist() for seed in range(50)]
    assert len({tuple(d) for d in draws}) == 50


def test_the_random_null_is_uniform_over_tokens():
    length, budget, seeds = 20, 5, 4000
    counts = np.zeros(length)
    for seed in range(seeds):
        counts[ks.random_null(length, budget, seed)] += 1
    expected = seeds * budget / length
    chi2 = ((counts - expected) ** 2 / expected).sum()
    # 19 degrees of freedom: mean 19, P(chi2 > 60) < 1e-5; a draw biased by
    # even 10% towards the low half of the range lands far above it.
    assert chi2 < 60, (chi2, counts)
    # Budget 1 over a length that is no power of two: each token ~1/7.
    ones = np.bincount([int(ks.random_null(7, 1, seed)[0]) for seed in range(7000)], minlength=7)
    chi2 = ((ones - 1000) ** 2 / 1000).sum()
    assert chi2 < 40, ones  # 6 degrees of freedom


def test_the_nulls_spend_exactly_the_policy_budget():
    lens = np.array([16], np.int32)
    merged = ks.apply_topology_witnesses(np.array([[0, -1, -1, -1, -1]], np.int32), lens, 1, 4, 4)[0]
    k = int((merged >= 0).sum())
    assert len(ks.random_null(16, k, 3)) == k
    assert ks.locality_null(16, k).tolist() == list(range(16 - k, 16))


def test_recall_is_nan_without_mass_and_coverage_is_one_without_segments():
    assert math.isnan(ks.attention_mass_recall(np.array([0, 1], np.int32), np.zeros(4)))
    # kept / total as the original computes it: +inf, not NaN, for a row whose
    # weights sum to 0 but whose kept part does not.
    assert ks.attention_mass_recall(np.array([0], np.int32), np.array([1.0, -1.0])) == math.inf
    assert ks.segment_coverage(np.array([], np.int32), 0, 4) == 1.0
    assert ks.segment_coverage(np.array([3], np.int32), 16, 0) == 1.0
    assert ks.attention_mass_recall(np.array([-1, 9, 0, 0], np.int32), np.array([0.5, 0.5])) == 0.5


def test_every_public_function_and_class_documents_itself_at_run_time():
    """``help(ks.f)`` shows a description, not only a signature: the docstring
    lives in the native module, not only in the stubs."""
    import inspect

    for name in ks.__all__:
        obj = getattr(ks, name)
        if callable(obj) or inspect.isclass(obj):
            doc = inspect.getdoc(obj) or ""
            assert len(doc.split()) >= 5, f"{name} has no docstring at run time: {doc!r}"
    for cls in (ks.Selector, ks.BlockSparseConfig):
        for attr in vars(cls):
            if not attr.startswith("_") and callable(getattr(cls, attr)):
                assert inspect.getdoc(getattr(cls, attr)), f"{cls.__name__}.{attr} has no docstring"


def test_every_refusal_is_a_kvselect_error_of_its_domain():
    assert issubclass(ks.KvselectError, ValueError)
    assert issubclass(ks.WitnessError, ks.KvselectError)
    assert issubclass(ks.SelectionError, ks.KvselectError)
    assert not issubclass(ks.WitnessError, ks.SelectionError)
    # The thread controls belong to neither domain.
    with pytest.raises(ks.KvselectError) as e:
        ks.set_num_threads(-1)
    assert type(e.value) is ks.KvselectError and e.value.argument == "n"
    # An oversized count names the rule's real bound, not the integer type's.
    buf = np.zeros((1, 64), np.int32)
    with pytest.raises(ks.WitnessError, match="at most 64") as e:
        ks.scatter_topology_witnesses(buf, [16], 2**64)
    assert e.value.argument == "num_segments"


def test_a_core_refusal_carries_its_variant_and_every_integer_field_as_attributes():
    # Block selection: an id past the sequences, with the entry's index.
    with pytest.raises(ks.SelectionError) as e:
        ks.block_sparse_select_packed(
            np.zeros((2, 1, 4), np.float32), np.zeros((5, 4), np.float32), [0, 5], [0, 3], [0, 1]
        )
    assert (e.value.argument, e.value.variant, e.value.index) == ("seq_ids", "OutOfRange", 1)
    # The attention module: a length that disagrees, with both counts.
    q, kv = np.zeros((1, 1, 4), np.float32), np.zeros((2, 1, 4), np.float32)
    with pytest.raises(ks.SelectionError) as e:
        ks.dense_attention(q, kv, kv, [0, 1])
    assert (e.value.argument, e.value.variant, e.value.expected, e.value.actual) == ("query_pos", "Length", 1, 2)
    # The same refusal from a batched witness metric is a WitnessError.
    with pytest.raises(ks.WitnessError) as e:
        ks.segment_coverage_rows(np.zeros((2, 3), np.int32), [1], 2)
    assert (e.value.argument, e.value.variant, e.value.expected, e.value.actual) == ("context_lens", "Length", 2, 1)
    # Only integers become attributes: a message or shape text stays in str(e).
    assert not any(isinstance(v, str) for k, v in vars(e.value).items() if k not in ("argument", "variant"))
