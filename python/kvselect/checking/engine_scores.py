"""An engine's own scores, checked: the rows an exact top-k of them
(:func:`own_scores_check`, a ``topk`` dump's ``engine_scores`` and
:func:`kvselect.testing.assert_topk`'s), and the scores themselves against
the exact ones under the tolerance (:func:`score_accuracy`);
:func:`engine_score_checks` runs both, the one place a ``topk`` dump's checker
and :func:`kvselect.testing.assert_topk` take them from."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import numpy as np

import kvselect as ks
from kvselect.checking._common import _U32, _context_lens, _gamma, _topk_of, _vacuous
from kvselect.checking.report import Report


def own_scores_check(
    engine_scores: np.ndarray,
    rows: np.ndarray,
    lens: np.ndarray,
    topk: int,
    slots: Optional[ks.GlobalSlots],
    filler: str,
) -> Report:
    """The rows against the engine's own scores, **exactly** (no
    tolerance): the self-consistency check that catches a threshold shift no
    tolerance can (vllm-project/vllm#51782). :func:`kvselect.check_topk`'s
    report plus ``vacuous``: the rows whose every position has the same
    score (any selection of the right size is right there)."""
    own = ks.check_topk(engine_scores, rows, lens, topk=topk, slots=slots, filler=filler)
    own["vacuous"] = _vacuous(engine_scores, None, lens, topk, 0.0, 0.0)
    return own


def score_accuracy(
    engine: np.ndarray,
    index_q: Any,
    weights: Any,
    index_k: Any,
    query_pos: np.ndarray,
    lens: np.ndarray,
    key_scale: Any,
    key_format: Optional[str],
    cu_seqlens: Any,
    seq_ids: Any,
    atol: float,
    rtol: float,
    compress_ratio: int,
    query_format: Optional[str] = None,
) -> Report:
    """The engine's own scores against kvselect's (:func:`kvselect.indexer_scores`,
    :func:`kvselect.indexer_magnitudes`): a position is reported off only
    when it is off by more than ``atol + rtol m`` **whatever** the float32
    rounding of kvselect's own score (slack ``2 γ_{d+H+2} m``, the bound of
    :func:`kvselect.checking.check_indexer_topk`), so a right kernel is never
    reported. One problem per row (reason ``score_off``): the worst
    position, and how many are off."""
    q = np.asarray(index_q)
    h, d = q.shape[1], q.shape[2]
    u = _U32
    gamma = _gamma(d + h + 2)
    k_all = np.asarray(index_k)
    n = len(q)
    if cu_seqlens is None:
        groups = [(np.arange(n), 0, len(k_all))]
    else:
        cu = np.asarray(cu_seqlens, dtype=np.int64)
        seq = np.asarray(seq_ids, dtype=np.int64)
        groups = [(np.flatnonzero(seq == s), int(cu[s]), int(cu[s + 1])) for s in np.unique(seq)]
    c_all = None if key_scale is None else np.asarray(key_scale, dtype=np.float32)
    details: List[Dict[str, Any]] = []
    w = np.asarray(weights, dtype=np.float32)
    for idx, lo, hi in groups:
        keys = k_all[lo:hi]
        c = None if c_all is None else (c_all if c_all.ndim == 0 else c_all[lo:hi])
        S = ks.indexer_scores(
            q[idx],
            w[idx],
            keys,
            query_pos[idx],
            key_scale=c,
            key_format=key_format,
            query_format=query_format,
            compress_ratio=compress_ratio,
        )
        M = ks.indexer_magnitudes(
            q[idx],
            w[idx],
            keys,
            query_pos[idx],
            key_scale=c,
            key_format=key_format,
            query_format=query_format,
            compress_ratio=compress_ratio,
        )
        for j, i in enumerate(idx):
            L = int(lens[i])
            e = np.asarray(engine[i, :L], dtype=np.float64)
            s, m = S[j, :L].astype(np.float64), M[j, :L].astype(np.float64)
            allowed = (atol + (rtol + 2 * gamma) * m) * (1 + 4 * u) + 2.0**-140
            with np.errstate(invalid="ignore"):
                off = np.abs(e - s) > allowed
                off |= np.isnan(e) != np.isnan(s)
                off &= ~(np.isinf(e) & (e == s))
            if off.any():
                with np.errstate(invalid="ignore"):
                    excess = np.where(off, np.nan_to_num(np.abs(e - s) - allowed, nan=np.inf), -np.inf)
                t = int(np.argmax(excess))
                details.append(
                    {
                        "row": int(i),
                        "problems": [
                            {
                                "reason": "score_off",
                                "n_positions": int(off.sum()),
                                "position": t,
                                "engine": float(e[t]),
                                "kvselect": float(s[t]),
                                "allowed": float(allowed[t]),
                            }
                        ],
                    }
                )
    details.sort(key=lambda x: x["row"])
    return Report(
        rows=n,
        correct=n - len(details),
        wrong=len(details),
        by_reason={"score_off": len(details)},
        details=details,
        vacuous=0,
    )


def engine_score_checks(
    engine_scores: Any,
    rows: np.ndarray,
    topk: Optional[int],
    slots: Optional[ks.GlobalSlots],
    filler: str,
    *,
    query_pos: Any = None,
    lens: Optional[np.ndarray] = None,
    index_q: Any = None,
    weights: Any = None,
    index_k: Any = None,
    key_scale: Any = None,
    key_format: Optional[str] = None,
    query_format: Optional[str] = None,
    cu_seqlens: Any = None,
    seq_ids: Any = None,
    seq_lens: Any = None,
    paged: bool = False,
    atol: float = 0.0,
    rtol: float = 0.0,
    compress_ratio: int = 1,
) -> Tuple[List[Tuple[str, Report]], Optional[str]]:
    """The checks an engine's own scores add to a top-k check, and the
    tolerance's note.

    Always the rows against the engine's own scores, exactly
    (:func:`own_scores_check`); with the indexer's inputs on dense or packed
    keys, the engine's scores against the exact ones under ``atol`` /
    ``rtol`` (:func:`score_accuracy`); for a paged cache (``paged``) not that
    comparison, and the note says so. Each row's context is ``lens`` when
    given (scores given with their ``context_lens``), else
    ``min((query_pos + 1) // compress_ratio, its sequence's keys)``, a paged
    cache's sequences (``seq_lens``) read as a packed batch's; ``query_pos``
    is needed unless ``lens`` is given and the inputs are not.
    """
    r = np.asarray(rows)
    k = _topk_of(r, topk, slots)
    own_scores = np.asarray(engine_scores, dtype=np.float32)
    if query_pos is None and (lens is None or index_q is not None):
        raise TypeError("engine_score_checks: query_pos is needed for the rows' contexts or the inputs' scores")
    pos = np.asarray(() if query_pos is None else query_pos, dtype=np.int64).reshape(-1)
    if lens is None:
        cu = cu_seqlens
        if seq_lens is not None:
            cu = np.concatenate([[0], np.cumsum(np.asarray(seq_lens, dtype=np.int64))])
        lens = _context_lens(pos, compress_ratio, 0 if index_k is None else len(np.asarray(index_k)), cu, seq_ids)
    checks = [("against the engine's own scores, exactly", own_scores_check(own_scores, r, lens, k, slots, filler))]
    if index_q is None:
        return checks, None
    if paged:
        return checks, "the engine's own scores are not compared with the exact ones for a paged cache"
    accuracy = score_accuracy(
        own_scores,
        index_q,
        weights,
        index_k,
        pos,
        lens,
        key_scale,
        key_format,
        cu_seqlens,
        seq_ids,
        atol,
        rtol,
        compress_ratio,
        query_format,
    )
    checks.append(("the engine's own scores against the exact ones", accuracy))
    return checks, None
