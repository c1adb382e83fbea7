"""The lightning indexer's top-k against the plain NumPy reference, on every
key and query format, and its contract (rank order, witnesses in the same
pass, refusals)."""

import numpy as np
import pytest
from levels import assert_child_equals, level_runs, require_simd
from pages import vllm_fp8_pages

import kvselect as ks
from kvselect import reference as ref

ml_dtypes = pytest.importorskip("ml_dtypes")

SEED = 20261201


def _case(rng, integer=True):
    n, h, d, t = (int(rng.integers(1, 4)), int(rng.integers(1, 9)), int(rng.integers(1, 40)), int(rng.integers(1, 400)))
    draw = (
        (lambda lo, hi, size: rng.integers(lo, hi + 1, size).astype(np.float32))
        if integer
        else (lambda lo, hi, size: rng.uniform(lo, hi, size).astype(np.float32))
    )
    q, w, k = draw(-3, 3, (n, h, d)), draw(-2, 2, (n, h)), draw(-3, 3, (t, d))
    c = draw(1, 4, t) if rng.random() < 0.5 else None
    pos = rng.integers(0, t + 5, n)
    if rng.random() < 0.1:
        k[rng.integers(0, t)] = np.nan
    return q, w, k, c, pos


def _formats(x, rng):
    """``x`` (integer-valued float32, |x| <= 3) in every format that holds it
    exactly, with the format argument a raw view needs."""
    bf16 = x.astype(ml_dtypes.bfloat16)
    fp8 = x.astype(ml_dtypes.float8_e4m3fn)
    return [
        (x, None),
        (x.astype(np.float16), None),
        (bf16, None),
        (bf16.view(np.uint16), "bfloat16"),
        (x.astype(np.float16).view(np.uint16), "float16"),
        (fp8, None),
        (fp8.view(np.uint8), "float8_e4m3fn"),
    ]


def test_every_format_equals_the_float64_reference_exactly_on_integer_data():
    rng = np.random.default_rng(SEED)
    cases = 0
    for _ in range(300):
        q, w, k, c, pos = _case(rng)
        topk = int(rng.integers(1, 60))
        s = int(rng.choice([0, 0, 1, 4, 64]))
        want_scores = np.zeros((len(pos), topk), np.float32)
        want = ref.indexer_topk(q, w, k, pos, topk, key_scale=c, num_segments=s, scores_out=want_scores)
        for kk, kf in _formats(k, rng):
            for qq, qf in _formats(q, rng)[::3]:
                got_scores = np.full((len(pos), topk), 7.0, np.float32)
                got = ks.indexer_topk(
                    qq,
                    w,
                    kk,
                    pos,
                    topk,
                    key_scale=c,
                    key_format=kf,
                    query_format=qf,
                    num_segments=s,
                    scores_out=got_scores,
                )
                assert got.dtype == np.int32 and np.array_equal(got, want), (kf, qf, got, want)
                np.testing.assert_array_equal(got_scores, want_scores)
                cases += 1
    assert cases >= 2000


