"""Quest's page bounds, scores and page sets: the native core against the
NumPy twin (kvselect.reference.quest) on thousands of random and adversarial
cases, dense / packed / paged, every variant; the decode update against a
build; every SIMD level against the best; refusals that write nothing."""

import numpy as np
import pytest
from levels import assert_child_equals, require_simd

import kvselect as ks
from kvselect import reference as R

SEED = 20261205
VARIANTS = ("kernel", "eval", "sglang")


def _bits_equal(a, b):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def _case(rng, integer=True):
    """Keys ``[n, h, d]``, a query ``[hq, d]``, the page size: integer-valued
    data (every score exact in float32 and float64, many exact ties) or floats."""
    h = int(rng.choice([1, 2, 4]))
    g = int(rng.choice([1, 2, 4]))
    d = int(rng.integers(1, 20))
    p = int(rng.choice([1, 2, 3, 16]))
    n = int(rng.integers(1, 6 * p + 3))
    if integer:
        keys = rng.integers(-3, 4, (n, h, d)).astype(np.float32)
        q = rng.integers(-2, 3, (h * g, d)).astype(np.float32)
    else:
        keys = rng.standard_normal((n, h, d)).astype(np.float32)
        q = rng.standard_normal((h * g, d)).astype(np.float32)
    return keys, q, p


def test_integer_data_equals_the_twin_exactly_in_every_variant():
    """2,000 cases: bounds and scores bit for bit, page sets exactly (ties
    included: integer scores tie often, and both break them to the lower page)."""
    rng = np.random.default_rng(SEED)
    for case in range(2000):
        keys, q, p = _case(rng)
        lo, hi = ks.quest_bounds(keys, p)
        rlo, rhi = R.quest_bounds(keys, p)
        assert _bits_equal(lo, rlo) and _bits_equal(hi, rhi), case
        n_pages = len(lo)
        budget = int(rng.integers(1, n_pages + 4))
        r = int(rng.integers(0, 6))
        for v in VARIANTS:
            assert np.array_equal(ks.quest_scores(q, lo, hi, variant=v), R.quest_scores(q, rlo, rhi, variant=v)), (
                case,
                v,
            )
            got = ks.quest_select(q, lo, hi, len(keys), budget, p, variant=v, num_recent_pages=r)
            want = R.quest_select(q, rlo, rhi, len(keys), budget, p, variant=v, num_recent_pages=r)
            assert np.array_equal(got, want), (case, v, budget, r)


def _near_tie_only(got, want, scores, tol):
    """Rows that differ only by pages whose twin scores lie within ``tol`` of
    the row's threshold (float32 rounding may order them either way)."""
    for j in range(len(got)):
        a, b = set(got[j][got[j] >= 0]), set(want[j][want[j] >= 0])
        if a == b:
            continue
        if len(a) != len(b):
            return False
        s = scores[j] if scores.ndim == 2 else scores
        diff = sorted(a ^ b)
        if np.ptp(s[diff]) > 2 * tol[j if np.ndim(tol) else 0]:
            return False
    return True


def test_float_data_agrees_with_the_twin_up_to_float32_rounding():
    """1,500 cases of float data: bounds bit for bit (no arithmetic enters
    them), scores within the float32 summation bound, page sets equal but
    for pages tied within it."""
    rng = np.random.default_rng(SEED + 1)
    for case in range(1500):
        keys, q, p = _case(rng, integer=False)
        lo, hi = ks.quest_bounds(keys, p)
        rlo, rhi = R.quest_bounds(keys, p)
        assert _bits_equal(lo, rlo) and _bits_equal(hi, rhi), case
        budget = int(rng.integers(1, len(lo) + 3))
        for v in VARIANTS:
            s = ks.quest_scores(q, lo, hi, variant=v)
            want_s = R.quest_scores(q, rlo, rhi, variant=v)
            d = q.shape[1] * (lo.shape[1] if v == "sglang" else 1)
            mag = np.abs(R.quest_scores(np.abs(q), np.abs(rlo), np.abs(rhi), variant=v)) + np.abs(want_s)
            tol = (d + 2) * 2.0**-23 * mag.max(axis=-1) + 1e-30
            assert np.all(
                np.abs(s - want_s) <= np.atleast_1d(tol)[..., None] if s.ndim == 2 else np.abs(s - want_s) <= tol
            )
            got = ks.quest_select(q, lo, hi, len(keys), budget, p, variant=v)
            want = R.quest_select(q, rlo, rhi, len(keys), budget, p, variant=v)
            assert got.shape == want.shape
            assert _near_tie_only(got, want, np.atleast_2d(want_s), np.atleast_1d(tol)), (case, v)


