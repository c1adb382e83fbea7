"""kvselect's own selections are the real-arithmetic top-k that ``check``
decides: the float32 kernel screens, the near ties at a row's threshold are
re-scored in float64 (src/indexer/exact.rs). So on random float data — where
float32 rounding decides near ties — every row's set equals the float64
reference's, every form and format, and passes the exact check at
``rtol = 0``; the listing order stays the float32 scores' (``scores_out``)."""

import numpy as np
import pytest
from pages import vllm_fp8_pages

import kvselect as ks
from kvselect import checking
from kvselect import reference as ref
from kvselect.testing import cases

ml_dtypes = pytest.importorskip("ml_dtypes")

SEED = 20261205


def _sets_equal(got, want):
    """Row by row, the same positions (the listing order is checked apart)."""
    assert got.shape == want.shape
    for i, (a, b) in enumerate(zip(got, want)):
        assert sorted(a[a >= 0]) == sorted(b[b >= 0]), f"row {i}"


def _low_contrast_operands(rng, n, h, d, t, spread):
    """Keys a few float32 ULPs apart in their scores: ``k_t = base + tiny``."""
    base = rng.standard_normal(d).astype(np.float32)
    k = (base + rng.integers(-spread, spread + 1, (t, d)) * np.float32(2.0**-22)).astype(np.float32)
    q = np.abs(rng.standard_normal((n, h, d))).astype(np.float32) * np.sign(base)
    w = rng.uniform(0.5, 1.5, (n, h)).astype(np.float32)
    return q, w, k


def _key_format(k, fmt):
    """``k`` (float32) rounded into format ``fmt``, as the call takes it, and
    the float32 values it holds."""
    if fmt == "float32":
        return k, None, k
    dt = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16, "float8_e4m3fn": ml_dtypes.float8_e4m3fn}[fmt]
    enc = k.astype(dt)
    raw = enc.view(np.uint8 if fmt == "float8_e4m3fn" else np.uint16)
    return raw, fmt, enc.astype(np.float32)


@pytest.mark.parametrize("fmt", ["float32", "bfloat16", "float16", "float8_e4m3fn"])
@pytest.mark.parametrize("contrast", ["random", "low"])
def test_dense_rows_are_the_float64_top_k_and_pass_the_exact_check(fmt, contrast):
    rng = np.random.default_rng(SEED + len(fmt) + (0 if contrast == "random" else 100))
    changed = 0
    for _ in range(150):
        n, h, d, t = (
            int(rng.integers(1, 4)),
            int(rng.integers(1, 9)),
            int(rng.integers(1, 40)),
            int(rng.integers(1, 500)),
        )
        if contrast == "random":
            q = rng.standard_normal((n, h, d)).astype(np.float32)
            w = rng.standard_normal((n, h)).astype(np.float32)
            k = rng.standard_normal((t, d)).astype(np.float32)
        else:
            q, w, k = _low_contrast_operands(rng, n, h, d, t, 3)
        raw, kf, k32 = _key_format(k, fmt)
        c = rng.uniform(0.5, 2, t).astype(np.float32) if rng.random() < 0.5 else None
        pos = rng.integers(0, t + 3, n)
        topk, s = int(rng.integers(1, 60)), int(rng.choice([0, 0, 3]))
        scores = np.zeros((n, topk), np.float32)
        got = ks.indexer_topk(q, w, raw, pos, topk, key_scale=c, key_format=kf, num_segments=s, scores_out=scores)
        want = ref.indexer_topk(q, w, k32, pos, topk, key_scale=c, num_segments=s)
        _sets_equal(got, want)
        if s == 0:
            report = checking.check_indexer_topk(got, q, w, raw, pos, topk, key_scale=c, key_format=kf, atol=0, rtol=0)
            assert report["wrong"] == 0, report.summary()
            # Listed in the float32 scores' order (ties to the lower position).
            for row, sc in zip(got, scores):
                m = row >= 0
                order = np.lexsort((row[m], -sc[m]))
                assert np.array_equal(order, np.arange(m.sum()))
        f32_rows = _float32_rows(q, w, raw, pos, topk, c, kf, s)
        changed += int((np.sort(f32_rows, axis=1) != np.sort(got, axis=1)).any(axis=1).sum())
    # The data really holds near ties float32 decides wrongly (low contrast).
    if contrast == "low" and fmt == "float32":
        assert changed > 0


