"""The exact check means real arithmetic: kvselect.checking.check_indexer_topk
decides rows against scores exact up to float64 rounding (issue 22, §1), and
the report tells near-ties apart (§4)."""

import numpy as np
import pytest

import kvselect as ks
from kvselect import checking, reference
from kvselect.checking import dense as dense_check
from kvselect.checking import exact as exact_check

IMPLS = ["native", "reference"]


@pytest.fixture(params=["screened", "dense", "probed"])
def path(request, monkeypatch):
    """The check's two ways to the same report, and its own choice: every
    position screened in float32 with the band re-scored, every position
    re-scored in float64 (``_DENSE``), or as a probe of each sequence's first
    row chooses (``_PROBE_KEYS`` lowered so these small sequences are
    probed)."""
    if request.param == "probed":
        monkeypatch.setattr(dense_check, "_DENSE_WORK", 0)
    else:
        monkeypatch.setattr(dense_check, "_DENSE", request.param == "dense")
    return request.param


def _impl(name):
    return ks if name == "native" else reference


def _repro():
    q = np.ones((1, 1, 3), np.float32)
    w = np.ones((1, 1), np.float32)
    k = np.array([[1, 2.0**-23 - 2.0**-30, 0], [1, 2.0**-24, 2.0**-24]], np.float32)
    return q, w, k


def _margins(report):
    return [p["margin"] for x in report["details"] for p in x["problems"] if p["reason"] == "wrong_selection"]


def test_the_float64_correct_row_passes_at_rtol_zero_and_the_float32_one_fails_by_two_to_the_minus_30():
    q, w, k = _repro()
    f32 = ks.indexer_scores(q, w, k, [1])[0]
    assert f32[0] > f32[1]  # float32 rounding ranks 0 first
    exact = k.astype(np.float64).sum(axis=1)
    assert exact[1] > exact[0]  # real arithmetic ranks 1 first
    assert ks.indexer_topk(q, w, k, [1], 1)[0, 0] == 1  # and so does kvselect's own row
    right = checking.check_indexer_topk(np.array([[1]]), q, w, k, [1], 1, atol=0, rtol=0)
    assert right["wrong"] == 0
    wrong = checking.check_indexer_topk(np.array([[0]]), q, w, k, [1], 1, atol=0, rtol=0)
    assert wrong["wrong"] == 1 and _margins(wrong) == [pytest.approx(2.0**-30, rel=1e-12)]


def test_the_reproduction_through_a_dump_passes_the_float64_correct_row(tmp_path):
    q, w, k = _repro()
    for row, wrong in (([1], 0), ([0], 1)):
        path = tmp_path / f"d{row[0]}.npz"
        checking.save_dump(
            path, "topk", rows=np.array([row]), index_q=q, weights=w, index_k=k, query_pos=np.array([1]), topk=1
        )
        result = checking.check_dump(str(path), atol=0, rtol=0)
        assert result["wrong"] == wrong
        if wrong:
            assert _margins(result["checks"][0]["report"]) == [pytest.approx(2.0**-30, rel=1e-12)]


def _ik_llama(weight_scale=1.0):
    """T 4096, query at 4092, topk 256: 255 keys at 1.0, key 100 at
    1014/1024, key 4090 at 1010/1024, the rest lower."""
    t, topk, d = 4096, 256, 4
    rng = np.random.default_rng(7)
    score = rng.uniform(0.1, 0.9, t)
    best = rng.choice(np.setdiff1d(np.arange(t - 4), [100, 4090]), 255, replace=False)
    score[best] = 1.0
    score[100], score[4090] = 1014 / 1024, 1010 / 1024
    score = score.astype(np.float32)
    k = np.zeros((t, d), np.float32)
    k[:, 0] = score
    q = np.zeros((1, 1, d), np.float32)
    q[0, 0, 0] = 1
    w = np.array([[weight_scale]], np.float32)
    right = np.concatenate([best, [100]])
    return q, w, k, np.array([4092]), topk, right, best


def test_ik_llamas_truncated_tail_keeping_4090_over_100_is_wrong_by_4_over_1024():
    q, w, k, pos, topk, right, best = _ik_llama()
    faulty = np.concatenate([best, [4090]])[None]
    for rtol in (0.0, None):
        r = checking.check_indexer_topk(faulty, q, w, k, pos, topk, atol=0 if rtol == 0 else None, rtol=rtol)
        assert r["wrong"] == 1
        if rtol == 0:
            assert _margins(r) == [pytest.approx(4 / 1024, rel=1e-9)]
    assert checking.check_indexer_topk(right[None], q, w, k, pos, topk, atol=0, rtol=0)["wrong"] == 0
    assert checking.check_indexer_topk(right[None], q, w, k, pos, topk)["wrong"] == 0


def test_ik_llamas_absolute_early_out_returning_the_first_positions_is_wrong_at_tiny_weights():
    q, w, k, pos, topk, right, _ = _ik_llama(2.0**-30)
    first = np.arange(topk)[None]
    assert checking.check_indexer_topk(first, q, w, k, pos, topk)["wrong"] == 1
    assert checking.check_indexer_topk(right[None], q, w, k, pos, topk)["wrong"] == 0


def _keys_in(base, fmt):
    """float32 keys ``base`` as ``fmt`` keys and their scales: float32 as
    they are, bfloat16 rounded, float8_e4m3fn with a per-key scale (the
    largest magnitude at 448); ``(keys, key_scale)``."""
    import ml_dtypes

    if fmt == "float32":
        return base, None
    if fmt == "bfloat16":
        return base.astype(ml_dtypes.bfloat16), None
    c = (np.abs(base).max(axis=1) / 448).astype(np.float32)
    return (base / c[:, None]).astype(ml_dtypes.float8_e4m3fn), c


