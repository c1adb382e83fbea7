"""DeepSeek-V4's attention sets (window + compressed entries), the entry →
tokens map, GLM-5-Next's pool expansion and vLLM's combined index rows
(``combine_topk_swa_indices``, ``vllm/v1/attention/ops/deepseek_v4_ops/
cache_utils.py``): small rows written out by hand, native == the NumPy
reference on thousands of random cases around every boundary, and every
refusal leaving its buffers byte-identical."""

import numpy as np
import pytest

import kvselect as ks
import kvselect.reference as ref

# -- hand examples (m = 4, W = 4) ----------------------------------------------


def test_the_window_is_the_last_w_tokens_ascending_the_query_included():
    assert ks.window_positions([0, 2, 3, 9], 4).tolist() == [[0, -1, -1, -1], [0, 1, 2, -1], [0, 1, 2, 3], [6, 7, 8, 9]]
    assert ks.window_positions(5, 0).shape == (1, 0)


def test_an_hca_query_sees_the_entries_whose_last_token_has_arrived():
    # entry w is complete at token 4(w + 1) - 1: p = 2 sees none, p = 3 one
    assert ks.visible_entries([2, 3, 6, 7, 100], 4, 3).tolist() == [
        [-1, -1, -1],
        [0, -1, -1],
        [0, -1, -1],
        [0, 1, -1],
        [0, 1, 2],
    ]


def test_a_csa_entry_covers_two_windows_and_an_hca_entry_one():
    e = np.array([[0, 1, 5], [-1, 2, -1]])
    csa = ks.compressed_entry_tokens(e, 4, overlap=True)
    hca = ks.compressed_entry_tokens(e, 4, overlap=False)
    assert csa.tolist() == [[[0, 4], [0, 8], [16, 24]], [[-1, -1], [4, 12], [-1, -1]]]
    assert hca.tolist() == [[[0, 4], [4, 8], [20, 24]], [[-1, -1], [8, 12], [-1, -1]]]
    assert ks.compressed_entry_tokens(np.array([1]), 128, overlap=False).tolist() == [[128, 256]]


def test_expansion_keeps_the_row_order_and_puts_the_tail_after_the_expanded_block():
    # p = 14: pools 0..2 visible ((14 + 1) // 4 = 3), tail = tokens 12..14
    rows = np.array([[2, 0, -1]], np.int32)
    got = ks.expand_entries(rows, [14], 4, tail=True, width=17)
    assert got.tolist() == [[8, 9, 10, 11, 0, 1, 2, 3, -1, -1, -1, -1, 12, 13, 14, -1, -1]]
    # (p + 1) % m == 0: an empty tail; no tail: k * m columns
    assert ks.expand_entries(rows, [11], 4, tail=True).tolist() == [
        [8, 9, 10, 11, 0, 1, 2, 3, -1, -1, -1, -1, -1, -1, -1]
    ]
    assert ks.expand_entries(rows, [14], 4).shape == (1, 12)
    # p < m - 1: nothing visible, the tail is every token so far
    assert ks.expand_entries(np.full((1, 1), -1, np.int32), 1, 4, tail=True).tolist() == [[-1, -1, -1, -1, 0, 1, -1]]


def test_vllm_rows_put_the_topk_first_then_the_window_in_the_gathered_workspace():
    # request 0: 3 query tokens at positions 5..7 of 8, all 8 gathered;
    # request 1: a decode token at position 3 of 4 (-1 top-k copied: M*1 - 1).
    topk = np.array([[1, 0], [0, 1], [1, 0], [-1, -1]], np.int32)
    idx, lens = ks.combine_topk_swa_indices(topk, [0, 3, 4], [8, 4], [8, 4], 4, 4, 2, 20, 8)
    assert idx.shape == (4, 128) and idx.dtype == np.int32
    assert idx[:, :7].tolist() == [
        [1, 10, 11, 12, 13, -1, -1],
        [0, 11, 12, 13, 14, -1, -1],
        [1, 0, 12, 13, 14, 15, -1],
        [19, 28, 29, 30, 31, -1, -1],
    ]
    assert (idx[:, 7:] == -1).all()
    assert lens.tolist() == [5, 5, 6, 5]
    # only the last 6 of 8 tokens gathered: the window shifts down by 2
    idx, _ = ks.combine_topk_swa_indices(topk[:3], [0, 3], [8], [6], 4, 4, 2, 20, 8)
    assert idx[0, :5].tolist() == [1, 8, 9, 10, 11]