def _float32_rows(q, w, k, pos, topk, c, kf, s):
    """The top-k of the float32 scores themselves (what kvselect returned
    before its selections were exact)."""
    sc = ks.indexer_scores(q, w, k, pos, key_scale=c, key_format=kf)
    out = np.full((len(q), topk), -1, np.int64)
    for i, row in enumerate(sc):
        L = int(np.sum(~np.isnan(row)))
        take = min(max(topk - s, 0), L)
        key = np.where(np.isnan(row[:L]), np.inf, -(row[:L].astype(np.float64) + 0.0))
        order = np.lexsort((np.arange(L), key, np.isnan(row[:L])))
        out[i, :take] = order[:take]
    return out


def test_the_packed_and_paged_forms_are_the_float64_top_k():
    rng = np.random.default_rng(SEED + 7)
    for case in range(120):
        h, d, bs = int(rng.integers(1, 6)), int(rng.integers(1, 24)), int(rng.choice([1, 4, 16]))
        lens = rng.integers(0, 200, int(rng.integers(1, 4)))
        keys, scales = [], []
        for n_tok in lens:
            raw = rng.standard_normal((n_tok, d)).astype(np.float32)
            if case % 2:  # low contrast: one base key, a few ULPs apart
                raw = (raw[:1] + rng.integers(-2, 3, (n_tok, d)) * np.float32(2.0**-21)).astype(np.float32)
            c = (np.maximum(np.abs(raw).max(axis=1, initial=0), 1e-4) / 448).astype(np.float32)
            keys.append((raw / c[:, None]).astype(ml_dtypes.float8_e4m3fn).astype(np.float32))
            scales.append(c)
        n = int(rng.integers(1, 6))
        sid = rng.integers(0, len(lens), n)
        pos = rng.integers(0, 210, n)
        q = rng.standard_normal((n, h, d)).astype(np.float32)
        w = rng.uniform(0.2, 1.0, (n, h)).astype(np.float32)
        topk = int(rng.integers(1, 50))
        cache, table = vllm_fp8_pages(keys, scales, bs, rng)
        got = ks.indexer_topk_paged(q, w, cache, table, lens, sid, pos, topk, page_layout="fp8_scaled")
        want = ref.indexer_topk_paged(q, w, cache, table, lens, sid, pos, topk, page_layout="fp8_scaled")
        _sets_equal(got, want)
        cu = np.concatenate([[0], np.cumsum(lens)])
        k_all = np.concatenate(keys) if len(keys) else np.zeros((0, d), np.float32)
        c_all = np.concatenate(scales)
        packed = ks.indexer_topk_packed(q, w, k_all, cu, sid, pos, topk, key_scale=c_all)
        np.testing.assert_array_equal(packed, got)
        report = checking.check_indexer_topk(
            packed, q, w, k_all, pos, topk, key_scale=c_all, cu_seqlens=cu, seq_ids=sid, atol=0, rtol=0
        )
        assert report["wrong"] == 0, report.summary()


def test_compressed_keys_are_the_float64_top_k():
    rng = np.random.default_rng(SEED + 8)
    for _ in range(100):
        n, h, d, t, m = 3, int(rng.integers(1, 5)), int(rng.integers(2, 20)), int(rng.integers(1, 120)), 4
        q, w, k = _low_contrast_operands(rng, n, h, d, t, 2)
        pos = rng.integers(0, 4 * t + 8, n)
        topk = int(rng.integers(1, 30))
        got = ks.indexer_topk(q, w, k, pos, topk, compress_ratio=m)
        _sets_equal(got, ref.indexer_topk(q, w, k, pos, topk, compress_ratio=m))
        report = checking.check_indexer_topk(got, q, w, k, pos, topk, compress_ratio=m, atol=0, rtol=0)
        assert report["wrong"] == 0, report.summary()


