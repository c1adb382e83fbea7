"""The indexer top-k checked against scores exact up to float64 rounding.

:func:`check_indexer_topk` screens with the native float32 scores and a
rigorous error bound, then re-scores only the candidate positions in
float64 (every product of fp8/bf16/f16/f32 operands is exact there); see
the package docs for the argument. Where the screen cannot decide (small
sequences, low-contrast rows) every position is re-scored instead
(:mod:`kvselect.checking.dense`): the same report either way."""

from __future__ import annotations

import math
import re
from typing import Any, List, Optional, Tuple

import numpy as np

import kvselect as ks
import kvselect.checking.dense as _path
from kvselect.checking._common import (
    _CHUNK_BYTES,
    _ETA32,
    _U32,
    Dump,
    DumpError,
    _check_packing,
    _codes,
    _gamma,
    _merge,
    _paged_keys,
    _precision,
    _refused,
    _tolerance_values,
    _topk_of,
    _vacuous_rows,
)
from kvselect.checking._vet import _vet_api
from kvselect.checking.family import DEFAULTS, check_indexer_family, family_options
from kvselect.checking.report import Report

# The float64 unit roundoff (``_U32``, ``_ETA32`` and ``_gamma`` are shared, in _common).
_U64 = 2.0**-53


def _f64_slack(d: int, h: int) -> float:
    """Twice ``γ_{d+H+3}`` in float64 (``u = 2^-53``): a bound, relative to
    the magnitude ``Σ_h |w_h| Σ_i |q_hi k_ti| |c_t|``, of a float64 score's
    rounding error in any summation order (every product exact), so of the
    difference between two float64 computations of one real score."""
    n = d + h + 3
    return 2 * n * _U64 / (1 - n * _U64)


def _up32(x: np.ndarray) -> np.ndarray:
    """``x`` (float64) as float32 rounded up: the least float32 ``>= x``."""
    y = np.asarray(x, dtype=np.float64).astype(np.float32)
    with np.errstate(invalid="ignore"):
        return np.where(y < x, np.nextafter(y, np.float32(np.inf)), y)


def _down32(x: np.ndarray) -> np.ndarray:
    """``x`` (float64) as float32 rounded down: the greatest float32 ``<= x``."""
    y = np.asarray(x, dtype=np.float64).astype(np.float32)
    with np.errstate(invalid="ignore"):
        return np.where(y > x, np.nextafter(y, np.float32(-np.inf)), y)


def _one_blas_thread() -> Any:
    """A context in which BLAS runs on one thread, if threadpoolctl is
    installed: the re-scoring's products are small ([H, d] by [d, a row's
    candidates]), and a threaded BLAS spends far longer waking its threads
    than computing them, worse on a busy machine (30x measured on 2 shared
    cores)."""
    try:
        from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]
    except ImportError:  # pragma: no cover - an optional speed-up
        import contextlib

        return contextlib.nullcontext()
    return threadpool_limits(1, user_api="blas")