def test_packed_sequences_are_each_their_own():
    """A packed batch's bounds are each sequence's, its page sets each
    sequence's alone (500 batches, integer data: exact)."""
    rng = np.random.default_rng(SEED + 2)
    for case in range(500):
        h, g, d, p = 2, 2, int(rng.integers(1, 9)), int(rng.choice([2, 16]))
        lens = rng.integers(1, 5 * p, int(rng.integers(1, 5)))
        cu = np.r_[0, np.cumsum(lens)]
        keys = rng.integers(-3, 4, (int(cu[-1]), h, d)).astype(np.float32)
        lo, hi = ks.quest_bounds(keys, p, cu_seqlens=cu)
        rlo, rhi = R.quest_bounds(keys, p, cu_seqlens=cu)
        assert _bits_equal(lo, rlo) and _bits_equal(hi, rhi)
        q = rng.integers(-2, 3, (len(lens), h * g, d)).astype(np.float32)
        budget = int(rng.integers(1, 6))
        for v in VARIANTS:
            got = ks.quest_select(q, lo, hi, lens, budget, p, variant=v)
            assert np.array_equal(got, R.quest_select(q, rlo, rhi, lens, budget, p, variant=v)), (case, v)
            at = 0
            for s, n in enumerate(lens):
                np_ = -(-int(n) // p)
                one = ks.quest_select(q[s], lo[at : at + np_], hi[at : at + np_], int(n), budget, p, variant=v)
                assert np.array_equal(got[s], one)
                at += np_


def _bf16_bits(x):
    b = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)


def _fp8_codes(rng, shape):
    """Random e4m3fn codes, never NaN (0x7F / 0xFF)."""
    c = rng.integers(0, 256, shape).astype(np.uint8)
    return np.where((c & 0x7F) == 0x7F, c ^ 1, c).astype(np.uint8)