def test_the_combined_width_is_topk_plus_window_rounded_up_to_128():
    for topk, w, want in [(0, 0, 0), (1, 0, 128), (512, 128, 640), (2048, 128, 2176), (0, 129, 256)]:
        idx, _ = ks.combine_topk_swa_indices(np.zeros((0, topk), np.int32), [0], [], [], w, 4, topk, 0, 0)
        assert idx.shape == (0, want)


# -- native == reference on random cases -------------------------------------------


def _combine_case(r):
    m = int(r.choice([1, 2, 3, 4, 8]))
    w = int(r.choice([0, 1, 3, 4, 8, 128]))
    topk = int(r.integers(0, 12))
    reqs = int(r.integers(1, 5))
    seq = r.integers(1, 48, reqs)
    qlen = np.array([int(r.choice([1, s, r.integers(0, s + 1)])) for s in seq])
    gather = []
    for s, q in zip(seq, qlen):
        first = s - q
        start = first + 1 - min(first + 1, w) if q else s
        gather.append(int(r.integers(s - start, s + 1)) if start < s else int(r.integers(0, s + 1)))
    gather = np.array(gather)
    qsl = np.concatenate([[0], np.cumsum(qlen)])
    N = -(-int(seq.max()) // m) + int(r.integers(0, 3))
    M = N + int(gather.max()) + int(r.integers(0, 9))
    width = topk + int(r.integers(0, 3))
    rows = np.full((int(qsl[-1]), width), -1, np.int32)
    for b in range(reqs):
        for i in range(qsl[b], qsl[b + 1]):
            pos = seq[b] - qlen[b] + (i - qsl[b])
            seen = (pos + 1) // m
            pick = r.permutation(seen)[:width]
            rows[i, : len(pick)] = pick
            if len(pick) and r.random() < 0.05:
                rows[i, r.integers(0, len(pick))] = -1  # a -1 vLLM copies
    return (rows, qsl, seq, gather, w, m, topk, M, N)


def test_combined_rows_equal_the_reference_on_random_batches_around_every_boundary():
    r = np.random.default_rng(25)
    seen = {"chunked": 0, "gather_short": 0, "no_entry": 0, "topk_over_visible": 0, "edge0": 0, "edge_m1": 0}
    for _ in range(1500):
        args = _combine_case(r)
        _, qsl, seq, gather, _, m, topk, _, _ = args
        got = ks.combine_topk_swa_indices(*args)
        want = ref.combine_topk_swa_indices(*args)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])
        qlen = np.diff(qsl)
        seen["chunked"] += int(((qlen > 1) & (qlen < seq)).any())
        seen["gather_short"] += int((gather < seq).any())
        for b in range(len(seq)):
            for pos in range(seq[b] - qlen[b], seq[b]):
                seen["no_entry"] += pos < m - 1
                seen["topk_over_visible"] += (pos + 1) // m < topk
                seen["edge0"] += m > 1 and (pos + 1) % m == 0
                seen["edge_m1"] += m > 1 and (pos + 1) % m == m - 1
    assert min(seen.values()) > 100, seen