def _exact_all(q, w, k, c, pos, cu, seq):
    """Every position's float64-exact score and magnitude ``|c_t| Σ_h |w_h|
    Σ_i |q_hi k_ti|``, brute force."""
    qd, kd = reference.decode(q), reference.decode(k)
    n = len(qd)
    t = int(np.diff(cu).max())
    out = np.full((n, t), np.nan)
    mags = np.full((n, t), np.nan)
    lens = np.zeros(n, dtype=np.int64)
    for i in range(n):
        lo, hi = int(cu[seq[i]]), int(cu[seq[i] + 1])
        L = min(int(pos[i]) + 1, hi - lo)
        lens[i] = L
        # Elementwise products and sums, not BLAS: a BLAS product may round
        # the same operands differently in different columns (edge tiles,
        # FMA or not; seen with OpenBLAS on an AVX-512 Xeon), which would
        # split the exact ties of duplicated keys by an ulp.
        kk = kd[lo : lo + L]
        dots = (qd[i][:, None, :] * kk[None, :, :]).sum(axis=2)  # [h, L]
        w64 = np.asarray(w[i], np.float32).astype(np.float64)
        s = (w64[:, None] * np.maximum(dots, 0.0)).sum(axis=0)
        absdots = (np.abs(qd[i])[:, None, :] * np.abs(kk)[None, :, :]).sum(axis=2)
        m = (np.abs(w64)[:, None] * absdots).sum(axis=0)
        if c is not None:
            s = s * np.asarray(c[lo : lo + L], np.float32).astype(np.float64)
            m = m * np.abs(np.asarray(c[lo : lo + L], np.float32).astype(np.float64))
        out[i, :L], mags[i, :L] = s, m
    return out, mags, lens


@pytest.mark.parametrize("fmt", ["float32", "bfloat16", "fp8"])
@pytest.mark.parametrize("packed", [False, True])
def test_check_indexer_topk_agrees_with_a_brute_force_float64_check_on_near_ties(fmt, packed, path):

    rng = np.random.default_rng({"float32": 1, "bfloat16": 2, "fp8": 3}[fmt] + 10 * packed)
    n, h, d, t, topk = 24, 3, 8, 96, 12
    base = rng.standard_normal((t, d)).astype(np.float32)
    # Near ties: duplicated keys and keys one last bit apart.
    base[1::7] = base[0]
    bumped = base[2::9].copy()
    bumped[:, 0] = np.nextafter(bumped[:, 0], np.float32(np.inf))
    base[3::9][: len(bumped)] = bumped[: len(base[3::9])]
    k, c = _keys_in(base, fmt)
    q = rng.standard_normal((n, h, d)).astype(np.float32)
    q[1::3] = q[0]  # repeated queries: rows whose scores tie across rows
    w = rng.standard_normal((n, h)).astype(np.float32)
    if packed:
        cu = np.array([0, 40, t])
        seq = rng.integers(0, 2, n)
        pos = np.array([rng.integers(0, (cu[s + 1] - cu[s]) + 4) for s in seq])
        kw = dict(cu_seqlens=cu, seq_ids=seq)
        q[np.argmax(pos)] = 0  # a row of equal scores: vacuous at any tolerance
        rows = ks.indexer_topk_packed(q, w, k, cu, seq, pos, topk, key_scale=c).astype(np.int64)
    else:
        cu, seq = np.array([0, t]), np.zeros(n, dtype=np.int64)
        pos = rng.integers(0, t + 4, n)
        kw = {}
        q[np.argmax(pos)] = 0  # a row of equal scores: vacuous at any tolerance
        rows = ks.indexer_topk(q, w, k, pos, topk, key_scale=c).astype(np.int64)
    exact, mags, lens = _exact_all(q, w, k, c, pos, cu, seq)
    # Engine rows: kvselect's, some with the best dropped for the best loser,
    # some with the exact top-k (ties by position).
    for i in range(0, n, 3):
        L = int(lens[i])
        if L > topk:
            order = np.argsort(-exact[i, :L], kind="stable")
            if i % 2:
                rows[i, :topk] = order[:topk]
            else:
                rows[i, 0], rows[i, 1:topk] = order[topk], order[1:topk]
    vacuous = 0
    for atol, rtol in ((0.0, 0.0), (0.0, 2.0**-16), (1e-3, 0.0), (0.0, 2.0**-6)):
        got = checking.check_indexer_topk(rows, q, w, k, pos, topk, key_scale=c, atol=atol, rtol=rtol, **kw)
        want = _brute_check(exact, mags, rows, lens, topk, atol, rtol)
        _assert_same(got, want, (atol, rtol))
        assert got["wrong"] > 0  # the broken rows are caught
        vacuous += want["vacuous"]
    assert vacuous > 0


def _brute_check(exact, mags, rows, lens, topk, atol, rtol):
    """check_topk on the brute-force float64 scores and magnitudes, and the
    vacuous rows counted one by one."""
    want = ks.check_topk(exact, rows, lens, topk=topk, atol=atol, rtol=rtol, magnitudes=mags if rtol else None)
    vac = 0
    for i, L in enumerate(lens):
        s, e = exact[i, :L], atol + rtol * mags[i, :L]
        vac += bool(L > topk and np.max(s - e) <= np.min(s + e))
    want["vacuous"] = vac
    return want


def _assert_same(got, want, why):
    """The same verdicts, margins, thresholds, counts past the line and
    vacuous rows (the listed positions may differ: see check_indexer_topk)."""
    assert (got["correct"], got["wrong"], got["vacuous"]) == (want["correct"], want["wrong"], want["vacuous"]), why
    assert [x["row"] for x in got["details"]] == [x["row"] for x in want["details"]], why
    assert _margins(got) == pytest.approx(_margins(want), rel=1e-12, abs=1e-300), why

    def line(r):
        return [
            (p["threshold"], p["n_dropped"], p["n_intruders"])
            for x in r["details"]
            for p in x["problems"]
            if p["reason"] == "wrong_selection"
        ]

    # The counts past the line exactly; the threshold, a float64 score
    # summed in the native re-score's order (the brute force sums in
    # NumPy's), to float64 rounding as the margins.
    assert [c[1:] for c in line(got)] == [c[1:] for c in line(want)], why
    assert [c[0] for c in line(got)] == pytest.approx([c[0] for c in line(want)], rel=1e-12, abs=1e-300), why


