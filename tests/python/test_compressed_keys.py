"""The lightning indexer over compressed keys (DeepSeek-V4's CSA / HCA
entries, GLM-5 pools: ``compress_ratio = m`` tokens per key): a query at
token ``p`` sees ``min((p + 1) // m, T)`` entries, the rest of the rule is
the token-level one. Differential against the NumPy reference around every
boundary, and against the token-level call it reduces to."""

import numpy as np
import pytest
from pages import vllm_fp8_pages

import kvselect as ks
from kvselect import reference as ref
from kvselect import testing as kt
from kvselect.checking import check_indexer_topk

SEED = 20261202
RATIOS = (1, 2, 3, 4, 16, 128)


def _boundary_positions(rng, m, t, n):
    """Token positions around the entry boundaries: ``(p + 1) % m`` in ``{0,
    m - 1}``, before the first entry (``p < m - 1``), and past the keys."""
    w = rng.integers(0, t + 3, n)
    kind = rng.integers(0, 4, n)
    p = np.where(
        kind == 0,
        (w + 1) * m - 1,  # the token that completes entry w
        np.where(
            kind == 1,
            (w + 1) * m - 2,  # one token short of it
            np.where(
                kind == 2,
                rng.integers(0, max(m - 1, 1), n),  # no entry yet (m > 1)
                w * m + rng.integers(0, m, n),
            ),
        ),
    )  # anywhere in window w
    return np.maximum(p, 0)


def _case(rng, m):
    n, h, d, t = int(rng.integers(1, 5)), int(rng.integers(1, 6)), int(rng.integers(1, 24)), int(rng.integers(0, 90))
    q = rng.integers(-3, 4, (n, h, d)).astype(np.float32)
    w = rng.integers(-2, 3, (n, h)).astype(np.float32)
    k = rng.integers(-3, 4, (t, d)).astype(np.float32)
    if rng.random() < 0.3:  # the zero plateau after the ReLU: ties to the lower entry
        k[rng.random(t) < 0.5] = 0
    c = rng.integers(1, 5, t).astype(np.float32) if rng.random() < 0.5 else None
    return q, w, k, c, _boundary_positions(rng, m, t, n)


def test_a_query_sees_the_entries_its_tokens_have_completed():
    # m = 4: entry w exists once token 4w + 3 has arrived.
    q, w = np.ones((8, 1, 1), np.float32), np.ones((8, 1), np.float32)
    k = np.arange(1, 4, dtype=np.float32)[:, None]  # entry 2 scores best
    pos = np.array([0, 2, 3, 6, 7, 10, 11, 400])
    got = ks.indexer_topk(q, w, k, pos, 3, compress_ratio=4)
    want = np.array(
        [[-1, -1, -1], [-1, -1, -1], [0, -1, -1], [0, -1, -1], [1, 0, -1], [1, 0, -1], [2, 1, 0], [2, 1, 0]], np.int32
    )
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(ref.indexer_topk(q, w, k, pos, 3, compress_ratio=4), want)