def test_on_random_float_data_every_row_is_in_rank_order_of_its_own_scores():
    rng = np.random.default_rng(SEED + 1)
    for _ in range(200):
        q, w, k, c, pos = _case(rng, integer=False)
        topk = int(rng.integers(1, 80))
        scores = np.zeros((len(pos), topk), np.float32)
        rows = ks.indexer_topk(q, w, k, pos, topk, key_scale=c, scores_out=scores)
        for row, sc, p in zip(rows, scores, pos):
            n_valid = min(int(p) + 1, len(k), topk)
            assert (row[:n_valid] >= 0).all() and (row[n_valid:] == -1).all()
            assert len(set(row[:n_valid].tolist())) == n_valid
            a, b = sc[: n_valid - 1], sc[1:n_valid]
            ordered = (a > b) | ((a == b) & (row[: n_valid - 1] < row[1:n_valid])) | np.isnan(b)
            assert ordered.all(), (row, sc)
        # And every row is a correct top-k of the reference's scores (float64,
        # rounded once) up to the float32 arithmetic's error bound: a dot of d
        # terms, a product by w_h, a sum of H terms and a product by c_t, in any
        # order, are within gamma_{d+H+2} * m_t of the exact score (m_t the
        # score's magnitude), and the reference's one rounding adds u * m_t.
        # A row may differ from the reference's only at a tie within that bound.
        h, d = q.shape[1:]
        u = 2.0**-24
        rtol = ((d + h + 2) * u / (1 - (d + h + 2) * u) + u) * (1 + 2**-10)
        exact = ref.indexer_scores(q, w, k, pos, key_scale=c)
        mags = ref.indexer_magnitudes(q, w, k, pos, key_scale=c)
        lens = np.minimum(pos + 1, len(k))
        report = ks.check_topk(exact, rows, lens, topk=topk, rtol=rtol, magnitudes=np.nan_to_num(mags, nan=0.0))
        assert report["wrong"] == 0, report["details"][:2]


def test_witnesses_in_the_same_pass_equal_the_two_call_composition():
    rng = np.random.default_rng(SEED + 2)
    for _ in range(500):
        q, w, k, c, pos = _case(rng, integer=False)
        topk = int(rng.integers(1, 80))
        s = int(rng.integers(1, 65))
        fused = ks.indexer_topk(q, w, k, pos, topk, key_scale=c, num_segments=s)
        keep = max(topk - s, 0)
        two = np.full((len(pos), topk), -1, np.int32)
        if keep:
            two[:, :keep] = ks.indexer_topk(q, w, k, pos, keep, key_scale=c)
        lens = np.minimum(pos + 1, len(k)).astype(np.int32)
        ks.scatter_topology_witnesses(two, lens, s)
        np.testing.assert_array_equal(fused, two)


def test_out_is_filled_in_place_and_returned():
    rng = np.random.default_rng(SEED + 3)
    q, w, k, c, pos = _case(rng)
    out = np.full((len(pos), 5), 99, np.int32)
    got = ks.indexer_topk(q, w, k, pos, 5, key_scale=c, out=out)
    assert got is out or np.shares_memory(got, out)
    np.testing.assert_array_equal(out, ref.indexer_topk(q, w, k, pos, 5, key_scale=c))


def _err(exc, fn, *args, **kwargs):
    with pytest.raises(exc) as e:
        fn(*args, **kwargs)
    return e.value


def test_malformed_calls_are_refused_naming_the_argument_and_write_nothing():
    q = np.ones((2, 3, 4), np.float32)
    w = np.ones((2, 3), np.float32)
    k = np.ones((10, 4), np.float32)
    pos = np.array([3, 9])
    SE = ks.SelectionError
    assert _err(SE, ks.indexer_topk, q[0], w, k, pos, 4).argument == "index_q"
    assert _err(SE, ks.indexer_topk, q, w, k[:, :3], pos, 4).argument == "index_q"
    assert _err(SE, ks.indexer_topk, q, w[:, :2], k, pos, 4).argument == "weights"
    assert _err(SE, ks.indexer_topk, q, w, k, pos, 4, key_scale=np.ones(9, np.float32)).argument == "key_scale"
    assert _err(SE, ks.indexer_topk, q, w, k, pos[:1], 4).argument == "query_pos"
    assert _err(SE, ks.indexer_topk, q, w, k, [3, -1], 4).argument == "query_pos"
    assert _err(SE, ks.indexer_topk, q, w, k, pos, -1).argument == "topk"
    assert _err(SE, ks.indexer_topk, q, w, k, pos, 4, num_segments=65).argument == "num_segments"
    # Formats: a raw view needs its format, and a typed array must agree with one.
    for key, key_format in [
        (k.astype(np.float16).view(np.uint16), None),
        (k.astype(np.float16), "bfloat16"),
        (k.astype(np.float16).view(np.uint16), "float8_e4m3fn"),
        (k.astype(np.int32), None),
    ]:
        e = _err(TypeError, ks.indexer_topk, q, w, key, pos, 4, key_format=key_format)
        assert str(e).startswith(f"index_k has dtype {key.dtype}"), str(e)
    assert _err(ks.SelectionError, ks.indexer_topk, q, w, k, pos, 4, key_format="int4").argument == "key_format"
    # out= and scores_out=: checked, never converted, never aliasing an input.
    out = np.full((2, 4), 7, np.int32)
    assert _err(SE, ks.indexer_topk, q, w, k, pos, 5, out=out).argument == "out"
    # An out= aliasing a query handed over as a memoryview is still caught.
    qb = np.zeros((2, 1, 4), np.float32)
    out_view = qb.view(np.int32).reshape(2, 4)
    assert (
        _err(SE, ks.indexer_topk, memoryview(qb), np.ones((2, 1), np.float32), k, pos, 4, out=out_view).argument
        == "out"
    )
    assert (qb == 0).all()
    scores = np.zeros((2, 4), np.float32)
    assert (
        _err(SE, ks.indexer_topk, q, w, k, pos, 4, out=scores.view(np.int32), scores_out=scores).argument
        == "scores_out"
    )
    assert (scores == 0).all() and (out == 7).all()