def _key_bounds(keys: Any, ksc: Optional[np.ndarray], key_format: Optional[str]) -> np.ndarray:
    """``g_t = |c_t| max_i |k_ti|`` per key (float64, exact: the product of
    two values of at most 24 significant bits), the keys decoded a chunk at a
    time so a long sequence never decodes all of them at once. NaN for a NaN
    key or scale."""
    from kvselect import reference

    keys = np.asarray(keys)
    n = len(keys)
    d = int(np.prod(keys.shape[1:])) if keys.ndim > 1 else 1
    codes = _codes(keys, key_format)
    if codes is not None and n and d:
        # bfloat16 / float16 / fp8 e4m3fn: |x| rises with the bits below the
        # sign (NaN codes the highest), so the largest code is kmax's.
        bits, sign_less, _ = codes
        code = (bits.reshape(n, d) & sign_less).max(axis=1).view(keys.dtype)
        g = np.abs(reference.decode(code, key_format, "key_format"))
    elif keys.dtype == np.float32:
        g = np.abs(keys.reshape(n, d)).max(axis=1, initial=0.0).astype(np.float64)
    else:
        g = np.empty(n, dtype=np.float64)
        step = max(1, (16 << 20) // (8 * max(1, d)))
        for a in range(0, n, step):
            kd = reference.decode(keys[a : a + step], key_format, "key_format").reshape(-1, d)
            g[a : a + step] = np.abs(kd).max(axis=1, initial=0.0)
    if ksc is not None:
        g *= np.abs(np.asarray(ksc, dtype=np.float32).astype(np.float64))
    return g


def indexer_check(
    rows: np.ndarray,
    index_q: Any,
    weights: Any,
    index_k: Any,
    query_pos: np.ndarray,
    topk: Optional[int],
    key_scale: Any,
    key_format: Optional[str],
    query_format: Optional[str],
    cu_seqlens: Optional[np.ndarray],
    seq_ids: Optional[np.ndarray],
    atol: float,
    rtol: float,
    layout_of: Any,
    whole: Optional[ks.GlobalSlots] = None,
    filler: str = "-1",
    compress_ratio: int = 1,
) -> Report:
    """The body of :func:`check_indexer_topk` (and of a dump's indexer-input
    check): ``layout_of(rows)`` is the ``GlobalSlots`` of those rows, or
    None; ``whole``, a ``GlobalSlots`` of every row, checks the batch in one
    piece through it instead; ``filler`` is :func:`kvselect.check_topk`'s;
    ``compress_ratio`` :func:`kvselect.indexer_topk`'s (keys are compressed
    entries: a row's context is ``(query_pos + 1) // compress_ratio``)."""
    engine_rows = np.asarray(rows)
    if engine_rows.ndim != 2 or (engine_rows.dtype.kind not in "iu" and engine_rows.size):
        raise _refused(
            "rows", f"rows must be 2-D integers [n_rows, width], got {engine_rows.dtype} {engine_rows.shape}"
        )
    if engine_rows.dtype.kind == "i" and engine_rows.dtype.itemsize < 8:
        engine_rows = engine_rows.astype(np.int64)  # (read once: the native calls take int64)
    n = len(engine_rows)
    pos = (
        np.asarray(query_pos).astype(np.int64).reshape(-1)
        if np.ndim(query_pos)
        else np.array([int(query_pos)], dtype=np.int64)
    )
    q_arr = np.asarray(index_q)
    if q_arr.ndim != 3 or len(q_arr) != n or len(pos) != n:
        raise _refused(
            "rows", f"rows has {n} rows, index_q {q_arr.shape}, query_pos {len(pos)} entries: one each per row"
        )
    k_arr = np.asarray(index_k)
    # Each sequence's keys lo .. hi and rows: one sequence (no packing) is
    # every row and key, read in place.
    if cu_seqlens is None:
        sequences = [(0, len(k_arr), np.arange(n))]
    else:
        if seq_ids is None:
            raise _refused("seq_ids", "cu_seqlens needs seq_ids: each row's sequence")
        cu = np.asarray(cu_seqlens).astype(np.int64).reshape(-1)
        seq = np.asarray(seq_ids).astype(np.int64).reshape(-1)
        _check_packing(cu, seq, len(k_arr), _refused, n_rows=n)
        sequences = [(int(cu[s]), int(cu[s + 1]), np.flatnonzero(seq == s)) for s in np.unique(seq)]
    w32 = np.asarray(weights, dtype=np.float32)
    c32 = None if key_scale is None else np.asarray(key_scale, dtype=np.float32)
    if c32 is not None and c32.ndim == 0:
        c32 = np.full(len(k_arr), c32, dtype=np.float32)  # one per-tensor scale
    h, d = q_arr.shape[1], q_arr.shape[2]
    # Exact up to float64 rounding: two scores within the float64 re-score's
    # own error bound of each other are a tie (either side may win), so a
    # right row is never failed — kvselect's own rows included, which are
    # decided in float64 summed in another order. The verdict takes it; a
    # wrong row's report is against the tolerance given.
    slack = _f64_slack(d, h)
    parts: List[Tuple[np.ndarray, dict]] = []
    vacuous = 0
    if whole is not None:  # one piece: every sequence's scores in one matrix
        t_max = max(hi - lo for lo, hi, _ in sequences) if n else 0
        full = np.full((n, t_max), np.nan)
        full_m = np.full((n, t_max), np.nan)
        full_lens = np.zeros(n, dtype=np.int64)
    for lo, hi, idx in sequences:
        keys, ksc = k_arr[lo:hi], None if c32 is None else c32[lo:hi]
        g: Optional[np.ndarray] = None
        step = len(idx) if whole is not None else max(1, _CHUNK_BYTES // (26 * max(1, hi - lo) + 16 * max(1, h * d)))
        # Screened or dense (see checking.dense): a small sequence
        # goes dense, a larger one with rows to spare is probed with its
        # first row's float32 scores (_band_share) and goes dense where the
        # screen would re-score more than _DENSE_BAND of them. Either way
        # the same report.
        dense = _path._DENSE
        if dense is None:
            small = len(idx) * (hi - lo) * h * d < _path._DENSE_WORK
            dense = small or len(idx) > 1
            if dense and not small:
                kk = topk if topk is not None else engine_rows.shape[1]
                share = _path._band_share(
                    q_arr[idx[0]], w32[idx[0]], keys, pos[idx[0]], ksc, key_format, query_format, compress_ratio, kk
                )
                dense = share > _path._DENSE_BAND
        # (the screen's |c_t|; the dense path reads the scales as they are)
        absc = None if dense else np.ones(1) if ksc is None else np.abs(ksc.astype(np.float64))
        for c0 in range(0, len(idx), step):
            sub = idx[c0 : c0 + step]
            # (every row of the batch: the arrays as they are, no copy)
            every = len(sub) == n
            q_sub, w_sub, p_sub, r_sub = (a if every else a[sub] for a in (q_arr, w32, pos, engine_rows))
            lens = np.minimum((p_sub + 1) // compress_ratio, hi - lo)
            layout = whole if whole is not None else layout_of(sub)
            rel = None if whole is None else whole.positions(engine_rows)[sub]
            operands = (q_sub, w_sub, keys, ksc, absc, h, d, query_format, key_format, p_sub, compress_ratio)
            args = (r_sub, lens, topk, atol, rtol, layout, operands, rel, whole is not None, slack)
            if dense:
                idx_, real, exact, mags, vac = _path._dense(*args)
            else:
                S = ks.indexer_scores(
                    q_sub,
                    w_sub,
                    keys,
                    p_sub,
                    key_scale=ksc,
                    key_format=key_format,
                    query_format=query_format,
                    compress_ratio=compress_ratio,
                )
                if g is None:  # once per sequence, after the native call has vetted the keys
                    g = _key_bounds(keys, ksc, key_format)
                idx_, real, exact, mags, vac = _rescore(S, g, *args)
            vacuous += int(np.count_nonzero(vac))
            if whole is not None:
                full[sub, : hi - lo], full_lens[sub] = exact, lens
                if full_m is not None and mags is not None:
                    full_m[sub, : hi - lo] = mags
                continue
            # The exactly wrong rows against their float64 scores; the rest,
            # exactly right, on their structure alone (below).
            mine = sub[idx_[real]]
            if len(mine):
                parts.append(
                    (
                        mine,
                        ks.check_topk(
                            exact[real],
                            engine_rows[mine],
                            lens[idx_[real]],
                            topk=topk,
                            atol=atol,
                            rtol=rtol,
                            magnitudes=None if mags is None else mags[real],
                            slots=layout_of(mine),
                            filler=filler,
                        ),
                    )
                )
            # The exactly right rows: their structural faults alone (no score
            # is read; check_topk's report of them against equal scores).
            if not len(mine):
                parts.append((sub, _structure(r_sub, lens, topk, layout, filler)))
                continue
            right = np.ones(len(sub), dtype=bool)
            right[idx_[real]] = False
            if right.any():
                sub_r = sub[right]
                parts.append((sub_r, _structure(engine_rows[sub_r], lens[right], topk, layout_of(sub_r), filler)))
    if whole is not None:
        parts = [
            (
                np.arange(n),
                ks.check_topk(
                    full,
                    engine_rows,
                    full_lens,
                    topk=topk,
                    atol=atol,
                    rtol=rtol + slack,
                    magnitudes=full_m,
                    slots=whole,
                    filler=filler,
                ),
            )
        ]
    # (one part of every row, in order: its report as it is)
    out = Report(parts[0][1]) if len(parts) == 1 and len(parts[0][0]) == n else _merge(parts)
    out["rows"] = n
    out["correct"] = n - out["wrong"]
    out["vacuous"] = vacuous
    if not parts:
        out["by_reason"] = dict.fromkeys(
            ("padding_hole", "duplicate", "not_causal", "not_in_table", "wrong_count", "wrong_selection"), 0
        )
    return out


def _structure(rows: np.ndarray, lens: np.ndarray, topk: Optional[int], layout: Any, filler: str) -> dict:
    """:func:`kvselect.check_topk`'s report of ``rows`` against equal
    scores — their structural faults alone — without reading a score
    (``kvselect._core._check_topk_structure``): the rows the exact verdict
    found right."""
    return ks._core._check_topk_structure(rows, lens, topk=topk, slots=layout, filler=filler)


def _rescore(
    S: np.ndarray,
    g: np.ndarray,
    rows: np.ndarray,
    lens: np.ndarray,
    topk: Optional[int],
    atol: float,
    rtol: float,
    layout: Any,
    operands: tuple,
    rel: Optional[np.ndarray] = None,
    full: bool = False,
    slack: float = 0.0,
) -> Tuple[np.ndarray, np.ndarray, np.ndarray, Optional[np.ndarray], np.ndarray]:
    """The float64-exact check of a chunk of rows, screened (see
    :func:`check_indexer_topk` for the rule and why it is exact): ``(idx,
    real, scores, magnitudes, vacuous)``. ``scores`` (and ``magnitudes``,
    ``None`` at ``rtol = 0``) are rows ``idx`` of the chunk in float64: ``S``
    (``M'``) with the exact values at the candidates; ``real[j]`` says row
    ``idx[j]`` is exactly wrong, the rows whose values check_topk must see
    (every other row is exactly right, so any equal scores give its report:
    only its structural faults); every row with ``full``. ``vacuous`` is per
    chunk row. ``S`` is the native float32 scores (modified: NaN past each
    row's length becomes ``-inf``), ``g`` the sequence's :func:`_key_bounds`.

    The screen is vectorised over the chunk, in float32 for the rows with
    finite operands: one pass for each row's largest unselected score, one
    comparison against a per-row threshold, then arithmetic on the few
    candidates it leaves. The candidates are re-scored and each row's exact
    verdict is computed from them; only the exactly wrong rows, those the
    bounds leave undecided as to vacuity, and those with a non-finite
    operand are screened again, one by one in float64. ``slack`` (relative
    to the magnitude, like ``rtol``) widens the verdict's tolerance by the
    float64 re-score's own rounding: the returned magnitudes are for the
    tolerance given (every row's with ``full``, whose caller adds it)."""
    user_rtol, rtol = rtol, rtol + slack
    from kvselect import reference

    q, w32, keys, ksc, absc, h, d, query_format, key_format, qpos, ratio = operands
    c, t = S.shape
    k = _topk_of(rows, topk, layout)
    if rel is None:
        rel = layout.positions(rows) if layout is not None else np.asarray(rows, dtype=np.int64)
    lens = np.asarray(lens, dtype=np.int64)
    vac = np.zeros(c, dtype=bool)
    f64 = np.float64
    if t == 0:
        idx0 = np.arange(c) if full else np.zeros(0, dtype=np.int64)
        return (
            idx0,
            np.zeros(len(idx0), bool),
            np.zeros((len(idx0), 0)),
            (np.zeros((len(idx0), 0)) if user_rtol or full else None),
            vac,
        )
    S = np.ascontiguousarray(S)  # (the native call's already is: no copy)
    for i in np.flatnonzero(lens < t):  # past the row's length: -inf, below every bound
        S[i, lens[i] :] = -np.inf
    qd = reference.decode(q, query_format, "query_format").reshape(c, h, d)
    w64 = w32.astype(f64)
    absw = np.abs(w64)
    absq = np.abs(qd)
    wq = np.einsum("ch,chd->cd", absw, absq)  # Σ_h |w_h| |q_hi|, per row
    # A_q = Σ_h |w_h| Σ_i |q_hi|, rounded up past its float64 roundings (at
    # most d + H + 3 of them, each relative 2^-53): M'_t = A_q g_t >= M_t.
    with np.errstate(invalid="ignore", over="ignore"):
        A = wq.sum(axis=1) * (1.0 + 4 * (d + h + 4) * _U64)
        gmax = float(np.max(g, initial=0.0))
        gam = _gamma(d + h + 2)
        eta = 2 * 8 * _ETA32 * (float(absc.max(initial=1.0)) * (d * absw.sum(axis=1) + h) + 1.0)
        # Δ: the underflow term plus room for the screen's own roundings (and
        # check_topk's float64 ones): a few of size at most (2 + rtol) max M'
        # + atol, each off by at most u of it.
        delta = eta + 16 * _U32 * ((2 + rtol) * A * gmax + atol)
        # Rows whose float32 scores cannot overflow (nor be NaN): finite operands.
        fin = np.isfinite(A) & np.isfinite(delta) & np.isfinite(gmax) & (2 * A * gmax + delta < 2.0**120)
    ok = (rel >= 0) & (rel < lens[:, None])
    sr = np.broadcast_to(np.arange(c)[:, None], rel.shape)[ok]
    st = rel[ok]  # the selected (row, position) pairs, row by row
    flat = sr * t + st
    sel = np.zeros((c, t), dtype=bool)
    sel.reshape(-1)[flat] = True
    n_sel = np.count_nonzero(sel, axis=1)  # distinct selected positions
    has_both = (n_sel > 0) & (lens > n_sel)
    go = has_both & fin
    Sf = S.reshape(-1)  # a view: S is C-contiguous (made so above)
    with np.errstate(invalid="ignore", over="ignore"):
        # Unselected b: exact s_b - e_b lies in [S_b - (2γ + rtol) M'_b - Δ -
        # atol, S_b + 2γ M'_b + Δ - atol]. One pass finds each row's largest
        # unselected S (the selected set to -inf meanwhile); every b that can
        # be the best unselected has S_b >= that - (4γ + rtol) A gmax - 2Δ
        # (a float32 threshold rounded down: an exact float32 comparison),
        # a superset refined below with each position's own M'_b.
        sv32 = Sf[flat]
        Sf[flat] = -np.inf
        smax = S.max(axis=1).astype(f64)
        coarse = _down32(np.where(go, smax - (4 * gam + rtol) * A * gmax - 2 * delta, np.inf))
        cr, ct = np.nonzero(S >= coarse[:, None])
        Sf[flat] = sv32
        Sc = Sf[cr * t + ct].astype(f64)
        Mc = A[cr] * g[ct]
        lo_c = Sc - (2 * gam + rtol) * Mc - delta[cr] - atol
        lo_max = np.full(c, -np.inf)  # the best unselected lower bound
        if len(cr):
            starts = np.flatnonzero(np.r_[True, cr[1:] != cr[:-1]])
            lo_max[cr[starts]] = np.maximum.reduceat(lo_c, starts)
        keep = Sc + 2 * gam * Mc + delta[cr] - atol >= lo_max[cr]
        cr, ct = cr[keep], ct[keep]
        # Selected a: s_a + e_a within [S - E + atol, S + E + atol + rtol M'].
        sv = sv32.astype(f64)
        Ms = A[sr] * g[st]
        Es = 2 * gam * Ms + delta[sr]
        lo_s = sv - Es + atol
        up_s = sv + Es + atol + rtol * Ms
        worst_up = np.full(c, np.inf)
        top = np.full(c, -np.inf)
        if len(sr):
            starts = np.flatnonzero(np.r_[True, sr[1:] != sr[:-1]])
            worst_up[sr[starts]] = np.minimum.reduceat(up_s, starts)
            top[sr[starts]] = np.maximum.reduceat(sv - Es - atol - rtol * Ms, starts)
        s_cand = go[sr] & (lo_s <= worst_up[sr])
        # Certainly not vacuous: some s - e (a selected one's, or the best
        # unselected's) above some s + e (the worst selected's).
        decided = (lens <= k) | (np.maximum(top, lo_max) > worst_up)
    slow = ~fin | ~decided
    pr_parts, pt_parts = [cr, sr[s_cand]], [ct, st[s_cand]]
    for i in np.flatnonzero(slow):
        ts = _screen_row(
            S[i, : int(lens[i])], g[: int(lens[i])], float(A[i]), float(delta[i]), gam, rel[i][ok[i]], k, atol, rtol
        )
        pr_parts.append(np.full(len(ts), i, dtype=np.int64))
        pt_parts.append(ts)
    keys_ = np.asarray(keys)
    cs_all = None if ksc is None else np.asarray(ksc, dtype=np.float32).astype(f64)

    def rescore(
        pr_parts: List[np.ndarray], pt_parts: List[np.ndarray]
    ) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Re-score the (row, position) pairs in float64 (every product of
        the decoded operands exact; one decode of their distinct keys): the
        pairs (``row * t + position``, row, position), their scores and
        magnitudes."""
        # The distinct pairs, sorted, through a mask of the chunk's [c, t]
        # pairs (a hash or a sort of some 10^5 pairs costs more).
        mark = np.zeros(c * t, dtype=bool)
        for p, q_ in zip(pr_parts, pt_parts):
            mark[np.asarray(p, dtype=np.int64) * t + np.asarray(q_, dtype=np.int64)] = True
        u = np.flatnonzero(mark)
        pr, pt = u // t, u % t
        # The scores natively (the exact selection's float64 re-score: the
        # products exact, the sums in float64), the pairs row by row (``u``
        # is sorted); the magnitudes Σ_i (Σ_h |w_h| |q_hi|) |k_ti| (no ReLU:
        # one vector per row) by a product per row.
        ex = ks._core._indexer_rescore(
            q,
            w32,
            keys_,
            qpos,
            pr,
            pt,
            key_scale=ksc,
            key_format=key_format,
            query_format=query_format,
            compress_ratio=ratio,
        )
        used = np.zeros(t, dtype=bool)
        used[pt] = True
        ut = np.flatnonzero(used)
        inv = (np.cumsum(used) - 1)[pt]  # pt's place in ut
        absk = np.abs(reference.decode(keys_[ut], key_format, "key_format").reshape(len(ut), d))
        mg = np.empty(len(u))
        starts = np.flatnonzero(np.r_[True, pr[1:] != pr[:-1]]) if len(pr) else np.zeros(0, np.int64)
        ends = np.r_[starts[1:], len(pr)].astype(np.int64)
        with np.errstate(invalid="ignore", over="ignore"), _one_blas_thread():
            for a_, b_ in zip(starts, ends):
                mg[a_:b_] = absk[inv[a_:b_]] @ wq[int(pr[a_])]
            if cs_all is not None:
                mg *= np.abs(cs_all[pt])
        return u, pr, pt, ex, mg

    done, pr, pt, ex, mg = rescore(pr_parts, pt_parts)
    # Each row's exact verdict, as check_topk computes it, from its
    # candidates (they hold its best unselected and worst selected).
    is_sel = sel.reshape(-1)[done]
    with np.errstate(invalid="ignore", over="ignore"):
        rel_e = rtol * np.abs(mg) if rtol else np.zeros(len(mg))
        e = atol + np.where(np.isnan(rel_e), 0.0, rel_e)
        best = np.full(c, -np.inf)
        np.maximum.at(best, pr[~is_sel], (ex - e)[~is_sel])
        worst = np.full(c, np.inf)
        np.minimum.at(worst, pr[is_sel], (ex + e)[is_sel])
    wrong = has_both & (~fin | ~(best <= worst))
    # The float64 scores (and magnitudes) of the rows whose values matter:
    # the wrong ones' (check_topk reports their line) and the vacuous test's
    # undecided ones; every row with ``full``.
    need = np.ones(c, dtype=bool) if full else (wrong | slow)
    idx = np.flatnonzero(need)
    at = np.full(c, -1)
    at[idx] = np.arange(len(idx))
    out = S[idx].astype(f64)
    mags = np.multiply.outer(A[idx], g)
    mine = need[pr]
    out[at[pr[mine]], pt[mine]] = ex[mine]
    if mags is not None:
        mags[at[pr[mine]], pt[mine]] = mg[mine]
    wi = np.flatnonzero(wrong)
    if len(wi):
        # A wrong row's every score and magnitude in float64 (the dense
        # path's pass): its report (threshold, counts past the line, the
        # positions listed and their scores) is then exact throughout.
        out[at[wi]], mags[at[wi]] = _path._exact_rows(operands, wi)
    if slow.any():
        rs = at[np.flatnonzero(slow)]
        vac[slow] = _vacuous_rows(out[rs], mags[rs], lens[slow], k, atol, rtol)
    return idx, (wrong if not full else need)[idx], out, (mags if user_rtol or full else None), vac


def _screen_row(
    S: np.ndarray,
    g: np.ndarray,
    A: float,
    delta: float,
    gam: float,
    selected: np.ndarray,
    k: int,
    atol: float,
    rtol: float,
) -> np.ndarray:
    """One row's candidates (positions), screened in float64 (``S`` and
    ``g`` the row's ``L`` positions'): a row the chunk's screen left
    undecided as to vacuity, or with a non-finite score or operand: its
    best unselected and worst selected candidates and the vacuous test's
    extremes."""
    L = len(S)
    s = S.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        M = A * g
        E = 2 * gam * M + delta
        bad = ~(np.isfinite(s) & np.isfinite(E) & np.isfinite(M))
        s, M = np.where(bad, 0.0, s), np.where(bad, 0.0, M)
        E = np.where(bad, np.inf, E)  # a non-finite score or bound: anything
        lo_m, up_m = s - E - atol - rtol * M, s + E - atol  # bounds of s - e
        lo_p, up_p = s - E + atol, s + E + atol + rtol * M  # bounds of s + e
    sel = np.zeros(L, dtype=bool)
    sel[selected] = True
    uns = ~sel
    cand = bad.copy()
    if sel.any() and uns.any():
        cand |= uns & (up_m >= lo_m[uns].max())
        cand |= sel & (lo_p <= up_p[sel].min())
    if L > k:  # the vacuous test's extremes, unless the bounds decide it
        top_lo, bottom_up = lo_m.max(), up_p.min()
        if not (top_lo > bottom_up or up_m.max() <= lo_p.min()):
            cand |= (up_m >= top_lo) | (lo_p <= bottom_up)
    return np.flatnonzero(cand)


def check_indexer_topk(
    rows: Any,
    index_q: Any,
    weights: Any,
    index_k: Any,
    query_pos: Any,
    topk: Optional[int] = None,
    *,
    key_scale: Any = None,
    key_format: Optional[str] = None,
    query_format: Optional[str] = None,
    cu_seqlens: Any = None,
    seq_ids: Any = None,
    precision: str = "float32",
    atol: Optional[float] = None,
    rtol: Optional[float] = None,
    slots: Optional[ks.GlobalSlots] = None,
    filler: str = "-1",
    kv_cache: Any = None,
    block_table: Any = None,
    seq_lens: Any = None,
    page_layout: str = "dense",
    compress_ratio: int = 1,
    activation: str = "relu",
    force_first: int = 0,
    force_last: int = 0,
    row_layout: str = "rank",
    score_pool: int = 1,
    score_type: str = "max",
    sm_scale: Optional[float] = None,
    topk_length: Any = None,
) -> Report:
    """Whether each engine row is a correct lightning-indexer top-k of the indexer's inputs.

    Judged against scores **exact up to float64 rounding**. The arguments
    are :func:`kvselect.indexer_topk`'s; a packed batch as
    :func:`kvselect.indexer_topk_packed` takes it; a paged cache as
    :func:`kvselect.indexer_topk_paged` takes it, each sequence's pages read
    in their own format. With ``atol = rtol = 0`` a row passes iff it is
    right up to float64 rounding: two positions whose float64 scores differ
    by less than ``2 γ_{d+H+3}`` (``u = 2^-53``) times the magnitude ``|c_t|
    Σ_h |w_h| Σ_i |q_hi k_ti|`` are a tie (a float64 sum in another order
    may round them the other way; real arithmetic may tie them), and
    :func:`kvselect.indexer_topk`'s own rows always pass. The operands are the values the native
    kernel reads (weights and key scales as float32, keys and queries
    decoded exactly). Every argument is judged before any work.

    Parameters
    ----------
    rows : array_like
        The engine's output, int32 or int64 ``[n_rows, width]`` (with DCP
        ``slots``, every rank's rows side by side), any order, ``-1`` padded:
        positions (offsets from the sequence's start in a packed batch), or
        global slot ids through ``slots``.
    index_q : array_like
        ``[n_rows, H, d]``: float32, float16, ``ml_dtypes`` bfloat16 /
        float8_e4m3fn, or raw bits with ``query_format``.
    weights : array_like
        ``[n_rows, H]``, read as float32 (scales folded in).
    index_k : array_like or None
        ``[n_keys, d]``, in the formats ``index_q`` takes (raw bits with
        ``key_format``);
        None with ``kv_cache``.
    query_pos : array_like or int
        Integer ``[n_rows]``: each row's query position (within its
        sequence; the token, with ``compress_ratio``); one int for one row.
    topk : int, optional
        ``k``; None (the default) is the rows' width (a rank's width with
        DCP ``slots``).
    key_scale : array_like, optional
        float32 ``[n_keys]``, or 0-d: one per-tensor scale for every key.
    key_format, query_format : str, optional
        ``"bfloat16"``, ``"float16"`` or ``"float8_e4m3fn"`` when
        ``index_k`` / ``index_q`` (or ``kv_cache``) hold raw bits.
    cu_seqlens : array_like, optional
        Integer ``[n_seqs + 1]``: a packed batch's key offsets, rising from 0
        to ``n_keys``; needs ``seq_ids``.
    seq_ids : array_like, optional
        Integer ``[n_rows]``: each row's sequence (packed or paged).
    precision : str, optional
        The engine's coarsest rounding (default ``"float32"``; aliases
        ``"fp32"``, ``"bf16"``, ``"fp16"``, ``"fp8"``): sets the default
        ``rtol`` (:data:`DEFAULT_RTOL`), as in a dump.
    atol, rtol : float, optional
        The tolerance, finite and non-negative; None (the default) is 0 for
        ``atol`` and ``DEFAULT_RTOL[precision]`` for ``rtol``.
    slots : kvselect.GlobalSlots, optional
        When the rows are global slot ids (the whole batch is then checked
        in one piece).
    filler : str, optional
        The engine's contract for short rows, one of :data:`FILLERS`
        (default ``"-1"``), as :func:`kvselect.check_topk` takes it.
    kv_cache : array_like, optional
        A paged cache as :func:`kvselect.indexer_topk_paged` takes it
        (``index_k``, ``key_scale`` and ``cu_seqlens`` then None).
    block_table : array_like, optional
        Integer ``[n_seqs, max_blocks]``, with ``kv_cache``.
    seq_lens : array_like, optional
        Integer ``[n_seqs]``, with ``kv_cache``.
    page_layout : str, optional
        ``"dense"`` (the default) or ``"fp8_scaled"`` (vLLM's uint8 DSA
        pages), with ``kv_cache``.
    compress_ratio : int, optional
        As :func:`kvselect.indexer_topk` takes it (default 1; DeepSeek-V4's
        CSA rows: positions are compressed entries, ``query_pos`` the token).
    activation, force_first, force_last, row_layout, score_pool, score_type, sm_scale, topk_length : optional
        The indexer family's options (``weights`` may then be None), as
        :func:`check_indexer_family` takes them; given any, the rows are judged
        by its judge (``slots`` and a ``filler`` other than ``"-1"`` refused).

    Returns
    -------
    Report
        The report of :func:`kvselect.check_topk` (``rows``, ``correct``,
        ``wrong``, ``by_reason``, ``details``) plus ``vacuous``: the number
        of rows no selection could fail at this tolerance.

    Raises
    ------
    SelectionError
        ``argument`` naming the argument at fault: an unknown
        ``precision`` or ``filler``; a negative or non-finite ``atol`` /
        ``rtol``; ``topk`` or ``compress_ratio`` below 1; ``rows`` not 2-D
        integers or not one per ``index_q`` / ``query_pos`` row;
        ``weights`` or ``key_scale`` of the wrong shape; a NaN or infinite
        operand (its exact score is undefined); ``cu_seqlens`` without
        ``seq_ids`` or not rising from 0 to the keys; ``seq_ids`` naming no
        sequence, or without ``cu_seqlens`` or ``kv_cache``; ``block_table`` / ``seq_lens`` / ``page_layout`` without
        ``kv_cache``, packed keys beside it, or a paged cache the pages
        refuse; ``index_k`` None without ``kv_cache``; and the native
        functions' refusals.
    TypeError
        When ``slots`` is not a :class:`kvselect.GlobalSlots` or None;
        ``topk`` or ``compress_ratio`` is not an integer; ``query_pos``,
        ``seq_ids`` or ``cu_seqlens`` does not hold integers (never
        truncated).

    Notes
    -----
    How: the native float32 scores ``S`` (:func:`kvselect.indexer_scores`,
    the one native pass) screen, with a cheap bound ``M'`` in place of the
    magnitudes; only the candidates are re-scored in float64 (their score
    and their magnitude), each row is decided from them, and
    :func:`kvselect.check_topk` sees float64 scores (exact at the
    candidates, ``S`` elsewhere) and magnitudes (exact at the candidates,
    ``M'`` elsewhere).

    - **The magnitude bound.** ``M'_t = |c_t| kmax_t A_q`` with ``kmax_t =
      max_i |k_ti|`` (the decoded keys, once per sequence, a chunk of keys at
      a time) and ``A_q = Σ_h |w_h| Σ_i |q_hi|``: each ``|q_hi k_ti| <=
      |q_hi| kmax_t``, so ``M'_t >= M_t = |c_t| Σ_h |w_h| Σ_i |q_hi
      k_ti|``. It is computed in float64: ``|c_t| kmax_t`` is exact (a
      product of two values of at most 24 significant bits), and ``A_q`` is
      multiplied by ``1 + 4 (d + H + 4) 2^-53``, more than its at most ``d +
      H + 3`` float64 roundings and the product's one can take off, so the
      computed ``M'_t`` is an upper bound.
    - **The score bound.** ``S_t = fl(c_t · Σ_h fl(w_h · relu(fl(q_h ·
      k_t))))`` in float32, in whatever order a kernel sums. With ``u =
      2^-24`` and ``γ_n = n u / (1 - n u)``: a dot of ``d`` terms in any
      order is off by at most ``γ_d Σ_i |q_hi k_ti|``; the ReLU is exact and
      1-Lipschitz; the product with ``w_h``, the sum over ``H`` heads (any
      order) and the product with ``c_t`` add ``H + 2`` roundings, so ``|S_t
      - s_t| <= γ_{d+H+2} M_t`` plus the absolute error of roundings into
      the subnormal range (at most ``2^-150`` each, scaled by what
      multiplies them later): ``η = 8 · 2^-150 (|c|max (d Σ_h |w_h| + H) +
      1)``, doubled. ``E_t = 2 γ_{d+H+2} M'_t + Δ`` bounds it, ``Δ = η + 16
      u ((2 + rtol) A_q max_t g_t + atol)`` (``g_t = |c_t| kmax_t``): room
      for the screen's and the check's own roundings, each at most ``u`` of
      a value below ``(2 + rtol) max M' + atol``. The screen compares float32
      scores with per-row thresholds computed in float64 and rounded down to
      float32, so its comparisons are exact.
    - **The tolerance, with only bounds.** ``e_t = atol + rtol m_t``, ``m_t``
      the exact magnitude, lies in ``[atol, atol + rtol M'_t]``; so an
      unselected ``b``'s exact ``s_b - e_b`` lies in ``[S_b - E_b - atol -
      rtol M'_b, S_b + E_b - atol]`` and a selected ``a``'s ``s_a + e_a`` in
      ``[S_a - E_a + atol, S_a + E_a + atol + rtol M'_a]``.
    - **The candidates.** The unselected whose upper end reaches the largest
      lower end over the unselected, and the selected whose lower end
      reaches the smallest upper end over the selected: they hold the best
      unselected and the worst selected, the row's verdict and margin. A row
      is vacuous iff ``max_t (s_t - e_t) <= min_t (s_t + e_t)`` over all its
      positions; unless the bounds decide it (some lower end of an ``s - e``
      above some upper end of an ``s + e``: not vacuous; every upper end of
      ``s - e`` at most every lower end of ``s + e``: vacuous), the positions
      that can be those extremes, by the same rule over all positions, join.
      A non-finite score or operand is always re-scored. The candidates are
      re-scored in float64, where every product of float32 / bfloat16 /
      float16 / fp8 operands is exact: the score and ``|c_t| Σ_h |w_h| Σ_i
      |q_hi k_ti|``. A row the re-scored candidates show wrong (or that may
      be, a non-finite score in it) is then re-scored whole, every position.
    - **Why the result is exact.** A non-candidate's value as the check
      sees it (``S_t``, and ``e_t`` from ``M'_t``) lies in the same interval
      as its exact one, and that interval lies strictly on the losing side of
      an extreme a candidate holds: so the best unselected ``s - e``, the
      worst selected ``s + e`` and the vacuous test's maximum and minimum are
      the exact scores' — the verdict, the margin and the vacuous count are
      exact. A wrong row is reported from every position's float64 score:
      its threshold, ``n_dropped``, ``n_intruders`` and the positions listed
      with their scores are exact. A row the candidates show exactly right is
      checked on its structure alone (its selection is right: the report
      ``check_topk`` gives it against equal scores, no score read), so only
      the wrong rows' scores are held in float64.
    - **The cost.** One native pass (the float32 scores), one pass over the
      keys for ``kmax`` (once per sequence; for bfloat16 / float16 / fp8 keys
      the largest sign-less code, since ``|x|`` rises with those bits), a
      vectorised float32 screen (one pass for each row's largest unselected
      score, one comparison with a per-row threshold, refined with each
      candidate's own ``M'``), a re-score of the candidates (some tens per
      row near its line) and of every position of a wrong row. The re-score
      is native (``kvselect._core._indexer_rescore`` and
      ``_indexer_rescore_all``: the exact selection's float64 kernel, every
      product exact, the same bits at every SIMD level).
    - **Where the screen cannot decide.** On low-contrast rows the float32
      bound leaves every position a candidate, and the screen costs more
      than it saves: a sequence whose first row's screen would re-score
      more than a third of its positions (or any sequence under ``2^22``
      multiply-adds) is checked dense instead (:mod:`kvselect.checking.dense`):
      one native pass computes every position's float64 score and magnitude
      with the same kernel and folds each row's verdict and vacuous test as
      they come, and a wrong row is reported from its float64 scores, as
      on the screened path: the same report either way.
    """
    p = _precision(precision, lambda message: _refused("precision", message))
    atol_, rtol_ = (float(x) for x in _tolerance_values(p, atol, rtol))
    for name, v in (("atol", atol_), ("rtol", rtol_)):
        if not (math.isfinite(v) and v >= 0):
            raise _refused(name, f"{name} = {v} must be finite and non-negative")
    if slots is not None and not isinstance(slots, ks.GlobalSlots):
        raise TypeError(f"slots must be a GlobalSlots or None, got {type(slots).__name__}")
    if isinstance(compress_ratio, bool) or not isinstance(compress_ratio, (int, np.integer)):
        raise TypeError(f"compress_ratio must be an integer, got {type(compress_ratio).__name__}")
    if compress_ratio < 1:
        raise _refused("compress_ratio", f"compress_ratio must be at least 1 (tokens per key), got {compress_ratio}")
    _vet_api(
        rows,
        index_q,
        weights,
        index_k,
        query_pos,
        topk,
        key_scale,
        key_format,
        query_format,
        cu_seqlens,
        seq_ids,
        kv_cache,
        block_table,
        seq_lens,
        page_layout,
        filler,
    )
    given = (activation, force_first, force_last, row_layout, score_pool, score_type, sm_scale, topk_length)
    options = family_options(weights, slots, filler, **dict(zip(DEFAULTS, given)))
    if kv_cache is not None:  # each sequence's pages, read into a packed batch's keys
        index_k, key_scale, cu_seqlens, key_format = _api_paged_keys(
            index_k, key_scale, cu_seqlens, kv_cache, block_table, seq_lens, seq_ids, page_layout, key_format
        )
    elif index_k is None:
        raise _refused(
            "index_k",
            "index_k is None: pass the keys, or kv_cache= (with block_table=, seq_lens=, seq_ids=) for a paged cache",
        )
    if options is not None:  # the family's one judge
        kw = dict(key_scale=key_scale, key_format=key_format, query_format=query_format, cu_seqlens=cu_seqlens)
        kw.update(seq_ids=seq_ids, compress_ratio=compress_ratio, atol=atol_, rtol=rtol_, **options)
        return check_indexer_family(rows, index_q, weights, index_k, query_pos, topk, **kw)
    return indexer_check(
        rows,
        index_q,
        weights,
        index_k,
        query_pos,
        topk,
        key_scale,
        key_format,
        query_format,
        cu_seqlens,
        seq_ids,
        atol_,
        rtol_,
        lambda rows_: None,
        slots,
        filler=filler,
        compress_ratio=compress_ratio,
    )


def _api_paged_keys(
    index_k: Any,
    key_scale: Any,
    cu_seqlens: Any,
    kv_cache: Any,
    block_table: Any,
    seq_lens: Any,
    seq_ids: Any,
    page_layout: str,
    key_format: Optional[str],
) -> tuple:
    """:func:`check_indexer_topk`'s paged form: the pages read as a dump's
    (:func:`_paged_keys`), refusals as the API's (``SelectionError`` naming
    the argument)."""
    for name, v in (("index_k", index_k), ("key_scale", key_scale), ("cu_seqlens", cu_seqlens)):
        if v is not None:
            raise _refused(
                name,
                f"{name} beside kv_cache: the keys are either packed (index_k, "
                f"cu_seqlens, key_scale) or paged (kv_cache, block_table, seq_lens)",
            )
    for name, v in (("block_table", block_table), ("seq_lens", seq_lens), ("seq_ids", seq_ids)):
        if v is None:
            raise _refused(name, f"kv_cache needs {name}, as indexer_topk_paged takes it")
    cache = np.asarray(kv_cache)
    raw = {"bfloat16": np.uint16, "float8_e4m3fn": np.uint8}.get(cache.dtype.name)
    d = Dump(
        {
            "kv_cache": cache.view(raw) if raw is not None else cache,
            "block_table": np.asarray(block_table),
            "seq_lens": np.asarray(seq_lens),
            "seq_ids": np.asarray(seq_ids),
            "page_layout": np.array(page_layout),
        }
    )
    fmt = cache.dtype.name if raw is not None else key_format
    d.kind, d.source, d.formats = "topk", "", ({} if fmt is None else {"kv_cache": fmt})
    try:
        return _paged_keys(d)
    except DumpError as e:  # named by the argument its message starts with
        first = re.match(r"(\w+)", str(e))
        name = first.group(1) if first else "kv_cache"
        name = {"kv_cache_format": "key_format"}.get(name, name)
        known = ("kv_cache", "block_table", "seq_lens", "seq_ids", "page_layout", "key_format")
        raise _refused(name if name in known else "kv_cache", str(e).replace("a paged dump", "a paged cache")) from e