def test_compressed_rows_equal_the_reference_on_thousands_of_boundary_cases():
    rng = np.random.default_rng(SEED)
    rows = 0
    for case in range(900):
        m = RATIOS[case % len(RATIOS)]
        q, w, k, c, pos = _case(rng, m)
        visible = np.minimum((pos + 1) // m, len(k))
        topk = int(rng.integers(1, 2 * max(int(visible.max()), 1) + 3))  # often past the visible count
        s = int(rng.choice([0, 0, 1, 3]))
        want_s = np.zeros((len(pos), topk), np.float32)
        want = ref.indexer_topk(q, w, k, pos, topk, key_scale=c, num_segments=s, compress_ratio=m, scores_out=want_s)
        got_s = np.full((len(pos), topk), 7.0, np.float32)
        got = ks.indexer_topk(q, w, k, pos, topk, key_scale=c, num_segments=s, compress_ratio=m, scores_out=got_s)
        np.testing.assert_array_equal(got, want, err_msg=f"case {case}: m={m} pos={pos} T={len(k)}")
        np.testing.assert_array_equal(got_s, want_s)
        if s == 0:  # every visible entry is in the row or outranked; none past it
            for i, v in enumerate(visible):
                assert (got[i] < v).all() and (got[i] >= 0).sum() == min(topk, v)
        rows += len(pos)
    assert rows > 2000


def test_a_compressed_call_is_the_token_call_at_the_last_completed_entry():
    # On float data too (native against native, bit for bit): the ratio only
    # moves where the context ends.
    rng = np.random.default_rng(SEED + 1)
    for case in range(300):
        m = RATIOS[1 + case % (len(RATIOS) - 1)]
        n, h, d, t = (
            int(rng.integers(1, 6)),
            int(rng.integers(1, 9)),
            int(rng.integers(1, 70)),
            int(rng.integers(1, 3000)),
        )
        q = rng.standard_normal((n, h, d)).astype(np.float32)
        w = rng.standard_normal((n, h)).astype(np.float32)
        k = rng.standard_normal((t, d)).astype(np.float32)
        pos = _boundary_positions(rng, m, t, n)
        topk, s = int(rng.integers(1, 300)), int(rng.choice([0, 2]))
        got = ks.indexer_topk(q, w, k, pos, topk, compress_ratio=m, num_segments=s)
        seen = (pos + 1) // m
        for i in range(n):
            if seen[i] == 0:
                assert (got[i] == -1).all()
                continue
            one = ks.indexer_topk(q[i : i + 1], w[i : i + 1], k, seen[i] - 1, topk, num_segments=s)
            np.testing.assert_array_equal(got[i : i + 1], one)


def test_witnesses_cover_the_compressed_context():
    # Segments split the entries a query sees, not its tokens: the fused
    # row is scatter_topology_witnesses over context L = (p + 1) // m.
    rng = np.random.default_rng(SEED + 2)
    for _ in range(200):
        m = int(rng.choice([4, 16]))
        q, w, k, c, pos = _case(rng, m)
        topk, s = int(rng.integers(4, 40)), int(rng.integers(1, 5))
        plain = ks.indexer_topk(q, w, k, pos, topk, key_scale=c, compress_ratio=m)
        plain[:, max(topk - s, 0) :] = -1
        lens = np.minimum((pos + 1) // m, len(k)).astype(np.int32)
        ks.scatter_topology_witnesses(plain, lens, s)
        np.testing.assert_array_equal(
            ks.indexer_topk(q, w, k, pos, topk, key_scale=c, compress_ratio=m, num_segments=s), plain
        )


def test_scores_and_magnitudes_end_at_the_last_completed_entry():
    rng = np.random.default_rng(SEED + 3)
    for case in range(200):
        m = RATIOS[case % len(RATIOS)]
        q, w, k, c, pos = _case(rng, m)
        for fn, twin in ((ks.indexer_scores, ref.indexer_scores), (ks.indexer_magnitudes, ref.indexer_magnitudes)):
            got = fn(q, w, k, pos, key_scale=c, compress_ratio=m)
            np.testing.assert_array_equal(got, twin(q, w, k, pos, key_scale=c, compress_ratio=m))
            seen = np.minimum((pos + 1) // m, len(k))
            assert (np.isnan(got) == (np.arange(len(k))[None, :] >= seen[:, None])).all()


def test_packed_and_paged_compressed_rows_equal_the_dense_call_per_sequence():
    # DeepSeek-V4's indexer cache keeps V3.2's fp8 page layout over entries:
    # entry c of a request at block_table[r, c // bs] * bs + c % bs.
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(SEED + 4)
    for case in range(150):
        m = RATIOS[1 + case % (len(RATIOS) - 1)]
        h, d, bs = int(rng.integers(1, 5)), int(rng.integers(1, 20)), int(rng.choice([1, 4, 16, 64]))
        lens = rng.integers(0, 60, int(rng.integers(1, 4)))
        keys = [rng.integers(-3, 4, (e, d)).astype(np.float32) for e in lens]
        scales = [rng.integers(1, 5, e).astype(np.float32) for e in lens]
        n = int(rng.integers(1, 7))
        sid = rng.integers(0, len(lens), n)
        pos = _boundary_positions(rng, m, int(lens.max()), n)
        q = rng.integers(-3, 4, (n, h, d)).astype(np.float32)
        w = rng.integers(-2, 3, (n, h)).astype(np.float32)
        topk, s = int(rng.integers(1, 70)), int(rng.choice([0, 2]))
        cu = np.concatenate([[0], np.cumsum(lens)])
        packed = ks.indexer_topk_packed(
            q,
            w,
            np.concatenate(keys),
            cu,
            sid,
            pos,
            topk,
            key_scale=np.concatenate(scales),
            compress_ratio=m,
            num_segments=s,
        )
        cache, table = vllm_fp8_pages(keys, scales, bs, rng)
        paged = ks.indexer_topk_paged(
            q, w, cache, table, lens, sid, pos, topk, page_layout="fp8_scaled", compress_ratio=m, num_segments=s
        )
        for i in range(n):
            one = ks.indexer_topk(
                q[i : i + 1],
                w[i : i + 1],
                keys[sid[i]],
                pos[i : i + 1],
                topk,
                key_scale=scales[sid[i]],
                compress_ratio=m,
                num_segments=s,
            )
            np.testing.assert_array_equal(packed[i : i + 1], one)
            np.testing.assert_array_equal(paged[i : i + 1], one)
        np.testing.assert_array_equal(
            packed,
            ref.indexer_topk_packed(
                q,
                w,
                np.concatenate(keys),
                cu,
                sid,
                pos,
                topk,
                key_scale=np.concatenate(scales),
                compress_ratio=m,
                num_segments=s,
            ),
        )
        np.testing.assert_array_equal(
            paged,
            ref.indexer_topk_paged(
                q, w, cache, table, lens, sid, pos, topk, page_layout="fp8_scaled", compress_ratio=m, num_segments=s
            ),
        )
    assert ml_dtypes is not None


@pytest.mark.parametrize("impl", [ks, ref], ids=["native", "reference"])
def test_a_ratio_of_zero_is_refused_and_writes_nothing(impl):
    q, w, k = np.ones((1, 1, 2), np.float32), np.ones((1, 1), np.float32), np.ones((4, 2), np.float32)
    out = np.full((1, 2), 7, np.int32)
    error = ks.SelectionError if impl is ks else ref.ReferenceSelectionError
    with pytest.raises(error) as e:
        impl.indexer_topk(q, w, k, [3], 2, compress_ratio=0, out=out)
    assert e.value.argument == "compress_ratio" and (out == 7).all()
    for call in (
        lambda: impl.indexer_scores(q, w, k, [3], compress_ratio=0),
        lambda: impl.indexer_topk_packed(q[:0], w[:0], k, [0, 4], [], [], 2, compress_ratio=0),
    ):
        with pytest.raises(error) as e:
            call()
        assert e.value.argument == "compress_ratio"
    with pytest.raises(ValueError, match="compress_ratio"):  # SelectionError is a ValueError
        impl.indexer_topk(q, w, k, [3], 2, compress_ratio=-4)


def _v4_case(rng, n=6, t=80, h=4, d=16, m=4):
    q = rng.standard_normal((n, h, d)).astype(np.float32)
    w = rng.standard_normal((n, h)).astype(np.float32)
    k = rng.standard_normal((t, d)).astype(np.float32)
    pos = np.array([m - 2, m - 1, 2 * m, 37, 4 * t - 1, 4 * t + 9])[:n]  # none, one, ... all entries
    return q, w, k, pos


def test_the_check_passes_right_compressed_rows_in_any_order_and_finds_planted_faults():
    rng = np.random.default_rng(SEED + 5)
    q, w, k, pos = _v4_case(rng)
    topk = 16
    rows = ks.indexer_topk(q, w, k, pos, topk, compress_ratio=4)
    for i in range(len(rows)):  # an engine's order of the entries is its own (-1 stays last)
        rng.shuffle(rows[i, : int((rows[i] >= 0).sum())])
    ok = check_indexer_topk(rows, q, w, k, pos, compress_ratio=4)
    assert ok["wrong"] == 0 and ok["rows"] == len(pos)
    # Read as token-level rows they are wrong: the row of the query at 37
    # holds 9 entries of the 38 tokens it sees.
    assert check_indexer_topk(rows, q, w, k, pos)["wrong"] > 0
    dropped = rows.copy()
    i = 3  # p = 37: 9 entries visible, all in the row
    dropped[i, np.flatnonzero(dropped[i] >= 0)[0]] = -1
    rep = check_indexer_topk(dropped, q, w, k, pos, compress_ratio=4)
    assert rep["wrong"] == 1 and rep["details"][0]["row"] == i
    early = rows.copy()
    early[1, np.flatnonzero(early[1] == -1)[0]] = 1  # p = 3 sees entry 0 only; entry 1 is not written yet
    rep = check_indexer_topk(early, q, w, k, pos, compress_ratio=4)
    assert rep["wrong"] == 1 and rep["by_reason"]["not_causal"] == 1
    with pytest.raises(ks.SelectionError) as e:
        check_indexer_topk(rows, q, w, k, pos, compress_ratio=0)
    assert e.value.argument == "compress_ratio"


def test_assert_topk_takes_the_compress_ratio():
    rng = np.random.default_rng(SEED + 6)
    q, w, k, pos = _v4_case(rng)
    rows = ks.indexer_topk(q, w, k, pos, 8, compress_ratio=4)
    scores = ks.indexer_scores(q, w, k, pos, compress_ratio=4)
    report = kt.assert_topk(rows, q, w, k, pos, compress_ratio=4, engine_scores=scores)
    assert report["wrong"] == 0 and len(report["checks"]) == 3
    with pytest.raises(kt.CheckFailure, match="row 0: wrong count: valid 0, expected 3"):  # read as tokens
        kt.assert_topk(rows, q, w, k, pos, engine_scores=scores)


def _global_slots(rows, table, req, bs):
    """vLLM's compressed slot mapping: entry c of request r at
    ``block_table[r, c // bs] * bs + c % bs`` (``bs`` entries per page)."""
    safe = np.maximum(rows, 0)
    slots = table[req[:, None], safe // bs] * bs + safe % bs
    return np.where(rows >= 0, slots, -1).astype(np.int32)


def test_a_v4_dump_of_global_entry_slots_is_checked_and_its_faults_found(tmp_path):
    # What a V4 engine writes: the CSA top-k over compressed entries as
    # global slots of the compressed cache, in a dump with compress_ratio.
    from kvselect.checking import check_dump, save_dump
    from kvselect.cli import main

    rng = np.random.default_rng(SEED + 7)
    q, w, k, pos = _v4_case(rng)
    bs, n_pages = 8, 16
    table = rng.permutation(n_pages)[None, : -(-len(k) // bs)].astype(np.int32)
    req = np.zeros(len(pos), np.int32)
    rows = _global_slots(ks.indexer_topk(q, w, k, pos, 16, compress_ratio=4), table, req, bs)
    dump = dict(
        rows=rows,
        index_q=q,
        weights=w,
        index_k=k,
        query_pos=pos,
        compress_ratio=4,
        block_table=table,
        req_ids=req,
        block_size=bs,
    )
    save_dump(tmp_path / "v4.npz", "topk", **dump)
    assert check_dump(str(tmp_path / "v4.npz"))["wrong"] == 0
    assert main(["check", str(tmp_path / "v4.npz")]) == 0
    early = rows.copy()
    early[1, 1] = _global_slots(np.array([[1]]), table, req[:1], bs)[0, 0]  # entry 1 before token 7
    save_dump(tmp_path / "early.npz", "topk", **{**dump, "rows": early})
    report = check_dump(str(tmp_path / "early.npz"))
    assert report["wrong"] == 1 and report["checks"][0]["report"]["by_reason"]["not_causal"] == 1
    assert main(["check", str(tmp_path / "early.npz")]) != 0
    save_dump(tmp_path / "zero.npz", "topk", **{**dump, "compress_ratio": 0})
    with pytest.raises(ks.checking.DumpError, match="compress_ratio"):
        check_dump(str(tmp_path / "zero.npz"))


def _v4_batch(rng, m=4, W=8, topk=4, h=2, d=8):
    """Two requests mid chunked prefill, their indexer rows over compressed
    entries and vLLM's combined rows of them."""
    sl, ql = np.array([40, 30]), np.array([6, 4])
    gl = np.array([40, 20])  # request 1 gathered only its last 20 tokens
    qsl = np.concatenate([[0], np.cumsum(ql)])
    n_ent = sl // m
    cu = np.concatenate([[0], np.cumsum(n_ent)])
    k = rng.standard_normal((int(cu[-1]), d)).astype(np.float32)
    n = int(qsl[-1])
    q = rng.standard_normal((n, h, d)).astype(np.float32)
    w = rng.standard_normal((n, h)).astype(np.float32)
    req = np.repeat([0, 1], ql)
    pos = sl[req] - ql[req] + (np.arange(n) - qsl[req])
    rows = ks.indexer_topk_packed(q, w, k, cu, req, pos, topk, compress_ratio=m)
    N = int(n_ent.max())
    M = N + int(gl.max()) + 8
    combined, lens = ks.combine_topk_swa_indices(rows, qsl, sl, gl, W, m, topk, M, N)
    args = (q, w, k, cu, qsl, sl, gl, W, m, topk, M, N)
    return combined, lens, args, pos, req, M


def test_v4_combined_rows_pass_in_any_entry_order_and_each_planted_fault_is_named():
    from kvselect.checking import check_v4_combined_indices as check

    rng = np.random.default_rng(SEED + 8)
    combined, lens, args, pos, req, M = _v4_batch(rng)
    m, topk, W = 4, 4, 8
    assert check(combined, lens, *args)["wrong"] == 0
    shuffled = combined.copy()
    for i in range(len(shuffled)):  # the engine's order of the entries is its own
        t0 = min((int(pos[i]) + 1) // m, topk)
        rng.shuffle(shuffled[i, :t0])
    assert check(shuffled, lens, *args)["wrong"] == 0

    def only_fault(rows, row_lens, reason):
        rep = check(rows, row_lens, *args)
        assert rep["wrong"] == 1 and rep["details"][0]["row"] == 2, rep
        assert rep["by_reason"][reason] == 1, rep["by_reason"]

    i = 2  # request 0, token 36: entries 0..9 visible, the top 4 chosen
    visible = (int(pos[i]) + 1) // m
    chosen = set(combined[i, :topk] - M * req[i])
    dropped = combined.copy()
    dropped[i, 0] = M * req[i] + min(set(range(visible)) - chosen)  # a worse entry for a winner
    only_fault(dropped, lens, "wrong_selection")
    early = combined.copy()
    early[i, 0] = M * req[i] + visible  # the next entry: not written until token 4 * visible + 3
    only_fault(early, lens, "not_causal")
    shifted = combined.copy()
    shifted[i, topk] -= 1  # the window's first slot one token before the window
    only_fault(shifted, lens, "window_slot")
    padded = combined.copy()
    padded[i, topk + W] = 0
    only_fault(padded, lens, "padding")
    short = lens.copy()
    short[i] -= 1
    only_fault(combined, short, "wrong_len")
    assert W == min(int(pos[i]) + 1, W)


def test_a_v4_combined_dump_is_checked_by_kvselect_check(tmp_path):
    from kvselect.checking import DumpError, check_dump, save_dump
    from kvselect.cli import main

    rng = np.random.default_rng(SEED + 9)
    combined, lens, args, pos, req, M = _v4_batch(rng)
    q, w, k, cu, qsl, sl, gl, W, m, topk, M, N = args
    dump = dict(
        combined_indices=combined,
        combined_lens=lens,
        index_q=q,
        weights=w,
        index_k=k,
        cu_entries=cu,
        query_start_loc=qsl,
        seq_lens=sl,
        gather_lens=gl,
        window_size=W,
        compress_ratio=m,
        topk=topk,
        M=M,
        N=N,
    )
    save_dump(tmp_path / "v4.npz", "v4_combined", **dump)
    assert check_dump(str(tmp_path / "v4.npz"))["wrong"] == 0
    assert main(["check", str(tmp_path / "v4.npz")]) == 0
    bad = combined.copy()
    bad[2, topk] -= 1  # a window slot outside the window
    save_dump(tmp_path / "bad.npz", "v4_combined", **{**dump, "combined_indices": bad})
    report = check_dump(str(tmp_path / "bad.npz"))
    assert report["wrong"] == 1 and report["checks"][0]["report"]["by_reason"]["window_slot"] == 1
    assert main(["check", str(tmp_path / "bad.npz")]) == 1
    # A setting past what combine_topk_swa_indices reads is refused naming it; a topk far
    # past the entries sizes nothing by it (the rows' width is their longest top-k part).
    for key, value in (("topk", 2**31), ("M", 2**63 - 1), ("N", -1), ("window_size", -(2**63))):
        with pytest.raises(DumpError, match=f"^the dump's arrays do not fit together: {key} must be 0 ..="):
            check_dump(dict(dump, kind="v4_combined", **{key: np.int64(value)}))
    report = check_dump(dict(dump, kind="v4_combined", topk=np.int64(2**26)))
    assert report["rows"] == len(combined)