def _pairs(rtol):
    """Rows whose fate rtol decides (H 1; row r reads its own two key
    columns, score x + y, magnitude |x| + |y| with |x| ~ 150): type 0 swaps
    its 8th and 9th best, 0.9 of their tolerance apart (right at rtol, wrong
    at 0); type 1 the same 1.1 apart (wrong); type 2 is low-contrast, every
    score within 0.4 of its tolerance of 10 (vacuous); type 3 is type 2 with
    one score 1.05 of a tolerance above the lowest (not vacuous; it is selected,
    the lowest is not)."""
    rng = np.random.default_rng(11)
    n_rows, t, topk = 12, 64, 8
    k = np.zeros((t, 2 * n_rows), np.float32)
    q = np.zeros((n_rows, 1, 2 * n_rows), np.float32)
    rows = np.zeros((n_rows, topk), np.int64)
    for r in range(n_rows):
        q[r, 0, 2 * r : 2 * r + 2] = 1
        x = rng.uniform(100, 200, t)
        kind = r % 4
        if kind < 2:
            v = rng.permutation(t) + 1.0  # well apart
            order = np.argsort(-v)
            a, b = order[topk - 1], order[topk]
            f = 0.9 if kind == 0 else 1.1
            g = f * rtol * (2 * x[a] + 2 * x[b] - 2 * v[a]) / (1 - f * rtol)
            v[b] = v[a] - g
            rows[r] = np.r_[order[: topk - 1], b]
        else:
            v = 10 + 0.4 * rtol * (2 * x - 10) * rng.uniform(-1, 1, t)
            if kind == 3:
                lo = int(np.argmin(v))
                p = (lo + 1) % t
                f = 1.05
                v[p] = v[lo] + f * rtol * (2 * x[p] + 2 * x[lo] - 2 * v[lo]) / (1 + f * rtol)
            rows[r] = rng.permutation(t)[:topk]
            if kind == 3:  # the raised one selected, the lowest not: right
                others = rng.permutation(np.setdiff1d(np.arange(t), [p, lo]))
                rows[r] = np.r_[p, others[: topk - 1]]
        k[:, 2 * r] = x
        k[:, 2 * r + 1] = (v - x).astype(np.float32)
    w = np.ones((n_rows, 1), np.float32)
    return q, w, k, np.full(n_rows, t - 1), topk, rows


@pytest.mark.parametrize("rtol", [2.0**-12, 2.0**-7])
def test_rtol_decides_near_ties_and_low_contrast_rows_exactly_as_a_brute_force_float64_check(rtol, path):
    q, w, k, pos, topk, rows = _pairs(rtol)
    cu, seq = np.array([0, len(k)]), np.zeros(len(q), dtype=np.int64)
    exact, mags, lens = _exact_all(q, w, k, None, pos, cu, seq)
    kinds = np.arange(len(q)) % 4
    at = _brute_check(exact, mags, rows, lens, topk, 0.0, rtol)
    wrong = {x["row"] for x in at["details"]}
    assert wrong == set(np.flatnonzero(kinds == 1))  # the cases are what they say
    assert at["vacuous"] == np.sum(kinds == 2)
    assert {x["row"] for x in _brute_check(exact, mags, rows, lens, topk, 0.0, 0.0)["details"]} >= set(
        np.flatnonzero(kinds < 2)
    )
    for atol, r in ((0.0, rtol), (0.0, 0.0), (0.0, rtol * 1.2), (0.0, rtol / 1.2), (1e-3, rtol)):
        got = checking.check_indexer_topk(rows, q, w, k, pos, topk, atol=atol, rtol=r)
        _assert_same(got, _brute_check(exact, mags, rows, lens, topk, atol, r), (atol, r))


@pytest.mark.parametrize("impl", IMPLS)
def test_float64_scores_are_checked_as_given_and_reported_as_float64(impl):
    m = _impl(impl)
    s = np.array([[1.0, 1.0 + 2.0**-40, 0.5]])
    r = m.check_topk(s, np.array([[0]]))
    [p] = r["details"][0]["problems"]
    assert p["threshold"] == 1.0 + 2.0**-40 and p["dropped"] == [(1, 1.0 + 2.0**-40)]
    assert p["margin"] == pytest.approx(2.0**-40)
    assert m.check_topk(s, np.array([[1]]))["wrong"] == 0
    # As float32 the two are one score: a tie.
    assert m.check_topk(s.astype(np.float32), np.array([[0]]))["wrong"] == 0


def test_float64_scores_native_and_reference_agree_on_random_rows():
    rng = np.random.default_rng(5)
    for _ in range(30):
        n, t, k = 6, 20, 5
        s = rng.choice([0.0, 1.0, 1.0 + 2.0**-45, 2.0, np.nan, -0.0], (n, t)) + rng.standard_normal((n, t)) * (
            rng.random() < 0.5
        )
        m = np.abs(rng.standard_normal((n, t)))
        rows = np.array([rng.permutation(t)[:k] for _ in range(n)])
        lens = rng.integers(k, t + 1, n)
        rows = np.where(rows < lens[:, None], rows, -1)
        for atol, rtol in ((0.0, 0.0), (0.1, 0.0), (0.0, 0.05)):
            a = ks.check_topk(s, rows, lens, topk=k, atol=atol, rtol=rtol, magnitudes=m)
            b = reference.check_topk(s, rows, lens, topk=k, atol=atol, rtol=rtol, magnitudes=m)
            assert repr(a) == repr(b)


@pytest.mark.parametrize("impl", IMPLS)
def test_float16_or_integer_scores_are_refused_naming_scores(impl):
    m = _impl(impl)
    for bad in (np.zeros((1, 3), np.float16), np.zeros((1, 3), np.int64)):
        with pytest.raises(TypeError, match="scores"):
            m.check_topk(bad, np.array([[0]]))


@pytest.mark.parametrize("impl", IMPLS)
def test_global_slots_positions_read_rows_back_with_padding_and_a_sentinel_for_unmapped(impl):
    m = _impl(impl)
    table = np.array([[3, 1]], np.int32)
    slots = m.GlobalSlots(table, [0, 0], 4)
    rows = np.array([[12, 5, -1, -7], [8, 15, 4, 13]])
    got = slots.positions(rows)
    assert got.dtype == np.int64
    assert got.tolist() == [[0, 5, -1, -1], [2**63 - 1, 3, 4, 1]]


def test_the_report_prints_digits_that_tell_near_ties_apart():
    q, w, k = _repro()
    result = checking.check_dump(
        checking.validate(
            dict(
                kind=np.asarray("topk"),
                rows=np.array([[0]]),
                index_q=q,
                weights=w,
                index_k=k,
                query_pos=np.array([1]),
                topk=np.asarray(1),
            )
        ),
        atol=0,
        rtol=0,
    )
    text = checking.format_report(result)
    assert "1.0000001" in text and "1.000000118277967" in text, text


def test_the_vacuous_advice_at_zero_tolerance_says_any_selection_is_right_and_how_to_test():
    k = np.ones((8, 2), np.float32)
    q = np.ones((1, 1, 2), np.float32)
    w = np.ones((1, 1), np.float32)
    result = checking.check_dump(
        checking.validate(
            dict(
                kind=np.asarray("topk"),
                rows=np.array([[0, 1]]),
                index_q=q,
                weights=w,
                index_k=k,
                query_pos=np.array([7]),
                topk=np.asarray(2),
            )
        ),
        atol=0,
        rtol=0,
    )
    text = checking.format_report(result)
    assert "any selection of the right size is correct" in text and "distinct keys" in text, text
    assert "lower --rtol" not in text