def test_the_packed_form_equals_the_reference_and_one_call_per_sequence():
    rng = np.random.default_rng(SEED + 4)
    for _ in range(200):
        h, d = int(rng.integers(1, 6)), int(rng.integers(1, 24))
        lens = rng.integers(0, 80, int(rng.integers(1, 5)))
        cu = np.concatenate([[0], np.cumsum(lens)])
        k = rng.integers(-3, 4, (int(cu[-1]), d)).astype(np.float32)
        c = rng.integers(1, 4, len(k)).astype(np.float32)
        n = int(rng.integers(1, 8))
        sid = rng.integers(0, len(lens), n)
        pos = rng.integers(0, 90, n)
        q = rng.integers(-3, 4, (n, h, d)).astype(np.float32)
        w = rng.integers(-2, 3, (n, h)).astype(np.float32)
        topk, s = int(rng.integers(1, 40)), int(rng.choice([0, 3]))
        fmt = rng.integers(0, 3)
        kk, kf = [
            (k, None),
            (k.astype(ml_dtypes.bfloat16), None),
            (k.astype(ml_dtypes.float8_e4m3fn).view(np.uint8), "float8_e4m3fn"),
        ][fmt]
        got = ks.indexer_topk_packed(q, w, kk, cu, sid, pos, topk, key_scale=c, key_format=kf, num_segments=s)
        want = ref.indexer_topk_packed(q, w, k, cu, sid, pos, topk, key_scale=c, num_segments=s)
        np.testing.assert_array_equal(got, want)
        for i in range(n):
            k0, k1 = cu[sid[i]], cu[sid[i] + 1]
            one = ks.indexer_topk(
                q[i : i + 1], w[i : i + 1], k[k0:k1], pos[i : i + 1], topk, key_scale=c[k0:k1], num_segments=s
            )
            np.testing.assert_array_equal(got[i : i + 1], one)
    q, w, k = np.ones((1, 1, 2), np.float32), np.ones((1, 1), np.float32), np.ones((6, 2), np.float32)
    assert _err(ks.SelectionError, ks.indexer_topk_packed, q, w, k, [0, 4], [0], [1], 2).argument == "cu_seqlens"
    assert _err(ks.SelectionError, ks.indexer_topk_packed, q, w, k, [0, 2, 6], [2], [1], 2).argument == "seq_ids"
    assert _err(ks.SelectionError, ks.indexer_topk_packed, q, w, k, [0, 6], [0, 0], [1], 2).argument == "seq_ids"