@pytest.mark.parametrize("layout", ["bfloat16", "fp8_scaled"])
def test_paged_caches_equal_the_dense_keys(layout):
    """An engine's paged cache (bfloat16 pages, or fp8 e4m3fn pages with a
    float32 scale per key) gives the bounds of the same keys laid out densely,
    natively and in the twin; 300 batches with shuffled block tables."""
    rng = np.random.default_rng(SEED + 3)
    for case in range(300):
        h, d, p = int(rng.choice([1, 2])), int(rng.integers(1, 9)), int(rng.choice([2, 4, 16]))
        row, nb = h * d, 12
        lens = rng.integers(1, 3 * p + 1, int(rng.integers(1, 4)))
        mb = -(-int(lens.max()) // p)
        table = rng.permutation(nb)[: len(lens) * mb].reshape(len(lens), mb).astype(np.int32)
        if layout == "bfloat16":
            cache = _bf16_bits(rng.standard_normal((nb, p, row)))
            kw = {"key_format": "bfloat16"}
            flat_keys = cache
            scales = None
        else:
            codes = _fp8_codes(rng, (nb, p * row))
            sc = rng.uniform(0.01, 2.0, (nb, p)).astype(np.float32)
            cache = np.concatenate([codes, sc.view(np.uint8).reshape(nb, 4 * p)], axis=1).reshape(nb, p, row + 4)
            kw = {"page_layout": "fp8_scaled"}
            flat_keys = codes.reshape(nb, p, row)
            scales = sc
        lo, hi = ks.quest_bounds_paged(cache, table, lens, h, **kw)
        rlo, rhi = R.quest_bounds_paged(cache, table, lens, h, **kw)
        assert _bits_equal(lo, rlo) and _bits_equal(hi, rhi), case
        # The same keys, dense and packed.
        tok = [(s, t) for s, n in enumerate(lens) for t in range(int(n))]
        dense = np.stack([flat_keys[table[s, t // p], t % p] for s, t in tok]).reshape(len(tok), h, d)
        cu = np.r_[0, np.cumsum(lens)]
        if scales is None:
            dlo, dhi = ks.quest_bounds(dense, p, key_format="bfloat16", cu_seqlens=cu)
        else:
            ksc = np.array([scales[table[s, t // p], t % p] for s, t in tok], np.float32)
            dlo, dhi = ks.quest_bounds(dense, p, key_format="float8_e4m3fn", key_scale=ksc, cu_seqlens=cu)
        assert _bits_equal(lo, dlo) and _bits_equal(hi, dhi), case


def test_the_decode_update_equals_the_build_over_a_stale_buffer():
    """Keys appended one decode step at a time into a buffer full of an
    earlier sequence's bounds give the bounds built from the keys, bit for
    bit (a page's first key resets it), in every key format; the twin alike."""
    rng = np.random.default_rng(SEED + 4)
    for case in range(200):
        h, d, p = int(rng.choice([1, 3])), int(rng.integers(1, 12)), int(rng.choice([1, 3, 16]))
        n = int(rng.integers(1, 5 * p))
        fmt = ["float32", "bfloat16", "float8_e4m3fn"][case % 3]
        if fmt == "float32":
            keys = rng.standard_normal((n, h, d)).astype(np.float32)
        elif fmt == "bfloat16":
            keys = _bf16_bits(rng.standard_normal((n, h, d)))
        else:
            keys = _fp8_codes(rng, (n, h, d))
        kf = None if fmt == "float32" else fmt
        scale = rng.uniform(0.1, 2.0, n).astype(np.float32) if fmt == "float8_e4m3fn" else None
        lo, hi = ks.quest_bounds(keys, p, key_format=kf, key_scale=scale)
        stale = rng.standard_normal((2,) + lo.shape).astype(np.float32) * 100
        ulo, uhi = stale[0].copy(), stale[1].copy()
        rlo, rhi = stale[0].copy(), stale[1].copy()
        for t in range(n):
            c = None if scale is None else float(scale[t])
            ks.quest_update(ulo, uhi, keys[t], t, p, key_scale=c, key_format=kf)
            R.quest_update(rlo, rhi, keys[t], t, p, key_scale=c, key_format=kf)
        assert _bits_equal(ulo, lo) and _bits_equal(uhi, hi), case
        assert _bits_equal(rlo, lo) and _bits_equal(rhi, hi), case


def test_adversarial_cases():
    # Every page ties: the lowest pages, the last forced (kernel), none forced (eval).
    keys = np.ones((80, 1, 4), np.float32)
    lo, hi = ks.quest_bounds(keys)
    q = np.ones((2, 4), np.float32)
    assert ks.quest_select(q, lo, hi, 80, 3).tolist() == [[0, 1, 4]] * 2
    assert ks.quest_select(q, lo, hi, 80, 3, variant="eval").tolist() == [[0, 1, 2]] * 2
    assert ks.quest_select(q, lo, hi, 80, 3, variant="sglang", num_recent_pages=1).tolist() == [[0, 1, 4]]
    # Fewer pages than the budget: every page, -1 after.
    assert ks.quest_select(q, lo, hi, 80, 7).tolist() == [[0, 1, 2, 3, 4, -1, -1]] * 2
    # The query in the first page: one page, whatever the budget.
    one_lo, one_hi = ks.quest_bounds(keys[:5])
    for v in VARIANTS:
        assert ks.quest_select(q, one_lo, one_hi, 5, 1, variant=v)[0, 0] == 0
    # A last page partly filled: bounded over its own keys, never the slots after.
    k = np.zeros((18, 1, 1), np.float32)
    k[16:] = -1.0
    lo, hi = ks.quest_bounds(k)
    assert lo[1, 0, 0] == -1.0 and hi[1, 0, 0] == -1.0
    # NaN keys are ignored; a dimension all NaN is NaN, and its page ranks last.
    k = np.arange(64, dtype=np.float32).reshape(64, 1, 1)
    k[:16] = np.nan
    k[17] = np.nan
    lo, hi = ks.quest_bounds(k)
    assert np.isnan(lo[0, 0, 0]) and lo[1, 0, 0] == 16.0 and hi[1, 0, 0] == 31.0
    assert ks.quest_select(np.ones((1, 1), np.float32), lo, hi, 64, 3).tolist() == [[1, 2, 3]]


def test_sglang_averages_bfloat16_queries_in_bfloat16():
    """SGLang's group mean is rounded to the query's dtype: a bfloat16 query
    (a raw uint16 view) whose float32 mean is not a bfloat16 value scores
    with the rounded mean; the same values as float32 do not round."""
    q32 = np.array([[1.0], [1.0 + 2.0**-7]], np.float32)  # mean 1 + 2^-8: a bf16 tie, to 1.0
    lo = np.array([[[2.0]]], np.float32)
    hi = np.array([[[2.0]]], np.float32)
    bits = _bf16_bits(q32)
    assert ks.quest_scores(bits, lo, hi, variant="sglang", query_format="bfloat16").tolist() == [2.0]
    assert ks.quest_scores(q32, lo, hi, variant="sglang").tolist() == [2.0 + 2.0**-7]
    assert R.quest_scores(bits, lo, hi, variant="sglang", query_format="bfloat16").tolist() == [2.0]


def test_refusals_name_the_argument_and_leave_the_buffers():
    keys = np.ones((40, 2, 4), np.float32)
    lo, hi = ks.quest_bounds(keys)
    q = np.ones((4, 4), np.float32)
    with pytest.raises(ks.SelectionError, match="keys must be 3-D") as e:
        ks.quest_bounds(keys[0])
    assert e.value.argument == "keys"
    with pytest.raises(ks.SelectionError, match="key_scale") as e:
        ks.quest_bounds(keys, key_scale=np.ones(3, np.float32))
    assert e.value.argument == "key_scale"
    with pytest.raises(ks.SelectionError, match="cu_seqlens") as e:
        ks.quest_bounds(keys, cu_seqlens=[0, 50, 40])
    assert e.value.argument == "cu_seqlens"
    with pytest.raises(ks.SelectionError, match="page_budget") as e:
        ks.quest_select(q, lo, hi, 40, 0)
    assert e.value.argument == "page_budget"
    with pytest.raises(ks.SelectionError, match="seq_lens") as e:
        ks.quest_select(q, lo, hi, 0, 2)
    assert e.value.argument == "seq_lens"
    with pytest.raises(ks.SelectionError, match="the bounds hold 3 pages") as e:
        ks.quest_select(q, lo, hi, 20, 2)
    assert e.value.argument == "kmin"
    with pytest.raises(ks.SelectionError, match="not a positive multiple") as e:
        ks.quest_select(q[:3], lo, hi, 40, 2)
    assert e.value.argument == "q"
    with pytest.raises(ks.SelectionError, match="variant") as e:
        ks.quest_select(q, lo, hi, 40, 2, variant="dense")
    assert e.value.argument == "variant"
    with pytest.raises(ks.SelectionError, match="n_kv_heads") as e:
        ks.quest_bounds_paged(np.ones((2, 16, 6), np.float32), np.array([[0]], np.int32), [5], 4)
    assert e.value.argument == "n_kv_heads"
    # The update: refused, nothing written.
    before = (lo.copy(), hi.copy())
    for args, kwargs, arg in [
        ((keys[0], 48), {}, "pos"),
        ((keys[0, :1], 3), {}, "key"),
    ]:
        with pytest.raises(ks.SelectionError) as e:
            ks.quest_update(lo, hi, *args, **kwargs)
        assert e.value.argument == arg
        assert _bits_equal(lo, before[0]) and _bits_equal(hi, before[1])
    with pytest.raises(ks.SelectionError, match="overlaps") as e:
        ks.quest_update(lo, lo, keys[0], 3)
    assert e.value.argument == "kmax"
    with pytest.raises(TypeError, match="kmin must have dtype float32"):
        ks.quest_update(lo.astype(np.float64), hi, keys[0], 3)
    assert _bits_equal(lo, before[0]) and _bits_equal(hi, before[1])


_CHILD = """
import sys, numpy as np, kvselect as ks
data = np.load(sys.argv[1])
out = {}
for i in range(int(data["n"])):
    keys, q, p, n = data[f"k_{i}"], data[f"q_{i}"], int(data[f"p_{i}"]), int(data[f"n_{i}"])
    lo, hi = ks.quest_bounds(keys, p)
    out[f"lo_{i}"], out[f"hi_{i}"] = lo, hi
    for v in ("kernel", "eval", "sglang"):
        out[f"s_{v}_{i}"] = ks.quest_scores(q, lo, hi, variant=v)
        out[f"r_{v}_{i}"] = ks.quest_select(q, lo, hi, n, 3, p, variant=v)
np.savez(sys.argv[2], **out)
"""


@pytest.mark.parametrize("level", ["scalar", "avx2"])
def test_every_simd_level_gives_the_same_bits(tmp_path, level):
    """Bounds, score bits and page sets at KVSELECT_SIMD=scalar / avx2 (in a
    child process) equal the best level's, on float data with ties, -0.0
    and NaN keys, on page counts past the parallel threshold."""
    require_simd()
    rng = np.random.default_rng(SEED + 5)
    arrays, expected = {"n": np.array(30)}, {}
    for i in range(30):
        keys, q, p = _case(rng, integer=False)
        if i % 3 == 0:
            keys = np.round(keys * 2) / 2
            keys[rng.random(keys.shape) < 0.05] = -0.0
            keys[rng.random(keys.shape) < 0.02] = np.nan
        if i == 0:
            keys = rng.standard_normal((9000, 2, 24)).astype(np.float32)
            q, p = rng.standard_normal((8, 24)).astype(np.float32), 16
        arrays.update({f"k_{i}": keys, f"q_{i}": q, f"p_{i}": np.array(p), f"n_{i}": np.array(len(keys))})
        lo, hi = ks.quest_bounds(keys, p)
        expected[f"lo_{i}"], expected[f"hi_{i}"] = lo, hi
        for v in VARIANTS:
            expected[f"s_{v}_{i}"] = ks.quest_scores(q, lo, hi, variant=v)
            expected[f"r_{v}_{i}"] = ks.quest_select(q, lo, hi, len(keys), 3, p, variant=v)
    np.savez(tmp_path / "in.npz", **arrays)
    # A NaN key's bound may be another NaN at another level (its sign and
    # payload are not part of the bound); every other value bit for bit.
    assert_child_equals(_CHILD, tmp_path, level, expected, nan_bits=False)


def test_paged_bounds_into_the_callers_buffers():
    """``quest_bounds_paged(..., out=(kmin, kmax))``, as ``quest_bounds``': written
    and returned, the same bits as new arrays; a buffer of another shape, shared by
    both, or sharing the cache's, the table's or the lengths' memory is refused
    naming ``out`` and left as it was."""
    rng = np.random.default_rng(SEED + 7)
    cache = rng.standard_normal((6, 4, 16)).astype(np.float32)
    table = rng.permutation(6).astype(np.int32).reshape(2, 3)
    lens = np.array([9, 12], np.int64)
    lo, hi = ks.quest_bounds_paged(cache, table, lens, 2)
    out = (np.full_like(lo, 7.0), np.full_like(hi, 7.0))
    got = ks.quest_bounds_paged(cache, table, lens, 2, out=out)
    assert got[0] is out[0] and got[1] is out[1]
    assert _bits_equal(out[0], lo) and _bits_equal(out[1], hi)
    small = (np.full((5, 2, 8), 5.0, np.float32), np.full((5, 2, 8), 5.0, np.float32))
    with pytest.raises(ks.SelectionError, match="out must have shape") as e:
        ks.quest_bounds_paged(cache, table, lens, 2, out=small)
    assert e.value.argument == "out" and (small[0] == 5.0).all() and (small[1] == 5.0).all()
    shared = np.full_like(lo, 5.0)
    with pytest.raises(ks.SelectionError, match="overlaps") as e:
        ks.quest_bounds_paged(cache, table, lens, 2, out=(shared, shared))
    assert e.value.argument == "out" and (shared == 5.0).all()
    for name in ("cache", "table", "lens"):
        blob = np.zeros(cache.nbytes + lo.nbytes, np.uint8)
        args = {"cache": cache, "table": table, "lens": lens}
        src = args[name]
        alias = blob[: src.nbytes].view(src.dtype).reshape(src.shape)
        alias[...] = src
        args[name] = alias
        buf = blob[: lo.nbytes].view(np.float32).reshape(lo.shape)
        before = blob.copy()
        with pytest.raises(ks.SelectionError, match="overlaps") as e:
            ks.quest_bounds_paged(args["cache"], args["table"], args["lens"], 2, out=(buf, np.empty_like(hi)))
        assert e.value.argument == "out" and (blob == before).all(), name


def test_a_paged_length_past_an_int32_position_is_refused_naming_seq_lens():
    # Refused before the bounds are sized by it (2**40 tokens' pages was a MemoryError).
    cache = np.zeros((6, 4, 16), np.float32)
    table = np.arange(6, dtype=np.int32).reshape(2, 3)
    for m, err in ((ks, ks.SelectionError), (R, R.ReferenceSelectionError)):
        with pytest.raises(err, match="at most 2147483647 tokens") as e:
            m.quest_bounds_paged(cache, table, np.array([2**40, 3]), 2)
        assert e.value.argument == "seq_lens"


def test_bounds_into_the_callers_buffers():
    """``out=(kmin, kmax)``: written and returned, the same bits as new
    arrays; a buffer of another shape, dtype, or shared by both is refused
    naming ``out`` and left as it was."""
    keys = np.random.default_rng(SEED + 6).standard_normal((50, 2, 8)).astype(np.float32)
    lo, hi = ks.quest_bounds(keys)
    out = (np.full_like(lo, 7.0), np.full_like(hi, 7.0))
    got = ks.quest_bounds(keys, out=out)
    assert got[0] is out[0] and got[1] is out[1]
    assert _bits_equal(out[0], lo) and _bits_equal(out[1], hi)
    small = (np.full((3, 2, 7), 5.0, np.float32), np.full((3, 2, 7), 5.0, np.float32))
    with pytest.raises(ks.SelectionError, match="out must have shape") as e:
        ks.quest_bounds(keys, out=small)
    assert e.value.argument == "out" and (small[0] == 5.0).all()
    shared = np.full_like(lo, 5.0)
    with pytest.raises(ks.SelectionError, match="overlaps") as e:
        ks.quest_bounds(keys, out=(shared, shared))
    assert e.value.argument == "out" and (shared == 5.0).all()
    with pytest.raises(TypeError, match="out must be a tuple"):
        ks.quest_bounds(keys, out=lo)
    with pytest.raises(TypeError, match="^out must have dtype float32, got float64"):
        ks.quest_bounds(keys, out=(lo.astype(np.float64), hi))