def _line(report):
    return [
        (x["row"], p["threshold"], p["n_dropped"], p["n_intruders"], p["margin"])
        for x in report["details"]
        for p in x["problems"]
        if p["reason"] == "wrong_selection"
    ]


@pytest.mark.parametrize("seed", range(0, 120, 8))
def test_random_tied_faulty_rows_get_the_brute_force_verdicts_margins_counts_and_vacuous_rows(seed, path):
    """Small integer-valued operands (many exact ties, whole rows of equal
    scores), tiny key scales and zero weights, rows with a swapped-in,
    duplicated, missing or out-of-range entry; every tolerance kind."""
    for s in range(seed, seed + 8):
        rng = np.random.default_rng(s)
        n, h, d, t = rng.integers(1, 12), rng.integers(1, 4), rng.integers(1, 6), rng.integers(1, 60)
        topk = int(rng.integers(1, 20))
        levels = rng.integers(1, 5)
        k = (rng.integers(-levels, levels + 1, (t, d)) * rng.choice([1.0, 0.5, 2.0**-20])).astype(np.float32)
        if rng.random() < 0.5:
            k = (k + rng.standard_normal((t, d)) * rng.choice([0, 1e-6, 1e-3, 1])).astype(np.float32)
        q = rng.integers(-2, 3, (n, h, d)).astype(np.float32)
        w = rng.choice([1.0, -1.0, 0.5, 0.0, 3.0], (n, h)).astype(np.float32)
        c = None if rng.random() < 0.5 else rng.choice([1.0, 0.5, 2.0**-30, 4.0], t).astype(np.float32)
        pos = rng.integers(0, t + 3, n)
        rows = ks.indexer_topk(q, w, k, pos, topk, key_scale=c).astype(np.int64)
        for i in range(n):
            r = rng.random()
            if r < 0.3:
                rows[i, rng.integers(0, topk)] = rng.integers(0, t)
            elif r < 0.4:
                rows[i, rng.integers(0, topk)] = -1
            elif r < 0.5:
                rows[i] = rng.permutation(max(t, topk))[:topk] - (rng.random() < 0.3)
        exact, mags, lens = _exact_all(q, w, k, c, pos, np.array([0, t]), np.zeros(n, dtype=np.int64))
        for atol, rtol in (
            (0, 0),
            (0, rng.choice([2.0**-16, 2.0**-4, 0.5])),
            (rng.choice([1e-6, 0.3, 2.0]), 0),
            (0.1, 0.1),
        ):
            got = checking.check_indexer_topk(rows, q, w, k, pos, topk, key_scale=c, atol=atol, rtol=rtol)
            want = _brute_check(exact, mags, rows, lens, topk, atol, rtol)
            why = (s, atol, rtol)
            assert (got["correct"], got["vacuous"], got["by_reason"]) == (
                want["correct"],
                want["vacuous"],
                want["by_reason"],
            ), why
            assert [x["row"] for x in got["details"]] == [x["row"] for x in want["details"]], why
            a, b = _line(got), _line(want)
            assert [x[:4] for x in a] == [x[:4] for x in b], why
            assert [x[4] for x in a] == pytest.approx([x[4] for x in b], rel=1e-12, abs=1e-300), why


@pytest.mark.parametrize("page_layout", ["dense", "fp8_scaled"])
def test_check_indexer_topk_takes_a_paged_cache_as_indexer_topk_paged_does(page_layout, path):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(2027)
    bs, d, h, n_blocks = 8, 16, 4, 24
    lens = np.array([13, 40, 29])
    table = np.stack([rng.permutation(n_blocks)[:6] for _ in lens]).astype(np.int32)
    keys = rng.standard_normal((n_blocks, bs, d)).astype(np.float32)
    if page_layout == "dense":
        cache = keys.astype(ml_dtypes.bfloat16)
    else:
        scale = (np.abs(keys).max(axis=2) / 448).astype(np.float32)
        fp8 = (keys / scale[..., None]).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
        cache = np.concatenate(
            [fp8.reshape(n_blocks, bs * d), scale.view(np.uint8).reshape(n_blocks, bs * 4)], axis=1
        ).reshape(n_blocks, bs, 1, d + 4)
    seq = rng.integers(0, 3, 12)
    pos = np.array([rng.integers(0, lens[s]) for s in seq])
    q = rng.standard_normal((12, h, d)).astype(np.float32)
    w = rng.standard_normal((12, h)).astype(np.float32)
    rows = ks.indexer_topk_paged(q, w, cache, table, lens, seq, pos, 6, page_layout=page_layout)
    paged = dict(kv_cache=cache, block_table=table, seq_lens=lens, seq_ids=seq, page_layout=page_layout)
    assert checking.check_indexer_topk(rows, q, w, None, pos, **paged)["wrong"] == 0
    broken = rows.copy()
    i = int(np.flatnonzero(pos >= 6)[0])
    kept = set(rows[i].tolist())
    broken[i, 0] = next(t for t in range(int(pos[i]) + 1) if t not in kept)  # an unselected position
    report = checking.check_indexer_topk(broken, q, w, None, pos, **paged)
    assert [x["row"] for x in report["details"]] == [i]
    with pytest.raises(ks.SelectionError) as e:
        checking.check_indexer_topk(rows, q, w, np.zeros((3, d), np.float32), pos, **paged)
    assert e.value.argument == "index_k"


def test_float64_scores_in_a_dump_are_judged_as_given_not_rounded_to_float32(tmp_path):
    p = tmp_path / "f64.npz"
    scores = np.array([[1.0, 1.0 + 2.0**-40]])  # equal once rounded to float32
    checking.save_dump(p, "topk", rows=np.array([[0]]), scores=scores, context_lens=np.array([2]), topk=1)
    r = checking.check_dump(p, atol=0.0, rtol=0.0)
    assert r["wrong"] == 1
    assert _margins(r["checks"][0]["report"]) == [2.0**-40]


def _small():
    rng = np.random.default_rng(7)
    q = rng.standard_normal((3, 2, 4)).astype(np.float32)
    w = rng.standard_normal((3, 2)).astype(np.float32)
    k = rng.standard_normal((9, 4)).astype(np.float32)
    pos = np.array([8, 6, 7])
    return ks.indexer_topk(q, w, k, pos, 3), q, w, k, pos