def test_the_fp8_paged_cache_equals_the_dense_call_on_its_keys_and_the_reference():
    rng = np.random.default_rng(SEED + 5)
    for case in range(150):
        h, d, bs = int(rng.integers(1, 5)), int(rng.integers(1, 20)), int(rng.choice([1, 4, 16, 64]))
        lens = rng.integers(0, 150, int(rng.integers(1, 4)))
        integer = case % 2 == 0
        keys, scales = [], []
        for n_tok in lens:
            if integer:
                k = rng.integers(-3, 4, (n_tok, d)).astype(np.float32)
                c = rng.integers(1, 5, n_tok).astype(np.float32)
            else:  # as vLLM quantises: scale = max(amax, 1e-4) / 448
                raw = rng.standard_normal((n_tok, d)).astype(np.float32)
                c = (np.maximum(np.abs(raw).max(axis=1, initial=0), 1e-4) / 448).astype(np.float32)
                k = (raw / c[:, None]).astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
            keys.append(k)
            scales.append(c)
        cache, table = vllm_fp8_pages(keys, scales, bs, rng)
        n = int(rng.integers(1, 6))
        sid = rng.integers(0, len(lens), n)
        pos = rng.integers(0, 160, n)
        q = rng.integers(-3, 4, (n, h, d)).astype(np.float32)
        w = rng.integers(-2, 3, (n, h)).astype(np.float32)
        topk, s = int(rng.integers(1, 50)), int(rng.choice([0, 2]))
        got = ks.indexer_topk_paged(q, w, cache, table, lens, sid, pos, topk, page_layout="fp8_scaled", num_segments=s)
        for i in range(n):
            one = ks.indexer_topk(
                q[i : i + 1], w[i : i + 1], keys[sid[i]], pos[i : i + 1], topk, key_scale=scales[sid[i]], num_segments=s
            )
            np.testing.assert_array_equal(got[i : i + 1], one)
        if integer:
            want = ref.indexer_topk_paged(
                q, w, cache, table, lens, sid, pos, topk, page_layout="fp8_scaled", num_segments=s
            )
            np.testing.assert_array_equal(got, want)


