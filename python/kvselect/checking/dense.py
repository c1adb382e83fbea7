"""The exact check's dense path: every position of a row re-scored in
float64, no float32 screen.

:func:`kvselect.checking.exact.indexer_check` screens a row's positions
with the native float32 scores and a rigorous bound, and re-scores the band
the bound leaves. On low-contrast rows (every score within the float32
bound of the others) the band is every position, and the screen costs more
than it decides: here every score is computed in float64 at once, with its
magnitude, by the same native kernel the screened path re-scores its band
with (the same bits), and each row's verdict and vacuous test are folded
natively as the scores come. Which path a sequence takes changes nothing
in the report (both are exact, and both report a wrong row from every
position's float64 score; the tests compare them): it is a speed choice,
made by size and by a probe of the sequence's first row.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import numpy as np

import kvselect as ks
from kvselect.checking._common import _gamma, _topk_of, _vacuous_rows

# Which way a sequence's rows are checked (the same report either way): a
# sequence of fewer than _DENSE_WORK multiply-adds (rows x keys x H x d) goes
# dense (one native call costs less than the screen's bookkeeping); a larger
# one with two rows or more is probed with its first row's float32 scores,
# and past a band of _DENSE_BAND of that row's positions the screen costs
# more than it saves (its float32 pass ~1, a pair's re-score ~3.5, the dense
# re-score ~2.3 of a float32 score) and its rows go dense; a larger one-row
# sequence is screened. _DENSE (None: choose) forces one way: the tests
# compare the two.
_DENSE_WORK = 1 << 22
_DENSE_BAND = 0.35
_DENSE: Optional[bool] = None


def _band_share(
    q: np.ndarray,
    w: np.ndarray,
    keys: Any,
    qpos: int,
    ksc: Optional[np.ndarray],
    key_format: Optional[str],
    query_format: Optional[str],
    ratio: int,
    k: int,
) -> float:
    """About what share of one row's positions the float32 screen would
    re-score: those whose float32 score lies within twice the bound
    (``2 γ_{d+H+2}`` of the row's largest magnitude) of its ``k``-th
    largest. A speed estimate only (it picks the path, not the report): one
    row's float32 scores and magnitudes, no pass over every key's bound."""
    h, d = q.shape
    kw: Dict[str, Any] = dict(key_scale=ksc, key_format=key_format, query_format=query_format, compress_ratio=ratio)
    one = (q[None], w[None], keys, np.array([qpos]))
    L = min((int(qpos) + 1) // ratio, len(keys))
    if L <= max(k, 0):
        return 0.0
    S = ks.indexer_scores(*one, **kw)[0, :L]
    M = ks.indexer_magnitudes(*one, **kw)[0, :L]
    with np.errstate(invalid="ignore", over="ignore"):
        x = 4 * _gamma(d + h + 2) * float(np.max(M, initial=0.0))
        theta = np.partition(S, L - k)[L - k]
        return float(np.count_nonzero(np.abs(S - theta) <= x)) / L


def _dense(
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
    """:func:`_rescore`'s result for a chunk of rows
    whose every position is re-scored: no float32 screen. Each row's
    verdict and vacuous test are folded natively from every float64 score
    and magnitude (``kvselect._core._indexer_rescore_verdict``: the same
    bits as the re-score of a pair, each key decoded once per group of
    rows), no score kept; the wrong rows' scores are then made
    (``_indexer_rescore_all``) for their report, and with ``full`` (one
    piece through ``GlobalSlots``) every row's. Where the screen leaves most
    positions in its band (low-contrast rows: every score within the
    float32 bound of the others) this costs less than the band's re-score
    alone, and skips the screen and its bookkeeping. The verdict, the
    reported rows and the vacuous test are :func:`_rescore`'s, taken over
    every position rather than its candidates."""
    user_rtol, rtol = rtol, rtol + slack
    q, w32, keys, ksc, _absc, _h, _d, query_format, key_format, qpos, ratio = operands
    kw: Dict[str, Any] = dict(key_scale=ksc, key_format=key_format, query_format=query_format, compress_ratio=ratio)
    k = _topk_of(rows, topk, layout)
    if rel is None:
        rel = layout.positions(rows) if layout is not None else np.asarray(rows, dtype=np.int64)
    lens = np.asarray(lens, dtype=np.int64)
    c = len(lens)
    if not full:
        # Each row's verdict and vacuous test folded natively as its scores
        # come (_core._indexer_rescore_verdict: no [rows, keys] matrix is
        # made); the scores of the wrong rows alone, which check_topk reports.
        v = ks._core._indexer_rescore_verdict(
            q, w32, keys, qpos, np.ascontiguousarray(rel, dtype=np.int64), atol=atol, rtol=rtol, **kw
        )
        best, worst, top, bottom, n_sel = v.T
        wrong = (n_sel > 0) & (lens > n_sel) & ~(best <= worst)
        vac = (lens > k) & (top <= bottom)
        idx = wrong.nonzero()[0]
        if not len(idx):
            none = np.zeros((0, len(keys)))
            return idx, np.ones(0, dtype=bool), none, (none if user_rtol else None), vac
        ex, mg = _exact_rows(operands, idx)
        return idx, np.ones(len(idx), dtype=bool), ex, (mg if user_rtol else None), vac
    # One piece (the whole batch's verdict is check_topk's): every row's
    # scores kept, and its vacuous test over them.
    ex, mg = _exact_rows(operands, np.arange(c))
    return np.arange(c), np.ones(c, dtype=bool), ex, mg, _vacuous_rows(ex, mg, lens, k, atol, rtol)


def _exact_rows(operands: tuple, idx: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Rows ``idx`` of a chunk (its ``operands``, as :func:`_dense` takes
    them), every position's float64 score and magnitude
    (``_core._indexer_rescore_all``), NaN past each row's length: what a
    wrong row is reported from, on either path."""
    q, w32, keys, ksc, _absc, _h, _d, query_format, key_format, qpos, ratio = operands
    both = ks._core._indexer_rescore_all(
        q[idx],
        w32[idx],
        keys,
        qpos[idx],
        key_scale=ksc,
        key_format=key_format,
        query_format=query_format,
        compress_ratio=ratio,
    )
    return both[:, 0], both[:, 1]