@pytest.mark.parametrize("name", ["index_q", "weights", "index_k", "key_scale"])
def test_a_non_finite_operand_is_refused_naming_it_before_any_work(name):
    rows, q, w, k, pos = _small()
    args = dict(index_q=q.copy(), weights=w.copy(), index_k=k.copy(), key_scale=np.ones(len(k), np.float32))
    args[name].reshape(-1)[1] = np.nan
    with pytest.raises(ks.SelectionError) as e:
        checking.check_indexer_topk(
            rows, args["index_q"], args["weights"], args["index_k"], pos, key_scale=args["key_scale"]
        )
    assert e.value.argument == name and "nan" in str(e.value)


@pytest.mark.parametrize(
    "fmt, raw, code",
    [
        ("bfloat16", True, 0x7FC0),  # NaN
        ("bfloat16", False, 0xFF80),  # -inf
        ("float16", True, 0x7C00),  # inf
        ("float16", False, 0xFE00),  # NaN
        ("float8_e4m3fn", True, 0xFF),  # NaN
        ("float8_e4m3fn", False, 0x7F),  # NaN
        ("bfloat16", "swapped", 0x7FC0),  # NaN, big-endian raw bits
        ("float16", "swapped", 0x7C00),  # inf, big-endian float16
    ],
)
def test_a_non_finite_key_code_is_refused_naming_its_place(fmt, raw, code):
    """Keys in a 16- or 8-bit format (raw bits with key_format, or ml_dtypes
    values) are vetted on their bits: a non-finite code is refused naming
    index_k and its [key, dimension]; finite codes (the largest finite ones
    among them) pass."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rows, q, w, k, pos = _small()
    dtype = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16, "float8_e4m3fn": ml_dtypes.float8_e4m3fn}[fmt]
    bits = np.uint8 if fmt == "float8_e4m3fn" else np.uint16
    keys = (k / 8).astype(dtype).view(bits)
    keys[0, 0] = {np.uint8: 0x7E, np.uint16: 0x7F7F if fmt == "bfloat16" else 0x7BFF}[bits]  # largest finite
    kw = dict(key_format=fmt) if raw is True else {}
    as_given = keys if raw is True else keys.view(dtype)
    assert (
        checking.check_indexer_topk(ks.indexer_topk(q, w, as_given, pos, 3, **kw), q, w, as_given, pos, **kw)["wrong"]
        == 0
    )
    keys[5, 2] = code
    if raw == "swapped":  # the same values, their bytes the other way round
        kw = dict(key_format=fmt) if fmt == "bfloat16" else {}
        as_given = keys.astype(">u2") if fmt == "bfloat16" else keys.view(dtype).astype(">f2")
    with pytest.raises(ks.SelectionError) as e:
        checking.check_indexer_topk(rows, q, w, as_given, pos, **kw)
    assert e.value.argument == "index_k" and "index_k[5, 2]" in str(e.value)


def test_the_16_and_8_bit_codes_are_read_on_their_bits():
    """Which key arrays the vetting and the screen's bounds read on their
    bits (``_codes``): raw bits that key_format names and typed codes in
    native byte order; float32, unnamed raw bits and byte-swapped arrays are
    decoded. On the bits, every finite code passes and each non-finite one
    is found."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    from kvselect.checking._common import _codes
    from kvselect.checking._vet import _finite_codes

    cases = [
        (ml_dtypes.bfloat16, None, np.uint16, 0x7F80),
        (np.uint16, "bfloat16", np.uint16, 0x7F80),
        (np.float16, None, np.uint16, 0x7C00),
        (np.uint16, "float16", np.uint16, 0x7C00),
        (ml_dtypes.float8_e4m3fn, None, np.uint8, 0x7F),
        (np.uint8, "float8_e4m3fn", np.uint8, 0x7F),
    ]
    for dtype, fmt, bits, first in cases:
        every = np.arange(np.iinfo(bits).max + 1, dtype=bits)
        finite = every[(every & (0x7FFF if bits == np.uint16 else 0x7F)) < first]
        a = finite.view(dtype)
        view, _, least = _codes(a, fmt)
        assert view.dtype == bits and least == first and np.shares_memory(view, a)
        assert _finite_codes(a, fmt)
        for code in every[(every & (0x7FFF if bits == np.uint16 else 0x7F)) >= first][::97]:
            assert not _finite_codes(np.concatenate([finite, [code]]).astype(bits).view(dtype), fmt), hex(code)
    for a, fmt in [
        (np.zeros(4, np.float32), None),
        (np.zeros(4, np.uint16), None),  # raw bits without a format
        (np.zeros(4, ">u2"), "bfloat16"),  # byte-swapped
        (np.zeros(4, ">f2"), None),
        (np.zeros(4, np.uint8), "bfloat16"),  # the wrong width for the format
    ]:
        assert _codes(a, fmt) is None and not _finite_codes(a, fmt)


@pytest.mark.parametrize(
    "change, argument",
    [
        (dict(weights=np.ones((2, 3), np.float32)), "weights"),  # transposed [H, n]
        (dict(key_scale=np.ones(12, np.float32)), "key_scale"),  # longer than the keys
        (dict(topk=0), "topk"),
        (dict(filler="-2"), "filler"),
        (dict(seq_ids=np.zeros(3, np.int64)), "seq_ids"),  # without cu_seqlens
        (dict(block_table=np.zeros((1, 2), np.int32)), "block_table"),  # without kv_cache
    ],
)
def test_check_indexer_topk_refuses_a_bad_argument_up_front_naming_it(change, argument):
    rows, q, w, k, pos = _small()
    args = dict(weights=w, key_scale=None, topk=None)
    args.update(change)
    weights = args.pop("weights")
    with pytest.raises(ks.SelectionError) as e:
        checking.check_indexer_topk(rows, q, weights, k, pos, **args)
    assert e.value.argument == argument


def test_float_positions_are_a_type_error_never_truncated():
    rows, q, w, k, pos = _small()
    with pytest.raises(TypeError, match="query_pos"):
        checking.check_indexer_topk(rows, q, w, k, pos + 0.7)