def test_dense_pages_in_every_format_equal_the_dense_call():
    rng = np.random.default_rng(SEED + 6)
    for case in range(90):
        h, d, bs = int(rng.integers(1, 5)), int(rng.integers(1, 20)), int(rng.choice([2, 8, 128]))
        n_tok = int(rng.integers(1, 300))
        k = rng.integers(-3, 4, (n_tok, d)).astype(np.float32)
        need = -(-n_tok // bs)
        n_blocks = need + 3
        order = rng.permutation(n_blocks)[:need]
        pages = np.zeros((n_blocks, bs, d), np.float32)
        padded = np.zeros((need * bs, d), np.float32)
        padded[:n_tok] = k
        pages[order] = padded.reshape(need, bs, d)
        table = np.zeros((1, need + 2), np.int32)
        table[0, :need] = order
        fmt = case % 4
        cache, kf = [
            (pages, None),
            (pages.astype(ml_dtypes.bfloat16), None),
            (pages.astype(np.float16).view(np.uint16), "float16"),
            (pages.astype(ml_dtypes.float8_e4m3fn).view(np.uint8), "float8_e4m3fn"),
        ][fmt]
        q = rng.integers(-3, 4, (2, h, d)).astype(np.float32)
        w = rng.integers(-2, 3, (2, h)).astype(np.float32)
        pos = rng.integers(0, n_tok + 3, 2)
        got = ks.indexer_topk_paged(q, w, cache, table, [n_tok], [0, 0], pos, 20, key_format=kf)
        np.testing.assert_array_equal(got, ks.indexer_topk(q, w, k, pos, 20))
        np.testing.assert_array_equal(
            got, ref.indexer_topk_paged(q, w, cache, table, [n_tok], [0, 0], pos, 20, key_format=kf)
        )


def test_a_paged_call_refuses_a_bad_block_table_and_writes_nothing():
    q, w = np.ones((1, 1, 4), np.float32), np.ones((1, 1), np.float32)
    cache = np.zeros((3, 2, 4), np.float32)
    out = np.full((1, 2), 7, np.int32)
    SE = ks.SelectionError
    for table, lens in [([[-1, 0]], [3]), ([[0, 3]], [3]), ([[0]], [3])]:
        e = _err(SE, ks.indexer_topk_paged, q, w, cache, np.array(table, np.int32), lens, [0], [2], 2, out=out)
        assert e.argument == "block_table"
    assert (out == 7).all()
    assert (
        _err(SE, ks.indexer_topk_paged, q, w, cache, np.zeros((1, 2), np.int32), [3], [1], [2], 2).argument == "seq_ids"
    )
    assert (
        _err(SE, ks.indexer_topk_paged, q, w, cache[:, :, :3], np.zeros((1, 2), np.int32), [3], [0], [2], 2).argument
        == "index_q"
    )
    # The keys' dimension is refused before the table and sequences are read.
    assert (
        _err(SE, ks.indexer_topk_paged, q, w, cache[:, :, :3], np.zeros((1, 2), np.float32), [-3], [0], [2], 2).argument
        == "index_q"
    )
    # fp8_scaled pages are uint8 [num_blocks, block_size, (1,) d + 4]: another shape is refused,
    # another dtype a TypeError (as the dense layout's float64 below).
    table = np.zeros((1, 2), np.int32)
    bad = np.zeros((3, 2, 4), np.uint8)
    assert _err(SE, ks.indexer_topk_paged, q, w, bad, table, [3], [0], [2], 2, page_layout="fp8_scaled").argument == (
        "kv_cache"
    )
    e = _err(TypeError, ks.indexer_topk_paged, q, w, cache, table, [3], [0], [2], 2, page_layout="fp8_scaled")
    assert str(e).startswith("kv_cache has dtype float32: with page_layout='fp8_scaled' it must be uint8"), str(e)
    e = _err(
        TypeError, ks.indexer_topk_paged, q, w, cache.astype(np.float64), np.zeros((1, 2), np.int32), [3], [0], [2], 2
    )
    assert str(e).startswith("kv_cache has dtype float64"), str(e)
    e = _err(
        SE,
        ks.indexer_topk_paged,
        q,
        w,
        cache,
        np.zeros((1, 2), np.int32),
        [3],
        [0],
        [2],
        2,
        page_layout="ragged",
    )
    assert e.argument == "page_layout"
    # out= aliasing the cache through a memoryview.
    c2 = np.zeros((2, 2, 4), np.float32)
    alias = c2.view(np.int32).reshape(-1)[:2].reshape(1, 2)
    e = _err(SE, ks.indexer_topk_paged, q, w, memoryview(c2), np.zeros((1, 2), np.int32), [3], [0], [2], 2, out=alias)
    assert e.argument == "out"


@pytest.mark.parametrize("t, topk, values", [(16_385, 2048, 3), (200_000, 4096, 5), (1_000_000, 10_000, 2)])
def test_low_contrast_rows_select_exactly_where_radix_kernels_dropped_candidates(t, topk, values):
    """Scores crowd into a handful of values, so the threshold holds tens of
    thousands of tied candidates (where vllm#51782, sglang#36807 and b12x#55
    returned wrong sets): the row must still be exactly the total order's."""
    rng = np.random.default_rng(SEED + t)
    k = rng.integers(0, values, (t, 2)).astype(np.float32)
    q = np.array([[[1.0, 1.0]]], np.float32)
    w = np.ones((1, 1), np.float32)
    got = ks.indexer_topk(q, w, k, [t - 1], topk)
    want = ref.indexer_topk(q, w, k, [t - 1], topk)
    np.testing.assert_array_equal(got, want)
    # The threshold's ties really are that many, and the lowest positions won them.
    scores = k.sum(axis=1)
    threshold = scores[got[0, -1]]
    assert (scores == threshold).sum() > topk // 2
    tied = got[0][scores[got[0]] == threshold]
    assert np.array_equal(tied, np.flatnonzero(scores == threshold)[: len(tied)])


_SCALAR_CHILD = """
import sys
import numpy as np
import kvselect as ks
data = np.load(sys.argv[1])
out = {}
for i in range(int(data["n"])):
    s = np.zeros((len(data[f"pos_{i}"]), int(data[f"topk_{i}"])), np.float32)
    out[f"rows_{i}"] = ks.indexer_topk(data[f"q_{i}"], data[f"w_{i}"], data[f"k_{i}"], data[f"pos_{i}"],
                                       int(data[f"topk_{i}"]), key_scale=data[f"c_{i}"], scores_out=s)
    out[f"scores_{i}"] = s
np.savez(sys.argv[2], **out)
"""


@pytest.mark.parametrize("level", ["scalar", "avx2"])
def test_every_simd_level_gives_the_same_rows_and_score_bits(tmp_path, level):
    """One summation order on every level: random float data (near-ties, -0.0,
    NaN keys) gives the same rows and the same score bits with the portable
    or the AVX2 kernel (KVSELECT_SIMD=scalar / avx2, in a child process) as
    with the best level (AVX-512 where the CPU has it)."""
    require_simd()
    rng = np.random.default_rng(SEED + 7)
    arrays, expected = {"n": np.array(40)}, {}
    for i in range(40):
        q, w, k, c, pos = _case(rng, integer=False)
        if i % 4 == 0:
            k = np.round(k * 2) / 2  # exact ties and signed zeros
        c = np.ones(len(k), np.float32) if c is None else c
        topk = int(rng.integers(1, 80))
        arrays.update(
            {f"q_{i}": q, f"w_{i}": w, f"k_{i}": k, f"c_{i}": c, f"pos_{i}": pos, f"topk_{i}": np.array(topk)}
        )
        s = np.zeros((len(pos), topk), np.float32)
        expected[f"rows_{i}"] = ks.indexer_topk(q, w, k, pos, topk, key_scale=c, scores_out=s)
        expected[f"scores_{i}"] = s
    np.savez(tmp_path / "in.npz", **arrays)
    assert_child_equals(_SCALAR_CHILD, tmp_path, level, expected)


_PAIRS_CHILD = """
import sys
import numpy as np
import kvselect as ks
data = np.load(sys.argv[1])
out = {}
for i in range(int(data["n"])):
    fmt = str(data[f"fmt_{i}"])
    s = np.zeros((len(data[f"pos_{i}"]), int(data[f"topk_{i}"])), np.float32)
    scale = data[f"c_{i}"] if fmt == "float8_e4m3fn" else None
    out[f"rows_{i}"] = ks.indexer_topk(data[f"q_{i}"], data[f"w_{i}"], data[f"k_{i}"], data[f"pos_{i}"],
                                       int(data[f"topk_{i}"]), key_scale=scale, key_format=fmt,
                                       query_format=fmt, scores_out=s)
    out[f"scores_{i}"] = s
np.savez(sys.argv[2], **out)
"""


@pytest.mark.parametrize("level", ["avx512bf16", "avx512", "avx2", "scalar"])
def test_bf16_and_fp8_queries_give_the_same_rows_and_score_bits_at_every_level(tmp_path, level):
    """The pair level's inputs (bfloat16 queries × bfloat16 keys, fp8 queries ×
    fp8 keys with scales, read as raw views) give the same rows and score bits
    at every level as in this process, whichever level it runs: blocks the
    pair level admits (exponents near 0) and, in bfloat16, blocks it must
    hand to the float32 kernel (keys near 2⁻⁶⁰ against queries near 2⁻⁵⁶,
    where the instruction's flushes would act); NaN keys and signed zeros in
    both formats. The pair level
    runs in a child with ``KVSELECT_SIMD=avx512bf16`` wherever the CPU has it,
    default or not."""
    import os

    if not level_runs(level):
        if level in ("avx2", "scalar") and os.environ.get("KVSELECT_REQUIRE_AVX2") == "1":
            pytest.fail(f"KVSELECT_REQUIRE_AVX2=1, but KVSELECT_SIMD={level} is not that level")
        pytest.skip(f"this CPU has no {level} level")
    rng = np.random.default_rng(SEED + 46)
    arrays, expected = {"n": np.array(24)}, {}
    for i in range(24):
        n, h, t = int(rng.integers(1, 4)), int(rng.choice([1, 3, 8, 13, 64])), int(rng.integers(1, 300))
        d = int(rng.choice([2, 8, 32, 128]))
        q = rng.standard_normal((n, h, d)).astype(np.float32)
        k = rng.standard_normal((t, d)).astype(np.float32)
        bf16 = i % 2 == 1
        if bf16 and i % 3 == 1:
            # Tiny bfloat16 keys and queries: the blocks holding the tiny keys
            # must fall back (exponent sum below -112); fp8 cannot get there.
            k[rng.random(t) < 0.3] *= np.float32(2.0**-60)
            q *= np.float32(2.0**-56)
        if i % 4 in (1, 2):  # both formats: a NaN key, signed zeros
            k[rng.integers(0, t)] = np.nan
            k[rng.random((t, d)) < 0.1] = -0.0
        fmt = "bfloat16" if bf16 else "float8_e4m3fn"
        dtype = ml_dtypes.bfloat16 if bf16 else ml_dtypes.float8_e4m3fn
        raw = np.uint16 if bf16 else np.uint8
        qq, kk = q.astype(dtype).view(raw), k.astype(dtype).view(raw)
        w = rng.standard_normal((n, h)).astype(np.float32)
        c = rng.uniform(0.5, 2.0, t).astype(np.float32)
        pos, topk = rng.integers(0, t + 5, n), int(rng.integers(1, 80))
        arrays.update(
            {f"q_{i}": qq, f"w_{i}": w, f"k_{i}": kk, f"c_{i}": c, f"pos_{i}": pos}
            | {f"topk_{i}": np.array(topk), f"fmt_{i}": np.array(fmt)}
        )
        s = np.zeros((n, topk), np.float32)
        scale = c if fmt == "float8_e4m3fn" else None
        expected[f"rows_{i}"] = ks.indexer_topk(
            qq, w, kk, pos, topk, key_scale=scale, key_format=fmt, query_format=fmt, scores_out=s
        )
        expected[f"scores_{i}"] = s
    np.savez(tmp_path / "in.npz", **arrays)
    assert_child_equals(_PAIRS_CHILD, tmp_path, level, expected)


def test_the_pair_level_is_the_default_exactly_where_its_race_pays():
    """``_pair_speedup()`` is None exactly where the CPU has no pair level
    (``KVSELECT_SIMD=avx512bf16`` cannot reach it), and, with no
    ``KVSELECT_SIMD``, the default level is the pair level exactly where the
    process's own race found at least 1.3 (each process races once: the
    level and the ratio are read in one child)."""
    import os
    import subprocess
    import sys

    def child(env: dict) -> list:
        code = "import kvselect as ks; from kvselect import _core; print(ks.simd_level(), _core._pair_speedup())"
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        return out.stdout.split()

    bare = {k: v for k, v in os.environ.items() if k != "KVSELECT_SIMD"}
    level, ratio = child(bare)
    asked, _ = child(dict(bare, KVSELECT_SIMD="avx512bf16"))
    assert (ratio == "None") == (asked != "avx512bf16"), (level, ratio, asked)
    if ratio != "None":
        assert float(ratio) > 0
        assert (level == "avx512bf16") == (float(ratio) >= 1.3), (level, ratio)
    else:
        assert level != "avx512bf16"