def test_a_float32_overflow_is_decided_in_float64():
    """Scores past float32's range are +inf in float32 (all tied, to the
    lowest positions) but finite and ordered in real arithmetic."""
    k = np.array([[1.0], [3.0], [2.0], [4.0]], np.float32) * np.float32(1e20)
    q = np.full((1, 1, 1), 1e20, np.float32)
    w = np.ones((1, 1), np.float32)
    assert np.isinf(ks.indexer_scores(q, w, k, [3])).all()
    got = ks.indexer_topk(q, w, k, [3], 2)
    assert sorted(got[0]) == [1, 3]


def test_the_shipped_cases_own_rows_pass_the_exact_check():
    """Every shipped top-k case (low-contrast ones included, at every score
    scale and form): kvselect's own rows pass the case's exact check."""
    call = {
        "dense": ks.indexer_topk,
        "compressed": ks.indexer_topk,
        "packed": ks.indexer_topk_packed,
        "paged": ks.indexer_topk_paged,
    }
    forms = set()
    for _, case in cases.all_topk_cases(seed=3):
        args = {k: v for k, v in case.inputs.items() if v is not None}
        case.assert_rows(call[case.form](**args))
        forms.add(case.form)
    assert forms == set(call)


def test_an_exact_tie_that_float64_rounding_splits_is_a_tie_to_the_check():
    """Two keys whose products are the same values in another order: their
    real scores are equal, but float64 sums (NumPy's pairwise order, a
    sequential chain) can round them apart by an ULP. The check decides up to
    float64 rounding: either key passes, and so does kvselect's own row."""
    rng = np.random.default_rng(SEED + 9)
    found = 0
    for _ in range(2000):
        d = 16
        a = (rng.integers(1, 8, d) * 2.0 ** rng.integers(-60, 0, d)).astype(np.float32)
        b = rng.permutation(a)
        q = np.ones((1, 1, d), np.float32)
        w = np.ones((1, 1), np.float32)
        k = np.stack([a, b])
        f64 = ref.indexer_scores(q, w, k, [1]).astype(np.float64)  # float32 out: use the float64 sums
        s = [float(np.sum(x.astype(np.float64))) for x in (a, b)]
        if s[0] == s[1]:
            continue
        found += 1
        for row in ([0], [1], list(ks.indexer_topk(q, w, k, [1], 1)[0])):
            report = checking.check_indexer_topk(np.array([row]), q, w, k, [1], 1, atol=0, rtol=0)
            assert report["wrong"] == 0, (row, s, f64)
        if found >= 5:
            break
    assert found >= 5


def _block_operands(rng, n, n_queries, n_heads, d, low):
    if low:  # every key within a few ULPs of one: block maxima crowd together
        base = rng.standard_normal(d).astype(np.float32)
        k = (base + rng.integers(-3, 4, (n, d)) * np.float32(2.0**-21)).astype(np.float32)
        q = (np.abs(rng.standard_normal((n_queries, n_heads, d))) * np.sign(base)).astype(np.float32)
    else:
        k = rng.standard_normal((n, d)).astype(np.float32)
        q = rng.standard_normal((n_queries, n_heads, d)).astype(np.float32)
    return q, k