def test_a_bad_page_layout_is_refused_naming_page_layout():
    rows, q, w, k, pos = _small()
    cache = k.reshape(3, 3, 4)
    with pytest.raises(ks.SelectionError) as e:
        checking.check_indexer_topk(
            rows,
            q,
            w,
            None,
            pos,
            kv_cache=cache,
            block_table=np.arange(3)[None],
            seq_lens=np.array([9]),
            seq_ids=np.zeros(3, np.int64),
            page_layout="bogus",
        )
    assert e.value.argument == "page_layout"


@pytest.mark.parametrize(
    "cu, seq, argument, text",
    [
        ([0, 5], [0, 0, 0], "cu_seqlens", "cu_seqlens must rise from 0 to the 9 keys"),
        ([0, 6, 3, 9], [0, 0, 0], "cu_seqlens", "cu_seqlens must rise from 0 to the 9 keys"),
        ([1, 9], [0, 0, 0], "cu_seqlens", "cu_seqlens must rise from 0 to the 9 keys"),
        ([0, 4, 9], [0, 2, 1], "seq_ids", "seq_ids must name one of the 2 sequences"),
        ([0, 4, 9], [0, -1, 1], "seq_ids", "seq_ids must name one of the 2 sequences"),
    ],
)
def test_a_packed_batch_is_refused_by_one_rule_on_the_api_and_the_dump_path(cu, seq, argument, text):
    # One validation (checking._common._packing_problem): the same mistake,
    # the same words; the API raises SelectionError naming the argument, a
    # dump DumpError.
    rows, q, w, k, pos = _small()
    cu, seq = np.array(cu), np.array(seq)
    with pytest.raises(ks.SelectionError) as e:
        checking.check_indexer_topk(rows, q, w, k, pos, cu_seqlens=cu, seq_ids=seq)
    assert e.value.argument == argument and text in str(e.value)
    dump = dict(kind="topk", rows=rows, index_q=q, weights=w, index_k=k, query_pos=pos, cu_seqlens=cu, seq_ids=seq)
    with pytest.raises(checking.DumpError, match=text):
        checking.check_dump({key: np.asarray(v) for key, v in dump.items()})


def test_a_packed_batchs_seq_ids_need_one_entry_per_row():
    rows, q, w, k, pos = _small()
    with pytest.raises(ks.SelectionError) as e:
        checking.check_indexer_topk(rows, q, w, k, pos, cu_seqlens=np.array([0, 9]), seq_ids=np.zeros(2, np.int64))
    assert e.value.argument == "seq_ids" and "seq_ids has 2 entries for 3 rows" in str(e.value)


def test_a_reports_near_tie_prints_each_score_and_the_threshold_distinct():
    # float32 1 + 2**-23 and the float64 1.0000001 both print "1.0000001" in
    # their shortest form: the report prints their float64 reprs instead.
    f32 = float(np.float32(1.0000001))
    f64 = 1.0000001
    assert f32 != f64 and checking.report._digits(f32) == checking.report._digits(f64) == "1.0000001"
    scores = np.array([[f32, f64, 0.5, f64 - 2e-16]])
    result = ks.check_topk(scores, np.array([[1, 3]]), atol=0, rtol=0)
    (problem,) = result["details"][0]["problems"]
    text = checking.report._describe(problem)
    assert text.startswith("wrong selection: dropped 1 [0 (1.0000001192092896)], "), text
    # before: "dropped 1 [0 (1.0000001)], intruders 1 [3 (1.0000001)]; threshold 1.0000001"
    assert text == (
        "wrong selection: dropped 1 [0 (1.0000001192092896)], intruders 1 [3 (1.0000000999999998)]; "
        "threshold 1.0000001, margin 1.92e-08"
    ), text
    assert problem["threshold"] == f64


def test_a_reports_scores_keep_their_float32_form_when_it_tells_them_apart():
    p = dict(
        reason="wrong_selection",
        dropped=[(0, float(np.float32(1.0000001)))],
        intruders=[(2, 0.5)],
        n_dropped=1,
        n_intruders=1,
        threshold=float(np.float32(1.0000001)),
        margin=0.5,
    )
    text = checking.report._describe(p)
    assert text == "wrong selection: dropped 1 [0 (1.0000001)], intruders 1 [2 (0.5)]; threshold 1.0000001, margin 0.5"


@pytest.mark.parametrize("fmt", ["float32", "fp8"])
def test_the_native_rescore_is_exact_to_float64_rounding(fmt):
    """``_core._indexer_rescore`` (the check's re-score of its candidates):
    query ``rows[j]``'s score of key ``positions[j]`` within the float64
    rounding bound ``γ_{d+H+2}`` (units of ``2^-53``) of the magnitude of the
    brute-force float64 score, pairs in any order and repeated; a position
    past its query's context, a row past the queries and lengths that differ
    are refused naming the argument."""

    rng = np.random.default_rng(4040)
    n, h, d, t = 5, 7, 33, 70
    q = rng.standard_normal((n, h, d)).astype(np.float32)
    w = rng.standard_normal((n, h)).astype(np.float32)
    base = rng.standard_normal((t, d)).astype(np.float32)
    base[9] = base[4]  # a duplicated key: the same bits
    k, c = _keys_in(base, fmt)
    pos = np.array([69, 3, 40, 69, 10])
    exact, mags, lens = _exact_all(q, w, k, c, pos, np.array([0, t]), np.zeros(n, dtype=np.int64))
    rows = np.repeat(np.arange(n), lens)[::-1].copy()  # rows out of order, runs reversed
    positions = np.concatenate([np.arange(L) for L in lens])[::-1].copy()
    rows, positions = np.r_[rows, 0, 0], np.r_[positions, 4, 9]
    got = ks._core._indexer_rescore(q, w, k, pos, rows, positions, key_scale=c)
    assert got.dtype == np.float64 and got.shape == rows.shape
    bound = 2 * (d + h + 2) * 2.0**-53 * mags[rows, positions] + 1e-300
    assert np.all(np.abs(got - exact[rows, positions]) <= bound)
    assert got[-1] == got[-2]  # the duplicated key: the same chain, the same bits
    for bad, name in (
        (dict(rows=np.array([0, 1]), positions=np.array([0, 4])), "positions"),  # row 1 sees 4 keys
        (dict(rows=np.array([5]), positions=np.array([0])), "rows"),
        (dict(rows=np.array([0, 1]), positions=np.array([0])), "positions"),
        (dict(rows=np.array([-1]), positions=np.array([0])), "rows"),
    ):
        with pytest.raises(ks.SelectionError, match=name) as err:
            ks._core._indexer_rescore(q, w, k, pos, bad["rows"], bad["positions"], key_scale=c)
        assert err.value.argument == name