def test_the_window_part_of_a_combined_row_is_the_queries_window_and_the_rest_its_topk():
    r = np.random.default_rng(7)
    for _ in range(300):
        rows, qsl, seq, gather, w, m, topk, M, N = args = _combine_case(r)
        idx, lens = ks.combine_topk_swa_indices(*args)
        for b in range(len(seq)):
            for i in range(qsl[b], qsl[b + 1]):
                pos = seq[b] - (qsl[b + 1] - qsl[b]) + (i - qsl[b])
                k = min((pos + 1) // m, topk)
                window = ks.window_positions(pos, w)[0]
                window = window[window >= 0]
                assert lens[i] == k + len(window)
                np.testing.assert_array_equal(idx[i, :k], rows[i, :k] + M * b)
                np.testing.assert_array_equal(idx[i, k : lens[i]] - M * b - N + (seq[b] - gather[b]), window)


def test_the_sets_equal_the_reference_on_random_queries():
    r = np.random.default_rng(4)
    for _ in range(2000):
        m = int(r.choice([1, 2, 3, 4, 16, 128]))
        pos = r.integers(0, 300, int(r.integers(1, 6)))
        pos[0] = int(r.choice([0, m - 1, m, 2 * m - 1, 2 * m - 2]))
        w, t = int(r.integers(0, 140)), int(r.integers(0, 12))
        np.testing.assert_array_equal(ks.window_positions(pos, w), ref.window_positions(pos, w))
        np.testing.assert_array_equal(ks.visible_entries(pos, m, t), ref.visible_entries(pos, m, t))
        entries = r.integers(-1, 50, (len(pos), 3)).astype(np.int32)
        for overlap in (False, True):
            np.testing.assert_array_equal(
                ks.compressed_entry_tokens(entries, m, overlap=overlap),
                ref.compressed_entry_tokens(entries, m, overlap=overlap),
            )
        k = int(r.integers(0, 5))
        rows = np.full((len(pos), k), -1, np.int32)
        for i, p in enumerate(pos):
            pick = r.permutation((p + 1) // m)[: int(r.integers(0, k + 1))]
            rows[i, : len(pick)] = pick
        tail = bool(r.integers(0, 2))
        width = None if r.random() < 0.5 else k * m + (m - 1 if tail else 0) + int(r.integers(0, 4))
        np.testing.assert_array_equal(
            ks.expand_entries(rows, pos, m, tail=tail, width=width),
            ref.expand_entries(rows, pos, m, tail=tail, width=width),
        )


# -- refusals ------------------------------------------------------------------------


def _good():
    topk = np.array([[1, 0], [0, 1], [1, 0], [0, -1]], np.int32)
    return [topk, np.array([0, 3, 4]), np.array([8, 4]), np.array([8, 4]), 4, 4, 2, 20, 8]


def _bad(i, value):
    a = _good()
    a[i] = value
    return a


COMBINE_REFUSALS = [
    ("query_start_loc", _bad(1, np.array([1, 3, 4]))),
    ("query_start_loc", _bad(1, np.array([0, 3, 3]))),
    ("query_start_loc", _bad(1, np.array([0, 5, 4]))),
    ("seq_lens", _bad(2, np.array([2, 4]))),
    ("gather_lens", _bad(3, np.array([9, 4]))),
    ("gather_lens", _bad(3, np.array([4, 4]))),  # request 0's window starts at 2 < 8 - 4
    ("topk_indices", _bad(0, np.array([[1, 0], [0, 1], [1, 8], [0, -1]], np.int32))),
    ("topk_indices", _bad(0, np.zeros((4, 1), np.int32))),
    ("M", _bad(7, 15)),
    ("compress_ratio", _bad(5, 0)),
]


@pytest.mark.parametrize("argument, args", COMBINE_REFUSALS)
def test_a_refused_combine_names_its_argument_and_writes_nothing(argument, args):
    out = np.full((4, 128), 7, np.int32)
    lens_out = np.full(4, 7, np.int32)
    before = (out.tobytes(), lens_out.tobytes())
    with pytest.raises(ks.SelectionError) as e:
        ks.combine_topk_swa_indices(*args, out=out, lens_out=lens_out)
    assert e.value.argument == argument, str(e.value)
    assert (out.tobytes(), lens_out.tobytes()) == before
    with pytest.raises(ref.ReferenceSelectionError) as e:
        ref.combine_topk_swa_indices(*args, out=out, lens_out=lens_out)
    assert e.value.argument == argument, str(e.value)
    assert (out.tobytes(), lens_out.tobytes()) == before


def test_a_good_combine_into_buffers_returns_them_filled():
    out, lens_out = np.full((4, 128), 7, np.int32), np.full(4, 7, np.int32)
    idx, lens = ks.combine_topk_swa_indices(*_good(), out=out, lens_out=lens_out)
    assert idx is out and lens is lens_out
    np.testing.assert_array_equal(out, ks.combine_topk_swa_indices(*_good())[0])


SET_REFUSALS = [
    ("entry_rows", lambda f, o: f.expand_entries(np.array([[3]], np.int32), [11], 4, tail=True, out=o), (1, 7)),
    ("entry_rows", lambda f, o: f.expand_entries(np.array([[-2]], np.int32), [11], 4, out=o), (1, 4)),
    ("width", lambda f, o: f.expand_entries(np.array([[0]], np.int32), [11], 4, tail=True, width=6, out=o), (1, 6)),
    ("compress_ratio", lambda f, o: f.visible_entries([3], 0, 2, out=o), (1, 2)),
    ("entries", lambda f, o: f.compressed_entry_tokens(np.array([0, -3]), 4, overlap=True, out=o), (2, 2)),
    ("entries", lambda f, o: f.compressed_entry_tokens(np.array([2**30]), 4, overlap=True, out=o), (1, 2)),
]


@pytest.mark.parametrize("argument, call, shape", SET_REFUSALS)
def test_a_refused_set_call_names_its_argument_and_writes_nothing(argument, call, shape):
    for module, error in ((ks, ks.SelectionError), (ref, ref.ReferenceSelectionError)):
        out = np.full(shape, 7, np.int32)
        with pytest.raises(error) as e:
            call(module, out)
        assert e.value.argument == argument, str(e.value)
        assert (out == 7).all()