@pytest.mark.parametrize("low", [False, True])
@pytest.mark.parametrize("fmt", ["float32", "bfloat16", "float8_e4m3fn"])
def test_block_selection_is_the_float64_top_k_dense_and_packed(low, fmt):
    """Block rows equal the float64 reference exactly (rows are ascending ids,
    so as arrays) on random and low-contrast float data, where float32
    rounding decides near ties; the packed form row for row the dense one."""
    rng = np.random.default_rng(SEED + 20 + int(low) + len(fmt))
    differ = 0
    for _ in range(120):
        bs = int(rng.choice([1, 2, 4, 8, 16]))
        cfg = ks.BlockSparseConfig(bs, int(rng.integers(1, 9)), int(rng.integers(0, 2)), int(rng.integers(0, 2)))
        n, d = int(rng.integers(1, 300)), int(rng.integers(1, 40))
        n_queries, n_heads = int(rng.integers(1, 4)), int(rng.integers(1, 5))
        q, k = _block_operands(rng, n, n_queries, n_heads, d, low)
        raw, kf, k32 = _key_format(k, fmt)
        pos = rng.integers(0, n + 4, n_queries)
        got = ks.block_sparse_select(q, raw, pos, cfg, key_format=kf)
        np.testing.assert_array_equal(got, ref.block_sparse_select(q, k32, pos, cfg))
        cu = np.array([0, n])
        packed = ks.block_sparse_select_packed(q, raw, cu, np.zeros(n_queries, np.int64), pos, cfg, key_format=kf)
        np.testing.assert_array_equal(packed, got)
        # How often the float32 block maxima would have chosen otherwise.
        s = ks.block_scores(q, raw, pos, cfg, key_format=kf)
        for j in range(n_queries):
            for h in range(n_heads):
                nb = int(np.sum(~np.isnan(s[j, h])))
                row = got[j, h][got[j, h] >= 0]
                free = [
                    b for b in range(min(cfg.init_blocks, nb), max(nb - cfg.local_blocks, min(cfg.init_blocks, nb)))
                ]
                chosen = [b for b in row if b in free]
                if chosen and len(chosen) < len(free):
                    order = sorted(free, key=lambda b: (-float(s[j, h, b]), b))[: len(chosen)]
                    differ += sorted(order) != sorted(chosen)
    if low and fmt == "float32":
        assert differ > 0  # the data really holds near ties float32 decides wrongly