@pytest.mark.parametrize("fmt", ["float32", "bfloat16", "fp8"])
def test_the_dense_rescore_is_the_pair_rescore_bit_for_bit_with_its_magnitudes(fmt):
    """``_core._indexer_rescore_all`` (the dense check's scores): row ``i``'s
    ``[0]`` is ``_indexer_rescore``'s score of every pair ``(i, t)``, bit for
    bit, ``[1]`` the magnitude ``|c_t| Σ_h |w_h| Σ_i |q_hi k_ti|`` to float64
    rounding, both NaN past the row's context; group and block tails (11
    rows, 9 heads, 300 keys), GQA-like repeated queries, a compress ratio."""

    rng = np.random.default_rng(5151)
    n, h, d, t = 11, 9, 20, 300
    q = rng.standard_normal((n, h, d)).astype(np.float32)
    q[3] = q[2]
    w = rng.standard_normal((n, h)).astype(np.float32)
    base = rng.standard_normal((t, d)).astype(np.float32)
    k, c = _keys_in(base, fmt)
    pos = np.array([0, 299, 150, 150, 31, 32, 33, 255, 256, 257, 400])
    for ratio in (1, 3):
        lens = np.minimum((pos + 1) // ratio, t)
        got = ks._core._indexer_rescore_all(q, w, k, pos, key_scale=c, compress_ratio=ratio)
        assert got.dtype == np.float64 and got.shape == (n, 2, t)
        rows = np.repeat(np.arange(n), lens)
        cols = np.concatenate([np.arange(L) for L in lens])
        pairs = ks._core._indexer_rescore(q, w, k, pos, rows, cols, key_scale=c, compress_ratio=ratio)
        assert np.array_equal(got[rows, 0, cols], pairs)
        past = np.arange(t)[None, :] >= lens[:, None]
        assert np.isnan(got[:, 0][past]).all() and np.isnan(got[:, 1][past]).all()
        if ratio == 1:
            _, mags, _ = _exact_all(q, w, k, c, pos, np.array([0, t]), np.zeros(n, dtype=np.int64))
            assert got[:, 1][~past] == pytest.approx(mags[:, :t][~past], rel=4 * (d + h) * 2.0**-53)
    with pytest.raises(ks.SelectionError) as err:
        ks._core._indexer_rescore_all(q, w[:, :2], k, pos, key_scale=c)
    assert err.value.argument == "weights"


@pytest.mark.parametrize("fmt", ["float32", "fp8"])
def test_the_native_verdict_folds_the_dense_scores_as_numpy_does(fmt):
    """``_core._indexer_rescore_verdict``: per row, from the dense scores
    ``s`` and magnitudes ``m`` with ``e = atol + rtol m``, the best
    unselected ``s - e``, the worst selected ``s + e``, the extremes of
    every key and the distinct selected count, each the value NumPy computes
    from ``_indexer_rescore_all`` (the same roundings); padding, duplicates
    and positions past the context select nothing; a bad ``positions`` /
    ``atol`` is refused naming it."""

    rng = np.random.default_rng(6262)
    n, h, d, t, width = 9, 5, 24, 333, 12
    q = rng.standard_normal((n, h, d)).astype(np.float32)
    w = rng.standard_normal((n, h)).astype(np.float32)
    base = rng.standard_normal((t, d)).astype(np.float32)
    k, c = _keys_in(base, fmt)
    pos = np.array([0, 5, 40, 332, 331, 100, 64, 400, 11])
    positions = rng.integers(-2, t + 10, (n, width))
    positions[2, :3] = positions[2, 3]  # duplicates
    positions[0] = -1  # nothing selected
    both = ks._core._indexer_rescore_all(q, w, k, pos, key_scale=c)
    lens = np.minimum(pos + 1, t)
    for atol, rtol in ((0.0, 0.0), (1e-3, 0.0), (0.0, 2.0**-10), (0.5, 0.25)):
        got = ks._core._indexer_rescore_verdict(q, w, k, pos, positions, atol=atol, rtol=rtol, key_scale=c)
        assert got.shape == (n, 5) and got.dtype == np.float64
        for i in range(n):
            L = int(lens[i])
            s, m = both[i, 0, :L], both[i, 1, :L]
            e = m * rtol + atol
            lo, up = s - e, s + e
            chosen = np.zeros(L, dtype=bool)
            p = positions[i]
            chosen[p[(p >= 0) & (p < L)]] = True
            want = [
                lo[~chosen].max(initial=-np.inf),
                up[chosen].min(initial=np.inf),
                lo.max(initial=-np.inf),
                up.min(initial=np.inf),
                chosen.sum(),
            ]
            assert got[i].tolist() == want, (i, atol, rtol)
    # A NaN score (the native pass takes a NaN key; the check refuses one
    # first) makes its row wrong and not vacuous, never skipped.
    k_nan = np.array(k, copy=True)
    if fmt == "fp8":
        k_nan.view(np.uint8)[4, 0] = 0x7F
    else:
        k_nan[4, 0] = np.nan
    got = ks._core._indexer_rescore_verdict(q, w, k_nan, pos, positions, atol=0.0, rtol=0.0, key_scale=c)
    plain = ks._core._indexer_rescore_verdict(q, w, k, pos, positions, atol=0.0, rtol=0.0, key_scale=c)
    sees = lens > 4
    assert sees.any() and not sees.all()
    assert np.all(got[sees, 0] == np.inf) and np.all(got[sees, 2] == np.inf) and np.all(got[sees, 3] == -np.inf)
    assert np.array_equal(got[~sees], plain[~sees])
    for bad, name in (
        (dict(positions=positions[:, :, None]), "positions"),
        (dict(positions=positions[1:]), "positions"),
        (dict(positions=positions, atol=-1.0), "atol"),
        (dict(positions=positions, rtol=float("nan")), "rtol"),
    ):
        args = dict(atol=0.0, rtol=0.0, key_scale=c) | bad
        with pytest.raises(ks.SelectionError) as err:
            ks._core._indexer_rescore_verdict(q, w, k, pos, args.pop("positions"), **args)
        assert err.value.argument == name


def _low_contrast(seed, n=6, t=1500, h=8, d=32):
    """Every key a few ULPs from one (every score within the float32 bound
    of the others) and ordinary random keys, with kvselect's rows and rows
    broken each way the check names."""
    rng = np.random.default_rng(seed)
    base = rng.standard_normal(d).astype(np.float32)
    low = (base + rng.integers(-3, 4, (t, d)) * np.float32(2.0**-20)).astype(np.float32)
    q = (np.abs(rng.standard_normal((n, h, d))) * np.sign(base)).astype(np.float32)
    w = rng.uniform(0.5, 1.5, (n, h)).astype(np.float32)
    ordinary = rng.standard_normal((t, d)).astype(np.float32)
    pos = rng.integers(t // 2, t + 5, n)
    return rng, q, w, low, ordinary, pos


def _broken(rng, rows, t):
    rows = rows.copy()
    rows[0, 0] = rows[0, 1]  # a duplicate
    rows[1, -1] = -1  # a padding hole
    rows[2, 3] = t + 7  # past the context
    rows[3, 0] = next(x for x in range(t) if x not in set(rows[3].tolist()))  # swapped in
    return rows


@pytest.mark.parametrize("seed", range(6))
def test_the_dense_and_the_screened_check_give_the_same_report(seed, monkeypatch):
    """The same report, entry for entry (verdicts, reasons, every problem
    with its listed positions and their scores, margins, thresholds, vacuous
    rows) by either path, on low-contrast and ordinary keys (float32; fp8
    with per-key scales; compressed entries), right and broken rows, every
    tolerance kind, single-sequence and packed."""
    import ml_dtypes

    rng, q, w, low, ordinary, pos = _low_contrast(seed)
    topk = 40
    kinds = set()
    scale = (np.abs(ordinary).max(axis=1) / 448).astype(np.float32)
    fp8 = (ordinary / scale[:, None]).astype(ml_dtypes.float8_e4m3fn)
    for k, c, ratio in ((low, None, 1), (ordinary, None, 1), (fp8, scale, 1), (low, None, 3)):
        t = len(k)
        one = dict(key_scale=c, compress_ratio=ratio)
        right = ks.indexer_topk(q, w, k, pos, topk, **one).astype(np.int64)
        cu, seq = np.array([0, 700, t]), np.array([0, 1, 1, 0, 1, 0])
        ppos = np.array([rng.integers(0, (cu[s + 1] - cu[s]) + 3) for s in seq])
        packed_rows = ks.indexer_topk_packed(q, w, k, cu, seq, ppos, topk, key_scale=c).astype(np.int64)
        for rows, kw, p in (
            (right, one, pos),
            (_broken(rng, right, t // ratio), one, pos),
            (_broken(rng, packed_rows, 700), dict(cu_seqlens=cu, seq_ids=seq, key_scale=c), ppos),
        ):
            for atol, rtol in ((0.0, 0.0), (0.0, 2.0**-20), (1e-7, 0.0), (0.0, 2.0**-8)):
                reports = []
                for dense in (False, True):
                    monkeypatch.setattr(dense_check, "_DENSE", dense)
                    reports.append(checking.check_indexer_topk(rows, q, w, k, p, topk, atol=atol, rtol=rtol, **kw))
                a, b = reports
                kinds.update(r for r, m in a["by_reason"].items() if m)
                kinds.update(["vacuous"] * (a["vacuous"] > 0))
                why = (seed, atol, rtol, kw)
                assert (a["correct"], a["wrong"], a["vacuous"], a["by_reason"]) == (
                    b["correct"],
                    b["wrong"],
                    b["vacuous"],
                    b["by_reason"],
                ), why
                assert a["details"] == b["details"], why
    assert {"wrong_selection", "duplicate", "not_causal", "vacuous"} <= kinds  # the reports differ in kind


def test_a_wrong_rows_listed_scores_are_exact_on_either_path(monkeypatch):
    """A wrong row lists its dropped positions with their float64 scores,
    not float32 ones, on either path: keys 3, 2, 2 + 1e-8, 1, 1 and zeros,
    the five zeros selected (the float32 score of key 2 + 1e-8 ties key 1's
    2.0; its exact one is above it, so it lists first)."""
    q = np.array([[[1.0, 1e-8]]], np.float32)
    w = np.ones((1, 1), np.float32)
    k = np.zeros((10, 2), np.float32)
    k[:5, 0] = [3, 2, 2, 1, 1]
    k[2, 1] = 1
    rows = np.arange(5, 10)[None]
    exact = 2 + np.float64(np.float32(1e-8))
    for dense in (False, True):
        monkeypatch.setattr(dense_check, "_DENSE", dense)
        r = checking.check_indexer_topk(rows, q, w, k, [9], 5, atol=0, rtol=0)
        (problem,) = r["details"][0]["problems"]
        assert problem["dropped"][:3] == [(0, 3.0), (2, exact), (1, 2.0)], dense


def test_the_probe_checks_low_contrast_rows_dense_and_ordinary_rows_screened(monkeypatch):
    """The probe's choice (speed only): past _DENSE_WORK a low-contrast
    sequence is checked dense, an ordinary one screened, and a one-row
    sequence screened unprobed; below it, dense unprobed."""
    rng, q, w, low, ordinary, pos = _low_contrast(7, t=2048)
    assert len(q) * 2048 * q.shape[1] * q.shape[2] < dense_check._DENSE_WORK
    seen = []
    probe = dense_check._band_share
    monkeypatch.setattr(dense_check, "_band_share", lambda *a, **k: seen.append("probe") or probe(*a, **k))
    dense, screened = dense_check._dense, exact_check._rescore
    monkeypatch.setattr(dense_check, "_dense", lambda *a, **k: seen.append("dense") or dense(*a, **k))
    monkeypatch.setattr(exact_check, "_rescore", lambda *a, **k: seen.append("screened") or screened(*a, **k))
    for k in (low, ordinary):
        seen.clear()
        rows = ks.indexer_topk(q, w, k, pos, 64)
        assert checking.check_indexer_topk(rows, q, w, k, pos, 64, atol=0, rtol=0)["wrong"] == 0
        assert set(seen) == {"dense"}
    monkeypatch.setattr(dense_check, "_DENSE_WORK", 0)
    for k, want in ((low, "dense"), (ordinary, "screened")):
        seen.clear()
        rows = ks.indexer_topk(q, w, k, pos, 64)
        assert checking.check_indexer_topk(rows, q, w, k, pos, 64, atol=0, rtol=0)["wrong"] == 0
        assert seen[0] == "probe" and set(seen[1:]) == {want}
        seen.clear()
        checking.check_indexer_topk(rows[:1], q[:1], w[:1], k, pos[:1], 64, atol=0, rtol=0)
        assert seen == ["screened"]