def test_paged_block_selection_is_the_float64_top_k():
    rng = np.random.default_rng(SEED + 30)
    for case in range(60):
        bs = int(rng.choice([2, 4, 8]))
        cfg = ks.BlockSparseConfig(bs, int(rng.integers(1, 6)), int(rng.integers(0, 2)), int(rng.integers(0, 2)))
        n_tok, d = int(rng.integers(1, 120)), int(rng.integers(1, 20))
        q, k = _block_operands(rng, n_tok, 2, 2, d, case % 2 == 1)
        need = -(-n_tok // bs)
        order = rng.permutation(need + 2)[:need]
        pages = np.zeros((need + 2, bs, d), np.float32)
        padded = np.zeros((need * bs, d), np.float32)
        padded[:n_tok] = k
        pages[order] = padded.reshape(need, bs, d)
        table = np.zeros((1, need + 1), np.int32)
        table[0, :need] = order
        pos = rng.integers(0, n_tok + 2, 2)
        got = ks.block_sparse_select_paged(q, pages, table, [n_tok], [0, 0], pos, cfg)
        np.testing.assert_array_equal(got, ks.block_sparse_select(q, k, pos, cfg))
        np.testing.assert_array_equal(got, ref.block_sparse_select(q, k, pos, cfg))


def _float32_flips():
    """Two one-key blocks: real arithmetic ranks block 1 first (1 + 2^-23
    against 1 + 2^-23 - 2^-30), the float32 tree sums block 0 (1 + 2^-23
    against 1)."""
    q = np.ones((1, 1, 3), np.float32)
    k = np.array([[1, 2.0**-23 - 2.0**-30, 0], [1, 2.0**-24, 2.0**-24]], np.float32)
    return q, k, ks.BlockSparseConfig(1, 1, 0, 0)


def test_the_block_check_is_exact_dense_packed_and_paged():
    """assert_blocks (a blocks dump) passes the float64-correct row that the
    float32 block scores would fail, and fails the row they would pass; so
    does kvselect's own selection choose the former."""
    from kvselect.testing import CheckFailure, assert_blocks

    q, k, cfg = _float32_flips()
    s = ks.block_scores(q, k, [1], cfg)[0, 0]
    assert s[0] > s[1]  # float32 ranks block 0 first
    assert ks.block_sparse_select(q, k, [1], cfg).tolist() == [[[1]]]
    # The float32 check on the float32 scores says the opposite: it judges them as given.
    assert ks.check_blocks(s[None], np.array([[1]]), [2], cfg)["wrong"] == 1
    for form in ("dense", "packed", "paged"):
        kw = {}
        keys, pos, right, wrong = k, [1], [[[1]]], [[[0]]]
        if form == "packed":  # another sequence first: the query's keys start at 3
            keys = np.concatenate([np.zeros((3, 3), np.float32), k])
            kw = {"cu_seqlens": [0, 3, 5], "seq_ids": [1]}
        if form == "paged":  # physical page ids through a block table
            kw = {"block_table": np.array([[7, 4]], np.int32)}
            right, wrong = [[[4]]], [[[7]]]
        assert assert_blocks(np.array(right), q, keys, pos, cfg, rtol=0, atol=0, **kw)["wrong"] == 0
        with pytest.raises(CheckFailure, match="wrong_selection"):
            assert_blocks(np.array(wrong), q, keys, pos, cfg, rtol=0, atol=0, **kw)


def test_kvselects_own_block_rows_pass_the_exact_check_on_random_and_low_contrast_data():
    from kvselect.testing import assert_blocks

    rng = np.random.default_rng(SEED + 40)
    for case in range(40):
        bs = int(rng.choice([1, 2, 4]))
        cfg = ks.BlockSparseConfig(bs, int(rng.integers(1, 6)), int(rng.integers(0, 2)), int(rng.integers(0, 2)))
        n, d = int(rng.integers(1, 120)), int(rng.integers(1, 20))
        q, k = _block_operands(rng, n, 2, 3, d, case % 2 == 1)
        pos = rng.integers(0, n + 2, 2)
        rows = ks.block_sparse_select(q, k, pos, cfg)
        assert assert_blocks(rows, q, k, pos, cfg, rtol=0, atol=0)["wrong"] == 0


def test_check_blocks_judges_float64_scores_as_given_native_and_reference_alike():
    """float64 block scores are compared as given (two blocks 2^-40 apart are
    not a tie), as float32 they are one score; native and reference agree."""
    cfg = ks.BlockSparseConfig(1, 1, 0, 0)
    s = np.array([[1.0, 1.0 + 2.0**-40, 0.5]])
    for m in (ks, ref):
        assert m.check_blocks(s, np.array([[0]]), [3], cfg)["wrong"] == 1
        assert m.check_blocks(s, np.array([[1]]), [3], cfg)["wrong"] == 0
        assert m.check_blocks(s.astype(np.float32), np.array([[0]]), [3], cfg)["wrong"] == 0
    rng = np.random.default_rng(SEED + 50)
    for _ in range(200):
        n, t = 5, 12
        s = rng.choice([0.0, 1.0, 1.0 + 2.0**-45, 2.0, -np.inf], (n, t)) + rng.standard_normal((n, t)) * (
            rng.random() < 0.5
        )
        cfg = ks.BlockSparseConfig(1, int(rng.integers(1, 5)), int(rng.integers(0, 2)), int(rng.integers(0, 2)))
        rows = np.array([np.sort(rng.permutation(t)[: cfg.width]) for _ in range(n)])
        vis = rng.integers(cfg.width, t + 1, n)
        rows = np.where(rows < vis[:, None], rows, -1)
        assert repr(ks.check_blocks(s, rows, vis, cfg)) == repr(ref.check_blocks(s, rows, vis, cfg))
